"""Predictive validity: do satcore's numbers predict what a trained inserted block actually does?

For stagewise ResNets trained for several lengths (under- to over-fitted) on
real data that ships offline (sklearn digits; Fashion-MNIST from Debian's
``dataset-fashion-mnist`` in the full run), at every candidate:

1. probe the model on its training split and on an independent held-out
   ("probe") split (:func:`satcore.adapters.torch.probe`), and tap the
   activation-gradient second moment ``F = E[Q^T Q]`` on both;
2. insert the zero-output block (:func:`satcore.adapters.torch.grow`,
   ``zero=True``) and train it, the rest of the model frozen in eval mode,
   with one fixed recipe: ``STEPS`` minibatch steps (batch ``BATCH``) on the
   training split, the terminal map only or the whole block, with SGD
   (``LR["sgd"]``) and with Adam (``LR["adam"]``), for each of ``SEEDS``
   (minibatch order);
3. record the realized decrease of the training loss (whole training split)
   and of the test loss (the official test split, never probed), and their
   spread over seeds;
4. score every predictor of :mod:`satcore.predictors` (and the paper's
   numbers) against them: pooled and within-model Spearman correlations with
   ``n``, the share of held-out signs predicted among insertions whose
   realized change exceeds its seed spread, and a calibration plot.

Run ``python bench/predictive_validity.py [--quick]``; output: JSON and PNG
under ``docs/figures/`` (``--out`` to change), seeds, recipes and sizes inside.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from exlib.data import load_images, load_text  # noqa: E402
from exlib.models import StagewiseResNet, gpt2_decoder  # noqa: E402
from exlib.output import versions  # noqa: E402
from exlib.training import (  # noqa: E402
    batches, classifier_loss, lm_batches, lm_loss, lm_windows, per_sample_ce, train_classifier, train_lm)
from satcore import predictors as P  # noqa: E402
from satcore.depth import DepthStatistics  # noqa: E402
from satcore.adapters.torch import StreamTaps, grow, positions, probe, sequence_loss  # noqa: E402
from satcore.adapters.torch.probe import call_model, eval_mode  # noqa: E402

STEPS = 30
BATCH = 64
LR = {"sgd": 0.05, "adam": 0.003}
SEEDS = (0, 1)
RECIPES = ("terminal", "whole")
WIDTHS = (8, 16, 32)
FULL = [
    # (dataset, n_train, n_probe, n_test, probe batch, training epochs)
    ("digits", 600, 320, 400, 20, (1, 3, 10, 60)),
    ("fashion", 1500, 640, 1000, 40, (1, 3, 12, 40)),
]
# GPT-2-style byte decoder (2 blocks, width 64) on the Debian python3.11-doc text (licence texts when it
# is not extracted): (training steps, windows of 64 bytes: train / probe / test, probe batch)
TEXT = {"steps": (20, 150, 800), "windows": (384, 256, 256), "probe_batch": 16, "batch": 16}
QUICK = [("digits", 192, 160, 160, 10, (1, 8))]
QUICK_STEPS = 8
QUICK_CANDIDATES = ("layer1.0", "layer2.0", "layer3.0")


class Task:
    """One trained model and its splits: ``train`` (inputs, targets) tensors the block is trained on,
    ``probe_train`` / ``probe_heldout`` batches, ``loss_fn`` (per-sample) and ``evaluate(model, split)``."""

    def __init__(self, tag, source, model, train, test, probe_train, probe_heldout, loss_fn, evaluate, batch,
                 to_inputs):
        self.tag, self.source, self.model, self.train, self.test = tag, source, model, train, test
        self.probe_train, self.probe_heldout, self.loss_fn = probe_train, probe_heldout, loss_fn
        self.evaluate, self.batch, self.to_inputs = evaluate, batch, to_inputs

    def losses(self, model) -> tuple[float, float]:
        return self.evaluate(model, *self.train), self.evaluate(model, *self.test)


def image_task(dataset, n_train, n_probe, n_test, probe_batch, epochs) -> Task:
    data = load_images(n_train, n_probe, n_test, seed=0, digits=dataset == "digits")
    torch.manual_seed(1)
    model = StagewiseResNet(1, WIDTHS)
    train_classifier(model, *data.train, epochs=epochs, seed=1)
    train = tuple(torch.as_tensor(a) for a in data.train)
    test = tuple(torch.as_tensor(a) for a in data.test)
    return Task(f"{dataset}/e{epochs}", data.source, model, train, test, batches(*data.train, 50),
                batches(*data.probe, probe_batch), per_sample_ce, lambda m, x, y: classifier_loss(m, x, y)[0],
                BATCH, lambda x: x)


def text_task(steps, quick) -> Task:
    text = load_text(quick)
    n_train, n_probe, n_test = TEXT["windows"]
    model = gpt2_decoder(2, d_model=64, n_head=4, n_positions=64, seed=1)
    train_lm(model, text.train, steps=steps, seq_len=64, batch_size=16, seed=1)
    train = lm_windows(text.train, 64, n_train, seed=2)
    test = lm_windows(text.test, 64, n_test, seed=4)
    return Task(f"text/s{steps}", text.source, model, (train, train), (test, test), lm_batches(train, 32),
                lm_batches(lm_windows(text.probe, 64, n_probe, seed=3), TEXT["probe_batch"]), sequence_loss,
                lambda m, x, y: lm_loss(m, x), TEXT["batch"], lambda x: {"input_ids": x})


def fisher(model, data, candidates, loss_fn) -> dict:
    """``F = (1/n) sum_i Q_i^T Q_i`` (``N x N``, summed over positions) per candidate, float64."""
    names = [c.name for c in candidates]
    total, n = {name: 0.0 for name in names}, 0
    with eval_mode(model), StreamTaps(model, tuple(candidates)) as taps:
        for inputs, targets in data:
            taps.clear()
            loss = loss_fn(call_model(model, inputs), targets).sum()
            for name, grad in zip(names, taps.gradients(loss, names)):
                q = positions(grad).to(torch.float64)
                q = q.reshape(-1, q.shape[-1])
                total[name] = total[name] + (q.T @ q).numpy()
            n += len(targets)
    return {name: total[name] / n for name in names}


def train_block(task, result, at, recipe, optimizer, seed, steps):
    """Insert the zero-output block at ``at`` and train it; returns the grown model (eval mode)."""
    grown = grow(task.model, result, at, zero=True).model.eval()
    branch = next(m for m in grown.modules() if type(m).__name__ == "InsertedResidual").branch
    for p in grown.parameters():
        p.requires_grad_(False)
    params = list(branch.projection.parameters()) if recipe == "terminal" else list(branch.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = (torch.optim.SGD(params, lr=LR["sgd"]) if optimizer == "sgd"
           else torch.optim.Adam(params, lr=LR["adam"]))
    (x, y), size = task.train, task.batch
    gen = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(len(y), generator=gen) for _ in range(steps * size // len(y) + 1)])
    for s in range(steps):
        idx = order[s * size : (s + 1) * size]
        loss = task.loss_fn(call_model(grown, task.to_inputs(x[idx])), y[idx]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return grown


def candidate_predictors(name, tr, ho, f_tr, f_ho, rms, steps) -> dict:
    """Every predictor's value for one candidate (gains: positive = the loss goes down)."""
    s_tr, s_ho = tr.score(name), ho.score(name)
    out = {
        "growth_value_train": s_tr.growth_value,
        "cnorm_train": s_tr.cross_gradient_norm,
        "ag_train": s_tr.ag,
        "growth_value_heldout": s_ho.growth_value,
        "growth_value_sq_heldout_unbiased": s_ho.fold_test.unbiased,
    }
    train, held = DepthStatistics({name: tr}), DepthStatistics({name: ho})
    for opt in ("sgd", "adam"):
        first = P.predict_gains(train, held, optimizer=opt, lr=LR[opt], steps=steps)[name]
        second = P.predict_gains(train, held, optimizer=opt, lr=LR[opt], steps=steps, train_fisher={name: f_tr},
                                 heldout_fisher={name: f_ho})[name]
        out[f"first_order_{opt}"], out[f"kfac_{opt}"] = first.training_gain, second.training_gain_second_order
        for key, gain in ((f"alignment_{opt}", first.heldout), (f"alignment_kfac_{opt}", second.heldout)):
            out[key], out[f"{key}_p_decrease"], out[f"{key}_interval"] = gain.value, gain.p_decrease, list(gain.interval)
    # held-out decrease of the gradient-matched block per unit of its relative size times ||z||_S:
    # tr(C_heldout K^- C^T) / V, which ranks like the held-out gain of any rho
    matched = P.predict_gains(train, held, optimizer="matched", rho=1.0, stream_rms={name: rms})[name]
    out["alignment_matched"] = matched.heldout.value / rms
    out["stream_rms"] = rms
    return out


def run_model(task, steps, log, candidates=None):
    t0 = time.time()
    base_train, base_test = task.losses(task.model)
    res_tr = probe(task.model, task.probe_train, task.loss_fn, split="train", variance=True, candidates=candidates,
                   head=candidates is None)
    res_ho = probe(task.model, task.probe_heldout, task.loss_fn, split="heldout", variance=True,
                   candidates=candidates, head=candidates is None)
    f_tr = fisher(task.model, task.probe_train, res_tr.candidates, task.loss_fn)
    f_ho = fisher(task.model, task.probe_heldout, res_ho.candidates, task.loss_fn)
    tag = task.tag
    log(f"{tag}: train loss {base_train:.3f}, test {base_test:.3f}, {len(res_tr.statistics)} candidates, "
        f"probed in {time.time() - t0:.1f}s")
    rows, skipped = [], []
    for name in res_tr.statistics:
        try:
            res_tr.statistics[name].score(name), res_ho.statistics[name].score(name)
        except ValueError as exc:  # reported, never silently dropped
            log(f"  {tag} {name}: skipped: {exc}")
            skipped.append({"model": tag, "candidate": name, "reason": str(exc)})
            continue
        row = {"model": tag, "dataset": task.source, "candidate": name,
               "base_train_loss": base_train, "base_test_loss": base_test,
               "predictors": candidate_predictors(name, res_tr.statistics[name], res_ho.statistics[name],
                                                  f_tr[name], f_ho[name], res_tr.diagnostics[name].stream_rms,
                                                  steps),
               "realized": {}}
        for recipe in RECIPES:
            for opt in ("sgd", "adam"):
                gains = []
                for seed in SEEDS:
                    after_train, after_test = task.losses(train_block(task, res_tr, name, recipe, opt, seed, steps))
                    gains.append((base_train - after_train, base_test - after_test))
                g = np.array(gains)
                row["realized"][f"{recipe}_{opt}"] = {
                    "train_gain": float(g[:, 0].mean()), "test_gain": float(g[:, 1].mean()),
                    "train_spread": float(np.ptp(g[:, 0])), "test_spread": float(np.ptp(g[:, 1])),
                    "per_seed": g.tolist()}
        rows.append(row)
    return rows, skipped


TRAIN_PREDICTORS = ("growth_value_train", "cnorm_train", "ag_train", "growth_value_heldout",
                    "growth_value_sq_heldout_unbiased", "first_order_{opt}", "kfac_{opt}",
                    "alignment_{opt}", "alignment_kfac_{opt}", "alignment_matched")


def _spearman(x, y) -> float | None:
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def score(rows) -> dict:
    """Per realized column (recipe x optimizer x split) and predictor: Spearman pooled and within model, signs."""
    out = {}
    models = sorted({r["model"] for r in rows})
    for recipe in RECIPES:
        for opt in ("sgd", "adam"):
            col = f"{recipe}_{opt}"
            for split in ("train", "test"):
                realized = np.array([r["realized"][col][f"{split}_gain"] for r in rows])
                spread = np.array([r["realized"][col][f"{split}_spread"] for r in rows])
                clear = np.abs(realized) > spread
                table = {}
                for template in TRAIN_PREDICTORS:
                    key = template.format(opt=opt)
                    pred = np.array([r["predictors"][key] for r in rows])
                    within = [_spearman(pred[[r["model"] == m for r in rows]],
                                        realized[[r["model"] == m for r in rows]]) for m in models]
                    within = [w for w in within if w is not None]
                    signs = np.sign(pred[clear]) == np.sign(realized[clear])
                    table[key] = {
                        "spearman_pooled": _spearman(pred, realized), "n": len(rows),
                        "spearman_within_mean": float(np.mean(within)) if within else None,
                        "n_models": len(within),
                        "sign_agreement": float(signs.mean()) if clear.any() else None,
                        "n_clear": int(clear.sum())}
                out[f"{col}/{split}"] = {"predictors": table,
                                         "share_decreasing": float(np.mean(realized > 0)),
                                         "n_clear": int(clear.sum())}
    return out


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 8))
    for i, opt in enumerate(("sgd", "adam")):
        for j, (split, key) in enumerate((("train", f"kfac_{opt}"), ("test", f"alignment_kfac_{opt}"))):
            ax = axes[i, j]
            for recipe, marker in zip(RECIPES, ("o", "x")):
                pred = [r["predictors"][key] for r in rows]
                real = [r["realized"][f"{recipe}_{opt}"][f"{split}_gain"] for r in rows]
                ax.scatter(pred, real, marker=marker, s=18, label=f"{recipe} block")
            lim = max(1e-6, max(abs(v) for r in rows for v in (r["predictors"][key],
                                                                 r["realized"][f"terminal_{opt}"][f"{split}_gain"])))
            ax.plot([-lim, lim], [-lim, lim], "k:", lw=1, label="predicted = realized")
            ax.axhline(0, color="grey", lw=0.5)
            ax.axvline(0, color="grey", lw=0.5)
            ax.set_xscale("symlog", linthresh=lim / 100)
            ax.set_yscale("symlog", linthresh=lim / 100)
            ax.set_xlabel(f"predicted {split} decrease ({key})")
            ax.set_ylabel(f"realized {split} decrease ({opt.upper()}, {STEPS_USED} steps)")
            ax.legend(fontsize=7)
    fig.suptitle("Inserted zero-output blocks: predicted vs realized loss decrease (loss units)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


STEPS_USED = STEPS
COLUMNS = [f"{recipe}_{opt}" for recipe in RECIPES for opt in ("sgd", "adam")]


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:+.{digits}f}"


def markdown_tables(result) -> str:
    """The docs tables: per predictor, pooled / within-model Spearman with each realized column; for the
    test split also the share of signs predicted among insertions whose change exceeds its seed spread."""
    scores, lines = result["scores"], []
    for split, title in (("train", "realized training-loss decrease"), ("test", "realized test-loss decrease")):
        n = scores[f"{COLUMNS[0]}/{split}"]["predictors"]["cnorm_train"]["n"]
        lines.append(f"**{title}** (n = {n} insertions; pooled Spearman / mean within-model Spearman"
                     + ("; sign agreement on insertions beyond their seed spread" if split == "test" else "") + ")\n")
        lines.append("| predictor | " + " | ".join(COLUMNS) + " |")
        lines.append("|---" * (len(COLUMNS) + 1) + "|")
        for template in TRAIN_PREDICTORS:
            cells = []
            for col in COLUMNS:
                opt = col.split("_")[1]
                entry = scores[f"{col}/{split}"]["predictors"][template.format(opt=opt)]
                cell = f"{_fmt(entry['spearman_pooled'])} / {_fmt(entry['spearman_within_mean'])}"
                if split == "test" and entry["sign_agreement"] is not None:
                    cell += f"; {100 * entry['sign_agreement']:.0f}% of {entry['n_clear']}"
                cells.append(cell)
            lines.append(f"| `{template.replace('{opt}', '<opt>')}` | " + " | ".join(cells) + " |")
        shares = ", ".join(f"{c}: {100 * scores[f'{c}/{split}']['share_decreasing']:.0f}%" for c in COLUMNS)
        lines.append(f"\nShare of insertions whose {split} loss went down: {shares}.\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    global STEPS_USED
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 2 checkpoints, short recipe (CI)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--tables", type=Path, help="print the docs tables of a finished run's JSON and exit")
    args = parser.parse_args(argv)
    if args.tables:
        print(markdown_tables(json.loads(args.tables.read_text())))
        return 0
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    plan = QUICK if args.quick else FULL
    steps = QUICK_STEPS if args.quick else STEPS
    STEPS_USED = steps
    start = time.time()
    rows, skipped = [], []
    tasks = [lambda d=d, e=e: image_task(*d[:5], e) for d in plan for e in d[5]]
    if not args.quick:
        tasks += [lambda n=n: text_task(n, quick=False) for n in TEXT["steps"]]
    for make in tasks:
        more, left_out = run_model(make(), steps, print, QUICK_CANDIDATES if args.quick else None)
        rows, skipped = rows + more, skipped + left_out
    result = {
        "schema": "satcore-bench-predictive-validity/1",
        "mode": "quick" if args.quick else "full",
        "recipe": {"steps": steps, "batch": {"images": BATCH, "text windows": TEXT["batch"]}, "lr": LR,
                   "seeds": list(SEEDS), "recipes": list(RECIPES),
                   "optimizers": ["sgd", "adam"], "frozen": "rest of the model, eval mode (BatchNorm running stats)",
                   "model": f"StagewiseResNet(n_added=1, widths={WIDTHS}), SGD momentum 0.9, cosine, seed 1",
                   "family": "conv (probe default), feature seed 0",
                   "realized_test_split": "official test split (never probed); held-out predictors use the probe split"},
        "models": [{"dataset": d, "n_train": a, "n_probe": b, "n_test": c, "probe_batch": pb, "epochs": list(e)}
                   for d, a, b, c, pb, e in plan]
        + ([] if args.quick else [{"dataset": "text", "model": "gpt2_decoder(2, d_model=64, n_head=4)",
                                   "seq_len": 64, "train": "train_lm AdamW lr 3e-3, batch 16, seed 1", **TEXT}]),
        "rows": rows,
        "skipped": skipped,
        "scores": score(rows),
        "wall_seconds": time.time() - start,
    }
    # the fields docs/results.md's table of runs reads (examples/update_results_page.py)
    result["meta"] = {"command": "bench/predictive_validity.py" + (" --quick" if args.quick else ""),
                      "seconds": result["wall_seconds"], "written": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "data": "; ".join(sorted({r["dataset"] for r in rows})), "versions": versions()}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "predictive_validity" + ("_quick" if args.quick else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=float))
    plot(rows, args.out / f"{stem}.png")
    print(f"{len(rows)} insertions in {result['wall_seconds']:.0f}s -> {args.out / stem}.json/.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
