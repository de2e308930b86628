"""bench/run_all.py hands ``--quick`` and ``--threads`` to every bench script that takes them,
also to those that declare them through ``_workloads.parse_bench_args`` (an earlier version
read only the script's own source, so ``run_all.py --quick`` ran three benches at full size)."""

import importlib.util
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_run_all():
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_and_threads_reach_every_script_that_takes_them():
    run_all = load_run_all()
    scripts = run_all.scripts(None)
    assert len(scripts) >= 7
    for script in scripts:
        source = script.read_text()
        declares = set(re.findall(r'add_argument\("(--[a-z]+)"', source))
        if "parse_bench_args(" in source:
            declares |= {"--quick", "--threads", "--repeats"}
        args = run_all.arguments(script, quick=True, threads=1)
        for flag in ("--quick", "--threads"):
            assert (flag in args) == (flag in declares), (script.name, flag, args)
