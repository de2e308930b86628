"""grow_until_saturated on a real Hugging Face GPT-2 (from a config) and Debian licence text:
insertions preserve the function, the stop reasons follow the verdicts, a killed run resumes to
the same log as an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from zoo import models_torch as mt
from satcore.adapters.torch import find_blocks, grow_until_saturated, sequence_loss
from satcore import GrowthBudget, GrowthCriteria, GrowthLogError, GrowthOptions, read_growth_log


def _setup():
    torch.manual_seed(0)
    model = mt.gpt2(steps=10).double()  # briefly trained: depth still helps
    probe_data = [(ids, ids) for ids, _ in mt.text_batches(24, 4, 16)]  # 16 batches: one per fold
    heldout = [(ids, ids) for ids, _ in mt.text_batches(24, 8, 2, offset=24 * 4 * 16)]
    return model, probe_data, heldout


def _train(model, round_index, steps=3):
    torch.manual_seed(100 + round_index)  # deterministic per round, so a resumed run trains alike
    return mt._train_lm(model.double(), steps=steps, seed=round_index)


def _loss(outputs, labels):
    return sequence_loss(outputs, labels)


@pytest.fixture(scope="module")
def setup():
    return _setup()


def test_grows_where_improvable_and_each_insertion_preserves_the_function(setup):
    model, probe_data, heldout = setup
    result = grow_until_saturated(model, _train, probe_data, _loss, heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0, rho=0.01), GrowthBudget(max_depth=4, max_rounds=4)))
    assert len(find_blocks(model)) == 2  # the input model is untouched
    inserted = [r for r in result.rounds if r.inserted_at is not None]
    assert inserted and result.depth == 2 + len(inserted)
    for r in inserted:
        assert r.verdict == "improvable"
        chosen = next(c for c in r.candidates if c["name"] == r.inserted_at)
        assert chosen["verdict"] == "improvable" and chosen["predicted_gain"] > 0
        assert chosen["predicted_gain"] == max(c["predicted_gain"] or 0 for c in r.candidates
                                               if c["verdict"] == "improvable")
        # a zero-output block: the loss right after insertion is the loss before it
        assert r.loss_after_insert == pytest.approx(r.train_loss_before, rel=1e-12)
    assert result.stop_reason in ("max_depth", "max_rounds", "inconclusive", "no gain above tolerance")
    if result.stop_reason == "max_depth":
        assert result.depth == 4


def test_hugging_face_dict_batches_need_no_loss_and_guard_as_pairs_do(setup):
    """``DataCollator``-style batches (``input_ids``, ``attention_mask``, ``labels``) with ``loss_fn=None``, the
    model's own per-sample loss, as ``probe`` and ``decide`` take them: the round and its held-out guard measure
    what the same windows as ``(ids, ids)`` pairs with ``sequence_loss`` give (before: the guard unpacked each
    mapping's keys as ``(inputs, targets)``, "too many values to unpack")."""
    model, probe_data, heldout = setup

    def as_dicts(batches):
        return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids} for ids, _ in batches]

    pairs = grow_until_saturated(model, _train, probe_data, _loss, heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1)))
    dicts = grow_until_saturated(model, _train, as_dicts(probe_data), None, heldout_data=as_dicts(heldout), options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1)))
    a, b = pairs.rounds[0], dicts.rounds[0]
    assert a.inserted_at == b.inserted_at is not None
    assert b.heldout_change == pytest.approx(a.heldout_change, rel=1e-9, abs=1e-12)
    assert b.heldout_change_se == pytest.approx(a.heldout_change_se, rel=1e-9)


def test_a_tolerance_no_block_can_reach_stops_at_once(setup):
    model, probe_data, _ = setup
    result = grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=1e3, rho=0.01)))
    assert len(result.rounds) == 1 and result.rounds[0].inserted_at is None
    assert result.stop_reason in ("saturated", "no gain above tolerance")
    assert result.depth == 2


def test_killed_run_resumes_to_the_uninterrupted_log(setup, tmp_path):
    model, probe_data, heldout = setup
    whole = tmp_path / "whole.jsonl"
    grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=4, max_rounds=3), log_path=whole))

    class Killed(Exception):
        pass

    def train_then_die(m, k):
        if k == 1:
            raise Killed
        return _train(m, k)

    part = tmp_path / "part.jsonl"
    with pytest.raises(Killed):
        grow_until_saturated(model, train_then_die, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=4, max_rounds=3), log_path=part))
    resumed = grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=4, max_rounds=3), log_path=part))
    a = [r.to_dict() for r in read_growth_log(whole).rounds]
    b = [r.to_dict() for r in read_growth_log(part).rounds]
    assert len(a) == 3
    drop = ("probe_seconds", "train_seconds")
    assert [{k: v for k, v in e.items() if k not in drop} for e in a] == \
           [{k: v for k, v in e.items() if k not in drop} for e in b]
    assert resumed.depth == 2 + sum(e["inserted_at"] is not None for e in a)


def test_a_stopped_run_called_again_returns_its_trained_model(setup, tmp_path):
    """The log's last round is a stop round (it writes no weights): the model comes back as trained, not as
    the input model with untrained zero blocks re-inserted."""
    model, probe_data, _ = setup
    log = tmp_path / "run.jsonl"
    first = grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=3, max_rounds=3), log_path=log))
    assert first.stop_reason == "max_depth" and first.rounds[-1].inserted_at is None
    again = grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=3, max_rounds=3), log_path=log))
    assert again.stop_reason == first.stop_reason and len(again.rounds) == len(first.rounds)
    trained, resumed = first.model.state_dict(), again.model.state_dict()
    assert trained.keys() == resumed.keys()
    for key in trained:
        assert torch.equal(trained[key], resumed[key]), key
    (tmp_path / "run.jsonl.round0.pt").unlink()  # a missing weights file is said, not silently skipped
    with pytest.raises(GrowthLogError, match="round0.pt.*missing"):
        grow_until_saturated(model, _train, probe_data, _loss, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_depth=3, max_rounds=3), log_path=log))
