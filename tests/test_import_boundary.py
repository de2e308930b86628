import os
import subprocess
import sys


def test_import_satcore_imports_no_framework():
    code = (
        "import sys, satcore, satcore.adapters, satcore.cli\n"
        "heavy = [m for m in ('torch', 'tensorflow', 'keras', 'onnxruntime', 'onnx', 'matplotlib') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_top_level_adapters_or_cli_module():
    code = "import importlib.util as u; print(u.find_spec('adapters'), u.find_spec('cli'))"
    # Without PYTHONPATH: a checkout root on it would make its folders top-level packages by design.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", env=env)
    assert out.stdout.strip() == "None None"


def test_checkout_subpackages_are_the_design_folders():
    """From a checkout root with nothing installed, ``satcore.adapters`` and ``satcore.cli`` are the
    top-level ``adapters/`` and ``cli/`` folders (through the committed symlinks), and nothing else in
    the checkout (``tests/``, ``examples/``) becomes part of ``satcore``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (
        "import os, importlib.util as u, satcore.adapters, satcore.cli.main\n"
        "print(os.path.realpath(satcore.adapters.__path__[0]))\n"
        "print(os.path.realpath(os.path.dirname(satcore.cli.main.__file__)))\n"
        "print(u.find_spec('satcore.tests'), u.find_spec('satcore.examples'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    adapters, cli, absent = out.stdout.strip().splitlines()
    assert adapters == os.path.realpath(os.path.join(root, "adapters"))
    assert cli == os.path.realpath(os.path.join(root, "cli"))
    assert absent == "None None"


def test_no_script_or_test_edits_the_import_path():
    """Studies, benches, examples and tests import each other as packages from the checkout root (``zoo``,
    ``studies``, ``bench``, ``examples``; pytest's ``pythonpath``), never by editing the interpreter's module
    path: such edits made the import order of the checkout depend on which script ran first."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    edit = "sys." + "path"  # split: this file must not match
    hits = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "venv")) and d not in ("out", "build", "__pycache__")
                   and not os.path.islink(os.path.join(folder, d))]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    hits += [f"{os.path.relpath(path, root)}:{i}" for i, line in enumerate(f, 1) if edit in line]
    assert not hits, hits
