"""bench/run_all.py hands ``--quick`` and ``--threads`` to every bench script that takes them,
also to those that declare them through ``_workloads.parse_bench_args`` (an earlier version
read only the script's own source, so ``run_all.py --quick`` ran three benches at full size)."""

import importlib.util
import json
import re
import subprocess
import sys
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


def load_results():
    spec = importlib.util.spec_from_file_location("bench_results", BENCH / "_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_runs_write_the_git_ignored_file_not_the_committed_results(tmp_path, monkeypatch):
    results = load_results()
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(results, "QUICK_RESULTS", tmp_path / "out" / "results-quick.json")
    monkeypatch.delenv(results.QUICK_ENV, raising=False)
    results.record("core", {"quick": True, "n": 1})  # a script's own --quick
    monkeypatch.setenv(results.QUICK_ENV, "1")  # run_all --quick, also for scripts without the flag
    results.record("memory", {"n": 2})
    assert not (tmp_path / "results.json").exists()
    assert set(json.loads((tmp_path / "out" / "results-quick.json").read_text())["sections"]) == {"core", "memory"}
    monkeypatch.setenv(results.QUICK_ENV, "0")
    results.record("core", {"quick": False, "n": 3})
    assert json.loads((tmp_path / "results.json").read_text())["sections"] == {"core": {"quick": False, "n": 3}}
    run_all = load_run_all()
    assert run_all.run_env(1, quick=True)[results.QUICK_ENV] == "1"
    assert run_all.run_env(1, quick=False)[results.QUICK_ENV] == "0"
    assert run_all.results_file(True) == BENCH / "out" / "results-quick.json"
    assert run_all.results_file(False) == BENCH / "results.json"
    assert "/bench/out/" in (BENCH.parent / ".gitignore").read_text().split()


def test_render_doc_refuses_quick_results(tmp_path):
    (tmp_path / "bench").mkdir()
    source = (BENCH / "render_doc.py").read_text()
    (tmp_path / "bench" / "render_doc.py").write_text(source)
    (tmp_path / "bench" / "results.json").write_text(json.dumps({"sections": {"core": {"quick": True}}}))
    done = subprocess.run([sys.executable, str(tmp_path / "bench" / "render_doc.py")], capture_output=True,
                          text=True, cwd=BENCH.parent)
    assert done.returncode == 1
    assert done.stderr.strip() == ("bench/results.json: quick-run sections core; rerun them without --quick "
                                   "before rendering")


def test_fresh_process_peaks_rotates_the_order_and_takes_each_names_median(tmp_path):
    from bench._workloads import fresh_process_peaks

    log = tmp_path / "order.txt"
    log.touch()
    # each fresh process appends its name and prints (processes so far) * 1000 after some other output
    script = ("import sys; p = sys.argv[1]; open(p, 'a').write(sys.argv[2] + '\\n'); "
              "print('loading'); print(1000 * len(open(p).read().split()))")
    peaks = fresh_process_peaks(lambda name: [sys.executable, "-c", script, str(log), name], ["a", "b"], 3)
    assert log.read_text().split() == ["a", "b", "b", "a", "a", "b"]
    assert peaks["runs"] == {"a": [1000, 4000, 5000], "b": [2000, 3000, 6000]}
    assert peaks["median"] == {"a": 4000, "b": 3000}  # medians, not means (3333, 3667)
