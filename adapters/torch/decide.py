"""``decide``: where to insert a block under the user's recipe, verified by short trials (:mod:`satcore.decision`).

::

    from satcore import Recipe
    from satcore.adapters.torch import decide
    decision = decide(model, train_batches, heldout_batches, loss_fn,
                      recipe=Recipe("adam", lr=1e-3, steps=300, batch_size=128))
    decision.choice, decision.stop_reason, decision.candidates[decision.choice or "head"].interval

The probe of both splits screens every candidate (:func:`~.splits.probe_splits` and
:func:`satcore.predict_gains` with the recipe's optimizer, lr and steps); the first
``max_trials`` are verified by training the zero-output block in a *copy* of the model
with the recipe for ``recipe.steps // verified`` steps and measuring the held-out loss
along the way (:func:`trial_losses`).  The user's model is never modified.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from satcore.adapters.batches import split_batch
from satcore.decision import CandidateDecision, TrialCurve, choose, trial_plan, verified_candidate
from satcore.decision_calibration import DEFAULT_CALIBRATION
from satcore.errors import InputError
from satcore.predictors import predict_gains
from satcore.recipe import Recipe

from .grow import InsertedResidual, grow
from .hf import model_loss
from .native import _terminal_paths, insert_block, insertion_site
from .probe import call_model, eval_mode, to_device
from .splits import probe_splits_in_passes, probe_training_split


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
    ``batches`` (pooled; a fresh seeded permutation each pass), or, where the batches cannot be pooled
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
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            losses = _loss_fn(model, loss_fn)(call_model(model, inputs), targets)
            out.append(losses.detach().to(torch.float64).reshape(-1).cpu().numpy())
    return np.concatenate(out)


def recipe_optimizer(recipe: Recipe, params):
    """The torch optimizer ``recipe`` names, over ``params``, at its lr and weight decay."""
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


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
    grown, params = inserted_copy(model, result, at, seed=seed, trainable=recipe.trainable)
    out = {"steps": checkpoints}
    after = {name: [] for name in evaluate}
    opt = recipe_optimizer(recipe, params)
    device = params[0].device
    stream = recipe_minibatches(train, recipe.batch_size, seed)
    done = 0
    for target in checkpoints:
        while done < target:
            inputs, targets = next(stream)
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            losses = _loss_fn(grown, loss_fn)(call_model(grown, inputs), targets)
            loss = losses if losses.dim() == 0 else losses.mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
        for name, data in evaluate.items():
            after[name].append(per_sample_eval(grown, data, loss_fn))
    for name in evaluate:
        out[name] = (before[name], np.stack(after[name]))
    return out


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


def decide(model, train, heldout, loss_fn=None, *, recipe: Recipe, candidates=None, family="auto", seed: int = 0,
           max_trials: int = 4, calibration=None, groups=None, max_statistics_bytes: int | None = None,
           **probe_options):
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
    calibration : satcore.decision.Calibration, optional
        Default: the shipped one (:mod:`satcore.decision_calibration`).
    groups : sequence of sequences of candidate names, optional
        Spread the trials over these groups (:func:`grouped_trials`): each group's first
        ``ceil(max_trials / len(groups))`` in the screen's order are verified instead of the
        screen's first ``max_trials``; their steps still add up to at most ``recipe.steps`` where
        there are no more trials than steps (:func:`satcore.decision.trial_plan`).
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
        ``cost_block_steps`` is the trials' optimizer steps, at most ``recipe.steps``.
    """
    if not isinstance(recipe, Recipe):
        raise InputError(f"decide: recipe must be a satcore.Recipe, got {type(recipe).__name__}")
    calibration = DEFAULT_CALIBRATION if calibration is None else calibration
    train, heldout = list(train), list(heldout)
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
        verified, T, checkpoints = trial_plan(len(names), recipe, max_trials)
        trialled = set(names[:verified])
    else:
        trialled = grouped_trials(names, groups, max_trials)
        verified, T, checkpoints = trial_plan(len(trialled), recipe, len(trialled))
        trialled = set(trialled)
    evaluate = {"heldout": heldout, "train": train}
    # the unexpanded model's losses, once: every trial starts from them (its block is the identity)
    before = {split: per_sample_eval(model, data, loss_fn) for split, data in evaluate.items()}
    out = []
    for name in names:
        screen_change, fold_gain, training_change = screened[name]
        if name in trialled:
            probed = last if name in last.statistics else None  # (None: the previous one goes first)
            if probed is None:  # an earlier pass's: its statistics are gone, its group is probed again
                probed = probe_training_split(model, train, loss_fn, **probe_options | pass_of[name])
            measured = trial_losses(model, probed, name, recipe.with_steps(T), train, evaluate, checkpoints,
                                    loss_fn, seed=seed, before=before)
            curve = TrialCurve.from_losses(checkpoints, *measured["heldout"], *measured["train"])
            out.append(verified_candidate(name, curve, recipe.steps, calibration, screen_change))
        else:
            low, high = fold_gain.interval  # the fold interval only: never chosen (not verified)
            out.append(CandidateDecision(name, screen_change, training_change, (-high, -low), fold_gain.p_decrease,
                                         screen_change))
    return choose(out, recipe, float(before["heldout"].mean()), verified * T, calibration)


__all__ = ["decide", "grouped_trials", "inserted_copy", "per_sample_eval", "recipe_minibatches", "screen", "trial_losses"]
