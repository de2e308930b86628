"""A growth round that enlarges its probe while inconclusive (``first_look_batches``), on the digits ResNet.

The schedule's level split across looks is measured in ``tests/test_look_schedule.py``; here:
the enlarged round decides where its first look alone cannot, its statistics are those of a
one-shot probe of the batches it used, and a strong signal stops at the first look.
"""

from __future__ import annotations

import re

import pytest
import torch

from zoo import models_torch as mt
from satcore import GrowthBudget, GrowthCriteria, GrowthOptions, InputError
from satcore.adapters.torch import grow_until_saturated, probe, sequence_loss


def _keep(model, round_index):
    return model


@pytest.fixture(scope="module")
def weak():
    """A digits ResNet trained 150 steps, probed on single held-out images: a weak signal per sample."""
    return mt.digits_resnet(steps=150).double(), mt.digits_batches(1, 256, dtype=torch.float64)


def test_an_inconclusive_first_look_is_enlarged_until_it_decides(weak):
    model, data = weak
    grown = grow_until_saturated(model, _keep, data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), first_look_batches=16)).rounds[0]
    assert grown.probe_looks > 1 and grown.probe_samples > 16
    # looks at 16, 32, 64, 128 batches at 0.025 / 4 each, at 256 at 0.025
    assert grown.look_alpha == pytest.approx(0.025 if grown.probe_samples == 256 else 0.025 / 4)
    assert grown.verdict == "improvable" and grown.inserted_at is not None
    # the first 16 batches alone, even at the full alpha, cannot decide
    first = grow_until_saturated(model, _keep, data[:16], mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1))).rounds[0]
    assert first.verdict == "inconclusive" and first.stop_reason == "inconclusive" and first.probe_looks == 1
    # the enlarged round's statistics are a one-shot probe's over the batches it used
    one_shot = probe(model, data[: grown.probe_samples], mt.per_sample_ce, family="native", seed=0, split="probe")
    scores = {c.name: c for c in one_shot.report(alpha=grown.look_alpha, tolerance=0.0, rho=0.01).candidates}
    for row in grown.candidates:
        assert row["growth_value"] == pytest.approx(scores[row["name"]].growth_value, rel=1e-12)


def test_a_strong_signal_stops_at_the_first_look(capsys):
    model = mt.gpt2(steps=10).double()
    data = [(ids, ids) for ids, _ in mt.text_batches(24, 2, 64)]
    result = grow_until_saturated(model, _keep, data, sequence_loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), first_look_batches=16, progress=True))
    r = result.rounds[0]
    # the round's line ends at the depth the run reports (it once said the depth the round started at only)
    assert f"round 0: depth {result.depth - 1} -> {result.depth}, block at {r.inserted_at}," in capsys.readouterr().err
    assert r.probe_looks == 1 and r.probe_samples == 32 and r.inserted_at is not None
    assert r.look_alpha == pytest.approx(0.025 / 2)  # a first look of 3 planned (16, 32, 64 batches)


def test_a_first_look_as_large_as_the_split_is_one_look_at_alpha_and_progress_is_shown(weak, capsys):
    model, data = weak
    few = data[:20]
    r = grow_until_saturated(model, _keep, few, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), first_look_batches=64, progress=True)).rounds[0]
    assert r.probe_looks == 1 and r.probe_samples == 20 and r.look_alpha == 0.05
    plain = grow_until_saturated(model, _keep, few, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1))).rounds[0]
    assert [c["growth_value"] for c in r.candidates] == [c["growth_value"] for c in plain.candidates]
    err = capsys.readouterr().err
    assert "sample" in err  # the tqdm bar counts samples, as probe(progress=True) does
    # one line a round; whether this weak signal inserts or stops moves with the host's float rounding
    assert re.search(r"round 0: depth \d+( -> \d+, block at \S+, training loss \S+ -> \S+|; stop: \S+) \(", err)
    # an iterator would be spent by the first look: refused before round 0, naming it
    with pytest.raises(InputError, match="grow_until_saturated's probe_data is a one-shot iterator"):
        grow_until_saturated(model, _keep, iter(few), mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), first_look_batches=4))
