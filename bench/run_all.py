"""Run every ``bench/bench_*.py`` in turn, then check ``bench/results.json``.

Usage: ``python -m bench.run_all [--quick] [--threads N] [--only NAME ...]`` (from the repository root).

Each script runs in its own process (so one's allocations cannot inflate the
next one's peak memory) with ``--quick`` when asked and when the script
accepts it (scripts without a ``--quick`` flag get the small arguments of
:data:`QUICK_FALLBACK`) and with BLAS/OpenMP threads pinned to ``--threads``
(default 1) through the environment.  Every script merges its own keys into
``bench/results.json`` (with ``--quick``, ``bench/out/results-quick.json``: quick numbers never reach the
committed results nor the pages rendered from them); afterwards the keys of :data:`REQUIRED` are checked
and printed.  Exit status 1 if a script failed or a required key is missing.
``--quick`` is meant to finish in under 5 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIRED = (
    "probe_overhead_default",
    "probe_overhead_variance",
    "gram_vs_projector_speedup",
    "score_vs_read_ratio",
    "probe_peak_memory_ratio_10x_samples",
    "backpack_vs_satcore_time",
    "gromo_vs_satcore_time",
)
QUICK_FALLBACK = {"bench_probe_memory.py": ["--batches", "1"]}


def scripts(only) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    return [s for s in found if not only or s.stem in only or s.name in only]


SHARED_OPTIONS = ("--quick", "--threads", "--repeats")  # what ``_workloads.parse_bench_args`` declares


def accepts(script: Path, flag: str) -> bool:
    """Whether the script declares ``flag``, itself or through ``parse_bench_args`` (read from its
    source: cheaper than importing torch for --help)."""
    source = script.read_text()
    return f'"{flag}"' in source or (flag in SHARED_OPTIONS and "parse_bench_args(" in source)


def arguments(script: Path, quick: bool, threads: int) -> list[str]:
    args = ["--threads", str(threads)] if accepts(script, "--threads") else []
    if quick:
        args += ["--quick"] if accepts(script, "--quick") else QUICK_FALLBACK.get(script.name, [])
    return args


def results_file(quick: bool) -> Path:
    """The file the scripts write: ``bench/results.json``, or the git-ignored quick one."""
    return HERE / "out" / "results-quick.json" if quick else HERE / "results.json"


def run_env(threads: int, quick: bool) -> dict:
    """:func:`thread_env`, and with ``quick`` the flag that sends every script's keys to the quick file (also
    scripts that take no ``--quick``)."""
    return {**thread_env(threads), "SATCORE_BENCH_QUICK": "1" if quick else "0"}


def thread_env(threads: int) -> dict:
    """The environment with BLAS/OpenMP pools pinned to ``threads``, also for scripts without ``--threads``.

    Besides fairness on a shared machine: NumPy 2.4's bundled OpenBLAS 0.3.31
    segfaulted here in ``A @ A.T`` (its syrk path) for ``A`` of shape
    ``(20000, 256)`` with 2 threads, and not with 1.
    """
    pinned = {name: str(threads) for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**os.environ, **pinned}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="script names (bench_peers or bench_peers.py)")
    args = parser.parse_args()
    failed, timings = [], {}
    for script in scripts(args.only):
        command = [sys.executable, "-m", f"bench.{script.stem}", *arguments(script, args.quick, args.threads)]
        print(f"== {script.name} {' '.join(command[3:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.run(command, cwd=HERE.parent, env=run_env(args.threads, args.quick)).returncode
        timings[script.name] = time.perf_counter() - start
        print(f"== {script.name}: exit {code}, {timings[script.name]:.0f} s", flush=True)
        if code:
            failed.append(script.name)
    path = results_file(args.quick)
    results = json.loads(path.read_text()) if path.exists() else {}
    missing = [k for k in REQUIRED if k not in results]
    print(f"\ntotal {sum(timings.values()):.0f} s")
    for key in REQUIRED:
        print(f"  {key:40s} {results.get(key, 'MISSING')}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    if missing:
        print(f"missing keys: {', '.join(missing)}")
    sys.exit(1 if failed or missing else 0)


if __name__ == "__main__":
    main()
