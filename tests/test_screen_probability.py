"""``studies/screen_probability.py``: the reliability of the screen's fold-test probability, read as a forecast of
the trained block's decrease.

Its bins against a count by hand, its fold statistic against :func:`satcore._decisions.predictors.heldout_gain`,
and the write-up's largest gaps against the recordings they were computed from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.special import stdtr

from satcore._decisions import predictors as P
from studies import screen_probability as S

ROOT = Path(__file__).resolve().parent.parent


def test_reliability_bins_and_gap_against_a_count_by_hand():
    # 12 insertions at 0.9 (9 decreased), 10 at 0.3 (6 decreased), 3 at 0.5 (none): bins of width 0.2
    p = [0.9] * 12 + [0.3] * 10 + [0.5] * 3
    y = [1] * 9 + [0] * 3 + [1] * 6 + [0] * 4 + [0] * 3
    r = S.reliability(p, y)
    got = {tuple(b["bin"]): (b["mean_p"], b["frequency"], b["n"]) for b in r["bins"]}
    assert got == {(0.2, 0.4): (pytest.approx(0.3), pytest.approx(0.6), 10),
                   (0.4, 0.6): (pytest.approx(0.5), 0.0, 3),
                   (0.8, 1.0): (pytest.approx(0.9), pytest.approx(0.75), 12)}
    # the bin of 3 is below MIN_BIN: the gap is the larger of |0.3 - 0.6| and |0.9 - 0.75|
    assert r["max_gap"] == pytest.approx(0.3)
    assert r["brier"] == pytest.approx(np.mean((np.array(p) - np.array(y)) ** 2))
    assert S.reliability([0.5] * 9, [1] * 9)["max_gap"] is None


def test_fold_statistic_recovers_the_fold_test_of_heldout_gain():
    rng = np.random.default_rng(3)
    sums = rng.normal(size=(S.N_FOLDS, 2, 3)) + 0.2
    h = P.heldout_gain(rng.normal(size=(2, 3)), sums, np.full(S.N_FOLDS, 5), alpha=S.ALPHA)
    statistic = S.fold_statistic(h.value, h.interval)
    assert statistic == pytest.approx(h.value / h.se, rel=1e-10)
    assert stdtr(S.N_FOLDS - 1, statistic) == pytest.approx(h.fold_test_p_positive, rel=1e-10)
    assert S.fold_statistic(-0.1, (-0.1, -0.1)) == -np.inf


def test_the_write_up_gaps_are_the_recordings():
    """The largest gaps studies/screen-probability.md reports, recomputed from the recordings."""
    result = S.scores()
    text = (ROOT / "studies" / "screen-probability.md").read_text()
    for group in ("predictor_bench", "decision_bench"):
        for key, entry in result[group].items():
            row = next(line for line in text.splitlines() if f": {key} |" in line)
            cells = [c.strip() for c in row.split("|")]
            assert cells[5] == f"{entry['shipped']['max_gap']:.2f}"
            assert cells[7] == f"{entry['logistic_lomo']['max_gap']:.2f}"
    bench = result["decision_bench"]
    assert bench["bench, 300 steps"]["shipped"]["max_gap"] > 0.1 and bench["bench, 1000 steps"]["shipped"]["max_gap"] > 0.1
    assert result["screen_deviation_from_recording"] <= S.SCREEN_RTOL
