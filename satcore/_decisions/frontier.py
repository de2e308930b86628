"""Whether to add blocks to a pretrained decoder, and how many: a frontier of predicted changes against K.

The user states the training they plan for the expanded model (``S`` optimizer
steps of ``B`` windows).  The decision spends at most a fraction of it (the
*decision budget*) on short trials of a few *arms*: ``K = 0`` (the model as it
is, trained with the same recipe) and ``K = 1, 2, 4, ...`` identity blocks at
LLaMA-Pro's uniform places (Wu et al., "LLaMA Pro: Progressive LLaMA with Block
Expansion").  Each arm is trained ``T`` steps from ``R`` seeds (replicates),
and its held-out losses are measured at ``T/4``, ``T/2`` and ``T``.

**Cost, in model-steps.**  A pass with gradients over a batch of ``B`` windows
(a trial's optimizer step, the timing step) is one step; a forward pass alone
over ``B`` windows (an evaluation) is a third of one, the FLOP ratio of a
forward to a forward and backward.  Every pass the decision runs is counted:
the timing step, the evaluations of the model as it is, every arm's steps and
evaluations (the ``K = 0`` arm's included) and, where there is one, the
first-order probe (a forward and backward pass per batch).

**Extrapolation.**  Over the few hundred steps that follow insertion, the
held-out loss of a language model falls close to linearly in the logarithm of
the steps.  Each window's change (loss after minus loss before; a decrease is
negative) is fitted by least squares on ``[1, log2 t]`` over the checkpoints
and read at ``log2 S``: a fixed linear combination ``w`` of the checkpoints,
``e_i = sum_j w_j d_ij``.  The predicted change is the mean of ``e`` over
windows and replicates.  Its interval is normal, ``point +- 1.96 se``, with
``se^2`` the sampling variance over held-out windows (of the replicates' mean
``e_i``) plus the seed variance over replicates (of their window means,
divided by ``R``): it measures the noise of the trials, not the error of the
log-linear model, which grows with ``S / T``.

**Choice.**  The smallest ``K`` whose predicted held-out change is within
``tolerance`` nats of the lowest, among the arms whose predicted change of the
general (old-domain) held-out loss is at most ``max_forgetting``; ``K = 0``
means expanding does not pay: the same training spent on the model as it is
is predicted to do as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._shared.errors import InputError
from .trials import trial_checkpoints

FORWARD_SHARE = 1 / 3  # a forward pass over a batch, in steps (forward + backward)
MIN_TRIAL_STEPS = 4  # three distinct checkpoints: T/4, T/2, T
Z_95 = 1.959963984540054
HEAD = "head"


def block_counts(max_blocks: int) -> tuple[int, ...]:
    """The arms' block counts: ``0, 1, 2, 4, ...`` doubling while below ``max_blocks``, then ``max_blocks``.

    Examples
    --------
    >>> block_counts(7)
    (0, 1, 2, 4, 7)
    >>> block_counts(1)
    (0, 1)
    """
    if max_blocks < 1:
        raise InputError(f"max_blocks must be at least 1, got {max_blocks}")
    counts = [0]
    k = 1
    while k < max_blocks:
        counts.append(k)
        k *= 2
    return tuple(counts + [max_blocks])


def uniform_places(n_blocks: int, k: int) -> list:
    """LLaMA-Pro's places for ``k`` new blocks in a stack of ``n_blocks``: one after each of ``k`` equal
    groups of blocks, as the original block index each precedes (``"head"`` after the last block).

    Examples
    --------
    >>> uniform_places(8, 2), uniform_places(8, 4), uniform_places(6, 4), uniform_places(3, 4)
    ([4, 'head'], [2, 4, 6, 'head'], [1, 3, 4, 'head'], [0, 1, 2, 'head'])
    """
    if not 0 <= k <= n_blocks + 1:
        raise InputError(f"{k} blocks at uniform places: a stack of {n_blocks} blocks has {n_blocks + 1} places")
    places = [(i + 1) * n_blocks // k for i in range(k)]
    return [HEAD if p >= n_blocks else p for p in places]


def uniform_groups(n_blocks: int, k: int) -> list[list]:
    """The places each uniform place stands for: the ``i``-th holds the places after the ``(i-1)``-th uniform
    place up to the ``i``-th (original block indices, ``"head"`` after the last block).

    Examples
    --------
    >>> uniform_groups(8, 2)
    [[0, 1, 2, 3, 4], [5, 6, 7, 'head']]
    """
    ends = [n_blocks if p == HEAD else p for p in uniform_places(n_blocks, k)]
    starts = [0] + [e + 1 for e in ends[:-1]]
    return [[HEAD if p == n_blocks else p for p in range(a, e + 1)] for a, e in zip(starts, ends)]


@dataclass(frozen=True)
class TrialPlan:
    """How the decision budget is spent (module docstring: costs in model-steps).

    ``fixed_steps``: passes that do not depend on the trials' length (the timing step, the model's
    own evaluations, a probe); ``eval_steps``: one evaluation of an arm (held-out and general data).
    """

    planned_steps: int
    budget_steps: float
    arms: int
    replicates: int
    trial_steps: int
    fixed_steps: float
    eval_steps: float

    @property
    def checkpoints(self) -> tuple[int, ...]:
        return trial_checkpoints(self.trial_steps) if self.arms else ()

    @property
    def cost_steps(self) -> float:
        """Every pass of the decision, in model-steps."""
        per_trial = self.trial_steps + len(self.checkpoints) * self.eval_steps
        return self.fixed_steps + self.arms * self.replicates * per_trial

    @property
    def cost_fraction(self) -> float:
        """``cost_steps`` over the planned training's steps."""
        return self.cost_steps / self.planned_steps

    def to_dict(self) -> dict:
        return {"planned_steps": self.planned_steps, "budget_steps": self.budget_steps, "arms": self.arms,
                "replicates": self.replicates, "trial_steps": self.trial_steps,
                "checkpoints": list(self.checkpoints), "fixed_steps": self.fixed_steps,
                "eval_steps": self.eval_steps, "cost_steps": self.cost_steps,
                "cost_fraction": self.cost_fraction}


def plan_trials(planned_steps: int, fraction: float, arms: int, replicates: int, fixed_steps: float,
                eval_steps: float) -> TrialPlan:
    """The longest trials that keep the decision within ``fraction`` of ``planned_steps``.

    Every one of ``arms`` is trained ``T`` steps from each of ``replicates`` seeds and evaluated at
    :func:`trial_checkpoints` (``eval_steps`` each); ``T`` is the largest with
    ``fixed_steps + arms replicates (T + 3 eval_steps) <= fraction planned_steps``.  With no arms
    (nothing to try) ``T`` is 0 and only ``fixed_steps`` must fit.

    Raises
    ------
    InputError
        When even ``T = 4`` (three checkpoints) does not fit; the message says the smallest fraction
        and the smallest planned training that would.
    """
    if not 0 < fraction <= 1:
        raise InputError(f"--decision-budget {fraction:g}: a fraction of the planned training in (0, 1]")
    budget = fraction * planned_steps
    trials = arms * replicates
    longest = math.floor((budget - fixed_steps) / trials - 3 * eval_steps) if trials else 0
    if (trials and longest < MIN_TRIAL_STEPS) or fixed_steps > budget:
        needed = fixed_steps + trials * (MIN_TRIAL_STEPS + 3 * eval_steps)
        fits = needed / planned_steps <= 1
        raise InputError(
            f"a decision budget of {fraction:g} (--decision-budget) of {planned_steps} planned steps (--steps) is "
            f"{budget:g} model-steps; deciding among {arms} arm(s) with {replicates} seed(s) each needs at least "
            f"{needed:.4g} (trials of {MIN_TRIAL_STEPS} steps read 3 times at {eval_steps:.3g} steps a reading, "
            f"plus {fixed_steps:.3g} fixed): give "
            + (f"--decision-budget {math.ceil(100 * needed / planned_steps) / 100:g} or " if fits else "")
            + f"--steps {math.ceil(needed / fraction)}, or read fewer held-out windows (--max-windows)")
    return TrialPlan(int(planned_steps), float(budget), int(arms), int(replicates), int(longest),
                     float(fixed_steps), float(eval_steps))


def extrapolation_weights(checkpoints, full_steps: int) -> np.ndarray:
    """``w`` with ``sum_j w_j d(t_j)`` the least-squares line of ``d`` on ``log2 t`` read at ``log2 full_steps``.

    Examples
    --------
    >>> w = extrapolation_weights((2, 4, 8), 64)
    >>> round(float(w @ [-0.1, -0.2, -0.3]), 12)   # a straight line in log2 t: -0.1 per doubling
    -0.6
    """
    x = np.log2(np.asarray(checkpoints, np.float64))
    design = np.stack([np.ones_like(x), x], axis=1)
    return np.array([1.0, math.log2(full_steps)]) @ np.linalg.pinv(design)


@dataclass(frozen=True)
class Prediction:
    """A predicted change after the full training (nats; negative: a decrease) and its 95% interval.

    ``se_sample``: the standard error from the held-out windows; ``se_seed``: from the replicates.
    """

    point: float
    interval: tuple[float, float]
    se_sample: float
    se_seed: float

    def to_dict(self) -> dict:
        return {"point": self.point, "interval": list(self.interval), "se_sample": self.se_sample,
                "se_seed": self.se_seed}


def predict_change(changes, checkpoints, full_steps: int) -> Prediction:
    """The change after ``full_steps`` from a trial's per-window changes (module docstring).

    Parameters
    ----------
    changes : array (replicates, checkpoints, windows)
        Loss after minus loss before, per held-out window, at each checkpoint of each replicate.
    checkpoints : the steps the changes were read at.
    full_steps : the planned training's steps.
    """
    d = np.asarray(changes, np.float64)
    if d.ndim != 3 or d.shape[1] != len(checkpoints) or d.shape[2] < 2:
        raise InputError(f"changes must be (replicates, {len(checkpoints)} checkpoints, >= 2 windows), "
                         f"got {d.shape}")
    per_window = np.einsum("j,rji->ri", extrapolation_weights(checkpoints, full_steps), d)
    point = float(per_window.mean())
    se_sample = float(per_window.mean(0).std(ddof=1) / math.sqrt(d.shape[2]))
    replicate_means = per_window.mean(1)
    se_seed = float(replicate_means.std(ddof=1) / math.sqrt(len(replicate_means))) if len(replicate_means) > 1 \
        else 0.0
    half = Z_95 * math.hypot(se_sample, se_seed)
    return Prediction(point, (point - half, point + half), se_sample, se_seed)


@dataclass(frozen=True)
class FrontierChoice:
    """The chosen block count and why (``reason``, plain words); ``excluded``: arms over ``max_forgetting``."""

    chosen_blocks: int
    best_blocks: int | None
    tolerance: float
    excluded: tuple[int, ...]
    reason: str


def choose_blocks(target: dict, general: dict | None, tolerance: float,
                  max_forgetting: float | None = None) -> FrontierChoice:
    """The smallest ``K`` whose predicted held-out change is within ``tolerance`` of the lowest.

    ``target`` / ``general``: ``{K: Prediction}`` of the target and general held-out losses
    (``general`` None: not measured).  Arms whose predicted general change exceeds
    ``max_forgetting`` are left out; when every arm is, nothing is added.
    """
    if tolerance < 0:
        raise InputError(f"tolerance must be at least 0 nats, got {tolerance:g}")
    if max_forgetting is not None and general is None:
        raise InputError("max_forgetting needs the general data's predicted change (--general-data)")
    excluded = tuple(k for k in sorted(target) if max_forgetting is not None
                     and general[k].point > max_forgetting)
    allowed = [k for k in sorted(target) if k not in excluded]
    if not allowed:
        return FrontierChoice(0, None, tolerance, excluded, (
            f"expanding does not pay here: every arm's predicted general loss change is above --max-forgetting "
            f"{max_forgetting:g} nats, no expansion included; nothing is inserted"))
    best = min(allowed, key=lambda k: target[k].point)
    chosen = next(k for k in allowed if target[k].point <= target[best].point + tolerance)
    if chosen == 0:
        reason = (f"expanding does not pay here: the model as it is, trained the same way, is predicted within "
                  f"{tolerance:.3g} nats of the best arm (K = {best}); nothing is inserted")
    else:
        reason = (f"{chosen} block(s): the fewest predicted within {tolerance:.3g} nats of the best arm (K = {best})"
                  + (", and above no expansion by more than that" if 0 in allowed else ""))
    return FrontierChoice(chosen, best, tolerance, excluded, reason)


__all__ = ["FORWARD_SHARE", "FrontierChoice", "Prediction", "TrialPlan", "block_counts", "choose_blocks",
           "extrapolation_weights", "plan_trials", "predict_change", "uniform_groups", "uniform_places"]
