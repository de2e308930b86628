"""The short-stop study (``studies/decision_short_stops.py``): its rules on constructed decisions, the causes it
sorts stops into, and its table against the recordings and the write-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satcore._decisions.calibration import DEFAULT_CALIBRATION
from satcore._decisions.trials import TrialCurve
from studies import decision_short_stops as short
from study_tables import assert_study_shows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "studies" / "results"


def _row(name: str, heldout: float, heldout_se: float, training: float, train_se: float, **outcome) -> dict:
    curve = TrialCurve((25, 50, 100), (heldout,) * 3, (training,) * 3, heldout_se)
    return {"candidate": name, "curve": curve, "may_choose": True, "screen": heldout, "train_se": train_se,
            "target": -0.05, "seed_sd": 0.01, "spread": 0.02, "own_heldout": heldout, **outcome}


def _stop(heldout_se: float, family: str = "sgd") -> dict:
    """A model of held-out loss 2 and training loss 1: the shipped gap fraction, 0.01, makes the stop tolerance
    0.01.  Both trials raise the held-out loss a little (no credible decrease: a stop); ``a``'s training loss falls by
    0.02 (10 of its standard errors, beyond the tolerance), ``b``'s by 0.005 (2.5 standard errors, within it), and
    ``b``'s held-out change is the lower.  With ``heldout_se`` 0.01 the intervals reach past -0.01 (an unresolved
    stop); with 0.002 they reach below 0 but not past -0.01 (a resolved one)."""
    return {"set": "toy", "steps": 300, "cost": 300, "base_heldout": 2.0, "base_train": 1.0, "base_test": 2.0,
            "optimizer_family": family,
            "rows": [_row("a", 0.001, heldout_se, -0.02, 0.002), _row("b", 0.0005, heldout_se, -0.005, 0.002)]}


def _decide_by(rule: str, inst: dict, x):
    return short.SHORT_STOP_RULES[rule][0](inst, DEFAULT_CALIBRATION, x)


UNRESOLVED = "unresolved stops: the same where its training loss falls by more than x SEs"
UNRESOLVED_SGD_MATERIAL = "unresolved stops, SGD recipes: training falling by more than x SEs and the stop tolerance"
OPEN_SGD = "the same, SGD recipes"


def test_the_shipped_decision_stops_on_the_constructed_cases_resolved_or_not():
    from studies.decision_scores import _decide

    assert _decide(_stop(0.01), DEFAULT_CALIBRATION).stop_reason == "heldout_too_small"
    assert _decide(_stop(0.002), DEFAULT_CALIBRATION).stop_reason == "no_credible_decrease"
    assert _decide(_stop(0.01), DEFAULT_CALIBRATION).stop_tolerance == pytest.approx(0.01, rel=1e-12)


def test_an_unverified_gain_is_the_lowest_held_out_change_among_the_candidates_whose_training_loss_falls_enough():
    # both training losses fall by more than 1 standard error: b, the lower held-out change, is inserted
    assert _decide_by(UNRESOLVED, _stop(0.01), 1.0).choice == "b"
    # at 3 standard errors only a's fall counts
    assert _decide_by(UNRESOLVED, _stop(0.01), 3.0).choice == "a"
    # the stop tolerance as a floor too: b's 0.005 is below 0.01, so a, on SGD recipes only
    assert _decide_by(UNRESOLVED_SGD_MATERIAL, _stop(0.01), 1.0).choice == "a"
    kept = _decide_by(UNRESOLVED_SGD_MATERIAL, _stop(0.01, family="adam"), 1.0)
    assert (kept.choice, kept.stop_reason) == (None, "heldout_too_small")
    # nobody falls by 20 standard errors: the stop stays
    assert _decide_by(UNRESOLVED, _stop(0.01), 20.0).choice is None


def test_a_resolved_stop_is_kept_by_the_unresolved_rules_and_opened_where_an_interval_reaches_below_zero():
    resolved = _stop(0.002)
    assert _decide_by(UNRESOLVED, resolved, 1.0).stop_reason == "no_credible_decrease"
    # 0.001 - 1.96 x 0.002 < 0: a decrease is not excluded; ungated, the lowest held-out change
    assert _decide_by(OPEN_SGD, resolved, None).choice == "b"
    assert _decide_by(short.SGD_RULE, resolved, 1.0).choice == "a"
    # intervals above 0 close it: a stop that shows saturation at any tolerance stays
    closed = _stop(0.0002)
    assert _decide_by(short.SGD_RULE, closed, 1.0).stop_reason == "no_credible_decrease"


def test_the_carried_stop_inserts_where_the_carried_decrease_clears_the_tolerance():
    inst = _stop(0.0001)
    inst["rows"][0] = _row("a", -0.004, 0.0001, -0.02, 0.002)  # credible, but 0.004 is below the tolerance 0.01
    rule = "stop tolerance against d(T) times the carry to the recipe's length (the median realized change over d(T))"
    assert _decide_by(rule, inst, 2.0).stop_reason == "gain_below_tolerance"
    assert _decide_by(rule, inst, 3.0).choice == "a"  # 0.012 clears 0.01


def test_the_carry_is_the_median_realized_change_over_the_trials_decrease_where_both_are_clear():
    inst = _stop(0.01)
    inst["rows"] = [_row(name, -0.01, 0.01, -0.02, 0.002, target=target, spread=0.005)
                    for name, target in (("a", -0.03), ("b", -0.01), ("c", -0.02),
                                         ("d", -0.004))]  # d: within its seed range, left out
    inst["rows"].append(_row("e", 0.01, 0.01, -0.02, 0.002, target=-0.05, spread=0.005))  # a trial that rose: out
    assert short.fit_carry([inst]) == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("rows, tolerance, cause", [
    # a trial whose training loss rose by 10 standard errors where the block lowers the test loss
    ([_row("a", 0.02, 0.01, 0.02, 0.002)], 0.01, "unstable trial"),
    # the full run raises the held-out loss everywhere
    ([_row("a", 0.02, 0.01, -0.02, 0.002, own_heldout=0.01)], 0.01, "held-out split disagrees"),
    # the full run's best held-out decrease, 0.005, is below the tolerance
    ([_row("a", 0.02, 0.001, -0.02, 0.002, own_heldout=-0.005)], 0.01, "gain below what the split resolves"),
    # it is beyond the tolerance and the trial's standard error: the trial fell short
    ([_row("a", 0.02, 0.001, -0.02, 0.002, own_heldout=-0.02)], 0.01, "trial too short"),
])
def test_a_short_stop_is_put_down_to_what_its_recordings_show(rows, tolerance, cause):
    from types import SimpleNamespace

    assert short.cause({"rows": rows}, SimpleNamespace(stop_tolerance=tolerance)) == cause


def test_the_write_up_shows_the_tables_the_recorded_scores_render():
    assert_study_shows(short.render(json.loads((RESULTS / "decision_validity_short_stops.json").read_text())))


@pytest.mark.slow
def test_the_recorded_scores_reproduce_from_the_recordings():
    res = json.loads(json.dumps(short.short_stop_scores(RESULTS / "decision_validity"), default=float))
    recorded = json.loads((RESULTS / "decision_validity_short_stops.json").read_text())
    assert short.render(res) == short.render(recorded)
