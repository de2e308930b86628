"""Decision validity: does ``decide`` pick the insertion that lowers the test loss under a practitioner's recipe?

Two parts, both on real data that ships offline, every model trained here from a seed:

* **Insertions.**  Model sets (``SETS``): stagewise ResNets on sklearn digits and on
  Fashion-MNIST (Debian ``dataset-fashion-mnist``), and small Llama decoders
  (``transformers.LlamaForCausalLM``, byte vocabulary) on the Python 3.11 documentation
  (Debian ``python3.11-doc``) and on the Linux kernel documentation (Debian
  ``linux-doc-6.1``), each trained for three lengths (under-trained to over-fitted).  At
  every candidate the zero-output block (the probe family's residual branch for the
  ResNets, the model's own decoder layer, ``family="native"``, for the Llamas) is trained,
  the rest frozen in eval mode, with each recipe column of ``COLUMNS`` for each seed of
  ``SEEDS`` (minibatch order) up to the column's longest length, and the held-out
  (probe split), test (never probed) and training-probe losses are recorded at every
  checkpoint a decision or a target needs.  The recipes have constant learning rates,
  so the first ``S`` steps of a run are the ``S``-step recipe.
* **Depth sweeps.**  ResNets of 1-6 blocks trained from scratch alike; the realized
  best depth (lowest test loss) and the trials ``decide`` runs at each depth.  The
  over-fitting sweeps (few training images, no weight decay, long training, 2-3 model
  seeds) make every deeper model over-fit more, so that the best depth is the shallowest.
  The text sweeps (``sweeps-text``): Llama decoders of 1-6 layers trained from scratch
  on the Python documentation for 300 and for 1000 steps (2 model seeds), the trials
  inserting the model's own layer.

The decisions themselves are recomputed from the recorded curves by the same core
functions ``decide`` calls (:mod:`satcore._decisions.trials`): a decision of seed ``a`` uses
seed ``a``'s trial prefix, its target is the other seeds' realized test change (so the
trial never shares its minibatches with what it predicts).  Every fitted choice (the
calibration's trend weight, error scale, residual quantiles, threshold, tolerance) is
fitted leave one model set out (``--tables``).

Run ``python -m studies.decision_validity --part SET`` (one process per part:
``digits``, ``fashion``, ``llama-pydoc``, ``llama-linux``, ``sweeps``,
``sweeps-overfit-digits``, ``sweeps-overfit-fashion``, ``sweeps-text``) to record raw
rows to ``studies/results/decision_validity/<part>.json`` (``--column sgd_block`` or
``adam_terminal``: that recipe column instead, to ``<part>-<column>.json``; ``--seeds 3``:
a sweep part's model seed 3 only, to ``<part>-seeds3.json``; ``--trial-seeds 2``: a model set part's models
re-trained from the same seeds, refused unless their base losses and screen are the recorded ones, and only trial
seed 2 run, to ``<part>-trialseed2.json`` (with ``--column``, ``<part>-<column>-trialseed2.json``), whose runs the scores merge into ``<part>.json``'s models; ``--large-heldout``: a model set part's
models and trials with every trial also evaluated on a held-out split 4 times the bench's, to
``studies/results/decision_validity_large_heldout/``; ``--large-heldout 16``: 16 times, to ``..._x16/``; with a 1000-step
``--column``, to ``decision_validity_1000_large_heldout/``, the transfer sets' to
``decision_validity_transfer_1000_large_heldout/``); ``--models TAG ...``: a model set part's models of those tags only
(``digits/e150``, ``llama-pydoc/s300``: each model is trained alone from its seed, so it is the whole part's); ``--tables``
scores them (``studies/decision_scores.py``) and prints the docs tables; ``--variants`` the
decision rules tried; ``--stop-rules`` the stop rules tried; ``--readouts`` the trial readouts tried against
short stops and what bounds them (``studies/decision_readouts.py``); ``--resolution`` which stops the held-out data
resolves and whether the held-out samples named would (``studies/decision_resolution.py``); ``--short-stops`` why the
transfer sets' short stops happen and the rules scored against them (``studies/decision_short_stops.py``);
``--third-set`` those rules, fixed before it was recorded, on the third transfer set (``THIRD``, recorded to
``studies/results/decision_validity_third/`` with ``--part`` as the transfer sets are; ``studies/decision_third_set.py``); ``--fit`` writes ``satcore/_decisions/calibrations.json`` from all sets.

**Transfer sets** (``TRANSFER``), which no fit reads: another architecture on data no fitted set uses, recorded
the same way (``--part gpt2-perldoc`` or ``resmlp-fashion``, with ``--column`` as above; depth sweeps
``--part sweeps-transfer-resmlp``, ``sweeps-transfer-gpt2``) to
``studies/results/decision_validity_transfer/`` and scored with the calibration shipped (fitted on every model set):
byte-level GPT-2 decoders (``transformers.GPT2LMHeadModel``, the ``native`` family inserting a ``GPT2Block`` with
zeroed output projections) on the Perl 5.36 documentation (Debian ``perl-doc``), and pre-norm residual MLPs (an
``nn.Sequential`` of the user's own blocks: the probe's ``auto`` family) on another draw of Fashion-MNIST images.

``--compressed`` (a model set part, fitted or transfer): an experiment, time-compressed trials (the even plan's
``T`` steps at ``lr * S / T``, :func:`record_compressed`), to ``studies/results/decision_validity_compressed/``;
with ``--large-heldout``, a fitted set's SGD trials at 300 steps also read on the larger held-out split (the
compressed-SGD rule's error model), to ``..._compressed_large_heldout/``.

``--screen`` (a model set part, fitted or transfer): the screen's rows of the re-trained models with their fold
interval and fold-test probability, no trials (:func:`record_screen`), to
``studies/results/decision_validity_screen/``, scored by ``studies/screen_probability.py``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

import torch
from torch import nn

from zoo.data import load_images, load_text
from zoo.models import BasicBlock, StagewiseResNet
from zoo.training import batches, classifier_loss, lm_batches, lm_windows, per_sample_ce, train_classifier
from satcore import Recipe, virtual_layer_sensitivity
from satcore._decisions.trials import paired_standard_error, trial_plan
from satcore.adapters.torch import InsertedResidual, probe_splits, sequence_loss
from satcore.adapters.torch.decide import TorchTrials, per_sample_eval, recipe_minibatches, recipe_optimizer, screen, trial_losses
from studies.decision_scores import LARGE_HELDOUT, TRANSFER_1000_FOLDER, large_heldout_folder, schedule_points

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "studies" / "results" / "decision_validity"
OUT_1000 = ROOT / "studies" / "results" / "decision_validity_1000"
OUT_TRANSFER = ROOT / "studies" / "results" / "decision_validity_transfer"  # every column and length of the transfer sets
# the folder --large-heldout names for the transfer sets' 1000-step columns (decision_scores.TRANSFER_1000_FOLDER)
OUT_TRANSFER_1000 = ROOT / "studies" / "results" / TRANSFER_1000_FOLDER
# --compressed: time-compressed trials (an experiment, not what decide runs), every set's models, to OUT_COMPRESSED
OUT_COMPRESSED = ROOT / "studies" / "results" / "decision_validity_compressed"
# --sensitivity: the sensitivity baseline's scores of every set's models (no trials), to OUT_SENSITIVITY
OUT_SENSITIVITY = ROOT / "studies" / "results" / "decision_validity_sensitivity"
# --screen: the screen's rows of every set's models with their fold test's probability (no trials), to OUT_SCREEN
OUT_SCREEN = ROOT / "studies" / "results" / "decision_validity_screen"
# --large-heldout N: the same models and trials, each trial also evaluated on a held-out split N times the bench's (its
# first part is the bench's own held-out split), to decision_scores.large_heldout_folder(OUT, N): how the decision
# depends on the size of the held-out data it reads (the test split and the targets are unchanged)
LENGTHS = (30, 300, 1000)
SEEDS = (0, 1, 2)
MAX_TRIALS = 4
# recipe columns: (optimizer, lr, trainable, longest length); the Llamas use AdamW where the ResNets use Adam
COLUMNS = {
    "adam_block": ("adam", 1e-3, "block", 300),
}
# further columns, recorded one at a time with --column where the CPU budget allowed
EXTRA_COLUMNS = {
    "sgd_block": ("sgd", 0.05, "block", 300),
    "adam_terminal": ("adam", 1e-3, "terminal", 300),
    # 1000 steps, recorded to OUT_1000 and kept out of every fit: the shipped calibration's transfer to a longer recipe
    "adam_block_1000": ("adam", 1e-3, "block", 1000),
    "sgd_block_1000": ("sgd", 0.05, "block", 1000),
    "adam_terminal_1000": ("adam", 1e-3, "terminal", 1000),
}
IMAGE_BATCH, TEXT_BATCH = 32, 8
WIDTHS = (8, 16, 32)
IMAGES = {
    # (digits?, n_train, n_probe, n_test, training epochs: over-fitted first, then under-trained .. mid)
    "digits": (True, 300, 160, 300, (150, 2, 15)),
    "fashion": (False, 500, 160, 300, (120, 2, 12)),
}
LLAMA = {"hidden": 32, "intermediate": 64, "layers": 2, "heads": 2, "seq_len": 32,
         "windows": (128, 96, 128), "steps": (1000, 40, 300), "lr": 3e-3}
# decoder sets: (architecture, text)
TEXTS = {"llama-pydoc": ("llama", "pydoc"), "llama-linux": ("llama", "linux")}
LINUX_DOC = Path.home() / ".cache/satcore-text-linux/usr/share/doc/linux-doc-6.1/Documentation"
LINUX_HINT = "apt-get download linux-doc-6.1 && dpkg-deb -x linux-doc-6.1_*.deb ~/.cache/satcore-text-linux"
PERL_POD = Path.home() / ".cache/satcore-text-perl/usr/share/perl/5.36.0/pod"
PERL_HINT = "apt-get download perl-doc && dpkg-deb -x perl-doc_*.deb ~/.cache/satcore-text-perl"
# transfer sets (no fit reads them): GPT-2 decoders of the Llamas' sizes (4x-wide MLP, learned positions, LayerNorm,
# GELU) on the Perl documentation; residual MLPs on Fashion-MNIST images drawn with another seed (data seed 5),
# (digits?, n_train, n_probe, n_test, epochs, data seed) as IMAGES; trained as the fitted sets of their kind
TRANSFER_TEXTS = {"gpt2-perldoc": ("gpt2", "perl")}
TRANSFER_IMAGES = {"resmlp-fashion": (False, 500, 160, 300, (120, 2, 12), 5)}
RESMLP = {"width": 64, "hidden": 128, "depth": 2}  # the transfer set's; the sweeps' width in their specs, hidden 2 x width
# depth sweeps: (dataset digits?, n_train, epochs, width, weight decay, model seeds); 1..6 blocks, SGD momentum
# as for the model sets.  Part "sweeps": moderately trained; parts "sweeps-overfit-*": few training images, no weight
# decay and long training, so that every deeper model over-fits more and the realized best depth is the shallowest
SWEEPS = {"digits-n150": (True, 150, 80, 8, 5e-4, (1,)), "digits-n1000": (True, 1000, 20, 8, 5e-4, (1,)),
          "fashion-n500": (False, 500, 30, 8, 5e-4, (1,))}
SWEEP_PARTS = {"sweeps": SWEEPS,
               "sweeps-overfit-digits": {"digits-n100-overfit": (True, 100, 300, 16, 0.0, (1, 2, 3))},
               "sweeps-overfit-fashion": {"fashion-n200-overfit": (False, 200, 150, 16, 0.0, (1, 2))}}
# text depth sweeps: (text, training steps, model seeds); Llamas of 1..6 layers of LLAMA's sizes on its windows,
# trained as the model sets' decoders (AdamW on a fixed pool of windows: the 1000-step models over-fit)
TEXT_SWEEPS = {"sweeps-text": {"pydoc-s300": ("pydoc", 300, (1, 2)), "pydoc-s1000": ("pydoc", 1000, (1, 2))}}
SWEEP_PARTS.update(TEXT_SWEEPS)
# transfer sweeps (to OUT_TRANSFER, no fit reads them), specs as above: residual MLPs of 1..6 blocks (width 64) on
# Fashion-MNIST (moderately trained; over-fitting: 200 images, no weight decay, 150 epochs) and GPT-2 decoders of
# 1..6 layers on the Perl documentation, trained as the Llama sweeps
TRANSFER_SWEEPS = {"sweeps-transfer-resmlp": {"resmlp-fashion-n500": (False, 500, 15, 64, 5e-4, (1, 2, 3)),
                                              "resmlp-fashion-n200-overfit": (False, 200, 150, 64, 0.0, (1, 2, 3))},
                   "sweeps-transfer-gpt2": {"gpt2-perl-s300": ("perl", 300, (1, 2)),
                                            "gpt2-perl-s1000": ("perl", 1000, (1, 2))}}
SWEEP_PARTS.update(TRANSFER_SWEEPS)
SWEEP_ARCHITECTURE = {"sweeps-transfer-resmlp": "resmlp", "sweeps-transfer-gpt2": "gpt2",  # else PlainResNet, Llama
                      "sweeps-third-resmlp": "resmlp"}
TRANSFER_LOOPS = {"loops-transfer-resmlp": "sweeps-transfer-resmlp", "loops-transfer-gpt2": "sweeps-transfer-gpt2"}
TRANSFER = (*TRANSFER_IMAGES, *TRANSFER_TEXTS, *TRANSFER_SWEEPS, *TRANSFER_LOOPS)
# the third transfer set (issue 39), fixed before any of it was recorded and read by no fit and no earlier rule choice
# (studies/decision-validity.md, "A third transfer set"): byte-level GPT-2 decoders of other sizes (hidden 48, 3 layers)
# on the Linux documentation, their windows drawn with other seeds; residual MLPs of width 96 on sklearn digits drawn
# with data seed 7; each trained as the model sets of its kind are, to OUT_THIRD
OUT_THIRD = ROOT / "studies" / "results" / "decision_validity_third"
THIRD_TEXTS = {"gpt2-linux": ("gpt2", "linux")}
THIRD_DECODER = {"hidden": 48, "layers": 3, "heads": 2, "window_seeds": (12, 13, 14)}  # train, probe, test offsets
THIRD_IMAGES = {"resmlp-digits": (True, 300, 160, 300, (150, 2, 15), 7)}
THIRD_RESMLP_WIDTH = 96
# its depth sweeps, specs as SWEEPS', on the digits drawn with the residual MLPs' data seed: moderately trained, and
# over-fitting (100 images, no weight decay, 150 epochs)
THIRD_SWEEPS = {"sweeps-third-resmlp": {"resmlp-digits-n300": (True, 300, 20, 96, 5e-4, (1, 2, 3)),
                                        "resmlp-digits-n100-overfit": (True, 100, 150, 96, 0.0, (1, 2, 3))}}
SWEEP_PARTS.update(THIRD_SWEEPS)
THIRD = (*THIRD_TEXTS, *THIRD_IMAGES, *THIRD_SWEEPS)
SWEEP_RECIPE = Recipe("adam", 1e-3, 150, IMAGE_BATCH, "block")
TEXT_SWEEP_RECIPE = Recipe("adamw", 1e-3, 150, TEXT_BATCH, "block")
DEPTHS = range(1, 7)


def column_recipe(column: str, text: bool, steps: int) -> Recipe:
    optimizer, lr, trainable, _ = {**EXTRA_COLUMNS, **COLUMNS}[column]
    if text and optimizer == "adam":
        optimizer = "adamw"
    return Recipe(optimizer, lr, steps, TEXT_BATCH if text else IMAGE_BATCH, trainable)


def checkpoints_for(n_candidates: int, longest: int) -> list[int]:
    """Every step a decision (the trial schedules :mod:`decision_scores` scores) or a target (the recipe's length)
    reads, up to ``longest``."""
    points = set()
    for steps in LENGTHS:
        if steps <= longest:
            points |= schedule_points(n_candidates, steps, MAX_TRIALS) | {steps}
    return sorted(points)


def _summary(before, after) -> dict:
    """Mean change per checkpoint and the paired standard error of each."""
    diff = after - before[None, :]
    return {"change": diff.mean(1).tolist(), "se": paired_standard_error(diff).tolist()}


def record_model(task: dict, log, seeds: tuple = SEEDS, stored: dict | None = None) -> dict:
    """Screen and trajectories of every candidate of one trained model, for the trial seeds ``seeds``.

    ``stored``: this model as an earlier run recorded it (``--trial-seeds``): the re-trained model must be that one
    (:func:`decision_scores.model_mismatch`, checked before any trial runs), or nothing is recorded."""
    t0 = time.time()
    model, loss_fn, text = task["model"], task["loss_fn"], task["text"]
    family = "native" if text else "auto"
    splits = probe_splits(model, task["probe_train"], task["heldout"], loss_fn, family=family)
    names = list(splits.train.statistics)
    sets = {"heldout": task["heldout"], "test": task["test"], "train": task["probe_train"]}
    if "heldout_large" in task:
        sets["heldout_large"] = task["heldout_large"]
    base = {k: float(per_sample_eval(model, v, loss_fn).mean()) for k, v in sets.items()}
    out = {"model": task["tag"], "set": task["set"], "source": task["source"], "candidates": names, "base": base,
           "screen": {}, "runs": []}
    for column, (_, _, _, longest) in COLUMNS.items():
        for steps in LENGTHS:
            if steps <= longest:
                out["screen"][f"{column}/{steps}"] = {
                    name: row.heldout_change for name, row in screen(splits, column_recipe(column, text, steps)).items()}
    if stored is not None:
        from studies.decision_scores import model_deviation, model_mismatch

        if (why := model_mismatch(stored, out)) is not None:
            raise SystemExit(f"{task['tag']}: the re-trained model is not the recorded one ({why}); "
                             "its trial seeds cannot be pooled with the recorded ones")
        out["same_model_deviation"] = model_deviation(stored, out)[0]
        log(f"  {task['tag']}: the recorded model (base losses and screen within {out['same_model_deviation']:.1e})")
    after = {}  # (column, seed, held-out split) -> {candidate: per-sample losses after each checkpoint}
    for name in names:
        for column, (_, _, _, longest) in COLUMNS.items():
            points = checkpoints_for(len(names), longest)
            for seed in seeds:
                measured = trial_losses(TorchTrials(model, splits.train, column_recipe(column, text, longest), task["train"], sets, loss_fn, seed), name, points)
                out["runs"].append({"candidate": name, "column": column, "seed": seed, "steps": points,
                                    **{k: _summary(*measured[k]) for k in sets}})
                if "heldout_large" in sets:  # --large-heldout: keep them for the candidates' paired differences
                    for split in ("heldout", "heldout_large"):
                        after.setdefault(f"{column}/{seed}/{split}", {})[name] = measured[split][1]
        log(f"  {task['tag']} {name}: {time.time() - t0:.0f}s")
    if after:
        # per checkpoint, InsertionDecision.margin_se as decide computes it
        out["paired_se"] = {key: {f"{a}|{b}": paired_standard_error(losses[b] - losses[a]).tolist()
                                  for a, b in itertools.combinations(names, 2)} for key, losses in after.items()}
    return out


def record_compressed(task: dict, log, large_heldout: bool = False) -> dict:
    """Time-compressed trials of one trained model: at every candidate, for each recipe column at 300 and 1000
    steps ``S``, the even plan's trial length ``T = S // min(n, 4)`` trained at ``lr * S / T`` (the recipe's
    ``lr * steps`` in ``T`` steps) with each trial seed, its held-out, test and training changes at ``T / 2``
    and ``T``.  Read beside the recorded runs at the recipe's ``lr`` (the same models: the base losses are
    recorded to check it) by :func:`decision_scores.compressed_scores`.  ``large_heldout``: the SGD column's
    300-step trials only, each also read on the task's larger held-out split (the error model's second size)."""
    t0 = time.time()
    model, loss_fn, text = task["model"], task["loss_fn"], task["text"]
    splits = probe_splits(model, task["probe_train"], task["heldout"], loss_fn, family="native" if text else "auto")
    names = list(splits.train.statistics)
    sets = {"heldout": task["heldout"], "test": task["test"], "train": task["probe_train"]}
    if large_heldout:
        sets["heldout_large"] = task["heldout_large"]
    out = {"model": task["tag"], "set": task["set"], "candidates": names,
           "base": {k: float(per_sample_eval(model, v, loss_fn).mean()) for k, v in sets.items()}, "runs": []}
    for steps in (300,) if large_heldout else (300, 1000):
        T = steps // min(len(names), MAX_TRIALS)
        for column in ("sgd_block",) if large_heldout else ("adam_block", "sgd_block", "adam_terminal"):
            optimizer, lr, trainable, _ = {**COLUMNS, **EXTRA_COLUMNS}[column]
            recipe = Recipe("adamw" if text and optimizer == "adam" else optimizer, lr * steps / T, T,
                            TEXT_BATCH if text else IMAGE_BATCH, trainable)
            for name in names:
                for seed in SEEDS:
                    measured = trial_losses(TorchTrials(model, splits.train, recipe, task["train"], sets, loss_fn, seed), name, [T // 2, T])
                    out["runs"].append({"steps_recipe": steps, "T": T, "lr": recipe.lr, "column": column,
                                        "candidate": name, "seed": seed, "steps": [T // 2, T],
                                        **{k: _summary(*measured[k]) for k in sets}})
    log(f"  {task['tag']} compressed trials: {time.time() - t0:.0f}s")
    return out


def record_sensitivity(task: dict, log) -> dict:
    """The sensitivity baseline of one trained model (``--sensitivity``): at every candidate, Sensitivity-Based
    Layer Insertion's ``||C||_F^2`` on the training probe split (:func:`satcore.virtual_layer_sensitivity`, the
    probe's family as the virtual layer), no trial.  The base losses are recorded to check, when scored, that the
    re-trained model is the recorded one (:func:`decision_scores.attach_sensitivity`)."""
    t0 = time.time()
    model, loss_fn, text = task["model"], task["loss_fn"], task["text"]
    splits = probe_splits(model, task["probe_train"], task["heldout"], loss_fn, family="native" if text else "auto")
    sets = {"heldout": task["heldout"], "test": task["test"], "train": task["probe_train"]}
    out = {"model": task["tag"], "set": task["set"], "candidates": list(splits.train.statistics),
           "base": {k: float(per_sample_eval(model, v, loss_fn).mean()) for k, v in sets.items()},
           "sensitivity": virtual_layer_sensitivity(splits.train.statistics)}
    log(f"  {task['tag']} sensitivity: {time.time() - t0:.0f}s")
    return out


def record_screen(task: dict, log) -> dict:
    """The screen's rows of one trained model (``--screen``), no trial: for every recipe column of 300 steps (the
    default and ``EXTRA_COLUMNS``) at 300 and 1000 steps, per candidate the first-order held-out change of the
    recipe's steps with its fold interval and the fold test's probability that the step's held-out gain is positive
    (:func:`satcore.predict_gains`; ``studies/screen_probability.py`` scores that probability as a forecast of the
    realized test change).  The base
    losses and the held-out changes are kept to check, when scored, that the re-trained model is the recorded one."""
    t0 = time.time()
    model, loss_fn, text = task["model"], task["loss_fn"], task["text"]
    splits = probe_splits(model, task["probe_train"], task["heldout"], loss_fn, family="native" if text else "auto")
    sets = {"heldout": task["heldout"], "test": task["test"], "train": task["probe_train"]}
    out = {"model": task["tag"], "set": task["set"], "candidates": list(splits.train.statistics),
           "base": {k: float(per_sample_eval(model, v, loss_fn).mean()) for k, v in sets.items()}, "screen_rows": {}}
    for column in [c for c in {**COLUMNS, **EXTRA_COLUMNS} if not c.endswith("_1000")]:
        for steps in LENGTHS[1:]:
            out["screen_rows"][f"{column}/{steps}"] = {
                name: {"heldout_change": row.heldout_change, "interval": list(row.interval), "fold_test_p_positive": row.fold_test_p_positive}
                for name, row in screen(splits, column_recipe(column, text, steps)).items()}
    log(f"  {task['tag']} screen: {time.time() - t0:.0f}s")
    return out


# -- model sets ---------------------------------------------------------------------------------------------
class ResMLPBlock(nn.Module):
    """A pre-norm residual MLP block: ``x + W2 gelu(W1 LayerNorm(x))``."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x):
        return x + self.mlp(x)


class ResMLP(nn.Module):
    """Flattened image, a linear stem, ``RESMLP["depth"]`` :class:`ResMLPBlock`, LayerNorm and a linear head: a
    user's own residual network with no block kind satcore knows (the probe's ``auto`` family)."""

    def __init__(self, inputs: int, classes: int = 10, depth: int = RESMLP["depth"], width: int = RESMLP["width"]):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(inputs, width))
        self.blocks = nn.Sequential(*[ResMLPBlock(width, 2 * width) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def model_tags(part: str) -> list[str]:
    """The tags of a model set part's models, as recorded (``--models`` names them)."""
    if part in (*TEXTS, *TRANSFER_TEXTS, *THIRD_TEXTS):
        return [f"{part}/s{steps}" for steps in LLAMA["steps"]]
    return [f"{part}/e{e}" for e in {**IMAGES, **TRANSFER_IMAGES, **THIRD_IMAGES}[part][4]]


def image_tasks(name: str, large_heldout: int = 0, only: tuple | None = None):
    """The set's trained models (each trained alone from its seed), ``only`` those tags where given."""
    if name in TRANSFER_IMAGES or name in THIRD_IMAGES:
        *spec, data_seed = {**TRANSFER_IMAGES, **THIRD_IMAGES}[name]
    else:
        spec, data_seed = IMAGES[name], 0
    use_digits, n_train, n_probe, n_test, epochs = spec
    # a larger probe split extends the bench's one (the same seeded permutation, read further); train and test are
    # drawn as before
    data = load_images(n_train, n_probe * (large_heldout or 1), n_test, seed=data_seed, digits=use_digits)
    if len(data.train[1]) != n_train or len(data.probe[1]) != n_probe * (large_heldout or 1):
        raise SystemExit(f"{name}: the data holds too few images for a held-out split {large_heldout} times the "
                         f"bench's beside its {n_train} training images")
    probe = (data.probe[0][:n_probe], data.probe[1][:n_probe])
    for e in epochs:
        if only is not None and f"{name}/e{e}" not in only:
            continue
        torch.manual_seed(1)
        if name in THIRD_IMAGES:
            model = ResMLP(data.train[0][0].size, width=THIRD_RESMLP_WIDTH)
        else:
            model = ResMLP(data.train[0][0].size) if name in TRANSFER_IMAGES else StagewiseResNet(0, WIDTHS)
        train_classifier(model, *data.train, epochs=e, seed=1)
        yield {"tag": f"{name}/e{e}", "set": name, "source": data.source, "model": model, "loss_fn": per_sample_ce,
               "text": False, "train": batches(*data.train, 100),
               "probe_train": batches(data.train[0][:128], data.train[1][:128], 64),
               "heldout": batches(*probe, 40), "test": batches(*data.test, 150),
               **({"heldout_large": batches(*data.probe, 40)} if large_heldout else {})}


def _byte_splits(data: bytes, source: str):
    """``(source, train, probe, test)`` byte tokens, every tenth 64 KiB chunk in ``load_text``'s fixed pattern."""
    data = np.frombuffer(data, dtype=np.uint8)
    parts = {"train": [], "probe": [], "test": []}
    for i, start in enumerate(range(0, len(data), 1 << 16)):
        parts["probe" if i % 10 == 8 else "test" if i % 10 == 9 else "train"].append(data[start : start + (1 << 16)])
    return (f"{source}, {len(data)} bytes", *(np.concatenate(parts[k]) for k in ("train", "probe", "test")))


def linux_text():
    """Byte tokens of the kernel's admin-guide, process and filesystems documentation, split like ``load_text``."""
    if not LINUX_DOC.is_dir():
        raise SystemExit(f"{LINUX_DOC} not found; to get it: {LINUX_HINT}")
    files = sorted(p for sub in ("admin-guide", "process", "filesystems") for p in (LINUX_DOC / sub).rglob("*.rst.gz"))
    return _byte_splits(b"\n".join(gzip.open(p).read() for p in files),
                        f"Linux 6.1 documentation (Debian linux-doc-6.1), {len(files)} files")


def perl_text():
    """Byte tokens of the Perl 5.36 manual pages (``pod/*.pod``), split like ``load_text``."""
    files = sorted(PERL_POD.glob("*.pod")) if PERL_POD.is_dir() else []
    if not files:
        raise SystemExit(f"{PERL_POD} not found; to get it: {PERL_HINT}")
    return _byte_splits(b"\n".join(p.read_bytes() for p in files),
                        f"Perl 5.36 documentation (Debian perl-doc), {len(files)} files")


def decoder(architecture: str, layers: int, seed: int = 1, hidden: int = LLAMA["hidden"], heads: int = LLAMA["heads"]):
    """A byte-level decoder of ``LLAMA``'s sizes: ``"llama"`` (:func:`llama`) or ``"gpt2"`` (``GPT2LMHeadModel``, of
    width ``hidden`` with ``heads`` heads)."""
    if architecture == "llama":
        return llama(layers, seed)
    from zoo.models import gpt2_decoder

    return gpt2_decoder(layers, d_model=hidden, n_head=heads, n_positions=LLAMA["seq_len"], seed=seed)


def llama(layers: int, seed: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=LLAMA["hidden"], intermediate_size=LLAMA["intermediate"],
                      num_hidden_layers=layers, num_attention_heads=LLAMA["heads"],
                      num_key_value_heads=LLAMA["heads"], max_position_embeddings=LLAMA["seq_len"],
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def train_lm_windows(model, windows, steps: int, seed: int = 1, *, lr: float = LLAMA["lr"], weight_decay: float = 0.01,
                     cosine: bool = True) -> None:
    """AdamW (default: lr ``LLAMA["lr"]``, weight decay 0.01, cosine; ``cosine=False``: constant lr) on every
    parameter, minibatches of ``TEXT_BATCH`` from a FIXED pool of windows (so long runs over-fit)."""
    import math

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    for _ in range(steps):
        ids = windows[torch.randint(0, len(windows), (TEXT_BATCH,), generator=gen)]
        loss = sequence_loss(model(input_ids=ids), ids).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cosine:
            sched.step()
    model.eval()


def text_windows(text: str, probe_factor: int = 1, seeds: tuple = (2, 3, 4)):
    """``(source, train, probe, test)`` windows of ``LLAMA["seq_len"]`` bytes of ``text`` (``"pydoc"``, ``"linux"``);
    ``probe_factor`` times the probe windows (their first part the same windows: the offsets are drawn in order);
    ``seeds``: the train, probe and test windows' offset seeds."""
    if text == "pydoc":
        loaded = load_text(False)
        source, train, probe, test = loaded.source, loaded.train, loaded.probe, loaded.test
    else:
        source, train, probe, test = linux_text() if text == "linux" else perl_text()
    seq, (n_train, n_probe, n_test) = LLAMA["seq_len"], LLAMA["windows"]
    return (source, lm_windows(train, seq, n_train, seed=seeds[0]),
            lm_windows(probe, seq, n_probe * probe_factor, seed=seeds[1]), lm_windows(test, seq, n_test, seed=seeds[2]))


def text_tasks(name: str, large_heldout: int = 0, only: tuple | None = None):
    """The set's trained decoders (each trained alone from its seed), ``only`` those tags where given."""
    architecture, text = {**TEXTS, **TRANSFER_TEXTS, **THIRD_TEXTS}[name]
    third = name in THIRD_TEXTS
    source, train_w, large_w, test_w = text_windows(text, large_heldout or 1,
                                                    THIRD_DECODER["window_seeds"] if third else (2, 3, 4))
    probe_w = large_w[:LLAMA["windows"][1]]
    for steps in LLAMA["steps"]:
        if only is not None and f"{name}/s{steps}" not in only:
            continue
        model = (decoder(architecture, THIRD_DECODER["layers"], hidden=THIRD_DECODER["hidden"],
                         heads=THIRD_DECODER["heads"]) if third else decoder(architecture, LLAMA["layers"]))
        train_lm_windows(model, train_w, steps)
        yield {"tag": f"{name}/s{steps}", "set": name, "source": source, "model": model, "loss_fn": sequence_loss,
               "text": True, "train": lm_batches(train_w, 64), "probe_train": lm_batches(train_w[:64], 32),
               "heldout": lm_batches(probe_w, 32), "test": lm_batches(test_w, 64),
               **({"heldout_large": lm_batches(large_w, 32)} if large_heldout else {})}


# -- depth sweeps -------------------------------------------------------------------------------------------
class PlainResNet(nn.Module):
    """A 3x3 stem, ``depth`` BasicBlocks of one width (``blocks``), global average pooling, a linear classifier."""

    def __init__(self, depth: int, width: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(*[BasicBlock(width, width) for _ in range(depth)])
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def record_sweep(name: str, spec: tuple, seed: int, log, architecture: str = "resnet", data_seed: int = 0) -> dict:
    """Test loss of scratch models of every depth (one recipe, model seed ``seed``) and the trials ``decide`` runs
    at each depth (trial minibatch seed ``seed``), with the trials' test change recorded beside the held-out one.
    ``architecture``: ``"resnet"`` (:class:`PlainResNet`) or ``"resmlp"`` (:class:`ResMLP`); ``data_seed``: the
    images' draw (:func:`zoo.data.load_images`)."""
    use_digits, n_train, epochs, width, weight_decay, seeds = spec
    data = load_images(n_train, 160, 300, seed=data_seed, digits=use_digits)
    train, heldout = batches(*data.train, 100), batches(*data.probe, 40)
    test = batches(*data.test, 150)
    probe_train = batches(data.train[0][:128], data.train[1][:128], 64)
    tag = f"{name}/seed{seed}" if len(seeds) > 1 else name
    out = {"sweep": tag, "source": data.source, "recipe": SWEEP_RECIPE.to_dict(), "model_seed": seed,
           "n_train": n_train, "epochs": epochs, "width": width, "weight_decay": weight_decay, "data_seed": data_seed,
           "architecture": architecture, "depths": []}
    for depth in DEPTHS:
        t0 = time.time()
        torch.manual_seed(seed)
        if architecture == "resmlp":
            model = ResMLP(data.train[0][0].size, depth=depth, width=width)
        else:
            model = PlainResNet(depth, width)
        train_classifier(model, *data.train, epochs=epochs, seed=seed, weight_decay=weight_decay)
        row = depth_row(model, per_sample_ce, "auto", SWEEP_RECIPE, train, probe_train, heldout, test, seed)
        out["depths"].append({"depth": depth, "test_loss": classifier_loss(model, *data.test)[0],
                              "train_loss": classifier_loss(model, *data.train)[0], **row})
        log(f"  {tag} depth {depth}: test {out['depths'][-1]['test_loss']:.3f} ({time.time() - t0:.0f}s)")
    return out


def depth_row(model, loss_fn, family, recipe, train, probe_train, heldout, test, seed: int) -> dict:
    """The screen and the trials ``decide`` runs on one model of a sweep, their test change recorded beside the
    held-out one (trial minibatch seed ``seed - 1``: seed 0 with model seed 1, as first recorded)."""
    splits = probe_splits(model, probe_train, heldout, loss_fn, family=family)
    screened = screen(splits, recipe)
    names = list(screened)
    # the checkpoints of both schedules decide can run (the even plan's and successive halving's)
    verified = trial_plan(len(names), recipe, MAX_TRIALS)[0]
    points = sorted(schedule_points(len(names), recipe.steps, MAX_TRIALS, every_count=False))
    trials = {}
    for name in names[:verified]:
        measured = trial_losses(TorchTrials(model, splits.train, recipe.with_steps(points[-1]), train, {"heldout": heldout, "train": probe_train, "test": test}, loss_fn, seed - 1), name, points)
        trials[name] = {"steps": list(points), **{k: _summary(*measured[k]) for k in ("heldout", "train", "test")}}
    return {"heldout_loss": float(per_sample_eval(model, heldout, loss_fn).mean()),
            "screen": {k: row.heldout_change for k, row in screened.items()}, "trials": trials}


def record_text_sweep(name: str, spec: tuple, seed: int, log, architecture: str = "llama") -> dict:
    """:func:`record_sweep` for decoders (:func:`decoder`'s ``architecture``) of 1-6 layers trained from scratch on
    a text (model seed ``seed``), the trials inserting the model's own decoder layer (``family="native"``)."""
    text, steps, seeds = spec
    source, train_w, probe_w, test_w = text_windows(text)
    train, probe_train = lm_batches(train_w, 64), lm_batches(train_w[:64], 32)
    heldout, test = lm_batches(probe_w, 32), lm_batches(test_w, 64)
    tag = f"{name}/seed{seed}" if len(seeds) > 1 else name
    out = {"sweep": tag, "source": source, "recipe": TEXT_SWEEP_RECIPE.to_dict(), "model_seed": seed,
           "n_train": len(train_w), "training_steps": steps, "llama": LLAMA, "architecture": architecture,
           "depths": []}
    for depth in DEPTHS:
        t0 = time.time()
        model = decoder(architecture, depth, seed)
        train_lm_windows(model, train_w, steps, seed)
        row = depth_row(model, sequence_loss, "native", TEXT_SWEEP_RECIPE, train, probe_train, heldout, test, seed)
        out["depths"].append({"depth": depth, "test_loss": float(per_sample_eval(model, test, sequence_loss).mean()),
                              "train_loss": float(per_sample_eval(model, train, sequence_loss).mean()), **row})
        log(f"  {tag} depth {depth}: test {out['depths'][-1]['test_loss']:.3f} ({time.time() - t0:.0f}s)")
    return out


# -- the growth loop on the sweeps' depth-1 models -------------------------------------------------------------
LOOP_PARTS = {"loops-text": TEXT_SWEEPS["sweeps-text"], "loops-sweeps": SWEEPS,
              "loops-overfit-digits": SWEEP_PARTS["sweeps-overfit-digits"],
              "loops-overfit-fashion": SWEEP_PARTS["sweeps-overfit-fashion"],
              **{loop: TRANSFER_SWEEPS[sweep] for loop, sweep in TRANSFER_LOOPS.items()}}


def train_with_recipe(model, train, recipe: Recipe, seed: int, loss_fn) -> None:
    """``recipe``'s optimizer, lr, weight decay and steps on every parameter (constant lr, train mode, so
    BatchNorm normalises by the batch and updates its running statistics), minibatches of ``recipe.batch_size``
    drawn from ``train`` as :func:`decide`'s trials draw them."""
    opt = recipe_optimizer(recipe, model.parameters())
    stream = recipe_minibatches(train, recipe.batch_size, seed)
    model.train()
    for _ in range(recipe.steps):
        inputs, targets = next(stream)
        loss = loss_fn(model(inputs), targets).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()


def text_loop_start(spec: tuple, seed: int, architecture: str = "llama") -> dict:
    """The text sweep's depth-1 decoder and a round's training: the recipe's optimizer, lr and steps on every
    parameter, windows drawn from the sweep's training pool (a user training the grown model on)."""
    text, steps, _ = spec
    source, train_w, probe_w, test_w = text_windows(text)
    model = decoder(architecture, 1, seed)
    train_lm_windows(model, train_w, steps, seed)

    def train_round(grown, round_index):
        train_lm_windows(grown, train_w, TEXT_SWEEP_RECIPE.steps, 50_000 + 100 * seed + round_index,
                         lr=TEXT_SWEEP_RECIPE.lr, weight_decay=TEXT_SWEEP_RECIPE.weight_decay, cosine=False)

    test = lm_batches(test_w, 64)
    return {"source": source, "model": model, "train": lm_batches(train_w, 64), "heldout": lm_batches(probe_w, 32),
            "test_loss": lambda m: float(per_sample_eval(m, test, sequence_loss).mean()),
            "loss_fn": sequence_loss, "family": "native", "recipe": TEXT_SWEEP_RECIPE,
            "train_round": train_round, "depth": lambda grown: grown.config.num_hidden_layers,
            "settings": {"training_steps": steps}}


def image_loop_start(spec: tuple, seed: int, architecture: str = "resnet") -> dict:
    """The image sweep's depth-1 ResNet (:func:`record_sweep`'s) and a round's training: the sweep recipe's
    optimizer, lr and steps on every parameter (:func:`train_with_recipe`).  The loop inserts the probe family's
    zero-output residual (``family="auto"``: the ``conv`` family's branch, its terminal map zero), as the
    sweep's decisions do; the ResNet has no block kind ``insert_block`` would add at every candidate."""
    use_digits, n_train, epochs, width, weight_decay, _ = spec
    data = load_images(n_train, 160, 300, seed=0, digits=use_digits)
    torch.manual_seed(seed)
    model = ResMLP(data.train[0][0].size, depth=1, width=width) if architecture == "resmlp" else PlainResNet(1, width)
    train_classifier(model, *data.train, epochs=epochs, seed=seed, weight_decay=weight_decay)
    train = batches(*data.train, 100)

    def train_round(grown, round_index):
        train_with_recipe(grown, train, SWEEP_RECIPE, 50_000 + 100 * seed + round_index, per_sample_ce)

    def depth(grown):
        return len(grown.blocks) + sum(isinstance(m, InsertedResidual) for m in grown.modules())

    return {"source": data.source, "model": model, "train": train, "heldout": batches(*data.probe, 40),
            "test_loss": lambda m: classifier_loss(m, *data.test)[0],
            "loss_fn": per_sample_ce, "family": "auto", "recipe": SWEEP_RECIPE,
            "train_round": train_round, "depth": depth,
            "settings": {"n_train": n_train, "epochs": epochs, "width": width, "weight_decay": weight_decay}}


def record_loop(name: str, spec: tuple, seed: int, log, part: str = "") -> dict:
    """``grow_until_saturated(..., policy=DecisionPolicy(recipe))`` from the sweep's depth-1 model (the same model: its test loss is
    checked against the sweep's when scored): each round decides with :func:`decide` (its trials train the block
    alone), inserts the block and trains the whole grown model with the recipe's optimizer, lr and steps; the
    held-out guard rolls a harm back and stops.  The test loss of every round's trained model is recorded beside
    (never read by the loop)."""
    from satcore import DecisionPolicy, GrowthBudget, GrowthOptions
    from satcore.adapters.torch import ProbeConfig, grow_until_saturated

    architecture = SWEEP_ARCHITECTURE.get(TRANSFER_LOOPS.get(part, ""))
    kind = {} if architecture is None else {"architecture": architecture}
    is_text = name in TEXT_SWEEPS["sweeps-text"] or architecture == "gpt2"
    start = text_loop_start(spec, seed, **kind) if is_text else image_loop_start(spec, seed, **kind)
    model, loss_fn, test_loss = start["model"], start["loss_fn"], start["test_loss"]
    tag = f"{name}/seed{seed}" if len(spec[-1]) > 1 else name
    start_test = test_loss(model)  # as the sweep measured it: the same model gives the same number
    trained = []

    def train_round(grown, round_index):
        start["train_round"](grown, round_index)
        trained.append({"round": round_index, "depth": start["depth"](grown),
                        "test_loss": test_loss(grown)})
        return grown

    t0 = time.time()
    result = grow_until_saturated(model, train_round, start["heldout"], loss_fn, heldout_data=start["heldout"], train_data=start["train"], options=GrowthOptions(budget=GrowthBudget(max_depth=max(DEPTHS)), seed=seed, probe=ProbeConfig(family=start["family"])), policy=DecisionPolicy(start["recipe"]))
    out = {"loop": tag, "source": start["source"], "recipe": start["recipe"].to_dict(), "model_seed": seed,
           **start["settings"], "family": start["family"], "start_depth": 1, "start_test_loss": start_test,
           "final_depth": result.depth, "stop_reason": result.stop_reason, "trained": trained,
           "seconds": time.time() - t0,
           "rounds": [{"round": r.round, "depth": r.depth, "inserted_at": r.inserted_at,
                       "heldout_change": r.heldout_change, "heldout_change_se": r.heldout_change_se,
                       "rolled_back": r.rolled_back, "stop_reason": r.stop_reason} for r in result.rounds]}
    log(f"  {tag}: depth 1 -> {result.depth} ({result.stop_reason}; {time.time() - t0:.0f}s)")
    return out


def _stored(stored: dict | None, tag: str, path: Path):
    if stored is None:
        return None
    if tag not in stored:
        raise SystemExit(f"{path}: the recorded part has no model {tag}")
    return stored[tag]


def record(part: str, log=print, column: str | None = None, seeds: tuple | None = None,
           trial_seeds: tuple | None = None, large_heldout: int = 0, compressed: bool = False,
           sensitivity: bool = False, screen_only: bool = False, only: tuple | None = None) -> None:
    out = OUT_1000 if column is not None and column.endswith("_1000") else OUT
    if sensitivity or screen_only:
        if part not in (*IMAGES, *TEXTS, *TRANSFER_IMAGES, *TRANSFER_TEXTS) or column or trial_seeds or compressed \
                or large_heldout or (sensitivity and screen_only):
            raise SystemExit("--sensitivity, --screen: a model set part alone")
        out = OUT_SENSITIVITY if sensitivity else OUT_SCREEN
    if compressed:
        if part not in (*IMAGES, *TEXTS, *TRANSFER_IMAGES, *TRANSFER_TEXTS) or column or trial_seeds:
            raise SystemExit("--compressed: a model set part alone (with --large-heldout: a fitted set's)")
        if large_heldout and (part not in (*IMAGES, *TEXTS) or large_heldout != LARGE_HELDOUT):
            raise SystemExit(f"--compressed --large-heldout: a fitted model set, {LARGE_HELDOUT} times")
        out = large_heldout_folder(OUT_COMPRESSED) if large_heldout else OUT_COMPRESSED
    if part in TRANSFER and not compressed and not sensitivity and not screen_only:
        if trial_seeds is not None:
            raise SystemExit("--trial-seeds: the fitted model sets' parts only")
        out = OUT_TRANSFER
    if part in THIRD:
        if compressed or sensitivity or screen_only or trial_seeds is not None or large_heldout or seeds or only:
            raise SystemExit(f"{part}: the third transfer set is recorded whole, with --column alone")
        out = OUT_THIRD
    if large_heldout and not compressed:
        if part not in (*IMAGES, *TEXTS, *TRANSFER_IMAGES, *TRANSFER_TEXTS) or trial_seeds is not None:
            raise SystemExit("--large-heldout: a model set part alone")
        # out is the folder of the column's own recording (a transfer set's 1000-step columns have a folder of their
        # own here, so that what reads the 300-step larger splits reads no 1000-step run)
        long_transfer = part in TRANSFER and (column or "").endswith("_1000")
        out = large_heldout_folder(OUT_TRANSFER_1000 if long_transfer else out, large_heldout)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"{part}.json" if column is None else f"{part}-{column}.json")
    if seeds is not None:  # a sweep part's model seeds recorded one process at a time
        path = path.with_name(f"{part}-seeds{'-'.join(map(str, seeds))}.json")
    stored = None
    if trial_seeds is not None:  # more trial seeds of a recorded part's models, merged by decision_scores.load
        if part not in (*IMAGES, *TEXTS):
            raise SystemExit("--trial-seeds: a model set part only")
        from studies.decision_scores import TRIAL_SEEDS_FILE

        recorded = json.loads(path.read_text())
        if overlap := set(trial_seeds) & set(recorded["seeds"]):
            raise SystemExit(f"{path}: trial seeds {sorted(overlap)} are recorded there already")
        stored = {m["model"]: m for m in recorded["models"]}
        path = path.with_name(f"{path.stem}{TRIAL_SEEDS_FILE}{'-'.join(map(str, trial_seeds))}.json")
    if only is not None:
        tags = model_tags(part) if part in (*IMAGES, *TEXTS, *TRANSFER_IMAGES, *TRANSFER_TEXTS) else []
        if not tags or not set(only) <= set(tags):
            raise SystemExit(f"--models: a model set part's models ({', '.join(tags) or 'none here'})")
    if column is not None:
        COLUMNS.clear()
        COLUMNS[column] = EXTRA_COLUMNS[column]
    start = time.time()
    result = {"schema": "satcore-bench-decision-validity/1", "part": part, "columns": COLUMNS,
              "lengths": list(LENGTHS), "seeds": list(trial_seeds or SEEDS), "max_trials": MAX_TRIALS,
              "sizes": {"images": IMAGES, "llama": LLAMA, "widths": list(WIDTHS), "sweeps": SWEEP_PARTS.get(part),
                        **({"transfer": {**TRANSFER_IMAGES, **TRANSFER_TEXTS}.get(part), "resmlp": RESMLP}
                           if part in TRANSFER else {}),
                        **({"third": {**THIRD_IMAGES, **THIRD_TEXTS}.get(part), "decoder": THIRD_DECODER,
                            "resmlp_width": THIRD_RESMLP_WIDTH} if part in THIRD else {}),
                        **({"large_heldout_factor": large_heldout} if large_heldout else {})},
              "models": [], "sweeps": [],
              # float rounding differs between CPU kernels (AVX2, AVX-512), and long training amplifies it: the same
              # seeds give another model on another machine, so a part's models are compared only within a machine
              "machine": {"processor": platform.processor() or platform.machine(),
                          "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}}
    if part in LOOP_PARTS:
        makers = [(lambda n=n, spec=spec, seed=seed: record_loop(n, spec, seed, log, part))
                  for n, spec in LOOP_PARTS[part].items() for seed in spec[-1]]
        key = "loops"
        result["loops"] = []
    elif part in SWEEP_PARTS:
        sweep = record_text_sweep if part in TEXT_SWEEPS or SWEEP_ARCHITECTURE.get(part) == "gpt2" else record_sweep
        architecture = {"architecture": SWEEP_ARCHITECTURE[part]} if part in SWEEP_ARCHITECTURE else {}
        if part in THIRD_SWEEPS:
            architecture["data_seed"] = THIRD_IMAGES["resmlp-digits"][-1]
        makers = [(lambda n=n, spec=spec, seed=seed: sweep(n, spec, seed, log, **architecture))
                  for n, spec in SWEEP_PARTS[part].items() for seed in spec[-1] if seeds is None or seed in seeds]
        key = "sweeps"
    else:
        is_image = part in IMAGES or part in TRANSFER_IMAGES or part in THIRD_IMAGES
        tasks = (image_tasks if is_image else text_tasks)(part, large_heldout, only)
        if stored is not None:  # a column's part may hold only its first models (a run cut for CPU): train no more
            tasks = itertools.islice(tasks, len(stored))
        if compressed:
            makers = [(lambda t=t: record_compressed(t, log, bool(large_heldout))) for t in tasks]
        elif sensitivity:
            makers = [(lambda t=t: record_sensitivity(t, log)) for t in tasks]
        elif screen_only:
            makers = [(lambda t=t: record_screen(t, log)) for t in tasks]
        else:
            makers = [(lambda t=t: record_model(t, log, trial_seeds or SEEDS, _stored(stored, t["tag"], path)))
                      for t in tasks]
        key = "models"
    for make in makers:
        result[key].append(make())
        result["seconds"] = time.time() - start
        result["written"] = time.strftime("%Y-%m-%d %H:%M:%S")
        path.write_text(json.dumps(result, indent=0, default=float))  # after every model: a partial run is usable
    log(f"{part}: {time.time() - start:.0f}s -> {path}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=(*IMAGES, *TEXTS, *TRANSFER_IMAGES, *TRANSFER_TEXTS, *THIRD_TEXTS, *THIRD_IMAGES,
                                           *SWEEP_PARTS,
                                           *LOOP_PARTS))
    parser.add_argument("--column", choices=tuple(EXTRA_COLUMNS),
                        help="record this recipe column instead of the default ones (to <part>-<column>.json)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="sweep parts: only these model seeds (to <part>-seeds<seeds>.json)")
    parser.add_argument("--trial-seeds", type=int, nargs="+",
                        help="model set parts: re-train the recorded models and run only these trial seeds "
                             "(to <part>-trialseed<seeds>.json, merged into <part>.json's models when scored)")
    parser.add_argument("--large-heldout", type=int, nargs="?", const=LARGE_HELDOUT, default=0, metavar="N",
                        help="model set parts: each trial also evaluated on a held-out split N (default 4) times the "
                             "bench's (to studies/results/decision_validity_large_heldout/, or ..._x<N>/)")
    parser.add_argument("--models", nargs="+", metavar="TAG",
                        help="model set parts: only these models (tags as recorded, e.g. digits/e150; each is trained "
                             "alone from its seed, so it is the model the whole part records), to the part's file")
    parser.add_argument("--compressed", action="store_true",
                        help="model set parts: time-compressed trials (lr x S/T for the even plan's T steps; an "
                             "experiment) to studies/results/decision_validity_compressed/")
    parser.add_argument("--sensitivity", action="store_true",
                        help="model set parts: the sensitivity baseline (Sensitivity-Based Layer Insertion's ||C||^2 "
                             "on the training probe split, no trials) to studies/results/decision_validity_sensitivity/")
    parser.add_argument("--screen", action="store_true",
                        help="model set parts: the screen's rows with their fold interval and the fold test's "
                             "probability of a positive held-out gain (no trials) "
                             "to studies/results/decision_validity_screen/ (scored by studies/screen_probability.py)")
    parser.add_argument("--tables", action="store_true", help="score the recorded parts and print the docs tables")
    parser.add_argument("--variants", action="store_true",
                        help="score the decision rules tried (studies/decision_scores.py VARIANTS) and print their table")
    parser.add_argument("--stop-rules", action="store_true",
                        help="score the stop rules tried (studies/decision_scores.py STOP_RULES, OPTIMIZER_RULES) and print "
                             "their table")
    parser.add_argument("--readouts", action="store_true",
                        help="score the trial readouts tried against short stops (studies/decision_readouts.py "
                             "READOUT_RULES) and what bounds those stops, and print their tables")
    parser.add_argument("--resolution", action="store_true",
                        help="score which stops the held-out data resolves and whether the held-out samples named "
                             "would resolve them (studies/decision_resolution.py), and print their tables")
    parser.add_argument("--short-stops", action="store_true",
                        help="list the short stops with their trials' curves and score the rules tried against them "
                             "(studies/decision_short_stops.py SHORT_STOP_RULES), and print their tables")
    parser.add_argument("--third-set", action="store_true",
                        help="score the rules fixed before the third transfer set was recorded on it, alone and pooled "
                             "with the transfer sets (studies/decision_third_set.py), and print their table")
    parser.add_argument("--fit", action="store_true", help="write satcore/_decisions/calibrations.json from every set")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.part:
        record(args.part, column=args.column, seeds=None if args.seeds is None else tuple(args.seeds),
               trial_seeds=None if args.trial_seeds is None else tuple(args.trial_seeds),
               large_heldout=args.large_heldout, compressed=args.compressed, sensitivity=args.sensitivity,
               screen_only=args.screen, only=None if args.models is None else tuple(args.models))
    if args.readouts:
        from studies.decision_readouts import readouts

        print(readouts(OUT))
    if args.resolution:
        from studies.decision_resolution import resolution

        print(resolution(OUT))
    if args.short_stops:
        from studies.decision_short_stops import short_stops

        print(short_stops(OUT))
    if args.third_set:
        from studies.decision_third_set import third_set

        print(third_set(OUT))
    if args.tables or args.fit or args.variants or args.stop_rules:
        from studies.decision_scores import fit_and_write, stop_rules, tables, variants

        if args.fit:
            fit_and_write(OUT, ROOT / "satcore" / "_decisions" / "calibrations.json")
        if args.tables:
            print(tables(OUT))
        if args.variants:
            print(variants(OUT))
        if args.stop_rules:
            print(stop_rules(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
