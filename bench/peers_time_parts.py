"""Where each contender's GPT-2 time goes: ms per batch of its parts, in one process.

Usage: ``python -m bench.peers_time_parts [--quick] [--threads N] [--repeats R]``.

The contenders of :mod:`bench.bench_peers` (satcore's default probe, with ``report()``; BackPACK's
``SumGradSquared``; GroMo, with ``compute_optimal_delta``) and satcore's probe reduced to its float64
Gram (:func:`gram_only`, the floor of an exact default) at the bench's GPT-2 sizes, run in rotating
order ``R`` times; each part is timed (CPU seconds of this process) by wrapping the function that does
it, and the medians are printed per batch.  A peer's forward includes its branch ``z + V psi(z)`` (and
the features ``psi``, listed apart), its backward ``V``'s gradient and its hooks.  Prints only: the
peers page quotes one run.
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
import warnings

import torch

from bench import bench_peers
from bench._workloads import parse_bench_args

CONTENDERS = ("satcore", "backpack_sumgradsquared", "gromo", "satcore_scored", "gromo_scored", "satcore_gram_only")


def gram_only(run):
    """``run`` (satcore's default probe) with every per-batch sum but the Gram left at zero: the float64
    Gram of the float32 features added into the totals as the default adds it (``add_gram``), nothing else
    formed.  What no exact default can go under, the Gram being the float64 product it keeps (a float32
    Gram's round-off lands on the directions ``K^-`` amplifies: see the peers page)."""
    from satcore import BatchMoments
    from satcore.adapters.torch import moments

    probe = importlib.import_module("satcore.adapters.torch.probe")

    def gram_sums(q, psi, *, grams_into, **_):
        M, T, N = q.shape
        rows = psi.reshape(M * T, -1).to(torch.float64)
        moments.add_gram(grams_into["sum_gram"], rows)
        zero = torch.zeros((), dtype=torch.float64)
        return BatchMoments(n_samples=M, n_vectors=M * T, sum_q_sq=zero, batch_grad_norm=zero, sum_gram=None,
                                    sum_cross=torch.zeros((N, rows.shape[1]), dtype=torch.float64), sum_xi_sq=zero)

    def runner():
        routine, probe.batch_moments = probe.batch_moments, gram_sums
        try:
            return run()
        finally:
            probe.batch_moments = routine

    return runner


def timed_parts(totals: dict) -> None:
    """Wrap the functions that do each part so that their CPU seconds add up in ``totals`` (part -> s)."""
    from gromo.modules.linear_growing_module import LinearGrowingModule

    torch_adapter = {m: importlib.import_module(f"satcore.adapters.torch.{m}")
                     for m in ("moments", "probe", "running", "capture", "features", "result")}
    moments, probe, running = torch_adapter["moments"], torch_adapter["probe"], torch_adapter["running"]
    parts = [
        (probe, "call_model", "forward (model, taps / branches)"),
        (bench_peers, "call_model", "forward (model, taps / branches)"),
        (torch_adapter["capture"].StreamTaps, "gradients", "backward"),
        (torch.Tensor, "backward", "backward"),
        (probe, "build_feature_map", "feature maps built"),
        (bench_peers, "peer_feature_maps", "feature maps built"),
        (torch_adapter["features"].MLPFeatures, "forward", "psi (features)"),
        (moments, "centred_cross", "C: centred float32 product"),
        (moments, "_in_dtype", "float64 copies of q, psi"),
        (moments, "add_gram", "Gram: float64 dsfrk"),
        (moments, "kernel_inner_products", "sum ||xi||^2: float64 kernels"),
        (probe, "_batch_sums", "all batch sums (psi included)"),
        (running.RunningSums, "add", "running totals add"),
        (running.RunningSums, "sync", "sync: folds formed, Grams unpacked"),
        (torch_adapter["result"].ProbeResult, "report", "satcore report()"),
        (LinearGrowingModule, "update_computation", "GroMo update_computation (S, M)"),
        (LinearGrowingModule, "compute_optimal_delta", "GroMo compute_optimal_delta"),
    ]
    for owner, name, part in parts:
        setattr(owner, name, _timing(getattr(owner, name), part, totals))


def _timing(function, part: str, totals: dict):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            totals[part] = totals.get(part, 0.0) + time.process_time() - start

    return timed


def main():
    args = parse_bench_args(__doc__)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    setting, runs = bench_peers.contenders("gpt2", "quick" if args.quick else "full")
    runs["satcore_gram_only"] = gram_only(runs["satcore"])
    totals: dict = {}
    timed_parts(totals)
    for name in CONTENDERS:  # first calls: imports and lazily built state
        runs[name]()
    repeats = args.repeats or 3
    seconds = {n: [] for n in CONTENDERS}
    parts = {n: [] for n in CONTENDERS}
    load = os.getloadavg()[0]
    for rep in range(repeats):
        for name in CONTENDERS[rep % len(CONTENDERS):] + CONTENDERS[: rep % len(CONTENDERS)]:
            totals.clear()
            start = time.process_time()
            runs[name]()
            seconds[name].append(time.process_time() - start)
            parts[name].append(dict(totals))
    per_batch = 1e3 / setting["n_batches"]
    print(f"ms per batch, medians of {repeats}; load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'part':40s}" + "".join(f"{n[:14]:>15s}" for n in CONTENDERS))
    for part in sorted({p for runs_ in parts.values() for run in runs_ for p in run}):
        cells = [[run.get(part, 0.0) for run in parts[n]] for n in CONTENDERS]
        print(f"{part:40s}" + "".join(f"{statistics.median(c) * per_batch:15.1f}" if any(c) else f"{'-':>15s}"
                                      for c in cells))
    print(f"{'total':40s}" + "".join(f"{statistics.median(seconds[n]) * per_batch:15.1f}" for n in CONTENDERS))


if __name__ == "__main__":
    main()
