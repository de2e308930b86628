"""Probe overhead and peak memory on a CUDA device (skipped, nothing written, without one).

Usage: ``python -m bench.bench_probe_cuda [--quick] [--repeats R]``.

The workloads of :mod:`_workloads` (GPT-2 d=256, 8 blocks, T=128; the
stagewise ResNet-8 at 32x32) with model and batches on the GPU, float32
weights, PyTorch's default matmul/cuDNN precision settings (recorded).  As
in ``bench_probe_overhead.py`` the floor is a plain forward + backward of
``sum_i loss_i``; ``default``, ``variance`` and ``float32`` are probes with
those options; runs are interleaved in rotating order, each ended by
``torch.cuda.synchronize()``, ratios are medians over the floor's median.
Two batch sizes per workload: the CPU bench's (small: launch-bound on a GPU)
and a GPU-sized one.  Peak memory: the rise of
``torch.cuda.max_memory_allocated`` during a probe of ``B`` and of ``10 B``
batches (batches made lazily on the device).

Writes ``probe_overhead_default_cuda`` / ``probe_overhead_variance_cuda``
(the WORST over workloads at the GPU-sized batches),
``probe_peak_memory_ratio_10x_samples_cuda`` and per-case keys, under
``sections.probe_cuda`` with the device and versions.
"""

from __future__ import annotations

import argparse

import torch

from bench._results import record
from bench._workloads import WORKLOADS, floor_pass, interleaved, stream, versions

from satcore.adapters.torch import probe
from satcore.adapters.torch.probe import to_device

SIZES = {  # workload -> {label: (batch size, batches)}
    "gpt2": {"cpu_bench_size": (8, 2), "gpu_size": (64, 16)},
    "resnet8": {"cpu_bench_size": (64, 4), "gpu_size": (512, 16)},
}
OPTIONS = {"default": {}, "variance": {"variance": True}, "float32": {"batch_dtype": torch.float32}}
CUDA = torch.device("cuda")


def synced(fn):
    def run():
        fn()
        torch.cuda.synchronize()

    return run


def overhead(workload: str, batch_size: int, n_batches: int, repeats: int) -> dict:
    build, make_batches, loss_fn = WORKLOADS[workload]
    model = build().to(CUDA)
    batches = to_device(make_batches(batch_size, n_batches), CUDA)
    runs = {"floor": synced(lambda: floor_pass(model, batches, loss_fn))}
    for option, kwargs in OPTIONS.items():
        runs[option] = synced(lambda kwargs=kwargs: probe(model, batches, loss_fn, **kwargs))
    for fn in runs.values():  # warm-up: cuDNN autotuning, cuBLAS handles, feature maps
        fn()
    seconds = interleaved(runs, repeats)
    return {"batch_size": batch_size, "batches": n_batches, "seconds": seconds,
            "ratio": {name: seconds[name] / seconds["floor"] for name in OPTIONS}}


def peak_memory(workload: str, batch_size: int, n_batches: int, **options) -> int:
    build, make_batches, loss_fn = WORKLOADS[workload]
    model = build().to(CUDA)

    def lazy():
        return (to_device(batch, CUDA) for batch in stream(make_batches, batch_size, n_batches))

    probe(model, lazy(), loss_fn, **options)  # warm-up
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    probe(model, lazy(), loss_fn, **options)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: skipped (results.json unchanged)")
        return
    repeats = args.repeats or (3 if args.quick else 7)
    rows, summary = {}, {}
    for workload, sizes in SIZES.items():
        for label, (batch_size, n_batches) in sizes.items():
            row = overhead(workload, batch_size, n_batches, repeats)
            rows[f"{workload}_{label}"] = row
            for option, ratio in row["ratio"].items():
                summary[f"probe_overhead_{option}_{workload}_{label}_cuda"] = ratio
            ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio"].items())
            print(f"{workload} {label} {batch_size}x{n_batches}: floor {row['seconds']['floor'] * 1e3:.1f} ms; "
                  f"{ratios}", flush=True)
    for option in ("default", "variance"):
        summary[f"probe_overhead_{option}_cuda"] = max(
            rows[f"{w}_gpu_size"]["ratio"][option] for w in SIZES
        )
    memory, worst = {}, 0.0
    for workload, sizes in SIZES.items():
        batch_size, n_batches = sizes["cpu_bench_size"]
        one, ten = peak_memory(workload, batch_size, 2), peak_memory(workload, batch_size, 20)
        memory[workload] = {"batch_size": batch_size, "batches_1x": 2, "peak_bytes_1x": one, "peak_bytes_10x": ten,
                            "ratio": ten / one}
        worst = max(worst, ten / one)
        print(f"{workload} peak CUDA memory: 2 batches {one / 2**20:.1f} MiB, 20 batches {ten / 2**20:.1f} MiB",
              flush=True)
    summary["probe_peak_memory_ratio_10x_samples_cuda"] = worst
    device = {
        "name": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
        "cuda": torch.version.cuda,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    record("probe_cuda", {"quick": args.quick, "repeats": repeats, "device": device, "versions": versions(),
                          "workloads": rows, "memory": memory}, summary)
    print(f"probe_overhead_default_cuda {summary['probe_overhead_default_cuda']:.2f}x, "
          f"probe_overhead_variance_cuda {summary['probe_overhead_variance_cuda']:.2f}x (worst, GPU-sized batches)")


if __name__ == "__main__":
    main()
