"""Depth sweep on images (paper Figure 1, Appendix B.1-B.2).

The stagewise ResNet-8 backbone plus N cyclically assigned BasicBlocks,
trained on Fashion-MNIST (falls back to sklearn digits, saying so) for
several N.  Per depth: train/test loss; AG_max and the paper's logged eq. (2)
score on a training-sample probe (the paper's fixed-sample quantity); on a
HELD-OUT probe split (independent of training, Assumption 4): growth value
max, its realizability and noise floor, and the certified separated test
(Prop. 1) at error level 0.1.  One satcore dump per depth (held-out probe)
is written so that ``satcore sweep`` reproduces the plateau:

    python -m examples.depth_sweep_images [--quick]
    satcore sweep examples/out/full/image_dumps/*.npz --plot sweep.png

CPU scaling (stated in studies/paper-experiments.md): 28x28 images 2x2-pooled to 14x14,
half the paper's widths (8/16/32), 6000 training images, 10 epochs with a cosine schedule instead of
300; ``--quick`` also uses a tiny subset and 6 epochs.
"""

from __future__ import annotations

import time

import torch

from zoo.command import quick_main
from zoo.measure import ERROR_LEVEL, probe_model, report_row
from zoo.output import out_dir, results_dir, write_results
from zoo.sweeps import plateau_note, plot_sweep
from zoo.resnets import image_data, settings, trained_resnet
from zoo.training import batches, classifier_loss, per_sample_ce
from satcore._decisions.sweep import depth_sweep, sweep_point

COLUMNS = [
    ("blocks", "blocks (3+N)"), ("train_loss", "train loss"), ("test_loss", "test loss"), ("test_acc", "test acc"),
    ("train_ag_max", "AG_max (train)"), ("train_ag_batch_max", "eq.(2) (train)"),
    ("growth_value_max", "V_max (held-out)"), ("argmax", "at"), ("realizability", "realiz."),
    ("growth_floor", "V noise floor"), ("signal_to_floor", "V/floor"),
    ("min_p_adjusted", "min p_adj"), ("n_improvable", "# improvable"), ("verdict", "verdict (fold test)"),
    ("gamma_hat", "Gamma_hat"), ("t", "t (a=0.1)"), ("certified_saturated", "Prop.1 'saturated'"),
    ("prop1_verdict", "Prop.1 verdict"),
]


def run(quick: bool) -> dict:
    torch.set_num_threads(1)  # one thread: on a shared 2-core machine two threads ran 10x slower
    s = settings(quick)
    data = image_data(quick)
    print(f"data: {data.source}; train {len(data.train[1])}, held-out probe {len(data.probe[1])}, test {len(data.test[1])}")
    dumps, results = out_dir("image_dumps", quick), results_dir(quick)
    for stale in dumps.glob("*.npz"):  # one dump per depth of THIS sweep, so `satcore sweep dir/*.npz` is exact
        stale.unlink()
    rows, points, start = [], [], time.time()
    train_probe_data = batches(data.train[0][: s.n_probe], data.train[1][: s.n_probe], 128)
    heldout_data = batches(*data.probe, -(-len(data.probe[1]) // 16))  # 16 batches: one per fold of the tests
    for n_added in s.depths:
        model, seconds = trained_resnet(quick, n_added)
        train_loss, _ = classifier_loss(model, *data.train)
        test_loss, test_acc = classifier_loss(model, *data.test)
        fixed = probe_model(model, train_probe_data, per_sample_ce, split="train", depth=model.n_blocks, variance=False)
        held = probe_model(model, heldout_data, per_sample_ce, split="heldout", depth=model.n_blocks,
                           dump_path=dumps / f"resnet_N{n_added:02d}.npz")
        row = {"N": n_added, "blocks": model.n_blocks, "train_loss": train_loss, "test_loss": test_loss,
               "test_acc": test_acc, "train_seconds": seconds, **report_row(fixed, "train_"), **report_row(held)}
        rows.append(row)
        points.append(sweep_point(model.n_blocks, f"N={n_added}", held.report()))
        print(f"N={n_added}: train {train_loss:.4f} test {test_loss:.4f} V_max {row['growth_value_max']:.3e} "
              f"floor {row['growth_floor']:.3e} ({time.time() - start:.0f}s)")
    sweep = depth_sweep(points)
    notes = [f"loss: mean per-sample cross-entropy, eval mode; probes: {rows[0]['train_n_probe']} training "
             f"images (AG_max, eq. (2)) and {rows[0]['n_probe']} held-out images (all other columns).",
             plateau_note(sweep, rows)]
    meta = {"data": data.source, "settings": s.__dict__, "error_level": ERROR_LEVEL, "sweep": sweep.to_dict(),
            "seconds": time.time() - start}
    write_results(results, "images_depth_sweep", rows, COLUMNS, meta=meta, notes=notes)
    plot_sweep(rows, sweep, results / "images_depth_sweep.png", data.source.split(" (")[0], "residual blocks (3 + N)")
    return {"rows": rows, "sweep": sweep}


def main():
    quick_main(__doc__, run, "tiny data and widths (smoke test, ~1 minute)")


if __name__ == "__main__":
    main()
