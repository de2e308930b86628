"""The frontier's carry error (satcore._decisions.frontier: carry_error, with_carry, and the race and the choice that
weigh it) against arithmetic done by hand: two checkpoints at steps 2 and 4 read at 64 planned steps are the line
through (log2 t = 1, 2) read at log2 64 = 6, so each window's predicted change is ``-4 d(2) + 5 d(4)``; the carry
error from step 4 to 64 is ``kappa log2(16) = 4 kappa``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from satcore import InputError
from satcore.adapter_api import (CARRY_PER_DOUBLING, Prediction, carry_error, choose_blocks, predict_change, racing,
                                 still_credible, with_carry)

Z_95 = 1.959963984540054
TOLERANCE = 0.006
# per-window changes at step 2 and at step 4 of a K > 0 arm minus K = 0 (one replicate):
# e = -4 d(2) + 5 d(4) = (-0.10, -0.06, -0.14, -0.10): point -0.10, sd sqrt(0.0032 / 3), se sd / 2
FIRST, SECOND = (0.0, 0.01, -0.01, 0.0), (-0.02, -0.004, -0.036, -0.02)
POINT, SE = -0.10, math.sqrt(0.0032 / 3) / 2


def gain() -> Prediction:
    return predict_change(np.array([[FIRST, SECOND]], np.float64), (2, 4), 64)


@pytest.mark.parametrize("per_doubling,trial_steps,full_steps,expected", [
    (0.02, 4, 64, 0.08),                          # four doublings
    (0.023, 10, 400, 0.023 * math.log(40) / math.log(2)),
    (0.02, 64, 64, 0.0),                          # nothing carried
    (0.02, 128, 64, 0.0),                         # a trial past the planned steps carries nothing either
    (0.0, 4, 64, 0.0),
])
def test_the_carry_error_grows_with_the_doublings_carried(per_doubling, trial_steps, full_steps, expected):
    assert carry_error(per_doubling, trial_steps, full_steps) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("se_carry", [0.0, 0.01, 0.08])
def test_the_carry_error_widens_the_interval_in_quadrature_and_moves_no_point(se_carry):
    prediction = gain()
    assert prediction.point == pytest.approx(POINT, abs=1e-12)
    assert prediction.se_sample == pytest.approx(SE, rel=1e-12)
    carried = with_carry(prediction, se_carry)
    half = Z_95 * math.sqrt(SE ** 2 + se_carry ** 2)
    assert carried.point == prediction.point and carried.se_carry == se_carry
    assert carried.interval == pytest.approx((POINT - half, POINT + half), abs=1e-12)
    # the noise alone is what it was: the race moves the point by it
    assert carried.noise_half_width == pytest.approx(Z_95 * SE, rel=1e-9)
    assert carried.to_dict()["se_carry"] == se_carry


@pytest.mark.parametrize("se_carry", [0.0, 0.03, 0.06, 0.07, 0.2])
def test_the_race_moves_the_point_by_the_noise_and_keeps_the_carried_width(se_carry):
    """Going on: the point moved down one noise half-width ``h`` below minus the tolerance, and that moved point plus
    the whole half-width ``H`` (noise and carry) below 0."""
    h, big = Z_95 * SE, Z_95 * math.sqrt(SE ** 2 + se_carry ** 2)
    going = POINT - h < -TOLERANCE and POINT - h + big < 0
    assert going == (se_carry < 0.065)  # H reaches -(POINT - h) = 0.132 at se_carry 0.0653: the cases fall either side
    assert still_credible(with_carry(gain(), se_carry), TOLERANCE) == going
    none = np.zeros((1, 2, 4))
    arms = {0: none, 1: np.array([[FIRST, SECOND]], np.float64)}
    assert racing(arms, (2, 4), 64, TOLERANCE, se_carry) == ((0, 1) if going else ())


def test_a_carry_error_that_covers_the_gain_leaves_the_model_as_it_is():
    """K = 1 beats K = 0 by -0.10 on the trials' noise; with four doublings at 0.03 per doubling, its interval
    reaches above 0 (-0.10 + 1.96 sqrt(SE^2 + 0.12^2) > 0) and nothing is inserted."""
    target = {0: Prediction(0.0, (-0.01, 0.01), 0.005, 0.0), 1: Prediction(-0.10, (-0.12, -0.08), 0.01, 0.0)}
    noise_only = choose_blocks(target, None, TOLERANCE, versus_none={1: gain()})
    assert noise_only.chosen_blocks == 1
    carried = with_carry(gain(), carry_error(0.03, 4, 64))
    assert carried.interval[1] == pytest.approx(POINT + Z_95 * math.sqrt(SE ** 2 + 0.12 ** 2), abs=1e-12)
    assert carried.interval[1] > 0
    choice = choose_blocks(target, None, TOLERANCE, versus_none={1: carried})
    assert choice.chosen_blocks == 0 and choice.reason.startswith("expanding does not pay here")


def test_the_shipped_carry_error_and_a_negative_one_refused():
    torch = pytest.importorskip("torch")  # noqa: F841  (DecisionBudget is the torch adapter's)
    from satcore.adapters.torch.expansion_frontier import DecisionBudget

    assert DecisionBudget().carry_per_doubling == CARRY_PER_DOUBLING == 0.023
    with pytest.raises(InputError, match=r"carry_per_doubling \(nats\) must be >= 0, got -0.01"):
        DecisionBudget(carry_per_doubling=-0.01)
