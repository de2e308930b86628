"""Whether to add blocks to a pretrained decoder, and how many: a frontier of predicted changes against K.

The user states the training they plan for the expanded model (``S`` optimizer
steps of ``B`` windows).  The decision spends at most a fraction of it (the
*decision budget*) on short trials of a few *arms*: ``K = 0`` (the model as it
is, trained with the same recipe) and ``K = 1, 2, 4, ...`` identity blocks at
LLaMA-Pro's uniform places (Wu et al., "LLaMA Pro: Progressive LLaMA with Block
Expansion").  Each arm is trained ``T`` steps from ``R`` seeds (replicates),
and its held-out losses are measured at ``T/4``, ``T/2`` and ``T``.

**Cost, in planned steps' FLOPs.**  The unit is one step of the planned training, priced as the
largest arm's step trained as the user will (LLaMA-Pro's count at uniform places by default), in model
FLOPs (:func:`step_flops`: a forward of every block and the head; backward, one forward's worth for the
activation gradients of every module from the lowest trainable one up, one more for each trainable
module's weight gradients).  Each pass the decision runs is counted by that rule against the unit: the
timing step (every parameter), the evaluations of the model as it is (forward only), every arm's steps
(``K = 0``: every parameter; ``K`` blocks: ``L + K`` blocks forward, backward as they train) and its
evaluations (forward only), so the printed share is the share of the planned training's FLOPs.

**Windows.**  Training windows cost nothing to hold, held-out ones a forward pass at every reading: the
trials train on every window not held out, and the held-out set is as large as a quarter of the budget
reads (:func:`affordable_heldout`), at least :data:`MIN_HELDOUT` windows and at most half the data.

**Extrapolation.**  Over the few hundred steps that follow insertion, the
held-out loss of a language model falls close to linearly in the logarithm of
the steps.  Each window's change (loss after minus loss before; a decrease is
negative) is fitted by least squares on ``[1, log2 t]`` over the checkpoints
and read at ``log2 S``: a fixed linear combination ``w`` of the checkpoints,
``e_i = sum_j w_j d_ij``.  The predicted change is the mean of ``e`` over
windows and replicates.  Its interval is normal, ``point +- 1.96 se``, with
``se^2`` the sampling variance over held-out windows (of the replicates' mean
``e_i``) plus, with several replicates (each its own minibatch order), the seed
variance over replicates (of their window means, divided by ``R``); with one
replicate (the default: the budget buys trials twice as long) the windows' alone.
That measures the noise of the trials, not the error of carrying a short trial's
line to ``S`` steps.

**Carry error.**  A paired difference from ``K = 0`` (below) is what the choice
rests on, so its interval adds the carry error: a standard deviation growing
linearly with the length of the extrapolation in doublings,
``se_carry = kappa log2(S / t_last)`` (:func:`carry_error`, ``t_last`` the last
checkpoint read), added in quadrature, ``half = 1.96 sqrt(se^2 + se_carry^2)``
(:func:`with_carry`).  ``kappa`` (:data:`CARRY_PER_DOUBLING`) is the maximum-likelihood
fit of the realized differences at full budget (uniform ``K`` blocks minus no
expansion, same seed) around the predicted ones, ``realized - predicted ~
N(0, se^2 + se_carry^2)``, on the bench's three domain pairs
(studies/expansion-budget-notes.md, "Carry error").  The arms' own intervals stay
the trials' noise alone.

**Choice: expanding must beat K = 0 credibly.**  The short trials cannot see
the planned training's ordering of the arms: over a few steps, training every
parameter of the model as it is (``K = 0``) first raises the held-out loss,
then over hundreds of steps gains more than the new blocks alone do (measured in
studies/expansion-budget-notes.md, on three domain pairs).  So no expansion is the
prior.  Each ``K > 0`` is compared with ``K = 0`` paired on the same held-out
windows (:func:`predict_change` of the per-window difference of the two arms'
changes), and is *credible* when that predicted difference's 95% interval lies
below 0 and its point below minus ``tolerance`` (the placement check's rule for
a move).  The choice is the smallest credible ``K`` whose predicted held-out
change is within ``tolerance`` of the lowest credible one; with none credible,
``K = 0``: expanding does not pay.  Arms whose predicted change of the general
(old-domain) held-out loss exceeds ``max_forgetting`` are left out first; with
``K = 0`` left out, the choice is the smallest ``K`` within ``tolerance`` of the
lowest predicted change (no prior to beat).

**The race: trials stop once no expansion can become credible.**  The arms are trained checkpoint by
checkpoint, side by side.  After each checkpoint but the last, from the second on (a line in ``log2 t``
needs two), each ``K > 0`` still running is predicted from the checkpoints read so far; it goes on only
while it may still become credible (:func:`still_credible`): its paired difference from ``K = 0``,
moved down by :data:`RACE_MARGIN` times its 95% half-width (how far the remaining checkpoints may carry
it), would be credible.  ``K = 0`` goes on while any ``K > 0`` does; when none does, every trial stops
(:func:`racing`), the choice is ``K = 0``, and the budget not spent is the
training's (:meth:`TrialPlan.cost_reached`).  A stopped arm's predictions are read from its checkpoints
so far.  Nothing is chosen early: an expansion is still chosen only on every checkpoint read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._shared.errors import InputError
from .._shared.numbers import MAX_COUNT
from .trials import trial_checkpoints

MIN_TRIAL_STEPS = 4  # three distinct checkpoints: T/4, T/2, T
Z_95 = 1.959963984540054
MIN_HELDOUT = 8  # fewer held-out windows leave the interval's window variance on a handful of values
READ_SHARE = 0.25  # the held-out set is sized so that reading it takes at most this share of the budget
HEAD = "head"
# the carry error's standard deviation per doubling of the extrapolation (carry_error), nats: the maximum-likelihood
# fit on the bench's near, far and perl pairs together (0.0225; left out one pair at a time: 0.0211 without near, 0.0218
# without far, 0.0240 without perl), rounded up (studies/expansion-budget-notes.md, "Carry error")
CARRY_PER_DOUBLING = 0.023
# half-widths of an interim paired difference's 95% interval that the trial's last checkpoint may still move it
# down (still_credible): fitted when the trials were 7 steps read at 1, 3, 7 (five timing passes were charged before
# them), on the bench's near and far pairs (the largest move, over 60 arm x seed cells, of the point or the upper
# bound from the reading at step 3 to the one at step 7 of 400 planned steps: 0.98), rounded up; scored on perl
# (largest 0.78).  The timing passes are gone and the trials are now 10 steps read at 2, 5, 10: the margin was not
# refitted on those (studies/expansion-budget-notes.md: "The race", "The time estimate from the trials' own steps")
RACE_MARGIN = 1.0


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


def step_flops(n_blocks: int, trainable, head_trainable: bool, block: float, head: float) -> float:
    """FLOPs per token of one training step of a stack of ``n_blocks`` blocks (then the head) whose
    blocks at the indices ``trainable`` train: a forward of every module; backward, one forward's worth
    for the activation gradients of every module from the lowest trainable one up (the head always),
    one more for each trainable module's weight gradients.  No trainable module: the forward alone.

    Examples
    --------
    >>> step_flops(2, [0, 1], True, 1.0, 1.0), step_flops(2, [1], False, 1.0, 1.0), step_flops(2, [], False, 1.0, 1.0)
    (9.0, 6.0, 3.0)
    """
    trainable = set(trainable)
    if not trainable and not head_trainable:
        return n_blocks * block + head
    lowest = min(trainable) if trainable else n_blocks
    backward = sum(1 + (i in trainable) for i in range(lowest, n_blocks)) * block + (1 + head_trainable) * head
    return n_blocks * block + head + backward


def new_positions(places, n_blocks: int) -> list[int]:
    """Indices in the grown stack of the blocks inserted before ``places`` (original indices, ``"head"``).

    Examples
    --------
    >>> new_positions([4, "head"], 8), new_positions([0, 0], 3)
    ([4, 9], [0, 1])
    """
    ordered = sorted(n_blocks if p == HEAD else p for p in places)
    return [p + j for j, p in enumerate(ordered)]


def affordable_heldout(available: int, budget_steps: float, window_reads: float) -> int:
    """Held-out windows: as many as :data:`READ_SHARE` of ``budget_steps`` reads, at least :data:`MIN_HELDOUT`,
    at most half of the ``available`` windows (the other half or more trains the trials: training windows
    are free, each held-out one costs ``window_reads`` steps over the whole decision).

    Examples
    --------
    >>> affordable_heldout(64, 40.0, 0.5), affordable_heldout(64, 400.0, 0.5), affordable_heldout(10, 40.0, 0.5)
    (20, 32, 5)
    """
    afford = math.floor(READ_SHARE * budget_steps / window_reads) if window_reads > 0 else available
    return max(0, min(available // 2, max(MIN_HELDOUT, afford)))


@dataclass(frozen=True)
class TrialPlan:
    """How the decision budget is spent, in planned steps' FLOPs (module docstring).

    ``step_costs`` / ``read_costs``: per arm, one trial step and one reading (held-out and general windows);
    ``fixed_steps``: passes that do not depend on the trials' length (the timing step, the model's own
    evaluations, a probe).
    """

    planned_steps: int
    budget_steps: float
    step_costs: tuple
    read_costs: tuple
    replicates: int
    trial_steps: int
    fixed_steps: float

    @property
    def arms(self) -> int:
        return len(self.step_costs)

    @property
    def checkpoints(self) -> tuple[int, ...]:
        return trial_checkpoints(self.trial_steps) if self.arms else ()

    @property
    def cost_steps(self) -> float:
        """Every pass of the decision, in planned steps' FLOPs: the ceiling, every arm read at every checkpoint."""
        return self.cost_reached([len(self.checkpoints)] * self.arms)

    def cost_reached(self, readings) -> float:
        """The passes of trials stopped early (:func:`racing`), in planned steps' FLOPs: arm ``a`` trained to its
        ``readings[a]``-th checkpoint ``t_a`` and read that many times,
        ``fixed_steps + replicates sum_a (t_a step_a + readings_a read_a)`` (an arm never read: ``t_a = 0``).

        Examples
        --------
        >>> plan = TrialPlan(400, 40.0, (1.0, 0.5), (1.0, 1.0), 1, 8, 2.0)
        >>> plan.checkpoints, plan.cost_reached([3, 3]), plan.cost_reached([2, 2])   # 2 + 8 + 4 + 6; 2 + 4 + 2 + 4
        ((2, 4, 8), 20.0, 12.0)
        """
        steps = [self.checkpoints[n - 1] if n else 0 for n in readings]
        per_replicate = sum(t * s + n * r for t, n, s, r in zip(steps, readings, self.step_costs, self.read_costs))
        return self.fixed_steps + self.replicates * per_replicate

    @property
    def cost_fraction(self) -> float:
        """``cost_steps`` over the planned training's steps: the share of its FLOPs."""
        return self.cost_steps / self.planned_steps

    def to_dict(self) -> dict:
        return {"planned_steps": self.planned_steps, "budget_steps": self.budget_steps, "arms": self.arms,
                "replicates": self.replicates, "trial_steps": self.trial_steps,
                "checkpoints": list(self.checkpoints), "fixed_steps": self.fixed_steps,
                "step_costs": list(self.step_costs), "read_costs": list(self.read_costs),
                "cost_steps": self.cost_steps, "cost_fraction": self.cost_fraction}


def plan_trials(planned_steps: int, fraction: float, step_costs, read_costs, replicates: int,
                fixed_steps: float, deciding: str | None = None, otherwise: str = "") -> TrialPlan:
    """The longest trials that keep the decision within ``fraction`` of ``planned_steps``.

    Arm ``a`` (a step costs ``step_costs[a]``, a reading ``read_costs[a]``) is trained ``T`` steps from each
    of ``replicates`` seeds and read at :func:`trial_checkpoints`; ``T`` is the largest with
    ``fixed_steps + replicates sum_a (T step_a + 3 read_a) <= fraction planned_steps``.  With no arms
    (nothing to try) ``T`` is 0 and only ``fixed_steps`` must fit.

    ``deciding``: what the trials decide, as the refusal names it (default "deciding among N arm(s)");
    ``otherwise``: what the refusal adds after the budgets that would fit (another way to run, or "").

    Raises
    ------
    InputError
        When even ``T = 4`` (three checkpoints) does not fit; the message says the smallest fraction
        and the smallest planned training that would.
    """
    if not 0 < fraction <= 1:
        raise InputError(f"--decision-budget {fraction:g}: a fraction of the planned training in (0, 1]")
    step_costs, read_costs = tuple(map(float, step_costs)), tuple(map(float, read_costs))
    budget = fraction * planned_steps
    steps, reads = replicates * sum(step_costs), replicates * sum(read_costs)
    longest = math.floor((budget - fixed_steps - 3 * reads) / steps) if step_costs else 0
    if (step_costs and longest < MIN_TRIAL_STEPS) or fixed_steps > budget:
        needed = fixed_steps + MIN_TRIAL_STEPS * steps + 3 * reads
        # each remedy named only where it lies in its option's range: a tiny fraction asked for --steps past 2**53
        # (a 300-digit count, or an OverflowError where needed / fraction is inf)
        steps_needed = needed / fraction
        remedies = [f"--decision-budget {math.ceil(100 * needed / planned_steps) / 100:g}"] if needed <= planned_steps else []
        remedies += [f"--steps {math.ceil(steps_needed)}"] if steps_needed <= MAX_COUNT else []
        raise InputError(
            f"a decision budget of {fraction:g} (--decision-budget) of {planned_steps} planned steps (--steps) is "
            f"{budget:.4g} steps' FLOPs; {deciding or f'deciding among {len(step_costs)} arm(s)'} with "
            f"{replicates} seed(s) each "
            f"needs at least {needed:.4g} (trials of {MIN_TRIAL_STEPS} steps read 3 times on the fewest held-out "
            f"windows, plus {fixed_steps:.3g} fixed): "
            + (f"give {' or '.join(remedies)}" if remedies else
               f"no --decision-budget up to 1 nor --steps up to {MAX_COUNT} fits") + otherwise)
    return TrialPlan(int(planned_steps), float(budget), step_costs, read_costs, int(replicates), int(longest),
                     float(fixed_steps))


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

    ``se_sample``: the standard error from the held-out windows; ``se_seed``: from the replicates; ``se_carry``: the
    carry error's (:func:`with_carry`; 0: the trials' noise alone).
    """

    point: float
    interval: tuple[float, float]
    se_sample: float
    se_seed: float
    se_carry: float = 0.0

    @property
    def noise_half_width(self) -> float:
        """The 95% half-width of the trials' noise alone: the interval's half-width ``h`` less the carry error's share
        in quadrature, ``sqrt(h^2 - (1.96 se_carry)^2)`` (``1.96 sqrt(se_sample^2 + se_seed^2)`` where
        :func:`with_carry` made the interval; ``h`` itself without carry error)."""
        half = (self.interval[1] - self.interval[0]) / 2
        return math.sqrt(max(0.0, half ** 2 - (Z_95 * self.se_carry) ** 2))

    def to_dict(self) -> dict:
        return {"point": self.point, "interval": list(self.interval), "se_sample": self.se_sample,
                "se_seed": self.se_seed, "se_carry": self.se_carry}


def carry_error(per_doubling: float, trial_steps: int, full_steps: int) -> float:
    """The carry error's standard deviation (nats) of a prediction read ``full_steps`` from a trial whose last
    checkpoint is ``trial_steps``: ``per_doubling log2(full_steps / trial_steps)``, 0 where nothing is carried.

    Examples
    --------
    >>> carry_error(0.02, 10, 400), carry_error(0.02, 10, 10)   # log2(40) = 5.32 doublings
    (0.10643856189774725, 0.0)
    """
    return per_doubling * max(0.0, math.log2(full_steps / trial_steps))


def with_carry(prediction: Prediction, se_carry: float) -> Prediction:
    """``prediction`` with the carry error ``se_carry`` added to its interval in quadrature: ``point +- 1.96
    sqrt(se_sample^2 + se_seed^2 + se_carry^2)`` (module docstring: carry error).

    Examples
    --------
    >>> p = with_carry(Prediction(-0.1, (-0.1 - Z_95 * 0.03, -0.1 + Z_95 * 0.03), 0.03, 0.0), 0.04)
    >>> [round(v, 6) for v in p.interval], round(p.noise_half_width, 6)   # 1.96 x 0.05 = 0.098
    ([-0.197998, -0.002002], 0.058799)
    """
    half = Z_95 * math.sqrt(prediction.se_sample ** 2 + prediction.se_seed ** 2 + se_carry ** 2)
    return Prediction(prediction.point, (prediction.point - half, prediction.point + half), prediction.se_sample,
                      prediction.se_seed, se_carry)


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
    """The chosen block count and why (``reason``, plain words); ``excluded``: arms over ``max_forgetting``
    (None: no limit was stated); ``resolvable_gain``: on a stop where no ``K > 0`` beat ``K = 0`` credibly but some
    paired 95% interval reaches below minus the tolerance (a gain beyond it not ruled out), the narrowest of those
    intervals' half-widths, nats: the least predicted gain its trials could have shown credibly (a credible
    difference needs its upper end below 0, so its point below minus its half-width); None otherwise."""

    chosen_blocks: int
    best_blocks: int | None
    tolerance: float
    excluded: tuple[int, ...]
    reason: str
    max_forgetting: float | None = None
    resolvable_gain: float | None = None


def credible(difference: Prediction, tolerance: float) -> bool:
    """A predicted paired difference (an arm minus the one it must beat; negative: lower loss) is credible when its
    95% interval lies below 0 and its point below minus ``tolerance``.

    Examples
    --------
    >>> credible(Prediction(-0.05, (-0.09, -0.01), 0.02, 0.0), 0.006), credible(Prediction(-0.05, (-0.12, 0.02), 0.035, 0.0), 0.006)
    (True, False)
    """
    return difference.interval[1] < 0 and difference.point < -tolerance


def still_credible(difference: Prediction, tolerance: float, margin: float = RACE_MARGIN) -> bool:
    """Whether a paired difference predicted from the checkpoints read so far may still become :func:`credible` once
    the trial is read to its end: :func:`credible` of the prediction moved down by ``margin`` times the 95%
    half-width of its noise ``h`` (:attr:`Prediction.noise_half_width`), ``point - margin h < -tolerance`` and
    ``upper - margin h < 0`` (without carry error, at ``margin = 1``: the lower bound below minus the tolerance and the
    point below 0).  The interval keeps its carry error: the remaining checkpoints move the point, not the distance it
    is carried.

    The move is how far the last checkpoint may carry the prediction: :data:`RACE_MARGIN` (module docstring).

    Examples
    --------
    >>> still_credible(Prediction(-0.02, (-0.10, 0.06), 0.04, 0.0), 0.006)   # shifted: -0.10 [-0.18, -0.02]
    True
    >>> still_credible(Prediction(0.01, (-0.07, 0.09), 0.04, 0.0), 0.006)    # shifted: -0.07 [-0.15, +0.01]
    False
    """
    shift = margin * difference.noise_half_width
    moved = Prediction(difference.point - shift, (difference.interval[0] - shift, difference.interval[1] - shift),
                       difference.se_sample, difference.se_seed, difference.se_carry)
    return credible(moved, tolerance)


def racing(changes: dict, checkpoints, full_steps: int, tolerance: float, se_carry: float = 0.0,
           margin: float = RACE_MARGIN) -> tuple[int, ...]:
    """The arms whose trials go on after the checkpoints read so far (module docstring: the race).

    ``changes``: ``{K: (replicates, checkpoints read, windows)}`` of the arms still running, ``K = 0`` among them;
    ``checkpoints``: the steps read so far, at least two (a line in ``log2 t``); ``se_carry``: the carry error of a
    prediction from the trial's last checkpoint (:func:`carry_error`), which the choice will weigh.  Each ``K > 0``
    goes on while its paired difference from ``K = 0``, predicted from these checkpoints (:func:`predict_change`)
    with that carry error (:func:`with_carry`), is :func:`still_credible`; ``K = 0`` goes on while any does (it is what they must beat).  Returns the block counts
    that go on, ascending (empty: the race is over, no arm can become credible).

    Examples
    --------
    >>> none = np.zeros((1, 2, 4))
    >>> gain = none - np.array([0.0, 0.02])[None, :, None] - np.array([0.0, 0.01, -0.01, 0.0])   # -0.02 more by t = 4
    >>> racing({0: none, 1: none + 0.01, 2: gain}, (2, 4), 64, 0.006)   # K = 2's line: -0.02 per doubling
    (0, 2)
    >>> racing({0: none, 1: none + 0.01}, (2, 4), 64, 0.006)
    ()
    >>> racing({0: none, 1: none + 0.01, 2: gain}, (2, 4), 64, 0.006, se_carry=0.06)   # K = 2: -0.100 +- 0.118
    ()
    """
    if len(checkpoints) < 2:
        raise InputError(f"racing needs at least 2 checkpoints read (a line in log2 t), got {len(checkpoints)}")
    none = np.asarray(changes[0], np.float64)
    going = tuple(k for k in sorted(changes) if k > 0 and still_credible(with_carry(
        predict_change(np.asarray(changes[k], np.float64) - none, checkpoints, full_steps), se_carry), tolerance,
        margin))
    return (0, *going) if going else ()


def _half_width_words(difference: Prediction) -> str:
    """What a paired difference's 95% half-width is made of and what narrows each part, for the "not ruled out" stop:
    the trials' noise (:attr:`Prediction.noise_half_width`), which more held-out windows narrow, and, where
    :func:`with_carry` added it (else the words of the noise alone), the carry error's ``1.96 se_carry``, which
    grows with ``log2(your steps / the trials' steps)``: where it dominates, a larger budget narrows the half-width
    only slowly, which "longer trials, a larger --decision-budget, narrow it" did not say (on a user's run of 11-step
    trials for 400 planned steps the half-width was 0.234 nats: the carry 0.234, the noise 0.0165)."""
    noise = difference.noise_half_width
    if difference.se_carry == 0:
        return "the paired 95% half-width; longer trials, a larger --decision-budget, narrow it"
    return (f"the paired 95% half-width: the trials' noise, {noise:.3g}, and the error of carrying them to your "
            f"steps, {Z_95 * difference.se_carry:.3g}, in quadrature; a larger --decision-budget narrows the first "
            "with more held-out windows, the second only as log2(your steps / the trials' steps) falls")


def choose_blocks(target: dict, general: dict | None, tolerance: float,
                  max_forgetting: float | None = None, versus_none: dict | None = None) -> FrontierChoice:
    """The block count (module docstring: expanding must beat ``K = 0`` credibly).

    ``target`` / ``general``: ``{K: Prediction}`` of the target and general held-out losses
    (``general`` None: not measured).  ``versus_none``: ``{K: Prediction}`` of arm ``K``'s held-out change minus
    ``K = 0``'s, paired on the same windows, for every ``K > 0`` (None: no prior, the smallest ``K`` within
    ``tolerance`` of the lowest predicted change).  Arms whose predicted general change exceeds
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
            f"no arm met the forgetting limit: every arm's predicted general loss change, K = 0's included, is above "
            f"--max-forgetting {max_forgetting:g} nats"), max_forgetting)
    prior = versus_none is not None and 0 in allowed
    if prior:
        beats = [k for k in allowed if k > 0 and credible(versus_none[k], tolerance)]
        if not beats:
            best = min(allowed, key=lambda k: target[k].point)
            # a gain beyond the tolerance these intervals do not rule out: "not shown to pay", not "shown not to"
            unresolved = [versus_none[k] for k in allowed if k > 0 and versus_none[k].interval[0] < -tolerance]
            narrowest = min(unresolved, key=lambda d: d.interval[1] - d.interval[0]) if unresolved else None
            resolvable = None if narrowest is None else (narrowest.interval[1] - narrowest.interval[0]) / 2
            return FrontierChoice(0, best, tolerance, excluded, (
                f"expanding does not pay here: no block count's trials beat the model as it is, trained the same "
                f"way, credibly (paired on the same held-out windows: 95% interval below 0 and point below -"
                f"{tolerance:.3g} nats); nothing is inserted" + ("" if narrowest is None else
                f"; a gain is not ruled out: the paired intervals reach "
                f"{min(d.interval[0] for d in unresolved):.3g} nats, so these trials could show only a gain beyond "
                f"about {resolvable:.3g} nats ({_half_width_words(narrowest)})")), max_forgetting, resolvable)
        allowed = beats
    best = min(allowed, key=lambda k: target[k].point)
    chosen = next(k for k in allowed if target[k].point <= target[best].point + tolerance)
    if chosen == 0:
        reason = (f"expanding does not pay here: the model as it is, trained the same way, is predicted within "
                  f"{tolerance:.3g} nats of the best arm (K = {best}); nothing is inserted")
    elif prior:
        # the count is the choice's own field (chosen_blocks); the reason says why that count
        reason = (f"the fewest predicted within {tolerance:.3g} nats of the best arm (K = {best}) "
                  f"among those that beat the model as it is credibly (paired 95% interval below 0, point below -"
                  f"{tolerance:.3g})")
    else:
        reason = (f"the fewest predicted within {tolerance:.3g} nats of the best arm (K = {best})"
                  + (", and above no expansion by more than that" if 0 in allowed else ""))
    return FrontierChoice(chosen, best, tolerance, excluded, reason, max_forgetting)


__all__ = ["CARRY_PER_DOUBLING", "MIN_HELDOUT", "RACE_MARGIN", "FrontierChoice", "Prediction", "TrialPlan",
           "affordable_heldout", "block_counts", "carry_error", "choose_blocks", "credible", "extrapolation_weights",
           "new_positions", "plan_trials", "predict_change", "racing", "step_flops", "still_credible", "uniform_groups",
           "uniform_places", "with_carry"]
