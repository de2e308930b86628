"""The frontier's race (satcore._decisions.frontier: still_credible, racing, TrialPlan.cost_reached) against
arithmetic done by hand: two checkpoints at steps 2 and 4 read at 64 planned steps are the line through
(log2 t = 1, 2) read at log2 64 = 6, so each window's predicted change is ``-4 d(2) + 5 d(4)``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from satcore import InputError
from satcore.adapter_api import RACE_MARGIN, Prediction, TrialPlan, credible, racing, still_credible

Z_95 = 1.959963984540054
TOLERANCE = 0.006


def by_hand(first, second) -> tuple[float, float]:
    """``(point, 95% half-width)`` of the paired difference whose per-window changes are ``first`` at step 2 and
    ``second`` at step 4, one replicate: the mean of ``-4 first + 5 second`` and 1.96 its standard error."""
    e = [-4 * a + 5 * b for a, b in zip(first, second)]
    mean = sum(e) / len(e)
    sd = math.sqrt(sum((x - mean) ** 2 for x in e) / (len(e) - 1))
    return mean, Z_95 * sd / math.sqrt(len(e))


def arm(first, second) -> np.ndarray:
    """(1 replicate, 2 checkpoints, windows) changes of an arm whose K = 0 partner changed by nothing."""
    return np.array([[first, second]], np.float64)


# (changes at step 2, at step 4) per window, the difference from K = 0's all-zero changes
CASES = {
    # e = (-0.10, -0.06, -0.14, -0.10): point -0.10, lower below -0.006: it may still become credible
    "clear gain": ((0.0, 0.01, -0.01, 0.0), (-0.02, -0.004, -0.036, -0.02)),
    # e = (+0.02, +0.04, 0.0, +0.02): the point is above 0: moved down one half-width, the upper bound stays >= 0
    "a loss": ((0.0, 0.0, 0.0, 0.0), (0.004, 0.008, 0.0, 0.004)),
    # e = (-0.002, -0.004, 0.0, -0.002): point below 0, but even its lower bound is above -0.006
    "a gain within the tolerance": ((0.0, 0.0, 0.0, 0.0), (-0.0004, -0.0008, 0.0, -0.0004)),
    # e = (+0.1, -0.3, +0.1, -0.1): point -0.05 below 0, lower bound -0.05 - 0.19 below -0.006: goes on
    "a noisy gain": ((0.0, 0.0, 0.0, 0.0), (0.02, -0.06, 0.02, -0.02)),
}
EXPECTED_GOING = {"clear gain": True, "a loss": False, "a gain within the tolerance": False, "a noisy gain": True}


@pytest.mark.parametrize("case", sorted(CASES))
def test_still_credible_is_the_interim_interval_moved_down_one_half_width(case):
    from satcore.adapter_api import predict_change

    first, second = CASES[case]
    point, half = by_hand(first, second)
    prediction = predict_change(arm(first, second), (2, 4), 64)
    assert prediction.point == pytest.approx(point, abs=1e-12)
    assert prediction.interval[1] - prediction.point == pytest.approx(half, rel=1e-12)
    # at the shipped margin of one half-width: the point below 0 and the lower bound below minus the tolerance
    assert RACE_MARGIN == 1.0
    going = point < 0 and point - half < -TOLERANCE
    assert going == EXPECTED_GOING[case]
    assert still_credible(prediction, TOLERANCE) == going
    # margin 0: the choice's own rule on the interim prediction
    assert still_credible(prediction, TOLERANCE, margin=0.0) == credible(prediction, TOLERANCE)


def test_a_larger_margin_keeps_more_arms_going():
    """Moving the interval further down can only make it credible: the arms that go on at a margin go on at any
    larger one."""
    prediction = Prediction(0.01, (-0.03, 0.05), 0.02, 0.0)  # half-width 0.04
    # moved by m * 0.04: point 0.01 - 0.04 m < -0.006 needs m > 0.4, upper 0.05 - 0.04 m < 0 needs m > 1.25
    assert [still_credible(prediction, TOLERANCE, margin=m) for m in (0.0, 1.0, 1.24, 1.26, 3.0)] == \
        [False, False, False, True, True]


def test_racing_keeps_k0_while_any_expansion_goes_on_and_stops_all_when_none_does():
    none = np.zeros((1, 2, 4))
    gain, loss, small = (arm(*CASES[c]) for c in ("clear gain", "a loss", "a gain within the tolerance"))
    assert racing({0: none, 1: loss, 2: gain}, (2, 4), 64, TOLERANCE) == (0, 2)
    assert racing({0: none, 1: gain, 2: gain}, (2, 4), 64, TOLERANCE) == (0, 1, 2)
    assert racing({0: none, 1: loss, 2: small}, (2, 4), 64, TOLERANCE) == ()
    # paired: K = 0's own changes are subtracted window by window (here K = 0 gains what the arm does: no difference)
    assert racing({0: gain, 1: gain}, (2, 4), 64, TOLERANCE) == ()
    with pytest.raises(InputError, match="at least 2 checkpoints"):
        racing({0: none[:, :1], 1: gain[:, :1]}, (2,), 64, TOLERANCE)


def test_cost_reached_counts_each_arm_to_its_last_checkpoint():
    """Two replicates, checkpoints (2, 5, 10) of a 10-step trial: arm a stopped after its n-th reading costs
    ``t_n step_a + n read_a`` per replicate, on top of the fixed passes."""
    plan = TrialPlan(1000, 100.0, (1.5, 0.5, 1.0), (0.25, 0.5, 0.75), 2, 10, 3.0)
    assert plan.checkpoints == (2, 5, 10)
    # K = 0 and K = 2 to the end (10 steps, 3 reads), K = 1 stopped after its second reading (5 steps, 2 reads)
    by_hand = 3.0 + 2 * ((10 * 1.5 + 3 * 0.25) + (5 * 0.5 + 2 * 0.5) + (10 * 1.0 + 3 * 0.75))
    assert plan.cost_reached([3, 2, 3]) == pytest.approx(by_hand, rel=1e-15)
    assert plan.cost_reached([3, 3, 3]) == pytest.approx(plan.cost_steps, rel=1e-15)
    assert plan.cost_reached([2, 2, 2]) == pytest.approx(3.0 + 2 * (5 * 3.0 + 2 * 1.5), rel=1e-15)
