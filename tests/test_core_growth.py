"""The core growth loop (satcore._growth.loop) with fake callables: no framework is imported.

References are independent: the held-out change is recomputed here from the fake's scripted
per-sample losses, and the noise threshold uses z_{0.95} = 1.6448536269514722 typed in (not
scipy's), so a wrong sign, pairing or quantile in the loop fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo import growth_fakes as fk
from satcore import GrowthLogError, InputError, read_growth_log
from satcore._growth.loop import (
    GrowthBudget,
    GrowthCriteria,
    GrowthOptions,
    HeldoutGuard,
    RoundDecision,
    StopReason,
    round_summary,
    run_growth,
)
from satcore._growth.log import encode_round, parse_log

Z95 = 1.6448536269514722
ROOT = Path(__file__).resolve().parents[1]  # the subprocesses import zoo and this checkout's satcore from here


def _paired(steps, before_depth, after_depth):
    d = steps.heldout(after_depth) - steps.heldout(before_depth)
    return d.mean(), d.std(ddof=1) / np.sqrt(d.size)


@pytest.mark.slow
def test_the_core_loop_imports_no_framework(tmp_path):
    code = ("import sys; from zoo import growth_fakes as fk\n"
            "r = fk.run_one(%r)\n"
            "heavy = [m for m in ('torch', 'tensorflow', 'keras', 'jax') if m in sys.modules]\n"
            "print(r.stop_reason, r.depth, ','.join(heavy))") % str(tmp_path / "g.jsonl")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["max_rounds", "8"]  # 2 blocks + 6 rounds, nothing heavy listed


def test_a_harm_beyond_noise_is_rolled_back_and_stops_at_the_knee():
    steps = fk.FakeSteps({2: 1.0, 3: 0.9, 4: 0.8, 5: 1.1}, jitter=0.05)
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_rounds=10))
    assert result.stop_reason == StopReason.HELDOUT_KNEE == "heldout_knee"
    assert [r.rolled_back for r in result.rounds] == [False, False, True]
    assert result.depth == 4 and len(result.model) == 4  # the block of round 2 is gone
    assert steps.trained == [0, 1, 2]  # it was trained before the guard measured it
    for r, (before, after) in zip(result.rounds, [(2, 3), (3, 4), (4, 5)]):
        change, se = _paired(steps, before, after)
        assert r.heldout_change == pytest.approx(change, rel=1e-12, abs=1e-15)
        assert r.heldout_change_se == pytest.approx(se, rel=1e-12)
    last = result.rounds[-1]
    assert last.heldout_change > Z95 * last.heldout_change_se  # harm beyond noise: the precondition


def test_print_of_a_result_is_its_stop_and_one_line_per_round_not_the_model(tmp_path):
    steps = fk.FakeSteps({2: 1.0, 3: 0.9, 4: 0.8, 5: 1.1}, jitter=0.05)
    log = tmp_path / "g.jsonl"
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_rounds=10), log_path=log)
    lines = str(result).splitlines()
    assert lines[0] == "growth: stopped (heldout_knee) at depth 4 after 3 round(s)"
    assert lines[1:4] == [round_summary(r) for r in result.rounds] and lines[4] == f"log: {log}"
    change, se = _paired(steps, 4, 5)  # the rolled-back round's numbers, recomputed from the fake's losses
    # the place is named as a decision names it ("decision: insert a block at ..."), one phrase for one concept
    assert lines[3].startswith(f"round 2: depth 4, block at {result.rounds[2].inserted_at}, ")
    assert f"held-out change {change:+.3g} (se {se:.2g}), rolled back; stop: heldout_knee (" in lines[3]
    assert "FakeSteps" not in str(result) and repr(result).startswith("GrowthResult(model=")


def test_a_harm_within_noise_is_kept_and_a_gain_below_the_guard_tolerance_stops():
    steps = fk.FakeSteps({2: 1.0, 3: 1.0 + 0.002}, jitter=0.05)
    change, se = _paired(steps, 2, 3)
    assert 0 < change < Z95 * se  # within noise (margin: the fixed seeds give change/se ~ 0.4)
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_rounds=10))
    (r,) = result.rounds
    assert not r.rolled_back and result.depth == 3
    assert result.stop_reason == StopReason.SMALL_HELDOUT_GAIN
    # a real gain below a guard tolerance of 0.2 nats also stops, keeping the block
    steps = fk.FakeSteps({2: 1.0, 3: 0.9, 4: 0.8})
    opts = GrowthOptions(GrowthCriteria(0.0), GrowthBudget(max_rounds=5), HeldoutGuard(tolerance=0.2))
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), opts)
    assert result.stop_reason == "heldout gain below tolerance" and result.depth == 3
    assert result.rounds[0].heldout_change == pytest.approx(-0.1, rel=1e-12)


def test_without_a_guard_the_harm_is_measured_and_kept():
    steps = fk.FakeSteps({2: 1.0, 3: 1.5, 4: 2.0})
    opts = GrowthOptions(GrowthCriteria(0.0), GrowthBudget(max_rounds=2), guard=None)
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), opts)
    assert result.stop_reason == "max_rounds" and result.depth == 4
    assert [r.heldout_change for r in result.rounds] == pytest.approx([0.5, 0.5], rel=1e-12)


class _Decision:
    """A recipe-aware decision as satcore.adapters.torch.decide returns it (duck-typed)."""

    def __init__(self, choice, stop_reason):
        self.choice, self.stop_reason = choice, stop_reason

    def to_dict(self):
        return {"choice": self.choice, "stop_reason": self.stop_reason, "cost_block_steps": 300,
                "candidates": {"a": {"predicted_heldout_change": -0.1, "p_decrease": 0.9},
                               "b": {"predicted_heldout_change": 0.2, "p_decrease": 0.1}}}


def test_a_pluggable_decide_step_chooses_and_stops_with_its_own_reason(tmp_path):
    calls = []

    def decide(model, seed):
        calls.append(seed)
        return _Decision("a", None) if len(calls) == 1 else _Decision(None, "every candidate harms")

    steps = fk.FakeSteps({2: 1.0, 3: 0.9})
    result = run_growth(("a", "b"), steps, decide, GrowthOptions(GrowthCriteria(0.0), seed=3),
                        log_path=tmp_path / "g.jsonl")
    assert calls == [3000, 3001]  # round k's seed is seed * 1000 + k
    assert result.stop_reason == "every candidate harms" and result.depth == 3
    assert result.rounds[0].inserted_at == "a"
    assert result.rounds[0].candidates == [{"name": "a", "predicted_heldout_change": -0.1, "p_decrease": 0.9},
                                           {"name": "b", "predicted_heldout_change": 0.2, "p_decrease": 0.1}]
    assert result.rounds[0].decision == {"cost_block_steps": 300}
    logged = read_growth_log(tmp_path / "g.jsonl").rounds  # what the decision reported reads back
    assert [(r.candidates, r.decision, r.stop_reason) for r in logged] == \
           [(r.candidates, r.decision, r.stop_reason) for r in result.rounds]
    with pytest.raises(TypeError, match="choice"):
        run_growth(("a",), steps, lambda m, s: object(), GrowthOptions(GrowthCriteria(0.0)))


def test_the_log_keeps_the_family_each_trial_trained_beside_rounds_logged_without_it(tmp_path):
    """A round decided by a trial decision logs each candidate's ``trial_family`` and the decision's
    ``requested_family``, and they read back; the next round's decision (as decide steps reported before the
    fields) has neither, and the same log reads."""
    from satcore import Recipe, TrialSettings
    from satcore._decisions.trials import CandidateDecision, TrialCurve, choose

    trial = TrialCurve((75, 150, 300), (-0.02, -0.04, -0.05), (-0.03, -0.06, -0.08), 0.01)
    verified = CandidateDecision("a", -0.05, -0.08, (-0.09, -0.01), 0.97, -0.02, trial, trial_family="conv")
    decision = choose([verified, CandidateDecision.screen_only("b", -2.6, -2.9)], Recipe("adam", 1e-3, 300, 32),
                      2.0, 1.8, 300, TrialSettings().calibration)
    decision = dataclasses.replace(decision, requested_family="auto")
    decisions = iter([decision, _Decision(None, "every candidate harms")])
    result = run_growth(("a", "b"), fk.FakeSteps({2: 1.0, 3: 0.9}), lambda model, seed: next(decisions),
                        GrowthOptions(GrowthCriteria(0.0)), log_path=tmp_path / "g.jsonl")
    assert result.rounds[0].inserted_at == "a"
    first, second = read_growth_log(tmp_path / "g.jsonl").rounds
    assert {row["name"]: row["trial_family"] for row in first.candidates} == {"a": "conv", "b": None}
    assert first.decision["requested_family"] == "auto"
    assert all("trial_family" not in row for row in second.candidates) and "requested_family" not in second.decision


def test_budgets_stop_and_a_max_depth_round_inserts_nothing():
    steps = fk.FakeSteps({d: 1.0 - 0.1 * d for d in range(10)})
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_depth=3, max_rounds=10))
    assert result.stop_reason == StopReason.MAX_DEPTH and result.depth == 3
    assert [r.inserted_at is not None for r in result.rounds] == [True, False]
    result = run_growth(("a", "b"), steps, fk.FakeDecide(stop_at_depth=3), fk.options(max_rounds=10))
    assert result.stop_reason == "saturated" and result.depth == 3


@pytest.mark.parametrize("bad", [dict(tolerance=-1.0), dict(tolerance=float("nan")), dict(alpha=1.5),
                                 dict(tolerance=True)])
def test_bad_criteria_are_refused_in_one_line(bad):
    args = {"tolerance": 0.0, **bad}
    with pytest.raises(InputError, match="growth: "):
        GrowthCriteria(**args)


def test_one_heldout_sample_cannot_guard():
    steps = fk.FakeSteps({2: 1.0, 3: 0.9}, n=1)
    with pytest.raises(InputError, match="at least 2 held-out samples"):
        run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options())


def test_a_killed_run_resumes_to_the_uninterrupted_log_and_a_finished_one_returns_without_work(tmp_path):
    curve = {d: 1.0 - 0.05 * d for d in range(20)}
    whole = tmp_path / "whole.jsonl"
    run_growth(("a", "b"), fk.FakeSteps(curve), fk.FakeDecide(), fk.options(max_rounds=4), log_path=whole)

    class Killed(Exception):
        pass

    def die(model, k):
        if k == 2:
            raise Killed

    part = tmp_path / "part.jsonl"
    with pytest.raises(Killed):
        run_growth(("a", "b"), fk.FakeSteps(curve, on_train=die), fk.FakeDecide(), fk.options(max_rounds=4),
                   log_path=part)
    steps = fk.FakeSteps(curve)
    resumed = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_rounds=4), log_path=part)
    assert steps.trained == [2, 3] and resumed.depth == 6
    timeless = [{k: v for k, v in r.to_dict().items() if k not in ("probe_seconds", "train_seconds")}
                for r in read_growth_log(whole).rounds]
    assert timeless == [{k: v for k, v in r.to_dict().items() if k not in ("probe_seconds", "train_seconds")}
                        for r in read_growth_log(part).rounds]
    # a finished log (same settings) comes back without deciding or training again
    decide, steps = fk.FakeDecide(), fk.FakeSteps(curve)
    again = run_growth(("a", "b"), steps, decide, fk.options(max_rounds=4), log_path=whole)
    assert decide.calls == 0 and steps.trained == [] and again.depth == 6 and again.stop_reason == "max_rounds"
    assert again.model == resumed.model


def test_a_finished_log_under_other_settings_is_refused_with_what_to_do(tmp_path):
    log = tmp_path / "g.jsonl"
    steps = fk.FakeSteps({d: 1.0 - 0.05 * d for d in range(20)})
    run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(max_depth=3), log_path=log)
    decide = fk.FakeDecide()
    with pytest.raises(GrowthLogError, match=r"g\.jsonl: this log finished \('max_depth'\) under other settings "
                                             r"\(max_depth 3 -> 5\); give a new log_path"):
        run_growth(("a", "b"), steps, decide, fk.options(max_depth=5), log_path=log)
    assert decide.calls == 0


def test_a_missing_log_folder_is_reported_before_any_work(tmp_path):
    decide = fk.FakeDecide()
    with pytest.raises(GrowthLogError, match="does not exist; create it first"):
        run_growth(("a",), fk.FakeSteps({1: 1.0}), decide, fk.options(), log_path=tmp_path / "no" / "g.jsonl")
    assert decide.calls == 0


def test_round_seeds_stay_in_the_range_every_seed_is_taken_in():
    """Round ``k``'s seed is ``seed * 1000 + k`` where that is at most ``2**63 - 1`` (insert_block and a decision
    policy refuse more), and brought back into that range above it."""
    assert [GrowthOptions(GrowthCriteria(0.0), seed=3).round_seed(k) for k in (0, 7)] == [3000, 3007]
    top = 2**63 - 1
    assert GrowthOptions(GrowthCriteria(0.0), seed=top).round_seed(5) == (top * 1000 + 5) % 2**63
    assert 0 <= GrowthOptions(GrowthCriteria(0.0), seed=10**30).round_seed(0) <= top


def _good_log(tmp_path) -> Path:
    log = tmp_path / "g.jsonl"
    run_growth(("a", "b"), fk.FakeSteps({d: 1.0 - 0.05 * d for d in range(20)}), fk.FakeDecide(),
               fk.options(max_rounds=3), log_path=log)
    return log


def _damage(log: Path, how: str) -> None:
    lines = log.read_bytes().split(b"\n")[:-1]  # header, round 0, 1, 2
    if how == "truncated":
        log.write_bytes(b"\n".join(lines[:3]) + b"\n" + lines[3][: len(lines[3]) // 2])
    elif how == "missing key":
        entry = json.loads(lines[2])
        del entry["seed"]
        lines[2] = json.dumps(entry).encode()
        log.write_bytes(b"\n".join(lines) + b"\n")
    elif how == "deep nesting":
        lines[2] = b"[" * 100_000 + b"]" * 100_000
        log.write_bytes(b"\n".join(lines) + b"\n")
    elif how == "round skipped":
        log.write_bytes(b"\n".join([lines[0], lines[1], lines[3]]) + b"\n")
    elif how == "another file":  # a PNG given as the log: no final newline, but its first line is already no JSON
        log.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    elif how == "duplicate key":  # a hand-edited round: which round is it? json keeps the last, silently
        lines[2] = lines[2].replace(b'{"round":', b'{"round":7,"round":', 1)
        log.write_bytes(b"\n".join(lines) + b"\n")
    elif how == "wrong type":
        entry = json.loads(lines[1])
        entry["round"] = "0"
        lines[1] = json.dumps(entry).encode()
        log.write_bytes(b"\n".join(lines) + b"\n")


@pytest.mark.parametrize("how, line, says", [
    ("truncated", 4, "incomplete last line"), ("missing key", 3, "missing key 'seed'"),
    ("deep nesting", 3, "nested too deeply"), ("round skipped", 3, "round 2 where round 1 was expected"),
    ("wrong type", 2, "key 'round' has a value of type str"),
    ("duplicate key", 3, "key 'round' appears twice in one object"),
    ("another file", 1, "not valid JSON"),  # not 'line 3: incomplete last line ... delete that line to resume'
])
def test_log_damage_is_one_line_naming_the_file_and_line(tmp_path, how, line, says):
    log = _good_log(tmp_path)
    _damage(log, how)
    with pytest.raises(GrowthLogError) as caught:
        read_growth_log(log)
    message = str(caught.value)
    assert message.startswith(f"{log} line {line}: ") and says in message and "\n" not in message
    decide = fk.FakeDecide()
    with pytest.raises(GrowthLogError, match=f"line {line}: "):  # resuming refuses it the same way, before work
        run_growth(("a", "b"), fk.FakeSteps({2: 1.0}), decide, fk.options(max_rounds=3), log_path=log)
    assert decide.calls == 0


def test_a_second_run_on_a_log_in_use_is_refused_and_the_log_stays_consecutive(tmp_path):
    log = tmp_path / "g.jsonl"
    refused = []

    def second_run(model, k):
        if k == 1:  # the first run holds the log, between its rounds 0 and 1
            with pytest.raises(GrowthLogError, match="in use by another run"):
                run_growth(("a", "b"), fk.FakeSteps({2: 1.0}), fk.FakeDecide(), fk.options(max_rounds=3),
                           log_path=log)
            refused.append(k)

    curve = {d: 1.0 - 0.05 * d for d in range(20)}
    run_growth(("a", "b"), fk.FakeSteps(curve, on_train=second_run), fk.FakeDecide(), fk.options(max_rounds=3),
               log_path=log)
    assert refused == [1]
    assert [r.round for r in read_growth_log(log).rounds] == [0, 1, 2]


@pytest.mark.slow
def test_concurrent_processes_on_one_log_never_interleave(tmp_path):
    """Two processes started together: whichever holds the lock runs; the other is refused or, if it
    comes after, returns the finished log. Either way the log is one run's, rounds 0..5."""
    log = tmp_path / "g.jsonl"
    code = ("import sys; from zoo import growth_fakes as fk\n"
            "from satcore import GrowthLogError\n"
            "try:\n    print(fk.run_one(%r).stop_reason)\n"
            "except GrowthLogError as e:\n    print('refused', e)\n") % str(log)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(o == "max_rounds" or (o.startswith("refused") and "in use by another run" in o) for o in outs)
    contents = read_growth_log(log)
    assert [r.round for r in contents.rounds] == list(range(6))
    assert log.read_bytes().count(b"satcore_growth_log") == 1


def test_the_log_line_is_compact_and_reads_back_exactly(tmp_path):
    log = _good_log(tmp_path)
    rounds = read_growth_log(log).rounds
    rows = [{"name": f"transformer.h.{i}", "growth_value": i / 8, "p_value_adjusted": 0.01,
             "verdict": "improvable", "growth_value_interval": [0.1, 0.2], "predicted_gain": 1e-3,
             "predicted_gain_interval": [1e-4, 2e-3], "probe_size_to_decide": None} for i in range(6)]
    entry = rounds[0].__class__(**{**rounds[0].to_dict(), "candidates": rows})
    line = encode_round(entry)
    verbose = json.dumps(entry.to_dict()).encode()
    assert len(line) < 0.6 * len(verbose)
    header = log.read_bytes().split(b"\n")[0]
    (back,) = parse_log(header + b"\n" + line, "x").rounds
    assert back.candidates == rows  # these values have fewer than 9 significant digits: exact
    whole = entry.__class__(**{**entry.to_dict(), "train_loss_before": 1 / 3, "heldout_change": -2 / 3})
    (back,) = parse_log(header + b"\n" + encode_round(whole), "x").rounds
    assert back.train_loss_before == 0.333333333 and back.heldout_change == -0.666666667
    assert back.to_dict() | {"train_loss_before": 1 / 3, "heldout_change": -2 / 3} == whole.to_dict()


def test_weights_are_written_only_for_kept_rounds(tmp_path):
    steps = fk.FakeSteps({2: 1.0, 3: 0.9, 4: 1.4}, jitter=0.01)
    log = tmp_path / "g.jsonl"
    result = run_growth(("a", "b"), steps, fk.FakeDecide(), fk.options(), log_path=log)
    assert result.stop_reason == "heldout_knee"
    assert [os.path.basename(p) for p in steps.saved] == ["g.jsonl.round0.json"]  # round 1 was rolled back
    again = run_growth(("a", "b"), fk.FakeSteps({2: 1.0}), fk.FakeDecide(), fk.options(), log_path=log)
    assert again.model == result.model and again.depth == 3


def test_round_decision_of_a_decision_without_candidates():
    class Bare:
        choice, stop_reason = None, "saturated"

        def to_dict(self):
            return {}

    d = RoundDecision.of(Bare())
    assert d.candidates == [] and d.stop_reason == "saturated" and d.details is None
