"""Peak memory of ``satcore.adapters.torch.probe`` does not grow with the number of samples.

Usage: ``python -m bench.bench_probe_memory [--batches B] [--threads N]``.

For each workload of :mod:`_workloads` (GPT-2 d=256 x 8 blocks, T=128; the
stagewise ResNet-8 at 32x32) a probe over ``B`` batches and one over ``10 B``
batches are measured (default options, and ``variance=True``).  Batches are
produced lazily by a generator, so the data itself is never held; what is
measured is the resident high-water increase of the probe call
(:func:`_workloads.peak_rss_increase`).  Statistics are ``O(N r + r^2)`` per
candidate (docs/core.md, Streaming statistics), so the ratio should stay near 1.

Writes ``probe_peak_memory_ratio_10x_samples`` (the WORST ratio over
workloads and options) and the details under ``sections.probe_memory``.
"""

from __future__ import annotations

import argparse

from bench._results import record
from bench._workloads import WORKLOADS, gpt2_batches, peak_rss_increase, resnet8_batches, set_threads, versions

from satcore.adapters.torch import probe

BATCH_SIZE = {"gpt2": 4, "resnet8": 32}


def lazy_batches(workload: str, n_batches: int):
    """A generator of ``n_batches`` batches (text windows / digits recycled)."""
    size = BATCH_SIZE[workload]
    for b in range(n_batches):
        if workload == "gpt2":
            yield gpt2_batches(size, b % 20 + 1)[-1]
        else:
            yield resnet8_batches(size, 1, start=b * size)[0]


def measure(workload: str, n_batches: int, **options) -> int:
    build, _, loss_fn = WORKLOADS[workload]
    model = build()
    probe(model, lazy_batches(workload, 1), loss_fn, **options)  # warm-up: lazy imports, allocator
    return peak_rss_increase(lambda: probe(model, lazy_batches(workload, n_batches), loss_fn, **options))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    results, worst = {}, 0.0
    for workload in WORKLOADS:
        for option, kwargs in (("default", {}), ("variance", {"variance": True})):
            one = measure(workload, args.batches, **kwargs)
            ten = measure(workload, 10 * args.batches, **kwargs)
            ratio = ten / one if one else float("nan")
            worst = max(worst, ratio)
            results[f"{workload}_{option}"] = {
                "batch_size": BATCH_SIZE[workload],
                "batches_1x": args.batches,
                "peak_rss_increase_bytes_1x": one,
                "peak_rss_increase_bytes_10x": ten,
                "ratio": ratio,
            }
            print(f"{workload:8s} {option:8s} 1x {one / 2**20:8.1f} MiB  10x {ten / 2**20:8.1f} MiB  ratio {ratio:.3f}")
    record("probe_memory", {"workloads": results, "versions": versions()},
           {"probe_peak_memory_ratio_10x_samples": worst})
    print(f"probe_peak_memory_ratio_10x_samples = {worst:.3f}")


if __name__ == "__main__":
    main()
