"""Every front-end without its optional packages fails with one line naming the extra that installs them.

A package is made absent the way the import system documents (``sys.modules[name] = None`` makes
``import name`` raise ``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` return ``None``).
The front-end is imported in a fresh interpreter, so that its checks run as a user's first import runs
them: imported again in this process, its modules would be new objects, and what their import registers
process-wide (the torch feature maps in the family registry, the ``satcore.adapters.torch`` attribute of
``satcore.adapters``) would stay the new ones after ``sys.modules`` is restored, for later tests to trip on
(a ``ConvFeatures`` built by the registry that is not the class ``satcore.adapters.torch.features`` exports).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the fresh interpreter imports this checkout's satcore from here

# argv: module, attribute ("" for none), absent packages; prints what the import raised, as JSON
IMPORT_WITHOUT = """
import importlib, json, sys
module, attribute, absent = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in absent:
    sys.modules[name] = None
from satcore._shared.errors import MissingDependencyError, SatcoreError
try:
    imported = importlib.import_module(module)
    if attribute:
        getattr(imported, attribute)
except MissingDependencyError as err:
    print(json.dumps({"line": str(err), "import_error": isinstance(err, ImportError),
                      "satcore_error": isinstance(err, SatcoreError), "context": repr(err.__context__)}))
"""


def missing_dependency_error(module: str, attribute: str | None, absent: list[str]) -> dict | None:
    """What importing ``module`` (and taking ``attribute`` from it) raised in a fresh interpreter where the
    ``absent`` packages cannot be imported: the MissingDependencyError's line, whether it is an ImportError
    and a SatcoreError, and ``repr`` of its ``__context__``; ``None`` when nothing was raised."""
    done = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT, module, attribute or "", *absent],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


# (what the user imports, the attribute taken from it or None, packages made absent, the line expected)
CASES = [
    ("satcore.adapters.tensorflow", None, ["tensorflow"],
     "satcore.adapters.tensorflow needs tensorflow: pip install 'satcore[tensorflow]'"),
    ("satcore.adapters.onnx", None, ["onnxruntime"], "satcore.adapters.onnx needs onnxruntime: pip install 'satcore[onnx]'"),
    ("satcore.adapters.onnx", None, ["onnx", "onnxruntime"],
     "satcore.adapters.onnx needs onnx and onnxruntime: pip install 'satcore[onnx]'"),
    ("satcore.adapters.torch", None, ["torch"], "satcore.adapters.torch needs torch: pip install 'satcore[torch]'"),
    ("satcore.adapters.torch", "HFCallback", ["transformers"], "HFCallback needs transformers: pip install 'satcore[hf]'"),
    ("satcore.adapters.torch", "HFCallback", ["accelerate"], "HFCallback needs accelerate: pip install 'satcore[hf]'"),
    ("satcore.adapters.torch", "LightningCallback", ["lightning", "pytorch_lightning"],
     "LightningCallback needs lightning: pip install 'satcore[lightning]'"),
]


@pytest.mark.parametrize("module, attribute, absent, line", CASES, ids=[f"{c[0]}.{c[1]}-{'+'.join(c[2])}" for c in CASES])
def test_missing_optional_package_is_one_line_naming_the_extra(module, attribute, absent, line):
    raised = missing_dependency_error(module, attribute, absent)
    # raised before any import was tried: no chained ModuleNotFoundError
    assert raised == {"line": line, "import_error": True, "satcore_error": True, "context": "None"}


def test_the_checks_leave_this_process_s_torch_adapter_as_found():
    """The torch adapter's check (its modules imported again, where they are imported in the same process)
    leaves this process's ``satcore.adapters.torch`` the one ``sys.modules`` holds, and the registry's torch
    feature maps the classes and functions of the modules ``sys.modules`` holds."""
    import satcore.adapters.torch  # imported before the check, as by any earlier test
    from satcore.adapter_api import family_builder

    assert missing_dependency_error("satcore.adapters.torch", "HFCallback", ["accelerate"]) is not None
    assert satcore.adapters.torch is sys.modules["satcore.adapters.torch"], "a second copy of the adapter"
    for kind in ("mlp", "conv", "linear", "bias", "native"):
        builder = family_builder("torch", kind)
        assert getattr(sys.modules[builder.__module__], builder.__qualname__) is builder, kind


@pytest.mark.parametrize("command", ["score", "sweep"])
def test_plot_without_matplotlib_skips_the_figure_only_and_names_the_extra(monkeypatch, tmp_path, command):
    """``--plot`` where matplotlib is not installed (``sys.modules`` entry ``None``: the import system's own
    "not importable"): the command's output is what it is without ``--plot``, one line on stderr names the extra,
    and no file is written."""
    from click.testing import CliRunner

    from satcore.cli.main import main

    plain = CliRunner().invoke(main, [command, "examples/digits_resnet.npz"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, [command, "examples/digits_resnet.npz", "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0 and result.stdout == plain.stdout
    assert result.stderr.splitlines()[-1] == (f"satcore: note: --plot needs matplotlib: pip install 'satcore[plot]'; "
                                              f"the figure {tmp_path / 'p.png'} was skipped")
    assert not (tmp_path / "p.png").exists()
