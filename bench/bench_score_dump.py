"""``satcore score`` on a raw dump larger than a chunk: time and peak memory beside plain ``numpy.load``.

Usage: ``python -m bench.bench_score_dump [--size-gb 1.0] [--quick] [--dir /tmp] [--keep]``.

Writes a raw ``satcore-dump/1`` file (``--candidates`` candidates of float32
``q`` ``(M, T, N)`` and ``psi`` ``(M, T, r)``, stored members; default shape a
transformer MLP branch ``T=16, N=128, r=4N``), then measures, each in a fresh
child process (wall time and ``ru_maxrss`` of that child):

* ``read``: ``numpy.load`` of every member (one at a time, the arrays dropped),
  i.e. the time merely to read the same arrays;
* ``score``: the installed ``satcore score DUMP --json --quiet`` (streams the
  members in chunks and computes every statistic, including ``sum X^T X``).

The file is read once first so both runs see a warm page cache; each run is
repeated ``--repeats`` times and the median kept.  BLAS runs single-threaded
by default (``--threads``): on a shared machine oversubscribed BLAS threads
make timings meaningless.  Results go to
``bench/results.json``: section ``score_dump`` and the summary keys
``score_vs_read_ratio``, ``score_dump_peak_rss_mb``, ``score_dump_rss_vs_file``,
``score_dump_file_gb`` and ``score_dump_throughput_mb_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

from bench._results import record

SATCORE = Path(sys.executable).parent / "satcore"

# Child process: run a command, report its wall time and peak RSS (kB on Linux).
MEASURE = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
elapsed = time.perf_counter() - start
if proc.returncode:
    sys.exit(proc.stderr.decode())
print(json.dumps({"seconds": elapsed, "max_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""

READ_ALL = """
import sys, numpy as np
with np.load(sys.argv[1], allow_pickle=False) as data:
    for key in data.files:
        value = data[key]
        if value.dtype.kind == "f":
            value.sum()  # touch every value (the reader's minimum work)
"""


def write_dump(path: Path, size_bytes: int, candidates: int, T: int, N: int, r: int, seed: int) -> dict:
    """Write the raw dump member by member (memory: one candidate); return its shape summary."""
    row_bytes = T * (N + r) * 4
    M = max(2, size_bytes // (candidates * row_bytes))
    names = [f"blocks.{i}" for i in range(candidates)]
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, value in (("satcore_schema", np.array("satcore-dump/1")),
                           ("meta", np.array(json.dumps({"candidates": names, "split": "val"})))):
            with archive.open(key + ".npy", "w") as member:
                np.lib.format.write_array(member, value)
        for name in names:
            psi = np.maximum(rng.standard_normal((M, T, r), dtype=np.float32), 0)  # relu features
            q = rng.standard_normal((M, T, N), dtype=np.float32) * 1e-3
            for key, value in ((f"q/{name}", q), (f"psi/{name}", psi)):
                with archive.open(key + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, value)
            del q, psi
    return {"candidates": candidates, "M": int(M), "T": T, "N": N, "r": r, "dtype": "float32"}


def measure(cmd: list[str], threads: int) -> dict:
    env = {**os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"benchmark command failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def median_run(cmd, repeats, threads):
    runs = [measure(cmd, threads) for _ in range(repeats)]
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "max_rss_mb": max(r["max_rss_kb"] for r in runs) / 1024, "runs_s": [r["seconds"] for r in runs]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="raw data size (default 1 GB = 1e9 bytes)")
    parser.add_argument("--quick", action="store_true", help="20 MB smoke run (overrides --size-gb)")
    parser.add_argument("--dir", default="/tmp", help="where the dump is written")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--T", type=int, default=16)
    parser.add_argument("--N", type=int, default=128)
    parser.add_argument("--r", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads of the measured processes (1: stable on a shared machine)")
    parser.add_argument("--keep", action="store_true", help="keep the dump file")
    args = parser.parse_args()
    size = int((0.02 if args.quick else args.size_gb) * 1e9)
    path = Path(args.dir) / f"satcore_bench_{size // 10**6}MB.npz"
    shape = write_dump(path, size, args.candidates, args.T, args.N, args.r, seed=0)
    file_bytes = path.stat().st_size
    try:
        read_cmd = [sys.executable, "-c", READ_ALL, str(path)]
        measure(read_cmd, args.threads)  # warm the page cache
        read = median_run(read_cmd, args.repeats, args.threads)
        score = median_run([str(SATCORE), "score", str(path), "--json", "--quiet"], args.repeats, args.threads)
    finally:
        if not args.keep:
            path.unlink()
    values = {
        "file_bytes": file_bytes,
        "shape": shape,
        "read": read,
        "score": score,
        "score_vs_read_ratio": score["seconds"] / read["seconds"],
        "score_peak_rss_vs_file": score["max_rss_mb"] * 2**20 / file_bytes,
        "blas_threads": args.threads,
        "load_average_1min": os.getloadavg()[0],
        "quick": args.quick,
    }
    print(json.dumps(values, indent=2))
    if not args.quick:
        record("score_dump", values, {
            "score_vs_read_ratio": values["score_vs_read_ratio"],
            "score_dump_peak_rss_mb": score["max_rss_mb"],
            "score_dump_rss_vs_file": values["score_peak_rss_vs_file"],
            "score_dump_file_gb": file_bytes / 1e9,
            "score_dump_throughput_mb_s": file_bytes / 1e6 / score["seconds"],
        })


if __name__ == "__main__":
    main()
