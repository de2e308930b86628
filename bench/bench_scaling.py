"""Scaling of the probe with the number of samples: time (linear) and peak memory (flat).

Usage: ``python -m bench.bench_scaling [--quick] [--threads N] [--repeats R]``.

The paper's ResNet-8 (see :mod:`_workloads`) is probed with default options
over ``n = batch_size * k`` samples, ``k`` doubling.  Batches are STREAMED
(made one at a time by a generator, as a data loader would), so any growth of
memory with ``n`` would be the probe's own.  Per ``n``: the median time of
``repeats`` interleaved runs and the resident-peak increase of one run.
A least-squares line ``time = a + b n`` gives the per-sample cost ``b``; its
``R^2`` and the largest relative residual say how linear the probe is.

Writes ``scaling_seconds_per_sample``, ``scaling_time_linear_r2``,
``scaling_time_max_rel_residual`` and ``scaling_peak_memory_ratio``
(peak at the largest ``n`` over peak at the smallest).
"""

from __future__ import annotations


import numpy as np

from bench._results import record
from bench._workloads import WORKLOADS, interleaved, peak_rss_increase, probe_pass, parse_bench_args, stream, versions

BATCH_SIZE = 32
MULTIPLES = {"quick": (1, 2, 4, 8), "full": (1, 2, 4, 8, 16, 32)}


def linear_fit(n, seconds) -> dict:
    """Least squares ``seconds = a + b n``; ``R^2`` and the largest ``|residual| / seconds``."""
    n, t = np.asarray(n, dtype=float), np.asarray(seconds, dtype=float)
    A = np.stack([np.ones_like(n), n], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    residual = t - (a + b * n)
    r2 = 1.0 - float(residual @ residual) / float(((t - t.mean()) ** 2).sum())
    return {"intercept_seconds": float(a), "seconds_per_sample": float(b), "r2": r2,
            "max_rel_residual": float(np.max(np.abs(residual) / t))}


def main():
    args = parse_bench_args(__doc__)
    repeats = args.repeats or 3
    build, make_batches, loss_fn = WORKLOADS["resnet8"]
    model = build()
    multiples = MULTIPLES["quick" if args.quick else "full"]
    probe_pass(model, make_batches(BATCH_SIZE, 1), loss_fn)  # warm-up

    def run(k):
        return lambda: probe_pass(model, stream(make_batches, BATCH_SIZE, k), loss_fn)

    seconds = interleaved({k: run(k) for k in multiples}, repeats)
    memory = {k: peak_rss_increase(run(k)) for k in multiples}
    n = [BATCH_SIZE * k for k in multiples]
    fit = linear_fit(n, [seconds[k] for k in multiples])
    rows = [
        {"n_samples": BATCH_SIZE * k, "seconds": seconds[k], "peak_rss_increase_bytes": memory[k]}
        for k in multiples
    ]
    for row in rows:
        print(f"n={row['n_samples']:6d}  {row['seconds']:8.3f} s  {row['seconds'] / row['n_samples'] * 1e3:7.2f} ms/sample"
              f"  peak +{row['peak_rss_increase_bytes'] / 2**20:7.1f} MiB", flush=True)
    memory_ratio = memory[multiples[-1]] / max(memory[multiples[0]], 1)
    print(f"fit: {fit['seconds_per_sample'] * 1e3:.2f} ms/sample + {fit['intercept_seconds']:.3f} s, R^2 {fit['r2']:.4f};"
          f" peak memory x{memory_ratio:.2f} for {multiples[-1] // multiples[0]}x the samples")
    record(
        "scaling",
        {"quick": args.quick, "repeats": repeats, "workload": "resnet8", "batch_size": BATCH_SIZE,
         "versions": versions(), "rows": rows, "fit": fit},
        {
            "scaling_seconds_per_sample": fit["seconds_per_sample"],
            "scaling_time_linear_r2": fit["r2"],
            "scaling_time_max_rel_residual": fit["max_rel_residual"],
            "scaling_peak_memory_ratio": memory_ratio,
            "scaling_samples_ratio": multiples[-1] // multiples[0],
        },
    )


if __name__ == "__main__":
    main()
