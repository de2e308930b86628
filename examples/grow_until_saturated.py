"""Grow until saturated against four baselines on a byte-level GPT-2 (Debian text), several seeds.

The loop (:func:`satcore.adapters.torch.grow_until_saturated`) starts from a
1-block GPT-2 trained for ``warmup`` steps, then per round: a native-family probe
on the held-out probe split (16 batches), the fold verdicts at a tolerance of
``tolerance`` nats for a block of relative size ``rho``, a zero-output GPT-2
block where the predicted gain is largest, ``steps`` training steps.  Every
baseline gets the same total number of training steps (``warmup + rounds x
steps``, ``rounds`` the loop's own) and grows, if at all, by the same
zero-output blocks:

(a) scratch: the loop's final depth trained from random initialisation;
(b) end: a block appended after the last one every round (fixed schedule);
(c) random: a block at a uniformly drawn candidate every round;
(d) AutoGrow's rule: a block at the end whenever the validation loss improved
    by less than ``autogrow_threshold`` over the last round, else training on.

A scratch sweep over depths 1..``max_depth`` with the same total budget says
where depth stops helping, to compare with where the loop stopped.

    python -m examples.grow_until_saturated [--quick]
"""

from __future__ import annotations

import time

import numpy as np
import torch

from zoo.command import quick_main
from zoo.data import load_text
from zoo.models import gpt2_decoder
from zoo.output import figure, results_dir, save_figure, write_results
from zoo.training import lm_batches, lm_loss, lm_windows, train_lm
from satcore import GrowthBudget, GrowthCriteria, GrowthOptions
from satcore.adapters.torch import find_blocks, grow_until_saturated, insert_block, sequence_loss

COLUMNS = [
    ("method", "method"), ("final_depth", "final depth (blocks)"), ("heldout", "held-out loss (nats)"),
    ("train", "train loss (nats)"), ("steps", "training steps"), ("compute", "compute (block-steps)"),
    ("wins", "loop lower held-out (seeds)"),
]


def settings(quick: bool) -> dict:
    if quick:
        return dict(seeds=(0, 1), d_model=32, seq_len=32, batch=8, warmup=40, steps=20, max_depth=3, n_probe=64,
                    n_eval=64, tolerance=1e-4, rho=0.01, autogrow_threshold=0.01, max_bytes=400_000)
    return dict(seeds=(0, 1, 2), d_model=48, seq_len=64, batch=16, warmup=300, steps=150, max_depth=5, n_probe=256,
                n_eval=256, tolerance=1e-4, rho=0.01, autogrow_threshold=0.01, max_bytes=None)


def run(quick: bool) -> dict:
    torch.set_num_threads(1)
    s = settings(quick)
    text = load_text(quick, max_bytes=s["max_bytes"])
    probe_windows = lm_windows(text.probe, s["seq_len"], s["n_probe"], seed=4)
    probe_data = lm_batches(probe_windows, -(-s["n_probe"] // 16))  # 16 batches: one per fold
    heldout = lm_windows(text.test, s["seq_len"], s["n_eval"], seed=5)
    train_eval = lm_windows(text.train, s["seq_len"], s["n_eval"], seed=6)

    def fit(model, steps, seed):
        train_lm(model, text.train, steps=steps, seq_len=s["seq_len"], batch_size=s["batch"], seed=seed)
        return model

    def fresh(depth, seed):
        return gpt2_decoder(depth, d_model=s["d_model"], n_head=2, n_positions=s["seq_len"], seed=seed)

    def losses(model):
        return {"heldout": lm_loss(model, heldout), "train": lm_loss(model, train_eval)}

    per_seed, start = [], time.time()
    for seed in s["seeds"]:
        base = fit(fresh(1, seed), s["warmup"], seed)
        result = grow_until_saturated(base, lambda m, k: fit(m, s["steps"], 1000 * seed + k), probe_data, sequence_loss, options=GrowthOptions(GrowthCriteria(tolerance=s["tolerance"], rho=s["rho"]), GrowthBudget(max_depth=s["max_depth"], max_rounds=s["max_depth"]), seed=seed))
        inserted = [r for r in result.rounds if r.inserted_at is not None]
        rounds = len(inserted)
        out = {"seed": seed, "stop_reason": result.stop_reason,
               "loop": {"depth": result.depth, "steps": s["warmup"] + rounds * s["steps"],
                        "compute": compute(1, rounds, s), **losses(result.model),
                        "where": [r.inserted_at for r in inserted]},
               "rounds": [r.to_dict() for r in result.rounds]}
        total = s["warmup"] + rounds * s["steps"]
        scratch = fit(fresh(result.depth, seed), total, seed)
        out["scratch"] = {"depth": result.depth, "steps": total, "compute": result.depth * total, **losses(scratch)}
        rng = np.random.default_rng(seed)
        for method in ("end", "random"):
            m = base
            for k in range(rounds):
                names = [b for b in find_blocks(m)] + ["head"]
                at = "head" if method == "end" else names[int(rng.integers(len(names)))]
                m = fit(insert_block(m, at, seed=seed * 1000 + k), s["steps"], 1000 * seed + k)
            out[method] = {"depth": len(find_blocks(m)), "steps": total, "compute": compute(1, rounds, s), **losses(m)}
        m, last, depth_steps = base, lm_loss(base, probe_windows), 0
        for k in range(rounds):  # AutoGrow: grow when the last round's validation gain fell below the threshold
            now = lm_loss(m, probe_windows)
            if k and last - now < s["autogrow_threshold"] and len(find_blocks(m)) < s["max_depth"]:
                m = insert_block(m, "head", seed=seed * 1000 + k)
            last = now
            depth_steps += len(find_blocks(m)) * s["steps"]
            m = fit(m, s["steps"], 1000 * seed + k)
        out["autogrow"] = {"depth": len(find_blocks(m)), "steps": total, "compute": s["warmup"] + depth_steps,
                           **losses(m)}
        out["sweep"] = {d: losses(fit(fresh(d, seed), total, seed))["heldout"] for d in range(1, s["max_depth"] + 1)}
        per_seed.append(out)
        print(f"seed {seed}: loop depth {result.depth} ({result.stop_reason}) held-out {out['loop']['heldout']:.4f}; "
              f"scratch {out['scratch']['heldout']:.4f} end {out['end']['heldout']:.4f} random "
              f"{out['random']['heldout']:.4f} autogrow {out['autogrow']['heldout']:.4f} ({time.time() - start:.0f}s)")
    rows = summary(per_seed)
    notes = [f"{text.source}; byte-level GPT-2 d={s['d_model']}, 2 heads, sequences of {s['seq_len']}; AdamW "
             f"lr 3e-3 cosine, batch {s['batch']}; warm-up {s['warmup']} steps at depth 1, {s['steps']} steps per "
             f"round; tolerance {s['tolerance']} nats at rho {s['rho']}, alpha 0.05, probe {s['n_probe']} held-out "
             f"windows in 16 batches; losses on {s['n_eval']} test / training windows; mean +- sd over seeds "
             f"{list(s['seeds'])}. Compute counts block-steps (blocks in the model x steps trained).",
             sweep_note(per_seed)]
    write_results(results_dir(quick), "grow_until_saturated", rows, COLUMNS,
                  meta={"settings": s, "runs": per_seed, "seconds": time.time() - start}, notes=notes)
    plot(per_seed, results_dir(quick) / "grow_until_saturated.png")
    return {"rows": rows, "runs": per_seed}


def compute(depth0: int, rounds: int, s) -> int:
    """Block-steps of warm-up at ``depth0`` then one more block per round."""
    return depth0 * s["warmup"] + sum((depth0 + k + 1) * s["steps"] for k in range(rounds))


def summary(per_seed) -> list[dict]:
    rows = []
    for method in ("loop", "scratch", "end", "random", "autogrow"):
        values = {k: np.array([r[method][k] for r in per_seed], dtype=float)
                  for k in ("depth", "heldout", "train", "steps", "compute")}
        row = {"method": method, "final_depth": fmt_mean(values["depth"], 1), "heldout": fmt_mean(values["heldout"]),
               "train": fmt_mean(values["train"]), "steps": fmt_mean(values["steps"], 0),
               "compute": fmt_mean(values["compute"], 0), "heldout_mean": float(values["heldout"].mean()),
               "train_mean": float(values["train"].mean()), "depth_mean": float(values["depth"].mean())}
        if method != "loop":
            wins = sum(r["loop"]["heldout"] < r[method]["heldout"] for r in per_seed)
            row["wins"] = f"{wins}/{len(per_seed)}"
        rows.append(row)
    return rows


def fmt_mean(values, digits=4) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} +- {values.std(ddof=1):.{digits}f}"


def sweep_note(per_seed) -> str:
    """Where the scratch sweep stops improving (the first depth within the seed spread of the best) vs the loop."""
    depths = sorted(per_seed[0]["sweep"])
    curve = np.array([[r["sweep"][d] for d in depths] for r in per_seed])
    mean = curve.mean(axis=0)
    spread = curve.std(axis=0, ddof=1).max() if len(per_seed) > 1 else 0.0
    enough = next(d for d, v in zip(depths, mean) if v <= mean.min() + spread)
    loop = [r["loop"]["depth"] for r in per_seed]
    return ("scratch sweep (same total steps as the loop's run, mean over seeds): held-out "
            + ", ".join(f"{d} blocks {v:.4f}" for d, v in zip(depths, mean))
            + f"; depth stops helping at {enough} block(s) (within the largest seed sd {spread:.4f} of the best); "
            f"the loop stopped at depths {loop} with reasons {[str(r['stop_reason']) for r in per_seed]}.")


def plot(per_seed, path):
    fig, (ax1, ax2) = figure(2)
    for i, r in enumerate(per_seed):
        rounds = r["rounds"]
        ax1.plot([x["depth"] for x in rounds], [x["train_loss_before"] for x in rounds], "o-", color=f"C{i}",
                 label=f"loop, seed {r['seed']} (probe-split loss)")
        depths = sorted(r["sweep"])
        ax1.plot(depths, [r["sweep"][d] for d in depths], "x--", color=f"C{i}", alpha=0.6,
                 label=f"scratch sweep, seed {r['seed']} (held-out)")
        ins = [x for x in rounds if x["inserted_at"] is not None and x["train_loss_after"] is not None]
        predicted = [next(c["predicted_gain"] for c in x["candidates"] if c["name"] == x["inserted_at"]) for x in ins]
        realized = [x["train_loss_before"] - x["train_loss_after"] for x in ins]
        ax2.plot([x["depth"] for x in ins], predicted, "s-", color=f"C{i}", label=f"predicted (rho), seed {r['seed']}")
        ax2.plot([x["depth"] for x in ins], realized, "o:", color=f"C{i}", label=f"realized after a round, seed {r['seed']}")
    ax1.set_xlabel("depth (blocks)")
    ax1.set_ylabel("loss (nats)")
    ax1.legend(fontsize=6)
    ax2.set_xlabel("depth before insertion")
    ax2.set_ylabel("gain (nats)")
    ax2.set_yscale("symlog", linthresh=1e-5)
    ax2.legend(fontsize=6)
    save_figure(fig, path)


def main():
    quick_main(__doc__, run, "tiny model and text, two seeds (smoke test)")


if __name__ == "__main__":
    main()
