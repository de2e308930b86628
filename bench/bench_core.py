"""Exact growth value: Gram form vs the paper's explicit M x M projector; Jacobian vs standard block.

Usage: ``python -m bench.bench_core [--quick]``.  Times are medians of
interleaved repeats in one process; peak memory is the tracemalloc peak of one
call (NumPy reports its buffers to tracemalloc).  Writes ``bench/results.json``
keys ``gram_vs_projector_speedup``, ``gram_vs_projector_memory_ratio`` (at the
largest M both paths ran) and ``jacobian_vs_gram_slowdown``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

import satcore
from bench._results import record


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return value, statistics.median(times)


def peak_bytes(fn):
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [500, 1000, 2000] if args.quick else [1000, 2000, 5000, 10000, 20000]
    N, r = 64, 256
    rng = np.random.default_rng(0)
    rows = []
    for M in sizes:
        Q = rng.standard_normal((M, N)).astype(np.float32)
        Psi = rng.standard_normal((M, r)).astype(np.float32)
        repeats = 3 if M <= 5000 else 1
        gram_fn = lambda: satcore.growth_value(Q, Psi)  # noqa: E731
        proj_fn = lambda: satcore.projected_growth_value(Q, Psi)  # noqa: E731
        # Interleave: gram, projector, gram, projector, ...
        g_times, p_times = [], []
        for _ in range(repeats):
            g_val, g_t = timed(gram_fn, 1)
            p_val, p_t = timed(proj_fn, 1)
            g_times.append(g_t)
            p_times.append(p_t)
        assert abs(g_val - p_val) <= 1e-8 * satcore.ag(Q), (g_val, p_val)
        row = {
            "M": M,
            "gram_seconds": statistics.median(g_times),
            "projector_seconds": statistics.median(p_times),
            "gram_peak_bytes": peak_bytes(gram_fn),
            "projector_peak_bytes": peak_bytes(proj_fn),
        }
        row["speedup"] = row["projector_seconds"] / row["gram_seconds"]
        row["memory_ratio"] = row["projector_peak_bytes"] / row["gram_peak_bytes"]
        rows.append(row)
        print(
            f"M={M:6d}  gram {row['gram_seconds']*1e3:8.1f} ms {row['gram_peak_bytes']/2**20:8.1f} MiB   "
            f"projector {row['projector_seconds']*1e3:9.1f} ms {row['projector_peak_bytes']/2**20:8.1f} MiB   "
            f"speedup {row['speedup']:7.1f}x  memory {row['memory_ratio']:6.1f}x",
            flush=True,
        )

    # General-Jacobian path vs the standard block on the same block (J_i = I_N kron psi_i^T).
    M, N, r = (400, 8, 16) if args.quick else (2000, 16, 32)
    Q = rng.standard_normal((M, N))
    Psi = rng.standard_normal((M, r))
    J = np.einsum("nk,mr->mnkr", np.eye(N), Psi).reshape(M, N, N * r)
    (gv_j, t_j), (gv_g, t_g) = timed(lambda: satcore.growth_value_jacobian(Q, J), 3), timed(
        lambda: satcore.growth_value(Q, Psi), 3
    )
    assert abs(gv_j - gv_g) <= 1e-9 * satcore.ag(Q)
    jac = {"M": M, "N": N, "r": r, "jacobian_seconds": t_j, "gram_seconds": t_g, "slowdown": t_j / t_g}
    print(f"jacobian path {t_j*1e3:.1f} ms vs standard block {t_g*1e3:.2f} ms: {t_j/t_g:.0f}x slower (p = N r = {N*r})")

    last = rows[-1]
    record(
        "core",
        {"gram_vs_projector": rows, "jacobian_vs_gram": jac, "quick": args.quick, "N": 64, "r": 256},
        {
            "gram_vs_projector_speedup": last["speedup"],
            "gram_vs_projector_memory_ratio": last["memory_ratio"],
            "gram_vs_projector_M": last["M"],
            "jacobian_vs_gram_slowdown": jac["slowdown"],
        },
    )


if __name__ == "__main__":
    main()
