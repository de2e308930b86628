"""``decide`` on Keras: where to insert a block under the user's recipe, verified by short trials.

::

    from satcore import DecisionPolicy, Recipe, TrialSettings
    from satcore.adapters.tensorflow import decide
    decision = decide(model, train_batches, heldout_batches, loss_fn,
                      policy=DecisionPolicy(Recipe("adam", lr=1e-3, steps=300, batch_size=128),
                                            trials=TrialSettings(max_trials=4, schedule="even")))

The decision is the core's loop (:func:`satcore.adapter_api.trial_decision`), the one the torch
``decide`` runs: the same screen, schedules, calibration and :class:`satcore.InsertionDecision`.
This module supplies the Keras side: both splits probed with the Keras :func:`~.probe.probe`
(the same feature maps, one seed), the unexpanded model's per-sample losses, and
:class:`KerasTrials`, which trains the zero-output block of :func:`~.grow.grow` (``zero=True``:
an :class:`~.grow.InsertedResidual` whose ``V`` starts at 0) in a rebuilt copy of the functional
model.  The copy runs with ``training=False`` throughout, as the torch trials run in eval mode;
only ``V`` trains (the block's feature map is the probe's fixed seeded family, so
``recipe.trainable`` must be ``"terminal"``).

The recipe's optimizer is applied as the torch one is (:class:`RecipeOptimizer`: SGD and Adam
with an L2 penalty, AdamW with decoupled decay, Adam's ``eps`` 1e-8 added to the bias-corrected
root), not by ``keras.optimizers`` (whose Adam adds ``eps`` before the bias correction and whose
weight decay is decoupled for every optimizer), so that a recipe means one thing in both
frameworks.  Minibatches are drawn as the torch ones are (the pooled samples in a fresh seeded
permutation each pass), from NumPy's generator: for the same seed the two frameworks draw
different orders, the same minibatches only where each holds the whole training split.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import keras
import numpy as np
import tensorflow as tf

from satcore import DecisionPolicy, InputError, InsertionDecision, Recipe
from satcore.adapters.base import SPLIT_DATA, ProgressCounter, check_step_range, read_split, refusing_bad_batch
from satcore.adapters.options import family_option_label
from satcore.adapter_api import (TRAINING_SPLIT_WARNING, check_unexpanded_losses, moved_keywords, screen,
                                 split_words, trial_decision)

from .grow import InsertedResidual, grow, require_functional
from .probe import BATCH_ERRORS, ProbeConfig, _unpack, probe

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults


def _samples(tree) -> int:
    return int(tf.shape(tf.nest.flatten(tree)[0])[0])


def per_sample_eval(model, batches, loss_fn, progress=None, where: str = "") -> np.ndarray:
    """Per-sample losses (float64) of ``model`` (``training=False``) over ``(x, y)`` batches; a ``(B, T)`` loss is
    averaged over ``T`` (as the Keras probe reads it); ``progress``: called with each batch's sample count once it is
    read (``None``: silent).  A batch the model or ``loss_fn`` cannot take is a
    :class:`satcore.ProbeError` naming it, led by ``where`` (:func:`satcore.adapters.base.refusing_bad_batch`)."""
    out = []
    for index, batch in enumerate(batches):
        x, y = _unpack(batch)
        with refusing_bad_batch(index, BATCH_ERRORS, where=where):
            values = tf.convert_to_tensor(loss_fn(y, model(x, training=False)))
        if values.shape.rank == 0:  # a batch mean: the trials' paired standard errors need one loss per sample
            raise InputError("decide: loss_fn returned a 0-d loss (a batch mean?); decide needs per-sample losses of "
                             "shape (B,), e.g. a Keras loss with reduction=None")
        if values.shape[0] != _samples(x):
            raise InputError(f"decide: loss_fn returned shape {tuple(values.shape)} for a batch of {_samples(x)} "
                             "samples; decide needs per-sample losses of shape (B,), e.g. reduction=None")
        if values.shape.rank > 1:
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        out.append(np.asarray(values, dtype=np.float64))
        if progress is not None:
            progress(len(out[-1]))
    return np.concatenate(out)


def recipe_minibatches(batches: list, batch_size: int, seed: int):
    """An endless stream of ``(x, y)`` minibatches of ``batch_size`` samples drawn from the ``batches`` (pooled; a
    fresh permutation from ``numpy.random.default_rng(seed)`` each pass; every sample in each minibatch where the
    batches hold fewer than ``batch_size``), or, where the batches cannot be pooled (inputs of different
    shapes), the batches themselves in a seeded order."""
    pairs = [_unpack(b) for b in batches]
    rng = np.random.default_rng(int(seed))
    try:
        pooled = tf.nest.map_structure(lambda *parts: np.concatenate([np.asarray(p) for p in parts]), *pairs)
    except ValueError:
        while True:
            for i in rng.permutation(len(pairs)):
                yield pairs[i]
    n = _samples(pooled)
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1 if n >= batch_size else 1, batch_size):
            idx = order[start : start + batch_size]
            yield tf.nest.map_structure(lambda a: a[idx], pooled)


class RecipeOptimizer:
    """``recipe``'s optimizer over NumPy arrays, as ``torch.optim`` steps it.

    With gradient ``g`` of parameter ``p``, weight decay ``w``, learning rate ``lr`` and step ``t``:
    SGD ``p -= lr (g + w p)``; Adam ``g += w p``, ``m = b1 m + (1 - b1) g``,
    ``v = b2 v + (1 - b2) g^2``, ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``
    (``b1, b2 = 0.9, 0.999``, ``eps = 1e-8``); AdamW: ``p *= 1 - lr w``, then Adam without ``w``.
    ``state`` (``t``, ``m``, ``v``) is what a suspended trial keeps.  A recipe whose steps do not fit ``p``'s dtype
    is refused at the first step, as torch's optimizer is (:func:`satcore.adapters.base.check_step_range`).
    """

    def __init__(self, recipe: Recipe):
        self.recipe, self.state = recipe, {"t": 0, "m": None, "v": None}

    def step(self, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        """``p`` after one step along gradient ``g`` (a new array)."""
        lr, decay, kind = self.recipe.lr, self.recipe.weight_decay, self.recipe.optimizer
        check_step_range(self.recipe, p.dtype.name, float(np.finfo(p.dtype).max))  # NumPy would make it inf, unsaid
        if kind == "adamw":
            p = p * (1.0 - lr * decay)
        elif decay:
            g = g + decay * p
        if kind == "sgd":
            return p - lr * g
        b1, b2 = ADAM_BETAS
        s = self.state
        s["t"] += 1
        s["m"] = (1 - b1) * g if s["m"] is None else b1 * s["m"] + (1 - b1) * g
        s["v"] = (1 - b2) * g * g if s["v"] is None else b2 * s["v"] + (1 - b2) * g * g
        denominator = np.sqrt(s["v"]) / np.sqrt(1 - b2 ** s["t"]) + ADAM_EPS
        return p - lr / (1 - b1 ** s["t"]) * s["m"] / denominator


class KerasTrials:
    """The Keras side of :func:`satcore.adapter_api.trial_decision` (its ``TrialSteps``): trials of the zero-output
    block at a candidate of ``model`` (probed in ``result``), trained with ``recipe`` on minibatches of ``train``
    (:func:`recipe_minibatches`, ``seed``) and read on ``evaluate`` (``{split: batches}``); ``progress``: a
    :class:`~satcore.adapters.base.ProgressCounter` counting each optimizer step and each batch read (default silent)."""

    def __init__(self, model, result, recipe: Recipe, evaluate: dict, loss_fn, seed: int = 0,
                 progress: ProgressCounter | None = None):
        self.model, self.result, self.recipe = model, result, recipe
        self.evaluate, self.loss_fn, self.seed = evaluate, loss_fn, seed
        self.progress = ProgressCounter() if progress is None else progress

    def start(self, at: str) -> "_KerasTrial":
        return _KerasTrial(self, at)


class _KerasTrial:
    """One candidate's trial (:class:`satcore.adapter_api.Trial`): the grown copy, ``V``, the optimizer and the
    minibatch stream; ``suspend`` keeps ``V`` and the optimizer's state, ``resume`` rebuilds the copy and draws the
    stream up to the steps done; ``family``: the kind of the probe's family at ``at`` (the branch it trains)."""

    def __init__(self, source: KerasTrials, at: str):
        self.source, self.at, self.done, self.saved = source, at, 0, None
        self.family = source.result.meta["family"][at]["kind"]
        self.optimizer = RecipeOptimizer(source.recipe)
        self._build()

    def _build(self) -> None:
        source = self.source
        self.grown = grow(source.model, source.result, self.at, zero=True).model
        self.block = next(layer for layer in self.grown._flatten_layers(include_self=False)
                          if isinstance(layer, InsertedResidual))
        self.stream = recipe_minibatches(source.evaluate["train"], source.recipe.batch_size, source.seed)

    def run_to(self, target: int) -> None:
        projection = self.block.projection
        while self.done < target:
            x, y = next(self.stream)
            with tf.GradientTape() as tape:
                losses = tf.convert_to_tensor(self.source.loss_fn(y, self.grown(x, training=False)))
                loss = tf.reduce_mean(losses)
            gradient = tape.gradient(loss, projection)
            projection.assign(self.optimizer.step(projection.numpy(), np.asarray(gradient)))
            self.done += 1
            self.source.progress.add()

    def losses(self, split: str) -> np.ndarray:
        losses = per_sample_eval(self.grown, self.source.evaluate[split], self.source.loss_fn,
                                 progress=self.source.progress.per_batch())
        if not np.isfinite(losses).all():  # the model's own losses were finite: the recipe diverged here
            recipe = self.source.recipe
            raise InputError(f"the trial at {self.at!r} diverged: its {split_words(split)} loss is not finite after "
                             f"{self.done} {recipe.optimizer} steps at lr {recipe.lr:g}; lower the recipe's lr")
        return losses

    def suspend(self) -> None:
        self.saved = self.block.projection.numpy()
        self.grown = self.block = self.stream = None

    def resume(self) -> None:
        self._build()
        self.block.projection.assign(self.saved)
        for _ in range(self.done):
            next(self.stream)
        self.saved = None


def _per_sample_loss(model, loss_fn):
    """``loss_fn``, or the compiled model's loss returning one value per sample (``reduction=None``)."""
    if loss_fn is not None:
        return loss_fn
    compiled = getattr(model, "loss", None)
    if isinstance(compiled, keras.losses.Loss):
        return type(compiled).from_config({**compiled.get_config(), "reduction": None})
    if isinstance(compiled, str):  # a name: Keras' function of that name returns per-sample losses
        return keras.losses.get(compiled)
    raise InputError("decide: pass loss_fn(y_true, y_pred) -> per-sample losses (B,) (a Keras loss with "
                     "reduction=None), or compile the model with one loss")


def _batches(data, split: str) -> list:
    """``data`` read into a list of batches, each checked (:func:`decide`'s refusals)."""
    batches = read_split(data, f"decide: the {split} data")
    for i, batch in enumerate(batches):
        try:
            x, _ = _unpack(batch)
        except (ValueError, TypeError) as e:
            raise InputError(f"decide: {split} data: {e} (pass batches, e.g. a list of (x, y))") from None
        try:
            samples = _samples(x)
        except (ValueError, TypeError, IndexError, tf.errors.InvalidArgumentError) as e:  # not an array TF takes
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"decide: {split} data: batch {i}: inputs TensorFlow cannot take as a batch ({first})"
                             ) from None
        if samples == 0:
            raise InputError(f"decide: {split} data: batch {i} holds no samples")
    return batches


@moved_keywords("decide")
def decide(model, train, heldout, loss_fn=None, *, recipe: Recipe | None = None,
           policy: DecisionPolicy | None = None, progress=False) -> InsertionDecision:
    """Where to insert the next block of a functional Keras model under the policy's recipe, or why to stop: a
    :class:`satcore.InsertionDecision` (module docstring).

    Parameters
    ----------
    model : keras.Model
        Functional (:func:`~.grow.grow` rebuilds its graph); not modified (the trials train copies).
    train, heldout : iterables of batches
        ``(x, y)`` batches (or mappings with ``"labels"``), read into lists; the trials draw
        ``recipe.batch_size`` minibatches from ``train`` and measure the held-out loss on ``heldout``.
    loss_fn : ``loss_fn(y_true, y_pred) -> (B,)``, optional
        Per-sample losses (a Keras loss with ``reduction=None``); ``None``: the compiled model's loss,
        per sample.
    recipe : satcore.Recipe
        How the user will train the inserted block (``trainable`` must be ``"terminal"``): the shorthand of
        ``policy=DecisionPolicy(recipe)``.
    policy : satcore.DecisionPolicy
        Every option of the decision, as the torch ``decide`` reads it: ``recipe``; ``trials``
        (:class:`satcore.TrialSettings`: how many candidates are verified, by which schedule, under which
        calibration); ``candidates`` (layer names, as the Keras probe takes them; ``None``: the skip inputs of
        the residual ``Add`` layers); ``seed`` (the probe's feature maps and the trials' minibatch order);
        ``probe`` (a Keras :class:`~.probe.ProbeConfig`: ``family``, ``n_features``, ...).  Its
        ``max_statistics_bytes`` is torch's (one probe pass per group of candidates): refused here.
    progress : bool or callable
        As the torch ``decide`` takes it: ``False`` (default) silent, ``True`` a tqdm bar on stderr of the
        batches of work (the model's evaluation, the probe's batches, the trials' steps and readings), a callable
        called with each increment instead.

    Raises
    ------
    satcore.InputError
        Before any probe or trial: a recipe that trains the whole block, a ``max_statistics_bytes``, a probe
        that is not a Keras ``ProbeConfig``, a split that yields no batches or is one batch, an empty batch,
        fewer than 2 held-out samples, a loss that is not one per sample or not finite; and a trial whose losses
        stop being finite (the recipe diverged on the inserted block).
    """
    policy = DecisionPolicy.of(recipe, policy)
    with ProgressCounter(progress, "decide") as counter:
        return _decide(model, train, heldout, loss_fn, policy, progress=counter)


def _decide(model, train, heldout, loss_fn, policy: DecisionPolicy, progress: ProgressCounter) -> InsertionDecision:
    """:func:`decide` under ``policy``, counting its batches of work on ``progress``."""
    recipe = policy.recipe
    require_functional(model, "decide")  # before the probes: the trials rebuild the graph with the block in it
    if recipe.trainable != "terminal":
        raise InputError("decide: a Keras block's feature map is the probe's fixed seeded family, so only its terminal "
                         f"map V trains; use a recipe with trainable='terminal', got {recipe.trainable!r}")
    if policy.max_statistics_bytes is not None:
        raise InputError("decide: policy.max_statistics_bytes probes the candidates in passes, which the Keras "
                         "decide does not do; leave it None")
    # the block's V is float64 (grow.py): a recipe whose steps do not fit is refused before the screen prices them
    # (inf and NaN there, with NumPy's warnings), not at the first trial step
    check_step_range(recipe, "float64", float(np.finfo(np.float64).max))
    config = ProbeConfig() if policy.probe is None else policy.probe
    if not isinstance(config, ProbeConfig):
        raise InputError(f"policy: probe must be a satcore.adapters.tensorflow.ProbeConfig, got "
                         f"{type(config).__name__}")
    config = dataclasses.replace(config, candidates=policy.candidates, seed=policy.seed)
    train = _batches(train, "training")
    evaluate = {"heldout": _batches(heldout, "held-out"), "train": train}
    loss_fn = _per_sample_loss(model, loss_fn)
    batches_a_reading = sum(len(data) for data in evaluate.values())  # both splits are lists (read_split)
    progress.phase("model", batches_a_reading)
    before = {split: per_sample_eval(model, data, loss_fn, progress=progress.per_batch(), where=SPLIT_DATA[split])
              for split, data in evaluate.items()}
    check_unexpanded_losses(before)
    progress.phase("probe", batches_a_reading)
    with warnings.catch_warnings():
        # meant to be the training split here: its statistics fit the step, the held-out split tests it
        warnings.filterwarnings("ignore", message=re.escape(TRAINING_SPLIT_WARNING))
        fitted = probe(model, train, loss_fn, config=config, progress=progress.per_batch(), split="train")
    tested = probe(model, evaluate["heldout"], loss_fn, config=config, progress=progress.per_batch(), split="heldout")
    screened = screen(fitted.statistics, tested.statistics, recipe)

    trials = KerasTrials(model, fitted, recipe, evaluate, loss_fn, policy.seed, progress)
    return trial_decision(trials, screened, before, recipe, policy.trials,
                          progress.trials_planned(batches_a_reading),
                          requested_family=family_option_label(config.family))


__all__ = ["KerasTrials", "RecipeOptimizer", "decide", "per_sample_eval", "recipe_minibatches"]
