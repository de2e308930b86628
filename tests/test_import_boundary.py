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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "None None"
