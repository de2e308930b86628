"""Where the ``conv`` route's per-batch sums spend their time, candidate by candidate (ResNet-8).

Usage: ``python -m bench.bench_conv_moments [--quick] [--threads N] [--repeats R]``.

One default probe of the ResNet-8 workload (:mod:`_workloads`, batches of 64
images) hands every candidate's ``(grad, hidden)`` to
``moments.conv_batch_moments``; this bench keeps the first batch's pair of
each candidate and times, on exactly those tensors, in rotating order
(``repeats`` times, medians of CPU seconds, user + system, of this process,
which a shared machine disturbs less than wall time):

* ``sample_gradients``: the per-image gradients ``X_m`` (``moments.conv_sample_gradients``), float32
  products of the float32 maps as the route forms them;
* ``correlations``: the hidden map's channel correlations at the 25 lags in float64
  (``moments.channel_correlations``: the images converted group by group, FFTs, one product per
  frequency, the lags' inverse DFT);
* ``border_and_diagonal``: the rest of ``moments.conv_gram`` (border line
  correlations, corner pixels, exact diagonal, zero features);
* ``total``: ``conv_batch_moments`` itself; ``rest = total - the parts above``
  (the ``X_m`` converted to float64 and added up, squared norms, mirroring the Gram);

and the floor (a plain forward + backward of the whole network on one batch,
CPU seconds too) for scale.  Writes ``sections.conv_moments_profile`` and
``conv_moments_per_batch_vs_floor`` (all candidates' ``total`` over the
floor of one batch).
"""

from __future__ import annotations

import sys
import time

import torch

from bench._results import record
from bench._workloads import WORKLOADS, floor_pass, interleaved, parse_bench_args, probe_pass, versions


def captured_maps(model, batch, loss_fn) -> list:
    """``(grad, hidden)`` of each candidate on ``batch``, as the default probe hands them to ``conv_batch_moments``."""
    probe_module = sys.modules["satcore.adapters.torch.probe"]
    route = probe_module.conv_batch_moments
    seen = []

    def keep(grad, hidden, **options):
        seen.append((grad.detach().clone(), hidden.detach().clone()))
        return route(grad, hidden, **options)

    probe_module.conv_batch_moments = keep
    try:
        probe_pass(model, [batch], loss_fn)
    finally:
        probe_module.conv_batch_moments = route
    return seen


def part_functions(grad, hidden) -> dict:
    from satcore.adapters.torch import moments

    M, C, H, W = hidden.shape
    step = max(1, moments.CONV_CHUNK_BYTES // (C * (H + 2) * (W + 2) * torch.float64.itemsize))
    return {
        "sample_gradients": lambda: moments.conv_sample_gradients(grad, hidden),
        "correlations": lambda: moments.channel_correlations(hidden, step, torch.float64),
        "gram": lambda: moments.conv_gram(hidden, step, torch.float64),
        "total": lambda: moments.conv_batch_moments(grad, hidden),
    }


def main():
    args = parse_bench_args(__doc__)
    repeats = args.repeats or (3 if args.quick else 9)
    build, make_batches, loss_fn = WORKLOADS["resnet8"]
    model = build()
    batch_size = 32 if args.quick else 64
    batch = make_batches(batch_size, 1)[0]
    maps = captured_maps(model, batch, loss_fn)
    runs = {"floor": lambda: floor_pass(model, [batch], loss_fn)}
    for i, (grad, hidden) in enumerate(maps):
        for part, fn in part_functions(grad, hidden).items():
            runs[f"{i}:{part}"] = fn
    for fn in runs.values():
        fn()  # warm-up: allocator, cached DFT weights
    seconds = interleaved(runs, repeats, clock=time.process_time)
    candidates = []
    for i, (grad, hidden) in enumerate(maps):
        s = {part: seconds[f"{i}:{part}"] for part in ("sample_gradients", "correlations", "gram", "total")}
        row = {"grad_shape": list(grad.shape), "hidden_shape": list(hidden.shape),
               "seconds": {"sample_gradients": s["sample_gradients"],
                           "correlations": s["correlations"], "border_and_diagonal": s["gram"] - s["correlations"],
                           "total": s["total"]}}
        row["seconds"]["rest"] = s["total"] - s["sample_gradients"] - s["gram"]
        candidates.append(row)
        print(f"candidate {i} hidden {tuple(hidden.shape)}: "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row["seconds"].items()), flush=True)
    total = sum(row["seconds"]["total"] for row in candidates)
    ratio = total / seconds["floor"]
    print(f"floor {seconds['floor'] * 1e3:.0f} ms per batch of {batch_size}; the {len(candidates)} candidates' sums "
          f"{total * 1e3:.0f} ms = {ratio:.2f}x the floor", flush=True)
    record("conv_moments_profile", {"quick": args.quick, "repeats": repeats, "batch_size": batch_size,
                                    "floor_seconds": seconds["floor"], "candidates": candidates,
                                    "versions": versions()},
           {"conv_moments_per_batch_vs_floor": ratio})


if __name__ == "__main__":
    main()
