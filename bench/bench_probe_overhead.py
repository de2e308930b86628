"""Probe overhead: ``satcore.adapters.torch.probe`` over every residual block vs the floor.

Usage: ``python -m bench.bench_probe_overhead [--quick] [--threads N] [--repeats R]``.

For each workload of :mod:`_workloads` (GPT-2 d=256, 8 blocks, T=128; the
paper's stagewise ResNet-8 at 32x32) the same list of batches is run through

* ``floor``: a plain forward + backward of ``sum_i loss_i`` (eval mode);
* ``default``: ``probe(model, batches, loss_fn)`` with default options (all
  blocks + the ``head`` endpoint, per-batch sums in float64);
* ``variance``: ``variance=True`` (adds ``sum X_i^T X_i``);
* ``float32``: ``batch_dtype=torch.float32`` (per-batch sums in float32, totals
  still float64) -- an existing option, measured as a candidate default;
* ``float32_subsample``: float32 and ``position_subsample=64``;
* ``bias_family``: the one-feature ``bias`` family (r = 1): the same taps,
  forward and backward with next to no sums, i.e. the probe's skeleton, so
  ``default - bias_family`` is what the default family's features and float64
  sums cost;
* ``shifted_gram`` (workloads with ``conv`` candidates): the default probe with
  the ``conv`` Gram's channel correlations from 13 shifted products instead
  of the FFT (``moments.CONV_FFT_BYTES = 0``: the route large maps take);
* ``shifted_sample_gradients`` (workloads with ``conv`` candidates): the default
  probe with the per-image gradients ``X_i`` from nine shifted batched products
  (the GPUs' route) instead of the CPU's one split-offset product per image;

interleaved in rotating order, ``repeats`` times; ratios are medians over the
floor's median from the same run.  On one thread the times are CPU seconds
(user + system) of this process, which other processes on a shared machine
disturb far less than wall time; with ``--threads N`` other than 1 they are
wall time (CPU time would add up the threads).  The floor and the default probe also run
over 4x the batches, which splits the probe's time into a fixed cost per call
(feature maps drawn, totals allocated and handed over) and a cost per batch:
the MARGINAL ratio ``(probe_4x - probe) / (floor_4x - floor)`` is what the
probe costs per batch of a long streaming pass; the ``float32`` option runs
over 4x the batches too, for its own marginal ratio.  One extra probe under ``cProfile`` splits
the default probe's time into forward, backward (``autograd.grad``), feature
maps, per-batch moments and the rest.  Peak memory is the resident high-water
increase of one call (``/proc/self/clear_refs``).

Writes ``probe_overhead_default`` and ``probe_overhead_variance`` (the WORST
of the workloads, since the goal ``default <= 1.5x`` must hold for each) plus
per-workload ``probe_overhead_<option>_<workload>``,
``probe_overhead_default_marginal_<workload>``,
``probe_overhead_float32_marginal_<workload>`` and
``probe_fixed_seconds_<workload>`` keys.  With ``--threads N`` other than 1
the section is ``probe_overhead_threadsN`` and every key ends in
``_threadsN``: a side run that leaves the one-thread figures alone.
"""

from __future__ import annotations

import cProfile
import pstats
import time

import numpy as np
import torch

from bench._results import record
from bench._workloads import WORKLOADS, floor_pass, interleaved, peak_rss_increase, probe_pass, parse_bench_args, versions

CONV_WORKLOADS = ("resnet8",)  # the workloads whose candidates take the conv family's route
SIZES = {  # workload -> (batch size, batches) for quick / full
    "gpt2": {"quick": (2, 2), "full": (8, 2)},
    "resnet8": {"quick": (32, 2), "full": (64, 4)},
}
OPTIONS = {
    "default": {},
    "variance": {"variance": True},
    "float32": {"batch_dtype": torch.float32},
    "float32_subsample": {"batch_dtype": torch.float32, "position_subsample": 64},
    "bias_family": {"family": "bias"},
}
# (file suffix, functions) of the phases the profile reports, in the adapter and torch (the
# conv family's route calls ``hidden`` and ``conv_batch_moments`` instead of ``forward``/``batch_moments``).
PHASES = {
    "forward": ("adapters/torch/probe.py", ("call_model",)),
    "backward": ("torch/autograd/__init__.py", ("grad",)),
    "features": ("adapters/torch/features.py", ("forward", "hidden")),
    "moments": ("adapters/torch/moments.py", ("batch_moments", "conv_batch_moments")),
    "total": ("adapters/torch/probe.py", ("probe",)),
}


def phase_breakdown(run, clock) -> dict:
    """Seconds per phase of one probe from cProfile's cumulative times by ``clock`` (``other`` = the rest)."""
    profiler = cProfile.Profile(clock)
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    out = {}
    for phase, (suffix, functions) in PHASES.items():
        out[phase] = sum(
            row[3] for (filename, _, name), row in stats.items() if filename.endswith(suffix) and name in functions
        )
    out["other"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def float32_rel_error(model, batches, loss_fn) -> dict:
    """Largest relative error (Frobenius, over candidates) of float32 per-batch sums against float64."""
    exact = probe_pass(model, batches, loss_fn).statistics
    fast = probe_pass(model, batches, loss_fn, batch_dtype=torch.float32).statistics
    out = {}
    for field in ("sum_cross", "sum_gram", "sum_xi_sq", "sum_q_sq"):
        out[field] = max(
            float(np.linalg.norm(np.subtract(getattr(fast[n], field), getattr(exact[n], field)))
                  / np.linalg.norm(getattr(exact[n], field)))
            for n in exact
        )
    return out


def with_shifted_gram(run):
    """``run()`` with the conv Gram's correlations forced onto the shifted-products route."""
    from satcore.adapters.torch import moments

    budget, moments.CONV_FFT_BYTES = moments.CONV_FFT_BYTES, 0
    try:
        return run()
    finally:
        moments.CONV_FFT_BYTES = budget


def with_shifted_sample_gradients(run):
    """``run()`` with the conv route's per-image gradients forced onto the nine shifted products."""
    from satcore.adapters.torch import moments

    split = moments.conv_sample_gradients
    moments.conv_sample_gradients = lambda grad, hidden: split(grad, hidden, split=False)
    try:
        return run()
    finally:
        moments.conv_sample_gradients = split


def measure(workload: str, size: str, repeats: int, clock) -> dict:
    build, make_batches, loss_fn = WORKLOADS[workload]
    model = build()
    batch_size, n_batches = SIZES[workload][size]
    batches = make_batches(batch_size, n_batches)
    probe_pass(model, batches[:1], loss_fn)  # warm-up: allocator, feature-map construction
    floor_pass(model, batches[:1], loss_fn)
    more = batches * 4
    runs = {"floor": lambda: floor_pass(model, batches, loss_fn)}
    for option, kwargs in OPTIONS.items():
        runs[option] = lambda kwargs=kwargs: probe_pass(model, batches, loss_fn, **kwargs)
    options = list(OPTIONS)
    if workload in CONV_WORKLOADS:
        runs["shifted_gram"] = lambda: with_shifted_gram(lambda: probe_pass(model, batches, loss_fn))
        runs["shifted_sample_gradients"] = lambda: with_shifted_sample_gradients(
            lambda: probe_pass(model, batches, loss_fn))
        options += ["shifted_gram", "shifted_sample_gradients"]
    runs["floor_4x"] = lambda: floor_pass(model, more, loss_fn)
    runs["default_4x"] = lambda: probe_pass(model, more, loss_fn)
    runs["float32_4x"] = lambda: probe_pass(model, more, loss_fn, **OPTIONS["float32"])
    seconds = interleaved(runs, repeats, clock)
    per_floor_batch = seconds["floor_4x"] - seconds["floor"]
    marginal = (seconds["default_4x"] - seconds["default"]) / per_floor_batch
    marginal_float32 = (seconds["float32_4x"] - seconds["float32"]) / per_floor_batch
    fixed = (4 * seconds["default"] - seconds["default_4x"]) / 3  # intercept of probe time against batches
    memory = {name: peak_rss_increase(fn) for name, fn in runs.items() if not name.endswith("_4x")}
    breakdown = phase_breakdown(runs["default"], clock)
    float32_error = float32_rel_error(model, batches, loss_fn)
    row = {
        "batch_size": batch_size,
        "batches": n_batches,
        "candidates": len(probe_pass(model, batches[:1], loss_fn).statistics),
        "seconds": seconds,
        "ratio": {name: seconds[name] / seconds["floor"] for name in options},
        "marginal_ratio_default": marginal,
        "marginal_ratio_float32": marginal_float32,
        "fixed_seconds_default": fixed,
        "peak_rss_increase_bytes": memory,
        "default_breakdown_seconds": breakdown,
        "float32_max_rel_error": float32_error,
    }
    ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row["ratio"].items())
    shares = ", ".join(f"{k} {v / breakdown['total']:.0%}" for k, v in breakdown.items() if k != "total")
    print(f"{workload}: floor {seconds['floor']:.3f} s over {batch_size}x{n_batches}; {ratios}; default per batch "
          f"(marginal, from {4 * n_batches} batches) {marginal:.2f}x (float32 {marginal_float32:.2f}x), fixed {fixed:.2f} s "
          "per call", flush=True)
    print(f"  default probe time split: {shares}", flush=True)
    print("  float32 per-batch sums, max rel error vs float64: "
          + ", ".join(f"{k} {v:.1e}" for k, v in float32_error.items()), flush=True)
    return row


def main():
    args = parse_bench_args(__doc__)
    size = "quick" if args.quick else "full"
    repeats = args.repeats or (3 if args.quick else 5)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    rows = {workload: measure(workload, size, repeats, clock) for workload in WORKLOADS}
    summary = {}
    for workload, row in rows.items():
        for option, ratio in row["ratio"].items():
            summary[f"probe_overhead_{option}_{workload}"] = ratio
    for workload, row in rows.items():
        summary[f"probe_overhead_default_marginal_{workload}"] = row["marginal_ratio_default"]
        summary[f"probe_overhead_float32_marginal_{workload}"] = row["marginal_ratio_float32"]
        summary[f"probe_fixed_seconds_{workload}"] = row["fixed_seconds_default"]
    summary["probe_overhead_default"] = max(row["ratio"]["default"] for row in rows.values())
    summary["probe_overhead_variance"] = max(row["ratio"]["variance"] for row in rows.values())
    print(f"probe_overhead_default {summary['probe_overhead_default']:.2f}x, "
          f"probe_overhead_variance {summary['probe_overhead_variance']:.2f}x (worst workload)")
    section = "probe_overhead"
    if args.threads != 1:  # a side run: its own section and keys, the one-thread figures stay
        section += f"_threads{args.threads}"
        summary = {f"{key}_threads{args.threads}": value for key, value in summary.items()}
    record(section, {"quick": args.quick, "repeats": repeats, "clock": clock.__name__, "versions": versions(),
                     "workloads": rows}, summary)


if __name__ == "__main__":
    main()
