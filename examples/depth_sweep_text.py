"""Depth sweep on text (paper Figure 1, GPT-2-style models; Appendix B.1).

A byte-level Hugging Face GPT-2 (``GPT2Config``: d_model 64, 4 heads, vocab
256) with L decoder blocks, trained with the same recipe for every L on real
English text (Python 3.11 documentation sources from the Debian package
``python3.11-doc``; ``--quick`` and the fallback use the licence texts in
/usr/share/common-licenses).  Per depth the same measurements as the image
sweep, with the ``mlp`` family (``psi = gelu(W1 LN(z))``, r = 4 d,
W1 ~ N(0, 0.02^2) as GPT-2 initialises) at every block input and the head:

    python -m examples.depth_sweep_text [--quick]
    satcore sweep examples/out/full/text_dumps/*.npz
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from zoo.command import quick_main
from zoo.data import load_text
from zoo.measure import ERROR_LEVEL, probe_model, report_row
from zoo.models import gpt2_decoder
from zoo.output import out_dir, results_dir, write_results
from zoo.sweeps import plateau_note, plot_sweep
from zoo.training import lm_batches, lm_loss, lm_windows, train_lm
from satcore.adapters.torch import sequence_loss
from satcore._decisions.sweep import depth_sweep, sweep_point

COLUMNS = [
    ("blocks", "blocks L"), ("train_loss", "train loss"), ("test_loss", "test loss"),
    ("train_ag_max", "AG_max (train)"), ("train_ag_batch_max", "eq.(2) (train)"),
    ("growth_value_max", "V_max (held-out)"), ("argmax", "at"), ("realizability", "realiz."),
    ("growth_floor", "V noise floor"), ("signal_to_floor", "V/floor"),
    ("min_p_adjusted", "min p_adj"), ("n_improvable", "# improvable"), ("verdict", "verdict (fold test)"),
    ("gamma_hat", "Gamma_hat"), ("t", "t (a=0.1)"), ("certified_saturated", "Prop.1 'saturated'"),
    ("prop1_verdict", "Prop.1 verdict"),
]


@dataclass(frozen=True)
class TextSettings:
    depths: tuple
    d_model: int
    steps: int
    seq_len: int
    batch_size: int
    n_probe: int  # windows per probe split
    n_eval: int  # windows for the train/test losses


def settings(quick: bool) -> TextSettings:
    if quick:
        return TextSettings(depths=(1, 2), d_model=32, steps=60, seq_len=32, batch_size=16, n_probe=64, n_eval=128)
    return TextSettings(depths=(1, 2, 3, 4, 5, 6, 7, 8), d_model=64, steps=1200, seq_len=64, batch_size=32, n_probe=384,
                        n_eval=1024)


def run(quick: bool) -> dict:
    torch.set_num_threads(1)  # one thread: on a shared 2-core machine two threads ran 10x slower
    s = settings(quick)
    text = load_text(quick)
    print(f"text: {text.source}")
    train_eval = lm_windows(text.train, s.seq_len, s.n_eval, seed=1)
    test_eval = lm_windows(text.test, s.seq_len, s.n_eval, seed=2)
    train_probe = lm_batches(lm_windows(text.train, s.seq_len, s.n_probe, seed=3), 32)
    # 16 batches: one per fold of the per-candidate tests
    heldout_probe = lm_batches(lm_windows(text.probe, s.seq_len, s.n_probe, seed=4), -(-s.n_probe // 16))
    dumps, results = out_dir("text_dumps", quick), results_dir(quick)
    for stale in dumps.glob("*.npz"):  # one dump per depth of THIS sweep, so `satcore sweep dir/*.npz` is exact
        stale.unlink()
    rows, points, start = [], [], time.time()
    for L in s.depths:
        model = gpt2_decoder(L, d_model=s.d_model, n_positions=max(128, s.seq_len))
        seconds = train_lm(model, text.train, steps=s.steps, seq_len=s.seq_len, batch_size=s.batch_size, seed=0)
        fixed = probe_model(model, train_probe, sequence_loss, split="train", depth=L, variance=False)
        held = probe_model(model, heldout_probe, sequence_loss, split="heldout", depth=L,
                           dump_path=dumps / f"gpt2_L{L:02d}.npz")
        row = {"blocks": L, "train_loss": lm_loss(model, train_eval), "test_loss": lm_loss(model, test_eval),
               "train_seconds": seconds, **report_row(fixed, "train_"), **report_row(held)}
        rows.append(row)
        points.append(sweep_point(L, f"L={L}", held.report()))
        print(f"L={L}: train {row['train_loss']:.4f} test {row['test_loss']:.4f} V_max {row['growth_value_max']:.3e} "
              f"floor {row['growth_floor']:.3e} ({time.time() - start:.0f}s)")
    sweep = depth_sweep(points)
    notes = [f"loss: mean per-window next-byte cross-entropy (nats/byte), eval mode, {s.n_eval} windows of "
             f"{s.seq_len} bytes; probes: {s.n_probe} training windows (AG_max, eq. (2)) and {s.n_probe} held-out "
             f"windows (all other columns).", plateau_note(sweep, rows)]
    meta = {"data": text.source, "settings": s.__dict__, "error_level": ERROR_LEVEL, "sweep": sweep.to_dict(),
            "seconds": time.time() - start}
    write_results(results, "text_depth_sweep", rows, COLUMNS, meta=meta, notes=notes)
    plot_sweep(rows, sweep, results / "text_depth_sweep.png", "GPT-2 (bytes)", "decoder blocks L",
               "cross-entropy (nats/byte)")
    return {"rows": rows, "sweep": sweep}


def main():
    quick_main(__doc__, run, "tiny model and text (smoke test, ~1 minute)")


if __name__ == "__main__":
    main()
