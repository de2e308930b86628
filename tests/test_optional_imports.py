"""Every front-end without its optional packages fails with one line naming the extra that installs them.

A package is made absent the way the import system documents (``sys.modules[name] = None`` makes
``import name`` raise ``ModuleNotFoundError`` and ``importlib.util.find_spec(name)`` return ``None``);
the front-end's module is dropped from ``sys.modules`` so that importing it runs its checks again.
"""

import importlib
import sys

import pytest

from satcore._shared.errors import MissingDependencyError, SatcoreError

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
def test_missing_optional_package_is_one_line_naming_the_extra(monkeypatch, module, attribute, absent, line):
    for name in absent:
        monkeypatch.setitem(sys.modules, name, None)
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingDependencyError) as err:
        imported = importlib.import_module(module)
        getattr(imported, attribute)
    assert str(err.value) == line
    assert isinstance(err.value, ImportError) and isinstance(err.value, SatcoreError)
    assert err.value.__context__ is None  # raised before any import was tried: no chained ModuleNotFoundError


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
