"""The planned looks of a probe enlarged until it decides (``satcore._decisions.verdicts.look_schedule``).

Under the null (``q`` independent of ``psi``: ``V_pop = 0``; the simulation of
``studies/fold_test_calibration.py --looks``) a sequence of looks that stops at
the first "improvable" must say so at most ``alpha`` of the time when the looks' levels add up to ``alpha``; testing every look at ``alpha`` is measured to exceed that, so the split matters.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from satcore._decisions.verdicts import look_schedule



@pytest.mark.parametrize("initial, total, looks", [(16, 16, 1), (16, 17, 2), (16, 32, 2), (16, 33, 3), (4, 20, 4),
                                                   (1, 1024, 11), (40, 16, 1)])
def test_looks_double_to_total_and_their_levels_add_up_to_alpha(initial, total, looks):
    s = look_schedule(initial, total, 0.05)
    assert s.looks == looks and len(s.sizes) == looks and s.sizes[-1] == total
    first = min(initial, total)
    assert list(s.sizes) == [min(total, first * 2**k) for k in range(looks)]  # fixed in advance
    early = 0.05 if looks == 1 else 0.025 / (looks - 1)
    assert s.alpha_final == pytest.approx(0.05 if looks == 1 else 0.025) and s.alpha_early == pytest.approx(early)
    assert s.alpha_final + (looks - 1) * s.alpha_early == pytest.approx(0.05)  # the union bound's budget
    assert look_schedule(initial, total, 0.05, final_share=None).alpha_at(total) == pytest.approx(0.05 / looks)


def test_bad_schedules_are_refused():
    for initial, total in ((0, 10), (4, 0)):
        with pytest.raises(ValueError, match=">= 1"):
            look_schedule(initial, total)
    with pytest.raises(ValueError):
        look_schedule(4, 10, alpha=1.5)
    with pytest.raises(ValueError):
        look_schedule(4, 10, final_share=1.0)


def _calibration_bench():
    from studies import fold_test_calibration

    return fold_test_calibration


def test_the_level_holds_across_looks_and_would_not_at_full_alpha_each():
    """studies/fold_test_calibration.py --looks under H0, at 300 repetitions instead of 500."""
    bench, rng, reps = _calibration_bench(), np.random.default_rng(0), 300
    split = look_schedule(16, 128, 0.05)  # looks at 16, 32, 64 batches at 0.05/6 each, then 128 at 0.025
    naive = dataclasses.replace(split, alpha_early=0.05, alpha_final=0.05)
    runs = {name: [bench.looks_sequence(rng, s) for _ in range(reps)] for name, s in (("split", split),
                                                                                       ("naive", naive))}
    rate = {name: np.mean([v == "improvable" for v, _, _ in out]) for name, out in runs.items()}
    se = np.sqrt(0.05 * 0.95 / reps)
    print(f"false improvable: {rate['split']:.3f} split, {rate['naive']:.3f} at full alpha per look")
    assert rate["split"] <= 0.05 + 2 * se
    assert rate["naive"] > 0.05 + 2 * se  # four looks at 0.05 each do spend more than 0.05
    for verdict, used, looks in runs["split"]:  # an inconclusive sequence ran to the whole probe
        assert verdict != "inconclusive" or used == 128
        assert used == split.sizes[looks - 1]
