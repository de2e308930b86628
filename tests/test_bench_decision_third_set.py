"""The third transfer set (``studies/decision_third_set.py``): its rules' constants are the ones fitted before it was
recorded, its shipping criterion, and its table against the recordings and the write-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies import decision_third_set as third
from studies.decision_short_stops import SGD_RULE
from study_tables import assert_study_shows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "studies" / "results"


def test_the_pinned_constants_are_the_every_set_fits_recorded_before_the_third_set():
    recorded = json.loads((RESULTS / "decision_validity_short_stops.json").read_text())["rules"]
    assert recorded[SGD_RULE]["fitted_every_set"] == third.SGD_RULE_TRAINING_SE
    assert recorded[third.CARRY_RULE]["fitted_every_set"] == third.CARRY_FACTOR


def test_no_fit_reads_the_third_sets_folder():
    # the fits read the bench's folder and its larger held-out splits; the third set has a folder of its own
    from studies.decision_scores import large_heldout_folder
    from studies.decision_validity import OUT, OUT_THIRD, OUT_TRANSFER

    assert OUT_THIRD.name == third.THIRD_FOLDER
    assert OUT_THIRD not in (OUT, large_heldout_folder(OUT), OUT_TRANSFER)


def _column(stops: int, clear: int, harms: int = 0, flagged: int = 5, signs: float = 0.9, best: float = 0.5) -> dict:
    return {"stops_over_noise": (stops, clear), "harms_inserted": harms, "harms_flagged": flagged,
            "sign_right": signs, "best_picked": best}


def _verdict(rule_300: dict, rule_1000: dict, shipped: dict | None = None) -> dict:
    shipped = shipped or _column(5, 20)
    labels = [f"{third.THIRD_LABEL}, {s}" for s in (300, 1000)]
    return third.criterion({"shipped": dict.fromkeys(labels, shipped),
                            SGD_RULE: dict(zip(labels, (rule_300, rule_1000)))})


def test_the_criterion_is_met_only_where_every_clause_holds_at_both_lengths():
    assert _verdict(_column(2, 20), _column(0, 5))["met"]  # 10% is within the line
    assert not _verdict(_column(3, 20), _column(0, 5))["met"]  # 15%
    assert not _verdict(_column(0, 20), _column(0, 0))["met"]  # no clear gain at 1000 steps: the line is untested
    assert not _verdict(_column(0, 20, harms=1), _column(0, 5))["met"]  # one more clear harm than shipped
    assert not _verdict(_column(0, 20, flagged=4), _column(0, 5))["met"]
    assert not _verdict(_column(0, 20), _column(0, 5, best=0.4))["met"]
    why = _verdict(_column(3, 20), _column(0, 0))["lengths"]
    assert why["300"]["why"] == ["stops short in 3 of 20"]
    assert why["1000"]["why"] == ["no decision with a clear best gain: the line is not tested"]


def test_a_length_not_recorded_does_not_meet_the_criterion():
    label = f"{third.THIRD_LABEL}, 300"
    verdict = third.criterion({"shipped": {label: _column(5, 20)}, SGD_RULE: {label: _column(0, 20)}})
    assert verdict["lengths"]["300"]["met"] and verdict["lengths"]["1000"] == {"met": False, "why": ["not recorded"]}
    assert not verdict["met"]


def test_the_write_up_shows_the_table_the_recorded_scores_render():
    assert_study_shows(third.render(json.loads((RESULTS / "decision_validity_third_set.json").read_text())))


@pytest.mark.slow
def test_the_recorded_scores_reproduce_from_the_recordings():
    res = json.loads(json.dumps(third.third_set_scores(RESULTS / "decision_validity"), default=float))
    recorded = json.loads((RESULTS / "decision_validity_third_set.json").read_text())
    assert third.render(res) == third.render(recorded)
    assert res["criterion"] == recorded["criterion"]
