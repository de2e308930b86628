"""``decide``: where to insert a block under the user's recipe, verified by short trials (:mod:`satcore._decisions.trials`).

::

    from satcore import Recipe
    from satcore.adapters.torch import decide
    decision = decide(model, train_batches, heldout_batches, loss_fn,
                      recipe=Recipe("adam", lr=1e-3, steps=300, batch_size=128))
    decision.choice, decision.stop_reason, decision.candidates[decision.choice or "head"].interval

The probe of both splits screens every candidate (:func:`~.splits.probe_splits` and
:func:`satcore.predict_gains` with the recipe's optimizer, lr and steps); the first
``max_trials`` are verified by training the zero-output block in a *copy* of the model
with the recipe and measuring the held-out loss along the way, by successive halving
(:func:`satcore._decisions.trials.halving_plan`: every one half a trial, the better half trained
on) or an even plan (``recipe.steps // verified`` steps each, :func:`trial_losses`).  The
user's model is never modified.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import operator
from collections.abc import Mapping

import numpy as np
import torch

from satcore.adapters.batches import split_batch
from satcore import CandidateDecision, TrialCurve
from satcore.adapter_api import (choose, halving_plan, paired_standard_error, trial_checkpoints, trial_plan, verified_candidate)
from satcore.adapter_api import DEFAULT_CALIBRATION, HALVING_CALIBRATION
from satcore import InputError
from satcore import predict_gains
from satcore import Recipe

from .grow import InsertedResidual, grow
from .hf import model_loss
from .native import _terminal_paths, insert_block, insertion_site
from .probe import ProbeConfig, call_model, eval_mode, to_device
from .splits import probe_splits_in_passes, probe_training_split


PROBE_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(ProbeConfig)) | {"progress"}


def _with_gradients(function):
    """``function`` run with gradients on, also where the caller has them off (``torch.no_grad`` or
    ``torch.inference_mode`` around an evaluation): the trials train (the probe does the same)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.enable_grad():
            return function(*args, **kwargs)

    return wrapper


def inserted_copy(model, result, at: str, *, seed: int = 0, trainable: str = "terminal"):
    """``(copy, parameters)``: a deep copy of ``model`` with the zero-output block of ``result`` 's family
    inserted at ``at`` (the model's own kind for a ``"native"`` probe, :func:`~.native.insert_block`,
    else the family's residual branch, :func:`~.grow.grow` with ``zero=True``) and the block's parameters
    the recipe trains (``"terminal"``: its zero-initialised terminal maps; ``"block"``: all of them).
    Every parameter of the copy has ``requires_grad`` False except those."""
    if getattr(result.families.get(at), "kind", None) == "native":
        grown = insert_block(model, at, seed=seed)
        site = insertion_site(model, at)
        block = grown.get_submodule(site.container)[site.index]
        if trainable == "terminal":
            params = [p for path in _terminal_paths(block, site.kind) for p in block.get_submodule(path).parameters()]
        else:
            params = list(block.parameters())
    else:
        grown = grow(model, result, at, zero=True).model
        branch = next(m for m in grown.modules() if isinstance(m, InsertedResidual)).branch
        params = list(branch.projection.parameters()) if trainable == "terminal" else list(branch.parameters())
    for p in grown.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return grown.eval(), params


def _cat(parts):
    first = parts[0]
    if torch.is_tensor(first):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return {k: _cat([p[k] for p in parts]) for k in first}
    if first is None:
        return None
    raise TypeError(type(first).__name__)


def _take(tree, idx):
    if torch.is_tensor(tree):
        return tree[idx]
    if isinstance(tree, Mapping):
        return {k: _take(v, idx) for k, v in tree.items()}
    return tree


def _length(tree) -> int:
    if torch.is_tensor(tree):
        return tree.shape[0]
    return _length(next(iter(tree.values())))


def recipe_minibatches(batches, batch_size: int, seed: int):
    """An endless stream of ``(inputs, targets)`` minibatches of ``batch_size`` samples drawn from the
    ``batches`` (pooled; a fresh seeded permutation each pass; every sample in each minibatch where the
    batches hold fewer than ``batch_size``), or, where the batches cannot be pooled
    (inputs of different lengths, inputs that are not tensors), the batches themselves in a seeded order."""
    pairs = [split_batch(b, targets_to_model=True) for b in batches]
    if not pairs:
        raise InputError("decide: the training data yielded no batches")
    gen = torch.Generator().manual_seed(int(seed))
    try:
        inputs, targets = _cat([p[0] for p in pairs]), _cat([p[1] for p in pairs])
        n = _length(inputs)
    except (TypeError, RuntimeError, StopIteration):
        while True:
            for i in torch.randperm(len(pairs), generator=gen).tolist():
                yield pairs[i]
    while True:
        order = torch.randperm(n, generator=gen)
        for start in range(0, n - batch_size + 1 if n >= batch_size else 1, batch_size):
            idx = order[start : start + batch_size]
            yield _take(inputs, idx), _take(targets, idx)


def _batch_size(inputs) -> int | None:
    """The number of samples in a batch's inputs (a tensor, or a mapping of tensors); None where unknown."""
    try:
        return int(_length(inputs))
    except (TypeError, AttributeError, StopIteration, IndexError):
        return None


def _loss_fn(model, loss_fn):
    return model_loss(model) if loss_fn is None else loss_fn


@torch.no_grad()
def per_sample_eval(model, batches, loss_fn=None) -> np.ndarray:
    """Per-sample losses of ``model`` (eval mode) over ``batches``, float64."""
    device = next(model.parameters()).device
    out = []
    with eval_mode(model):
        for batch in batches:
            inputs, targets = split_batch(batch, targets_to_model=True)
            if loss_fn is None and targets is None:  # the model's own loss needs labels
                raise InputError("decide: a batch holds no targets (no 'labels'); pass loss_fn(outputs, targets) -> (B,) "
                                 "or batches with 'labels'")
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            losses = _loss_fn(model, loss_fn)(call_model(model, inputs), targets)
            if losses.ndim == 0:  # a batch mean: the trials' paired standard errors need one loss per sample
                raise InputError("decide: loss_fn returned a 0-d loss (a batch mean?); decide needs per-sample "
                                 "losses of shape (B,), e.g. reduction='none'")
            size = _batch_size(inputs)
            if size is not None and tuple(losses.shape) != (size,):
                raise InputError(f"decide: loss_fn returned shape {tuple(losses.shape)} for a batch of {size} samples; "
                                 "decide needs per-sample losses of shape (B,), e.g. reduction='none'")
            out.append(losses.detach().to(torch.float64).reshape(-1).cpu().numpy())
    return np.concatenate(out)


def recipe_optimizer(recipe: Recipe, params):
    """The torch optimizer ``recipe`` names, over ``params``, at its lr and weight decay."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


class _Trial:
    """One candidate's trial that can be set aside and resumed: the copy with the block inserted
    (:func:`inserted_copy`), its optimizer and its minibatch stream (:func:`recipe_minibatches`).

    ``suspend`` keeps only the trained parameters and the optimizer's state (the rest of the copy is
    frozen, and the trials run in eval mode, so nothing else changes); ``resume`` rebuilds the copy,
    loads them and draws the stream up to the steps done, so that a resumed trial takes exactly the
    steps an uninterrupted one would.  ``probed()`` returns the probe result whose family the block
    is built from; it is called again on resume rather than kept (a pass of a memory-bounded probe
    is dropped once read)."""

    def __init__(self, model, probed, at: str, recipe: Recipe, train, loss_fn, seed: int):
        self.model, self.probed, self.at, self.recipe, self.train = model, probed, at, recipe, train
        self.loss_fn, self.seed, self.done, self.saved = loss_fn, seed, 0, None
        self._build()

    def _build(self) -> None:
        self.grown, self.params = inserted_copy(self.model, self.probed(), self.at, seed=self.seed,
                                                trainable=self.recipe.trainable)
        self.opt = recipe_optimizer(self.recipe, self.params)
        self.stream = recipe_minibatches(self.train, self.recipe.batch_size, self.seed)

    def run_to(self, target: int) -> None:
        device = self.params[0].device
        loss_fn = _loss_fn(self.grown, self.loss_fn)
        while self.done < target:
            inputs, targets = next(self.stream)
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            losses = loss_fn(call_model(self.grown, inputs), targets)
            loss = losses if losses.dim() == 0 else losses.mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.done += 1

    def losses(self, evaluate: dict) -> dict:
        out = {name: per_sample_eval(self.grown, data, self.loss_fn) for name, data in evaluate.items()}
        for name, losses in out.items():
            if not np.isfinite(losses).all():  # the model's own losses were finite: the recipe diverged here
                raise InputError(f"the trial at {self.at!r} diverged: its {name} loss is not finite after {self.done} "
                                 f"{self.recipe.optimizer} steps at lr {self.recipe.lr:g}; lower the recipe's lr")
        return out

    def suspend(self) -> None:
        self.saved = ([p.detach().clone() for p in self.params], copy.deepcopy(self.opt.state_dict()))
        self.grown = self.params = self.opt = self.stream = None

    def resume(self) -> None:
        params, state = self.saved
        self._build()
        with torch.no_grad():
            for p, value in zip(self.params, params):
                p.copy_(value)
        self.opt.load_state_dict(state)
        for _ in range(self.done):
            next(self.stream)
        self.saved = None


@_with_gradients
def trial_losses(model, result, at: str, recipe: Recipe, train, evaluate: dict, checkpoints, loss_fn=None, *,
                 seed: int = 0, before: dict | None = None) -> dict:
    """Train the zero-output block at ``at`` (in a copy, :func:`inserted_copy`) with ``recipe`` on
    minibatches of ``train`` (:func:`recipe_minibatches`, ``seed``) and evaluate it at ``checkpoints``.

    Returns ``{"steps": checkpoints, name: (before (n,), after (k, n))}``: per-sample losses of each
    ``evaluate[name]`` batch list before training and after each checkpoint's number of steps.
    ``recipe.steps`` is not read: the trial runs to the last checkpoint.  ``before``: the
    unexpanded ``model``'s per-sample losses on each ``evaluate[name]`` (:func:`per_sample_eval`),
    where the caller already has them (:func:`decide` evaluates them once for all its trials: the
    inserted block is the identity, so they are also the grown copy's before training); ``None``:
    evaluated here.
    """
    checkpoints = tuple(sorted({int(c) for c in checkpoints}))
    if before is None:
        before = {name: per_sample_eval(model, data, loss_fn) for name, data in evaluate.items()}
    elif set(evaluate) - set(before):
        raise InputError(f"trial_losses: before= lacks {sorted(set(evaluate) - set(before))}")
    trial = _Trial(model, lambda: result, at, recipe, train, loss_fn, seed)
    after = {name: [] for name in evaluate}
    for target in checkpoints:
        trial.run_to(target)
        for name, losses in trial.losses(evaluate).items():
            after[name].append(losses)
    return {"steps": checkpoints, **{name: (before[name], np.stack(after[name])) for name in evaluate}}


def screen(splits, recipe: Recipe) -> dict:
    """Per candidate ``(held-out change, its HeldoutGain, training change)``: the first-order predicted
    changes (loss after minus before) of the recipe's steps (:func:`satcore.predict_gains`; AdamW is priced as Adam), ``None`` where a candidate cannot be
    scored; ordered from the largest predicted decrease."""
    # the screen prices the recipe's steps without weight decay (AdamW as Adam): its first-order step
    step = Recipe("sgd" if recipe.optimizer == "sgd" else "adam", recipe.lr, recipe.steps, recipe.batch_size,
                  recipe.trainable)
    train, held = splits.train.statistics, splits.heldout.statistics
    gains = predict_gains(train, held, step)
    changes = {c.name: (-c.heldout.value, c.heldout, -c.training_gain) for c in gains.candidates}
    return dict(sorted(changes.items(), key=lambda kv: kv[1][0]))


def grouped_trials(names, groups, max_trials: int) -> list[str]:
    """The candidates a grouped trial plan verifies: each group's first ``ceil(max_trials / len(groups))``
    (at least 1) of ``names`` (the screen's order), returned in that order; names of a group that are
    not in ``names`` (not scored) are skipped."""
    per_group = max(1, math.ceil(max_trials / max(1, len(groups))))
    order = {name: i for i, name in enumerate(names)}
    picked = set()
    for group in groups:
        picked.update(sorted((n for n in group if n in order), key=order.get)[:per_group])
    return [n for n in names if n in picked]


@_with_gradients
def decide(model, train, heldout, loss_fn=None, *, recipe: Recipe, candidates=None, family="auto", seed: int = 0,
           max_trials: int = 4, schedule: str = "even", calibration=None, groups=None,
           max_statistics_bytes: int | None = None, **probe_options):
    """Where to insert the next block under ``recipe``, or why to stop: a :class:`satcore.InsertionDecision`.

    Parameters
    ----------
    model : nn.Module
        Not modified (the trials train copies).
    train, heldout : iterables of batches
        As :func:`~.splits.probe_splits` takes them (each is iterated several times, so it is read
        into a list once); the trials draw ``recipe.batch_size`` minibatches from ``train`` and
        measure the held-out loss on ``heldout``.
    loss_fn : per-sample loss ``loss_fn(outputs, targets) -> (B,)``; ``None`` for batches holding ``labels``.
    recipe : satcore.Recipe
        How the user will train the inserted block.
    candidates, family, seed, probe_options
        As :func:`~.probe.probe` takes them (``family`` may be an ``nn.Module`` feature map, or
        ``"native"`` for a block of the model's own kind); ``seed`` also seeds the trials' minibatch order.
    max_trials : int
        How many candidates, in the screen's order, are verified by a trial.
    schedule : {"even", "halving"}
        How the trials share the recipe's steps.  ``"even"``: each verified candidate is trained
        ``recipe.steps // verified`` steps (:func:`trial_losses`).  ``"halving"`` (successive halving,
        :func:`satcore._decisions.trials.halving_plan`): each is trained half of that, and the half with the
        lowest held-out change then trained on with the rest; only those may be chosen (the others
        come back ``eliminated``).  The same cost.  Held out on the bench's 300-step recipes, halving
        ranks the candidates better (best picked in 68% of decisions against 50%) but stops within one
        block of the best depth of the depth sweeps less often (8 of 12 against 11 of 12); on its
        1000-step recipes it picks no better (51% against 53%) and ranks the candidates it drops worse
        (within-model Spearman +0.31 against +0.50); so it is not the default
        (docs/predictive-validity.md).
    calibration : satcore._decisions.trials.Calibration, optional
        Default: the shipped one fitted on the bench's trials of ``schedule``
        (:mod:`satcore._decisions.calibration`: ``DEFAULT_CALIBRATION`` for the even plan,
        ``HALVING_CALIBRATION`` for halving).
    groups : sequence of sequences of candidate names, optional
        Spread the trials over these groups (:func:`grouped_trials`): each group's first
        ``ceil(max_trials / len(groups))`` in the screen's order are verified instead of the
        screen's first ``max_trials``; their steps still add up to at most ``recipe.steps`` where
        there are no more trials than steps (:func:`satcore._decisions.trials.trial_plan`).
    max_statistics_bytes : int, optional
        The most probe statistics (both splits' sums, :func:`~.probe.plan`) held at once.  The
        candidates are then probed in consecutive groups that fit (:meth:`~.probe.MemoryPlan.passes`),
        one pass over both splits per group, each group's statistics dropped once screened, and a
        trialled candidate of an earlier group probed again (its group, training split) for its trial: the same
        screen (with ``position_subsample`` the positions drawn differ), more passes.  A Llama-style
        place (``r = d + intermediate`` native features) holds ``8 (17 d r + r^2 + 16)`` bytes a
        split (16 folds): 0.19 GiB for SmolLM2-135M (``d = 576``, ``r = 2112``), 2.4 GiB for a
        1.1B Llama (``d = 2048``, ``r = 7680``).  The head shares the last block's pass.

    Returns
    -------
    InsertionDecision
        ``cost_block_steps`` is the trials' optimizer steps, at most ``recipe.steps`` (the number of
        verified candidates where that is larger: each trial takes at least one step).

    Raises
    ------
    satcore.InputError
        Before any probe or trial: a split that yields no batches or is one batch rather than an
        iterable of batches, an empty batch, fewer than 2 held-out samples, a ``loss_fn`` that does not
        return one loss per sample (a batch mean, 0-d or ``(1,)``), ``max_trials`` not a positive integer, a
        loss that is not finite before any insertion; and a trial whose losses stop being finite (the recipe
        diverged on the inserted block).
    TypeError
        A keyword argument that is neither ``decide``'s nor a probe option (:class:`~.probe.ProbeConfig`).
    """
    if not isinstance(recipe, Recipe):
        raise InputError(f"decide: recipe must be a satcore.Recipe, got {type(recipe).__name__}")
    # the probe's options pass through; anything else is a misspelt argument of decide, named as Python would
    if unknown := sorted(set(probe_options) - PROBE_OPTION_NAMES):
        raise TypeError(f"decide() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; besides its "
                        f"own it takes the probe's options: {', '.join(sorted(PROBE_OPTION_NAMES))}")
    if schedule not in ("halving", "even"):
        raise InputError(f"decide: schedule must be 'halving' or 'even', got {schedule!r}")
    try:  # any integer, numpy's included; not a bool, float or str
        count = None if isinstance(max_trials, bool) else operator.index(max_trials)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise InputError(f"decide: max_trials must be a positive integer, got {max_trials!r}")
    max_trials = count
    if calibration is None:
        calibration = HALVING_CALIBRATION if schedule == "halving" else DEFAULT_CALIBRATION
    for split, data in (("training", train), ("held-out", heldout)):
        if isinstance(data, Mapping) or (isinstance(data, tuple) and len(data) == 2 and torch.is_tensor(data[0])):
            raise InputError(f"decide: the {split} data is one batch; pass an iterable of batches, e.g. [batch]")
    train, heldout = list(train), list(heldout)
    for split, data in (("training", train), ("held-out", heldout)):
        if not data:
            raise InputError(f"decide: the {split} data yielded no batches")
        for i, batch in enumerate(data):
            try:
                inputs, _ = split_batch(batch, targets_to_model=True)
            except ValueError as e:
                raise InputError(f"decide: {split} data: {e} (pass batches, e.g. a list of (inputs, targets))") from None
            if _batch_size(inputs) == 0:
                raise InputError(f"decide: {split} data: batch {i} holds no samples")
    evaluate = {"heldout": heldout, "train": train}
    # the unexpanded model's losses, once, before the probe so that a loss without per-sample values or a held-out
    # split too small for a standard error is refused first: every trial starts from them (its block is the identity)
    before = {split: per_sample_eval(model, data, loss_fn) for split, data in evaluate.items()}
    for split, losses in before.items():
        if not np.isfinite(losses).all():
            raise InputError(f"decide: the model's loss is not finite on {int((~np.isfinite(losses)).sum())} of "
                             f"{losses.size} {'held-out' if split == 'heldout' else 'training'} samples before any "
                             "block is inserted (loss_fn or the model gives NaN or inf)")
    if before["heldout"].size < 2:
        raise InputError(f"decide: the held-out data holds {before['heldout'].size} sample(s); a trial's held-out "
                         "change needs at least 2 for its standard error")
    probe_options.update(candidates=candidates, family=family, seed=seed)
    screened, pass_of = {}, {}

    def read(selection, splits):
        screened.update(screen(splits, recipe))
        pass_of.update(dict.fromkeys(splits.train.statistics, selection))

    # the trials need only the training split's statistics: the last pass's held-out split goes here
    _, last = probe_splits_in_passes(model, train, heldout, loss_fn, read, max_statistics_bytes=max_statistics_bytes,
                                     **probe_options)
    screened = dict(sorted(screened.items(), key=lambda kv: kv[1][0]))
    names = list(screened)
    if groups is None:
        trialled = names[:trial_plan(len(names), recipe, max_trials)[0]]
    else:
        trialled = grouped_trials(names, groups, max_trials)

    def probed(name):
        if name in last.statistics:
            return last
        # an earlier pass's: its statistics are gone, its group is probed again
        return probe_training_split(model, train, loss_fn, **probe_options | pass_of[name])

    run = _halving_trials if schedule == "halving" else _even_trials
    curves, cost, final = run(model, trialled, probed, recipe, train, evaluate, before, loss_fn, seed)
    out = []
    for name in names:
        screen_change, fold_gain, training_change = screened[name]
        if name in curves:
            curve, eliminated = curves[name]
            candidate = verified_candidate(name, curve, recipe.steps, calibration, screen_change)
            out.append(dataclasses.replace(candidate, eliminated=True) if eliminated else candidate)
        else:
            low, high = fold_gain.interval  # the fold interval only: never chosen (not verified)
            out.append(CandidateDecision(name, screen_change, training_change, (-high, -low), fold_gain.p_decrease,
                                         screen_change))
    decision = dataclasses.replace(choose(out, recipe, float(before["heldout"].mean()), cost, calibration),
                                   heldout_samples=int(before["heldout"].size))
    if decision.runner_up is None:
        return decision
    # the margin's standard error paired over the held-out samples both trials were evaluated on
    return dataclasses.replace(decision, margin_se=paired_standard_error(final[decision.runner_up]
                                                                         - final[decision.choice]))


def _even_trials(model, trialled, probed, recipe, train, evaluate, before, loss_fn, seed):
    """``({name: (curve, eliminated)}, block-steps, {name: per-sample held-out losses at the trial's end})``:
    every trialled candidate ``recipe.steps // n`` steps."""
    verified, T, checkpoints = trial_plan(len(trialled), recipe, len(trialled))
    curves, final = {}, {}
    for name in trialled:
        measured = trial_losses(model, probed(name), name, recipe.with_steps(T), train, evaluate, checkpoints,
                                loss_fn, seed=seed, before=before)
        curves[name] = (TrialCurve.from_losses(checkpoints, *measured["heldout"], *measured["train"]), False)
        final[name] = measured["heldout"][1][-1]
    return curves, verified * T, final


def _halving_trials(model, trialled, probed, recipe, train, evaluate, before, loss_fn, seed):
    """``({name: (curve, eliminated)}, block-steps, {name: per-sample held-out losses at its curve's end})`` by
    successive halving (:func:`satcore._decisions.trials.halving_plan`):
    every trialled candidate ``T1`` steps, set aside; the finalists (lowest held-out change at ``T1``) resumed to
    ``T2``.  A finalist's curve is read at a quarter, half and all of ``T2``, an eliminated one's of ``T1``."""
    verified, first, finalists, second = halving_plan(len(trialled), recipe, len(trialled))
    late = trial_checkpoints(second)
    measured, trials = {}, {}
    for name in trialled:
        trial = _Trial(model, lambda name=name: probed(name), name, recipe, train, loss_fn, seed)
        measured[name] = {}
        for t in sorted(set(trial_checkpoints(first)) | {t for t in late if t <= first}):
            trial.run_to(t)
            measured[name][t] = trial.losses(evaluate)
        trial.suspend()
        trials[name] = trial
    kept = sorted(trialled, key=lambda n: float(np.mean(measured[n][first]["heldout"] - before["heldout"])))
    kept = kept[:finalists]
    for name in kept:
        trial = trials[name]
        trial.resume()
        for t in late:
            if t > first:
                trial.run_to(t)
                measured[name][t] = trial.losses(evaluate)
    curves, final = {}, {}
    for name in trialled:
        points = late if name in kept else trial_checkpoints(first)
        after = {split: np.stack([measured[name][t][split] for t in points]) for split in evaluate}
        curve = TrialCurve.from_losses(points, before["heldout"], after["heldout"], before["train"], after["train"])
        curves[name] = (curve, name not in kept)
        final[name] = after["heldout"][-1]
    return curves, verified * first + finalists * (second - first), final


__all__ = ["decide", "grouped_trials", "inserted_copy", "per_sample_eval", "recipe_minibatches", "screen", "trial_losses"]
