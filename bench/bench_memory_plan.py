"""The memory plan against the measured peak of the probe it plans (CPU).

Usage: ``python -m bench.bench_memory_plan [--quick] [--threads N]``.

For GPT-2 (d 256 x 8 blocks, T 128) with the ``mlp`` family at two widths
(``n_features`` = 4 d, the default, and 8 d, where the sums dominate), with
``variance=True``: ``plan(...).peak_bytes`` (every candidate's float64 sums
plus the largest batch transient) against the resident high-water increase of
``probe`` over the same batches (:func:`_workloads.peak_rss_increase`, after
a warm-up probe), less the peak of the model's own forward + backward over
them (the floor, which training needs anyway and the plan does not count: it
runs no backward).  Writes ``memory_plan_measured_over_planned`` (the ratio of
the probe's peak above the floor to the plan farthest from 1; 1 means the
plan is exact) and the details under ``sections.memory_plan``.
"""

from __future__ import annotations

from bench._results import record
from bench._workloads import floor_pass, gpt2_batches, gpt2_model, parse_bench_args, peak_rss_increase, stream, versions

from satcore.adapters.torch import plan, probe, sequence_loss
from satcore._formulas.folds import DEFAULT_FOLDS


def main():
    args = parse_bench_args(__doc__)
    # every fold written: the fold sums are zeros whose pages become resident only once a batch adds to them, and a
    # probe of fewer batches than folds would measure a part of what a real one holds
    n_batches, batch_size = (2, 2) if args.quick else (DEFAULT_FOLDS, 4)
    model = gpt2_model()
    results, worst = {}, 1.0
    batches = lambda: stream(gpt2_batches, batch_size, n_batches)  # noqa: E731
    floor_pass(model, list(batches()), sequence_loss)  # warm-up
    floor = peak_rss_increase(lambda: floor_pass(model, list(batches()), sequence_loss))
    for expansion in (4, 8):
        options = {"variance": True, "n_features": expansion * model.config.n_embd}
        planned = plan(model, next(batches()), sequence_loss, **options)
        probe(model, stream(gpt2_batches, batch_size, 1), sequence_loss, **options)  # warm-up
        measured = peak_rss_increase(lambda: probe(model, batches(), sequence_loss, **options))
        ratio = (measured - floor) / planned.peak_bytes
        worst = ratio if abs(ratio - 1) > abs(worst - 1) else worst
        results[f"mlp_{expansion}d"] = {"planned_peak_bytes": planned.peak_bytes, "planned_sums_bytes":
                                        planned.device_bytes, "measured_peak_bytes": measured,
                                        "floor_peak_bytes": floor, "ratio": ratio}
        print(f"n_features {expansion}d: planned {planned.peak_bytes / 2**20:.1f} MiB "
              f"(sums {planned.device_bytes / 2**20:.1f}), measured {measured / 2**20:.1f} MiB, "
              f"floor {floor / 2**20:.1f} MiB, (measured - floor) / planned {ratio:.3f}")
    record("memory_plan", {"batch_size": batch_size, "batches": n_batches, "results": results, **versions()},
           {"memory_plan_measured_over_planned": worst})


if __name__ == "__main__":
    main()
