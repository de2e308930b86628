"""``decide``: where to insert a block under the user's recipe, verified by short trials (:mod:`satcore._decisions.trials`).

::

    from satcore import Recipe
    from satcore.adapters.torch import decide
    decision = decide(model, train_batches, heldout_batches, loss_fn,
                      recipe=Recipe("adam", lr=1e-3, steps=300, batch_size=128))
    decision.choice, decision.stop_reason, decision.candidates[decision.choice or "head"].interval

The decision is the core's loop (:func:`satcore.adapter_api.trial_decision`: the screen, the
even plan or successive halving, the calibrated choice); this module supplies its torch side.
The probe of both splits (:func:`~.splits.probe_splits`) gives the screen's statistics; the
unexpanded model's per-sample losses (:func:`per_sample_eval`) are what every trial starts from;
:class:`TorchTrials` trains the zero-output block in a *copy* of the model with the recipe
(:func:`inserted_copy`, :func:`recipe_optimizer`, :func:`recipe_minibatches`) and reads its
per-sample losses along the way.  The user's model is never modified.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping

import numpy as np
import torch

from satcore.adapters.base import SPLIT_DATA, ProgressCounter, check_step_range, read_split, refusing_bad_batch
from satcore.adapters.batches import split_batch
from satcore.adapters.options import family_option_label
from satcore import DecisionPolicy, InputError, InsertionDecision, Recipe
from satcore.adapter_api import check_unexpanded_losses, grouped_trials, moved_keywords, split_words, trial_decision
from satcore.adapter_api import screen as screen_rows

from .grow import InsertedResidual, grow
from .hf import model_loss
from .input_bounds import check_labels, check_trial_steps, forked_rng
from .locate import decision_places
from .native import _terminal_paths, insert_block, insertion_site
from .probe import BATCH_ERRORS, ProbeConfig, call_model, eval_mode, to_device
from .splits import probe_splits_in_passes, probe_training_split, statistics_passes


def _with_gradients(function):
    """``function`` run with gradients on, also where the caller has them off (``torch.no_grad`` or
    ``torch.inference_mode`` around an evaluation): the trials train (the probe does the same)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with torch.inference_mode(False), torch.enable_grad():
            return function(*args, **kwargs)

    return wrapper


def trained_family(result, at: str) -> str | None:
    """The family of the block a trial at ``at`` trains (:func:`inserted_copy`): the kind of ``result`` 's feature
    map there, as the probe resolved it (``"conv"``, ``"mlp"``, ``"native"``, ``"user"`` for an ``nn.Module``...)."""
    return getattr(result.families.get(at), "kind", None)


def inserted_copy(model, result, at: str, *, seed: int = 0, trainable: str = "terminal"):
    """``(copy, parameters)``: a deep copy of ``model`` with the zero-output block of ``result`` 's family
    inserted at ``at`` (the model's own kind for a ``"native"`` probe, :func:`~.native.insert_block`,
    else the family's residual branch, :func:`~.grow.grow` with ``zero=True``) and the block's parameters
    the recipe trains (``"terminal"``: its zero-initialised terminal maps; ``"block"``: all of them).
    Every parameter of the copy has ``requires_grad`` False except those."""
    if trained_family(result, at) == "native":
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
def per_sample_eval(model, batches, loss_fn=None, progress=None, where: str = "") -> np.ndarray:
    """Per-sample losses of ``model`` (eval mode) over ``batches``, float64; ``progress``: called with each batch's
    sample count once it is read (``None``: silent).  A batch the model or ``loss_fn`` cannot take is a
    :class:`satcore.ProbeError` naming it, led by ``where`` (:func:`satcore.adapters.base.refusing_bad_batch`)."""
    device = next(model.parameters()).device
    out = []
    with eval_mode(model):
        for index, batch in enumerate(batches):
            inputs, targets = split_batch(batch, targets_to_model=True)
            if loss_fn is None and targets is None:  # the model's own loss needs labels
                raise InputError("decide: a batch holds no targets (no 'labels'); pass loss_fn(outputs, targets) -> (B,) "
                                 "or batches with 'labels'")
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            with refusing_bad_batch(index, BATCH_ERRORS, passing=(torch.cuda.OutOfMemoryError,), where=where):
                losses = _loss_fn(model, loss_fn)(call_model(model, inputs), targets)
            if losses.ndim == 0:  # a batch mean: the trials' paired standard errors need one loss per sample
                raise InputError("decide: loss_fn returned a 0-d loss (a batch mean?); decide needs per-sample "
                                 "losses of shape (B,), e.g. reduction='none'")
            size = _batch_size(inputs)
            if size is not None and tuple(losses.shape) != (size,):
                raise InputError(f"decide: loss_fn returned shape {tuple(losses.shape)} for a batch of {size} samples; "
                                 "decide needs per-sample losses of shape (B,), e.g. reduction='none'")
            out.append(losses.detach().to(torch.float64).reshape(-1).cpu().numpy())
            if progress is not None:
                progress(len(out[-1]))
    return np.concatenate(out)


def recipe_optimizer(recipe: Recipe, params):
    """The torch optimizer ``recipe`` names, over ``params``, at its lr and weight decay; a recipe whose steps do
    not fit the parameters' narrowest floating dtype is refused (:func:`satcore.adapters.base.check_step_range`)."""
    params = list(params)
    dtype = min((p.dtype for p in params if p.dtype.is_floating_point), key=lambda d: torch.finfo(d).max,
                default=None)
    if dtype is not None:
        check_step_range(recipe, str(dtype).removeprefix("torch."), torch.finfo(dtype).max)
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)


class TorchTrials:
    """The torch side of :func:`satcore.adapter_api.trial_decision` (its ``TrialSteps``): trials of the zero-output
    block at a candidate of ``model``, trained with ``recipe`` on minibatches of ``train`` (:func:`recipe_minibatches`,
    ``seed``) and read on ``evaluate`` (``{split: batches}``).  ``probed(at)`` returns the probe result whose family
    the block at ``at`` is built from; it is called again on resume rather than kept (a pass of a memory-bounded
    probe is dropped once read); a probe result itself serves every candidate.  ``progress``: a
    :class:`~satcore.adapters.base.ProgressCounter` counting each optimizer step and each batch read (default silent)."""

    def __init__(self, model, probed, recipe: Recipe, train, evaluate: dict, loss_fn=None, seed: int = 0,
                 progress: ProgressCounter | None = None):
        self.model, self.recipe, self.train = model, recipe, train
        self.probed = probed if callable(probed) else (lambda _: probed)
        self.evaluate, self.loss_fn, self.seed = evaluate, loss_fn, seed
        self.progress = ProgressCounter() if progress is None else progress

    def start(self, at: str) -> "_Trial":
        return _Trial(self, at)


class _Trial:
    """One candidate's trial that can be set aside and resumed: the copy with the block inserted
    (:func:`inserted_copy`), its optimizer and its minibatch stream (:func:`recipe_minibatches`).

    ``suspend`` keeps only the trained parameters and the optimizer's state (the rest of the copy is
    frozen, and the trials run in eval mode, so nothing else changes); ``resume`` rebuilds the copy,
    loads them and draws the stream up to the steps done, so that a resumed trial takes exactly the
    steps an uninterrupted one would.  ``family``: the family of the block it trains (:func:`trained_family`)."""

    def __init__(self, source: TorchTrials, at: str):
        self.source, self.at, self.recipe, self.done, self.saved = source, at, source.recipe, 0, None
        self._build()

    def _build(self) -> None:
        source = self.source
        result = source.probed(self.at)
        self.family = trained_family(result, self.at)
        self.grown, self.params = inserted_copy(source.model, result, self.at, seed=source.seed,
                                                trainable=self.recipe.trainable)
        self.opt = recipe_optimizer(self.recipe, self.params)
        self.stream = recipe_minibatches(source.train, self.recipe.batch_size, source.seed)

    def run_to(self, target: int) -> None:
        device = self.params[0].device
        loss_fn = _loss_fn(self.grown, self.source.loss_fn)
        while self.done < target:
            inputs, targets = next(self.stream)
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            losses = loss_fn(call_model(self.grown, inputs), targets)
            loss = losses if losses.dim() == 0 else losses.mean()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            self.done += 1
            self.source.progress.add()

    def losses(self, split: str) -> np.ndarray:
        losses = per_sample_eval(self.grown, self.source.evaluate[split], self.source.loss_fn,
                                 progress=self.source.progress.per_batch())
        if not np.isfinite(losses).all():  # the model's own losses were finite: the recipe diverged here
            raise InputError(f"the trial at {self.at!r} diverged: its {split_words(split)} loss is not finite after "
                             f"{self.done} {self.recipe.optimizer} steps at lr {self.recipe.lr:g}; lower the recipe's lr")
        return losses

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
def trial_losses(trials: TorchTrials, at: str, checkpoints, before: dict | None = None) -> dict:
    """Train the zero-output block at ``at`` (in a copy, :func:`inserted_copy`) as ``trials`` (a :class:`TorchTrials`:
    the model, the probe result the block's family comes from, the recipe, the training batches, the splits to
    evaluate, the loss and the minibatches' seed) trains it, and evaluate it at ``checkpoints``.

    Returns ``{"steps": checkpoints, name: (before (n,), after (k, n))}``: per-sample losses of each
    ``trials.evaluate[name]`` batch list before training and after each checkpoint's number of steps.
    ``recipe.steps`` is not read: the trial runs to the last checkpoint.  ``before``: the
    unexpanded model's per-sample losses on each ``evaluate[name]`` (:func:`per_sample_eval`),
    where the caller already has them (the inserted block is the identity, so they are also the grown
    copy's before training: one evaluation serves every trial, as in :func:`decide`); ``None``:
    evaluated here.
    """
    checkpoints = tuple(sorted({int(c) for c in checkpoints}))
    evaluate = trials.evaluate
    if before is None:
        before = {name: per_sample_eval(trials.model, data, trials.loss_fn) for name, data in evaluate.items()}
    elif set(evaluate) - set(before):
        raise InputError(f"trial_losses: before= lacks {sorted(set(evaluate) - set(before))}")
    trial = trials.start(at)
    after = {name: [] for name in evaluate}
    for target in checkpoints:
        trial.run_to(target)
        for name in evaluate:
            after[name].append(trial.losses(name))
    return {"steps": checkpoints, **{name: (before[name], np.stack(after[name])) for name in evaluate}}


def screen(splits, recipe: Recipe) -> dict:
    """``{name: ScreenRow}`` of :func:`satcore.adapter_api.screen` on both splits' statistics (``splits``: a
    :class:`~.splits.SplitResults`), ordered from the largest predicted held-out decrease."""
    return {row.name: row for row in screen_rows(splits.train.statistics, splits.heldout.statistics, recipe)}


def decision_probe_options(policy: DecisionPolicy, defaults: ProbeConfig | None = None) -> dict:
    """The probe options of a decision under ``policy``: its probe (``policy.probe``, else ``defaults``, else
    :class:`~.probe.ProbeConfig`'s defaults) at the policy's seed, and exactly its places (:func:`decision_places`:
    the head only where ``"head"`` is named, never by default); where the policy names none, those of
    ``defaults`` (its ``candidates`` and ``head``)."""
    config = policy.probe if policy.probe is not None else defaults if defaults is not None else ProbeConfig()
    if not isinstance(config, ProbeConfig):
        raise InputError(f"policy: probe must be a satcore.adapters.torch.ProbeConfig, got {type(config).__name__}")
    if policy.candidates is None and defaults is not None:
        places = decision_places(defaults.candidates, defaults.head)
    else:
        places = decision_places(policy.candidates)
    return {"config": dataclasses.replace(config, seed=policy.seed, candidates=None, head=True), **places}


def check_input_dtype(model, inputs, what: str) -> None:
    """Refuse floating-point inputs of another dtype than the model's parameters (float64 data in a float32
    model fails inside its first layer), naming the batch."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    tensors = inputs.values() if isinstance(inputs, Mapping) else [inputs]
    for tensor in tensors:
        if torch.is_tensor(tensor) and tensor.is_floating_point() and dtype is not None and tensor.dtype != dtype:
            raise InputError(f"{what}: inputs are {tensor.dtype}, the model's parameters {dtype}; convert the data "
                             f"(.to({dtype}))")


@moved_keywords("decide")
def decide(model, train, heldout, loss_fn=None, *, recipe: Recipe | None = None,
           policy: DecisionPolicy | None = None, progress=False) -> InsertionDecision:
    """Where to insert the next block under the policy's recipe, or why to stop: a :class:`satcore.InsertionDecision`.

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
        How the user will train the inserted block: the shorthand of ``policy=DecisionPolicy(recipe)``.
    policy : satcore.DecisionPolicy
        Every option of the decision (give it or ``recipe``, not both):

        * ``recipe``: how the user will train the inserted block;
        * ``trials`` (:class:`satcore.TrialSettings`): ``max_trials``, how many candidates, in the screen's
          order, are verified by a trial; ``schedule``, how the trials share the recipe's steps:
          ``"even"``, each verified candidate trained ``recipe.steps // verified`` steps
          (:func:`trial_losses`), or ``"halving"`` (successive halving,
          :func:`satcore.adapter_api.halving_plan`): each trained half of that, and the half with the
          lowest held-out change then trained on with the rest; only those may be chosen (the others
          come back ``eliminated``); the same cost.  Held out on the bench's 300-step recipes, halving
          ranks the candidates better (best picked in 68% of decisions against 50%) but stops within one
          block of the best depth of the depth sweeps less often (8 of 12 against 11 of 12); on its
          1000-step recipes it picks no better (51% against 53%) and ranks the candidates it drops worse
          (within-model Spearman +0.31 against +0.50); so it is not the default
          (docs/predictive-validity.md).  ``calibration``: default the shipped one fitted on the bench's
          trials of the schedule (:mod:`satcore._decisions.calibration`).  ``groups``: spread the trials
          over these groups of candidate names (:func:`grouped_trials`): each group's first
          ``ceil(max_trials / len(groups))`` in the screen's order are verified instead of the screen's
          first ``max_trials``; their steps still add up to at most ``recipe.steps`` where there are no
          more trials than steps (:func:`satcore._decisions.trials.trial_plan`);
        * ``candidates``: ``None``, every block found and the ``head``; a list of module names, exactly
          those places are probed and trialled, ``"head"`` in it adds the head (the output of the last
          named module), which is otherwise left out;
        * ``seed``: the probe's feature maps and the trials' minibatch order;
        * ``max_statistics_bytes``: the most probe statistics (both splits' sums, :func:`~.probe.plan`)
          held at once.  The candidates are then probed in consecutive groups that fit
          (:meth:`~.probe.MemoryPlan.passes`), one pass over both splits per group, each group's
          statistics dropped once screened, and a trialled candidate of an earlier group probed again
          (its group, training split) for its trial: the same screen (with ``position_subsample`` the
          positions drawn differ), more passes.  A Llama-style place (``r = d + intermediate`` native
          features) holds ``8 (17 d r + r^2 + 16)`` bytes a split (16 folds): 0.19 GiB for SmolLM2-135M
          (``d = 576``, ``r = 2112``), 2.4 GiB for a 1.1B Llama (``d = 2048``, ``r = 7680``).  The head
          shares the last block's pass;
        * ``probe``: a :class:`~.probe.ProbeConfig` of the probe's other options (``family``, which may be an
          ``nn.Module`` feature map or ``"native"`` for a block of the model's own kind, ``n_features``,
          ``mask``, ``position_subsample``, ``batch_dtype``, ...).
    progress : bool or callable
        ``False`` (default) silent; ``True`` a tqdm bar on stderr of the decision's batches of work: the
        unexpanded model's evaluation of both splits, the probe's batches (every pass's), each trial's
        optimizer steps and its readings of both splits; each phase's total set when it starts (the trials'
        once they are planned).  A
        callable ``progress(n)`` is called with each increment instead, as :func:`~.probe.probe` takes it.

    Returns
    -------
    InsertionDecision
        ``cost_block_steps`` is the trials' optimizer steps, at most ``recipe.steps`` (the number of
        verified candidates where that is larger: each trial takes at least one step).

    Raises
    ------
    satcore.InputError
        Before any probe or trial: a policy that cannot run (:class:`satcore.DecisionPolicy` checks its fields
        when it is built; both ``recipe`` and ``policy``, or neither), a split that yields no batches or is one
        batch rather than an iterable of batches, an empty batch, fewer than 2 held-out samples, a ``loss_fn``
        that does not return one loss per sample (a batch mean, 0-d or ``(1,)``), float inputs of another dtype
        than the model's parameters, labels outside the vocabulary (the model's own loss), a split of more than
        65,536 batches (an endless iterator), a recipe of more steps than ``SATCORE_MAX_TRIAL_STEPS`` (100,000;
        :mod:`~.input_bounds`), a loss that is not finite before any insertion; and a trial whose losses stop
        being finite (the recipe diverged on the inserted block).
    """
    policy = DecisionPolicy.of(recipe, policy)
    with ProgressCounter(progress, "decide") as counter:
        return decide_under(model, train, heldout, loss_fn, policy, progress=counter)


@forked_rng()  # the caller's next random draws are those it would have made without the call
@_with_gradients
def decide_under(model, train, heldout, loss_fn, policy: DecisionPolicy,
                 defaults: ProbeConfig | None = None, progress: ProgressCounter | None = None) -> InsertionDecision:
    """:func:`decide` under ``policy``, the probe's options where the policy gives none (its ``probe`` None, its
    ``candidates`` None) those of ``defaults`` (:func:`decision_probe_options`): how a training-loop callback
    decides with its own probe settings.  ``progress`` counts the batches of work (:func:`decide`'s); default
    silent."""
    progress = ProgressCounter() if progress is None else progress
    recipe = policy.recipe
    check_trial_steps(recipe)
    probe_options = decision_probe_options(policy, defaults)
    train, heldout = read_split(train, "decide: the training data"), read_split(heldout, "decide: the held-out data")
    for split, data in (("training", train), ("held-out", heldout)):
        for i, batch in enumerate(data):
            try:
                inputs, targets = split_batch(batch, targets_to_model=True)
            except ValueError as e:
                raise InputError(f"decide: {split} data: {e} (pass batches, e.g. a list of (inputs, targets))") from None
            if _batch_size(inputs) == 0:
                raise InputError(f"decide: {split} data: batch {i} holds no samples")
            check_input_dtype(model, inputs, f"decide: {split} data: batch {i}")
            if loss_fn is None:  # the model's own loss: its labels must be in its vocabulary
                labels = inputs.get("labels") if isinstance(inputs, Mapping) else None
                check_labels(model, targets if labels is None else labels, f"decide: {split} data: batch {i}")
    evaluate = {"heldout": heldout, "train": train}
    # the unexpanded model's losses, once, before the probe so that a loss without per-sample values or a held-out
    # split too small for a standard error is refused first: every trial starts from them (its block is the identity)
    batches_a_reading = len(train) + len(heldout)  # both splits are lists (read_split)
    progress.phase("model", batches_a_reading)
    before = {split: per_sample_eval(model, data, loss_fn, progress=progress.per_batch(), where=SPLIT_DATA[split])
              for split, data in evaluate.items()}
    check_unexpanded_losses(before)
    screened, pass_of = [], {}

    def read(selection, splits):
        screened.extend(screen(splits, recipe).values())
        pass_of.update(dict.fromkeys(splits.train.statistics, selection))

    # the trials need only the training split's statistics: the last pass's held-out split goes here
    passes = statistics_passes(model, train, loss_fn, policy.max_statistics_bytes, **probe_options)
    progress.phase("probe", len(passes) * batches_a_reading)
    last = probe_splits_in_passes(model, train, heldout, loss_fn, read, passes=passes, progress=progress.per_batch(),
                                  **probe_options)

    def probed(name):
        if name in last.statistics:
            return last
        # an earlier pass's: its statistics are gone, its group is probed again (work the plan did not count)
        progress.extend(len(train))
        return probe_training_split(model, train, loss_fn, progress=progress.per_batch(), **probe_options | pass_of[name])

    trials = TorchTrials(model, probed, recipe, train, evaluate, loss_fn, policy.seed, progress)
    return trial_decision(trials, screened, before, recipe, policy.trials,
                          progress.trials_planned(batches_a_reading),
                          requested_family=family_option_label(probe_options["config"].family))


__all__ = ["TorchTrials", "decide", "decide_under", "decision_probe_options", "grouped_trials", "inserted_copy", "per_sample_eval", "recipe_minibatches", "screen", "trained_family", "trial_losses"]
