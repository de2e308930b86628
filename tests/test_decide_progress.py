"""``decide(..., progress=...)``: one count of the decision's batches of work, its bar's total the plan's.

The unit is a batch of work: each batch of the unexpanded model's evaluation of both splits, each batch the
probe reads (every pass's), each optimizer step of a trial and each batch of its readings of both splits.  The
expected totals are worked out here by hand from the recipe's steps, the schedule and the data's batches (the
independent reference); the decision is the same, bit for bit, whether it counts or not.
"""

from __future__ import annotations

import json
import re

import pytest

from zoo.models_torch import digits, digits_resnet, per_sample_ce
from satcore import DecisionPolicy, InputError, Recipe, TrialSettings
from satcore.adapters.torch import decide
from satcore.adapters.torch.probe import ProbeConfig, plan

CANDIDATES = ["layer1.1", "layer2.1", "head"]


def _data(start, n, batch):
    X, y = digits()
    return [(X[i : i + batch], y[i : i + batch]) for i in range(start, start + n, batch)]


def _policy(schedule="even", steps=24, **fields):
    return DecisionPolicy(Recipe("adam", 1e-3, steps, 16, "block"), trials=TrialSettings(schedule=schedule),
                          candidates=CANDIDATES, seed=2, **fields)


# 4 training and 3 held-out batches (E = 7): the model's evaluation 7 and the probe's 7, then the trials of the 3
# candidates on the recipe's 24 steps.  Even: 8 steps each, read at steps 2, 4 and 8: 3 (8 + 3 * 7) = 87.
# Halving: 4 steps each, read at 1, 2 and 4; the 2 finalists on to 4 + (24 - 12) // 2 = 10, read at 5 and 10:
# 3 * 4 + 2 * 6 = 24 steps, (3 * 3 + 2 * 2) * 7 = 91 batches read.
@pytest.mark.parametrize("schedule, total", [("even", 7 + 7 + 87), ("halving", 7 + 7 + 24 + 91)])
def test_the_increments_add_up_to_the_planned_batches_and_the_decision_is_unchanged(schedule, total):
    model, train, heldout = digits_resnet(), _data(0, 128, 32), _data(1200, 96, 32)
    increments = []
    counted = decide(model, train, heldout, per_sample_ce, policy=_policy(schedule), progress=increments.append)
    silent = decide(model, train, heldout, per_sample_ce, policy=_policy(schedule))
    assert counted.cost_block_steps == 24 and all(c.verified for c in counted.candidates.values())
    assert set(increments) == {1} and len(increments) == total
    assert json.dumps(counted.to_dict()) == json.dumps(silent.to_dict())  # every float, to the last bit
    assert counted.choice == silent.choice


def test_the_bar_goes_to_stderr_and_ends_at_its_total_the_probes_of_an_earlier_pass_included(capsys):
    """Under a statistics budget ``layer1.1`` is probed in a pass of its own; its trial probes that pass's
    training split again (3 batches), which the bar's total takes in when it happens."""
    model, train, heldout = digits_resnet(), _data(0, 96, 32), _data(1200, 64, 32)
    memory = plan(model, train[0], per_sample_ce, candidates=CANDIDATES[:2], seed=2)
    size = {c.name: c.sums_bytes for c in memory.candidates}
    budget = 2 * (size["layer2.1"] + size["head"])
    assert memory.passes(budget, splits=2) == [("layer1.1",), ("layer2.1", "head")]
    policy = _policy(steps=12, max_statistics_bytes=budget, probe=ProbeConfig(family="auto"))
    increments = []
    decided = decide(model, train, heldout, per_sample_ce, policy=policy, progress=increments.append)
    assert decided.candidates["layer1.1"].verified
    # E = 5: the model 5, two probe passes 10, layer1.1's group again 3, 3 trials of 4 steps read at 1, 2, 4
    total = 5 + 2 * 5 + 3 + 3 * (4 + 3 * 5)
    assert len(increments) == total
    capsys.readouterr()
    decide(model, train, heldout, per_sample_ce, policy=policy, progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    assert "trials" in err and f"{total}/{total}" in err
    # each phase is named once: "probe: ...", not "probe: : ..."
    segments = [part for part in err.replace("\n", "\r").split("\r") if ":" in part]
    phases = {part.split(":")[0] for part in segments}
    assert {"decide", "model", "probe", "trials"} <= phases and ": :" not in err
    # each phase shows its total from when it is named: the model's E, then the probe's 2 passes of E each
    # ("probe:  67%|...| 10/15", once "probe: 10batch")
    for phase, phase_total in [("model", 5), ("probe", 5 + 2 * 5)]:
        shown = [part for part in segments if part.startswith(f"{phase}:")]
        assert shown and all(re.search(rf"\| \d+/{phase_total} \[", part) for part in shown), shown


@pytest.mark.parametrize("bad", [3, "yes", 0.5])
def test_a_progress_that_is_neither_a_bool_nor_a_callable_is_refused_in_one_line(bad):
    with pytest.raises(InputError, match="progress must be True, False or a callable") as refused:
        decide(digits_resnet(), _data(0, 64, 32), _data(1200, 64, 32), per_sample_ce, policy=_policy(),
               progress=bad)
    assert "\n" not in str(refused.value) and repr(bad) in str(refused.value)


def test_the_bar_is_closed_when_the_decision_is_refused_after_it_opened(monkeypatch):
    """``decide`` counts inside ``with ProgressCounter(...)``: a refusal raised once the bar is open (the held-out
    split is one batch, checked after the counter is made) still ends the bar, once."""
    from satcore.adapters.base import ProgressCounter

    closed = []
    monkeypatch.setattr(ProgressCounter, "close", lambda self: closed.append(self.bar is not None))
    with pytest.raises(InputError, match="the held-out data is one batch"):
        decide(digits_resnet(), _data(0, 64, 32), _data(1200, 32, 32)[0], per_sample_ce, policy=_policy(),
               progress=True)
    assert closed == [True]
