"""The trial decision's loop, framework-free: screen -> trials by a schedule -> calibrated choice.

:func:`trial_decision` is what ``decide`` runs in every framework adapter
(``satcore.adapters.torch.decide``, ``satcore.adapters.tensorflow.decide``).  The adapter
probes both splits and evaluates the unexpanded model; the loop

1. **screens**: orders the candidates by the first-order predicted held-out change of the
   recipe's steps (:func:`screen`, from the probe's statistics) and picks the ones to verify:
   the first ``max_trials`` (:func:`~satcore._decisions.trials.trial_plan`), or each group's
   first (:func:`grouped_trials`);
2. **trials** them through the adapter's :class:`TrialSteps` by a schedule: the even plan
   (every trial ``T = S // verified`` steps, measured at a quarter, half and all of it) or
   successive halving (every trial ``T1`` steps and set aside; the half with the lowest
   held-out change at ``T1`` resumed to ``T2``; :func:`~satcore._decisions.trials.halving_plan`);
3. **decides**: each trial's :class:`~satcore._decisions.trials.TrialCurve` priced at the
   recipe's length (:func:`~satcore._decisions.trials.verified_candidate`), screen-only rows
   carried as the screen gave them, and :func:`~satcore._decisions.trials.choose`; the margin's
   standard error paired over the held-out samples the choice and its runner-up share.

Nothing here imports a framework: the adapter's trial steps insert, train and evaluate.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from .._shared.errors import InputError, ModelOnDataError
from .._shared.numbers import finite_real, positive_count
from .._shared.splits import split_words
from .calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION
from .predictors import predict_gains
from .recipe import Recipe
from .trials import (Calibration, CandidateDecision, InsertionDecision, TrialCurve, choose, halving_plan,
                     paired_standard_error, trial_checkpoints, trial_plan, verified_candidate)

SCHEDULES = ("even", "halving")
# the splits a trial reads, in the order it reads them (the held-out first: a divergence is named by it)
TRIAL_SPLITS = ("heldout", "train")


class Trial(Protocol):
    """One candidate's trial, as a framework adapter runs it (:meth:`TrialSteps.start` makes one).

    A trial is a *copy* of the user's model with a zero-output block inserted at one candidate
    (so that before any step it computes what the model does), the parameters
    ``recipe.trainable`` names trainable and every other one frozen, the recipe's optimizer
    from a zero state, and a seeded stream of ``recipe.batch_size`` minibatches of the training
    split.  The user's model is never modified.

    Its ``family`` attribute (a str) names the family of the inserted block as resolved at the candidate
    (``"conv"``, ``"mlp"``, ``"native"``, ...): the decision records it as the candidate's
    :attr:`~satcore.CandidateDecision.trial_family` (a trial without one leaves that None).
    """

    def run_to(self, step: int) -> None:
        """Take optimizer steps, one minibatch each, until ``step`` steps have been taken in all since
        :meth:`TrialSteps.start` (``step`` never decreases from one call to the next)."""

    def losses(self, split: str) -> np.ndarray:
        """The per-sample losses ``(n,)`` (float64) of the trained copy, in evaluation mode, on ``split``
        (``"heldout"`` or ``"train"``): the same samples in the same order as the unexpanded model's
        losses the loop was given, so that the changes are paired.  Raises
        :class:`satcore.InputError` naming the candidate, the steps and the recipe's lr where a loss
        is not finite (the recipe diverged on the inserted block)."""

    def suspend(self) -> None:
        """Set the trial aside: keep only what :meth:`resume` needs (the trained parameters, the
        optimizer's state, the steps taken) and release the copy."""

    def resume(self) -> None:
        """Rebuild a suspended trial so that the steps it takes next are exactly those an
        uninterrupted trial would take (the same parameters, optimizer state and minibatches)."""


class TrialSteps(Protocol):
    """What a framework adapter supplies to :func:`trial_decision`: one method."""

    def start(self, at: str) -> Trial:
        """A new :class:`Trial` at candidate ``at``, no step taken (its losses are the unexpanded
        model's)."""


@dataclasses.dataclass(frozen=True)
class ScreenRow:
    """The first-order screen's evidence on one candidate (:func:`screen`).

    ``heldout_change`` / ``training_change``: the predicted change (loss after minus before; a
    harm is positive) of the recipe's steps on the held-out and the training split;
    ``interval`` and ``fold_test_p_positive``: the held-out change's fold interval and the fold
    test's probability that the step's held-out gain is positive (:class:`satcore.HeldoutGain`:
    they omit the predictor's own error, and read as a probability of the trained block's
    decrease the latter is off by up to 0.47 per bin, studies/screen-probability.md).
    """

    name: str
    heldout_change: float
    training_change: float
    interval: tuple
    fold_test_p_positive: float

    def candidate(self) -> CandidateDecision:
        """The row as a candidate the trials did not verify (never chosen): the screen's changes, and no
        interval or ``P(decrease)`` (:meth:`CandidateDecision.screen_only`: the fold interval omits the
        predictor's error and read as near-certain)."""
        return CandidateDecision.screen_only(self.name, self.heldout_change, self.training_change)


def screen(train_statistics, heldout_statistics, recipe: Recipe) -> list[ScreenRow]:
    """Every scored candidate's :class:`ScreenRow`, from the largest predicted held-out decrease.

    The first-order predicted gains (:func:`satcore.predict_gains`) of ``recipe.steps`` steps of
    the recipe's optimizer at its lr, without weight decay (AdamW priced as Adam: the screen is a
    first-order step), fitted on ``train_statistics`` and tested on ``heldout_statistics``
    (:class:`satcore.DepthStatistics` of the same candidates and feature maps).
    """
    step = Recipe("sgd" if recipe.optimizer == "sgd" else "adam", recipe.lr, recipe.steps, recipe.batch_size,
                  recipe.trainable)
    rows = []
    for c in predict_gains(train_statistics, heldout_statistics, step).candidates:
        low, high = c.heldout.interval
        rows.append(ScreenRow(c.name, -c.heldout.value, -c.training_gain, (-high, -low),
                              c.heldout.fold_test_p_positive))
    return sorted(rows, key=operator.attrgetter("heldout_change"))


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


def _name_groups(groups) -> tuple:
    """``groups`` as a tuple of tuples of candidate names, or one ``InputError`` naming the field."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise InputError(f"trials: groups must be a list of lists of candidate names, got {type(groups).__name__}")
    out = []
    for group in groups:
        if isinstance(group, (str, bytes)) or not isinstance(group, Iterable):
            raise InputError("trials: groups must be a list of lists of candidate names, got a group "
                             f"{type(group).__name__}")
        group = tuple(group)
        if not all(isinstance(name, str) for name in group):
            raise InputError(f"trials: groups: a group's entries must be candidate names (str), got {group!r}")
        out.append(group)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class TrialSettings:
    """How the trials are planned (:func:`trial_decision`).

    Attributes
    ----------
    max_trials : int
        How many candidates, in the screen's order, are verified by a trial (a positive integer).
    schedule : {"even", "halving"}
        How the trials share the recipe's steps: the even plan or successive halving (module
        docstring); the same cost.
    calibration : Calibration, optional
        The trials' extrapolation and error model; default the shipped one fitted on the bench's
        trials of ``schedule``: ``TrialSettings(schedule=...).calibration`` is how to read it before any
        decision (``decision.calibration`` after one).
    groups : sequence of sequences of candidate names, optional
        Spread the trials over these groups (:func:`grouped_trials`) instead of the screen's first
        ``max_trials``.
    tolerance : float, optional
        A practical stop tolerance the user states: the smallest held-out decrease worth a block, as a share
        of the held-out loss before insertion (``0.003``: 0.3%).  It becomes the calibration's ``tolerance``
        (so :attr:`calibration` carries it); the stop tolerance is the larger of it and the fitted share of the
        generalization gap (:meth:`Calibration.stop_tolerance_terms`), and the printed stop says which ruled.
        None: the calibration's own (0 as shipped).

    Examples
    --------
    >>> TrialSettings(tolerance=0.003).calibration.tolerance
    0.003
    """

    max_trials: int = 4
    schedule: str = "even"
    calibration: object = None
    groups: tuple | None = None
    tolerance: float | None = None

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise InputError(f"trials: schedule must be 'halving' or 'even', got {self.schedule!r}")
        # any integer, numpy's included; not a bool, float or str
        object.__setattr__(self, "max_trials", positive_count(self.max_trials, "trials: max_trials"))
        if self.groups is not None:
            object.__setattr__(self, "groups", _name_groups(self.groups))
        if self.calibration is None:
            shipped = HALVING_CALIBRATION if self.schedule == "halving" else DEFAULT_CALIBRATION
            object.__setattr__(self, "calibration", shipped)
        elif not isinstance(self.calibration, Calibration):  # else an AttributeError once the trials had run
            raise InputError(f"trials: calibration must be a satcore Calibration (e.g. dataclasses.replace of "
                             f"TrialSettings().calibration), got {type(self.calibration).__name__}")
        if self.tolerance is not None:
            object.__setattr__(self, "tolerance", finite_real(self.tolerance, "trials: tolerance", low=0.0))
            object.__setattr__(self, "calibration", dataclasses.replace(self.calibration, tolerance=self.tolerance))

    def trialled(self, names: list, recipe: Recipe) -> list[str]:
        """The candidates among ``names`` (the screen's order) the trials verify."""
        if self.groups is None:
            return names[:trial_plan(len(names), recipe, self.max_trials)[0]]
        return grouped_trials(names, self.groups, self.max_trials)


def check_unexpanded_losses(before: Mapping) -> None:
    """Refuse per-sample losses of the unexpanded model (``{"heldout": (n,), "train": (m,)}``) that no trial
    can start from: a loss that is not finite (:class:`ModelOnDataError`: the model's, on that data), or fewer
    than 2 held-out samples (no standard error)."""
    for split, losses in before.items():
        if not np.isfinite(losses).all():
            raise ModelOnDataError(f"decide: the model's loss is not finite on {int((~np.isfinite(losses)).sum())} of "
                                   f"{losses.size} {split_words(split)} samples "
                                   "before any block is inserted (loss_fn or the model gives NaN or inf)")
    if before["heldout"].size < 2:
        raise InputError(f"decide: the held-out data holds {before['heldout'].size} sample(s); a trial's held-out "
                         "change needs at least 2 for its standard error")


def trial_decision(steps: TrialSteps, screened, before: Mapping, recipe: Recipe,
                   settings: TrialSettings, planned=None, requested_family: str | None = None) -> InsertionDecision:
    """Where to insert the next block under ``recipe``, or why to stop (module docstring).

    Parameters
    ----------
    steps : TrialSteps
        The framework's trials.
    screened : iterable of ScreenRow
        Every candidate's screen (:func:`screen`; rows of several probe passes may be joined:
        they are ordered here, ties kept in the order given).
    before : mapping
        The unexpanded model's per-sample losses on ``"heldout"`` and ``"train"``
        (:func:`check_unexpanded_losses`): every trial starts from them (its block is the identity), and their
        means' difference is the generalization gap the stop tolerance is a share of (:func:`choose`).
    recipe : Recipe
        How the user will train the inserted block; the trials together take at most its steps.
    settings : TrialSettings
        How many trials, by which schedule, under which calibration.
    planned : callable, optional
        Called once, before the first trial, with the plan's work ``(steps, readings)``
        (:func:`trial_work`): how a caller's progress bar learns its total.
    requested_family : str, optional
        The probe family the trials were asked to train, as the decision records it
        (:attr:`~satcore.InsertionDecision.requested_family`; each trial's own ``family`` is what it resolved to).

    Returns
    -------
    InsertionDecision
        With ``heldout_samples``, ``requested_family``, each verified candidate's ``trial_family`` and, where the
        choice has a runner-up, ``margin_se`` set.
    """
    rows = {row.name: row for row in sorted(screened, key=operator.attrgetter("heldout_change"))}
    trialled = settings.trialled(list(rows), recipe)
    cost, readings = trial_work(len(trialled), recipe, settings.schedule)
    if planned is not None:
        planned(cost, readings)
    run = _halving_trials if settings.schedule == "halving" else _even_trials
    curves, final = run(steps, trialled, recipe, before)
    out = []
    for name, row in rows.items():
        if name in curves:
            curve, eliminated, family = curves[name]
            candidate = verified_candidate(name, curve, recipe.steps, settings.calibration, row.heldout_change)
            out.append(dataclasses.replace(candidate, eliminated=eliminated, trial_family=family))
        else:
            out.append(row.candidate())
    decision = dataclasses.replace(choose(out, recipe, float(before["heldout"].mean()), float(before["train"].mean()),
                                          cost, settings.calibration, int(before["heldout"].size)),
                                   requested_family=requested_family)
    if decision.runner_up is None:
        return decision
    # the margin's standard error paired over the held-out samples both trials were evaluated on
    return dataclasses.replace(decision, margin_se=paired_standard_error(final[decision.runner_up]
                                                                         - final[decision.choice]))


def trial_work(trialled: int, recipe: Recipe, schedule: str) -> tuple[int, int]:
    """``(steps, readings)``: the optimizer steps the plan of ``schedule`` takes over ``trialled`` candidates (the
    decision's ``cost_block_steps``) and its readings, each one evaluation of every split of :data:`TRIAL_SPLITS`.

    Even: ``n T`` steps, ``n`` times the checkpoints of ``T`` readings (:func:`~satcore._decisions.trials.trial_plan`);
    halving: ``n T1 + f (T2 - T1)`` steps, ``n`` times the first phase's readings and ``f`` times the second's
    (:func:`_halving_checkpoints`)."""
    if schedule == "halving":
        verified, first, finalists, second = halving_plan(trialled, recipe, trialled)
        early, late = _halving_checkpoints(first, second)
        return verified * first + finalists * (second - first), verified * len(early) + finalists * len(late)
    verified, T, checkpoints = trial_plan(trialled, recipe, trialled)
    return verified * T, verified * len(checkpoints)


def _halving_checkpoints(first: int, second: int) -> tuple[list, list]:
    """Where successive halving reads its trials: every trial at the checkpoints of ``first`` steps and those of
    ``second`` up to ``first``; the finalists, resumed, at the rest of ``second`` 's."""
    late = trial_checkpoints(second)
    return sorted(set(trial_checkpoints(first)) | {t for t in late if t <= first}), [t for t in late if t > first]


def measure(trial: Trial, checkpoints) -> dict:
    """``{step: {split: per-sample losses}}``: ``trial`` run to each of ``checkpoints`` (increasing) in turn and
    read on every split of :data:`TRIAL_SPLITS` there."""
    out = {}
    for step in checkpoints:
        trial.run_to(step)
        out[step] = {split: trial.losses(split) for split in TRIAL_SPLITS}
    return out


def _curve(points, measured: dict, before: Mapping) -> tuple[TrialCurve, np.ndarray]:
    """The trial's curve at ``points`` and its per-sample held-out losses at the last of them."""
    after = {split: np.stack([measured[t][split] for t in points]) for split in TRIAL_SPLITS}
    curve = TrialCurve.from_losses(points, before["heldout"], after["heldout"], before["train"], after["train"])
    return curve, after["heldout"][-1]


def _trial_family(trial: Trial) -> str | None:
    """The family a trial trains (:class:`Trial`'s ``family``), None where its adapter does not say."""
    return getattr(trial, "family", None)


def _even_trials(steps: TrialSteps, trialled, recipe: Recipe, before: Mapping):
    """``({name: (curve, eliminated, family)}, {name: per-sample held-out losses at the trial's end})``: every
    trialled candidate ``recipe.steps // n`` steps."""
    checkpoints = trial_plan(len(trialled), recipe, len(trialled))[2]
    curves, final = {}, {}
    for name in trialled:
        trial = steps.start(name)
        curve, final[name] = _curve(checkpoints, measure(trial, checkpoints), before)
        curves[name] = (curve, False, _trial_family(trial))
        del trial  # released once measured, before the next is built: one copy of the model at a time
    return curves, final


def _halving_trials(steps: TrialSteps, trialled, recipe: Recipe, before: Mapping):
    """``({name: (curve, eliminated, family)}, {name: per-sample held-out losses at its curve's end})`` by
    successive halving (:func:`~satcore._decisions.trials.halving_plan`): every trialled candidate ``T1`` steps,
    set aside; the finalists (lowest held-out change at ``T1``) resumed to ``T2``.  A finalist's curve is read at
    a quarter, half and all of ``T2``, an eliminated one's of ``T1``."""
    _, first, finalists, second = halving_plan(len(trialled), recipe, len(trialled))
    early, later = _halving_checkpoints(first, second)
    measured, trials = {}, {}
    for name in trialled:
        trial = steps.start(name)
        measured[name] = measure(trial, early)
        trial.suspend()
        trials[name] = trial
    kept = sorted(trialled, key=lambda n: float(np.mean(measured[n][first]["heldout"] - before["heldout"])))
    kept = kept[:finalists]
    for name in kept:
        trials[name].resume()
        measured[name] |= measure(trials[name], later)
    late = trial_checkpoints(second)
    curves, final = {}, {}
    for name in trialled:
        curve, final[name] = _curve(late if name in kept else trial_checkpoints(first), measured[name], before)
        curves[name] = (curve, name not in kept, _trial_family(trials[name]))
    return curves, final


__all__ = ["SCHEDULES", "TRIAL_SPLITS", "ScreenRow", "Trial", "TrialSettings", "TrialSteps", "check_unexpanded_losses",
           "grouped_trials", "measure", "screen", "trial_decision", "trial_work"]
