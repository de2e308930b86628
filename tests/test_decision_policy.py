"""``satcore.DecisionPolicy``: each field's constraint refused once, naming the field; frozen; and one policy object
giving the same decision, to the bit, through ``decide``, a training-loop callback's evaluation and a growth run's
first round."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from satcore import (DecisionPolicy, GrowthBudget, GrowthCriteria, GrowthOptions, InputError, Recipe, TrialSettings,
                     adapter_api)

RECIPE = Recipe("adam", 1e-2, 12, 32)


@pytest.mark.parametrize("fields, message", [
    ({"recipe": {"optimizer": "adam"}}, r"^policy: recipe must be a satcore.Recipe, got dict$"),
    ({"trials": {"max_trials": 2}}, r"^policy: trials must be a satcore.TrialSettings, got dict$"),
    ({"candidates": "layer1"}, r"^policy: candidates must be None or a list of place names, got 'layer1'$"),
    ({"candidates": ["layer1", 2]}, r"^policy: candidates must be None or a list of place names"),
    ({"seed": -1}, r"^policy: seed: -1 is not in the range 0\.\.9223372036854775807$"),
    ({"seed": 1.0}, r"^policy: seed must be a whole number, got 1\.0 \(float\)$"),
    ({"max_statistics_bytes": 0}, r"^policy: max_statistics_bytes: 0 is not in the range 1\.\."),
    ({"max_statistics_bytes": True}, r"^policy: max_statistics_bytes must be a whole number, got True"),
    ({"probe": {"family": "mlp"}}, r"^policy: probe must be an adapter's frozen probe options .*got dict$"),
])
def test_each_bad_field_is_one_message_naming_it(fields, message):
    with pytest.raises(InputError, match=message):
        DecisionPolicy(**({"recipe": RECIPE} | fields))


def test_the_trial_settings_and_the_probe_keep_their_own_constraints():
    """The trials' fields are checked by ``TrialSettings`` (the one reader of ``max_trials``, its message kept), a
    probe's by its ``ProbeConfig``; the policy refuses a probe that names places (they are the policy's)."""
    torch_adapter = pytest.importorskip("satcore.adapters.torch")
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(InputError, match=rf"^trials: max_trials must be a positive integer, got {bad!r}$"):
            TrialSettings(max_trials=bad)
    with pytest.raises(InputError, match=r"^trials: schedule must be 'halving' or 'even'"):
        TrialSettings(schedule="thirds")
    for probe in (torch_adapter.ProbeConfig(candidates=["layer1"]), torch_adapter.ProbeConfig(head=False)):
        with pytest.raises(InputError, match=r"^policy: probe: the places are the policy's; give them as "
                                             r"DecisionPolicy\(candidates=\[\.\.\.\]\)"):
            DecisionPolicy(RECIPE, probe=probe)


def test_recipe_is_the_shorthand_and_both_or_neither_is_refused():
    policy = DecisionPolicy(RECIPE)
    assert DecisionPolicy.of(RECIPE) == policy and DecisionPolicy.of(policy=policy) is policy
    with pytest.raises(InputError, match=r"^decide: give recipe= \(the shorthand of DecisionPolicy\(recipe=\.\.\.\)\) "
                                         r"or policy=, not both$"):
        DecisionPolicy.of(RECIPE, policy)
    with pytest.raises(InputError, match=r"^expand: give recipe=satcore.Recipe\(\.\.\.\) or policy="):
        DecisionPolicy.of(by="expand")
    with pytest.raises(InputError, match=r"^decide: policy must be a satcore.DecisionPolicy, got Recipe$"):
        DecisionPolicy.of(policy=RECIPE)


def test_the_policy_and_the_run_options_are_frozen_and_normalised():
    policy = DecisionPolicy(RECIPE, candidates=["a", "head"], seed=np.int64(3), max_statistics_bytes=np.uint32(9))
    assert (policy.candidates, policy.seed, policy.max_statistics_bytes) == (("a", "head"), 3, 9)
    assert type(policy.seed) is int and type(policy.max_statistics_bytes) is int
    assert policy.trials == TrialSettings() and hash(policy) == hash(DecisionPolicy(RECIPE, candidates=("a", "head"),
                                                                                    seed=3, max_statistics_bytes=9))
    for frozen, field in ((policy, "seed"), (policy.trials, "max_trials"), (GrowthOptions(), "log_path")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, 1)
    assert policy.with_seed(7) == dataclasses.replace(policy, seed=7) and policy.seed == 3
    assert adapter_api.DecisionPolicy is DecisionPolicy


def test_growth_options_need_a_tolerance_only_for_first_order_decisions():
    with pytest.raises(InputError, match=r"^growth options: criteria: the growth loop needs tolerance= for its "
                                         r"first-order decisions"):
        GrowthOptions().deciding(first_order=True)
    recorded = GrowthOptions().deciding(first_order=False)
    assert recorded.criteria == GrowthCriteria(0.0) and recorded.settings() == GrowthOptions(GrowthCriteria(0.0)).settings()
    with pytest.raises(InputError, match=r"^growth options: probe must be an adapter's frozen probe options"):
        GrowthOptions(probe={"family": "mlp"})


def test_one_policy_decides_alike_through_decide_a_callback_and_a_growth_round():
    """The same policy object: ``decide``, a training-loop callback's evaluation (:func:`callback_report`, what
    ``HFCallback`` and ``LightningCallback`` run) and the first round of ``grow_until_saturated`` give the same
    decision to the bit, where they overlap (the round decides at seed ``seed * 1000``: the policy's seed there)."""
    torch = pytest.importorskip("torch")
    from zoo.models_torch import digits, digits_resnet, per_sample_ce
    from satcore.adapters.torch import ProbeConfig, decide, grow_until_saturated
    from satcore.adapters.base import callback_scalars
    from satcore.adapters.torch.callback_common import callback_report, callback_settings

    X, y = digits()
    train = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 96, 32)]
    heldout = [(X[i : i + 32], y[i : i + 32]) for i in range(1200, 1264, 32)]
    policy = DecisionPolicy(RECIPE, trials=TrialSettings(max_trials=2), candidates=["layer1.1", "layer2.1", "head"],
                            probe=ProbeConfig(family="mlp", n_features=16))
    model = digits_resnet()
    direct = decide(model, train, heldout, per_sample_ce, policy=policy).to_dict()
    config, decision = callback_settings("HFCallback", heldout, ProbeConfig(), policy, train)
    report = callback_report(model, heldout, per_sample_ce, config, {}, decision)
    assert report.decision.to_dict() == direct
    assert callback_scalars(report, "satcore/")["satcore/decision/cost_block_steps"] == direct["cost_block_steps"]
    rounds = grow_until_saturated(model, lambda m, k: m, heldout, per_sample_ce, train_data=train,
                                  options=GrowthOptions(budget=GrowthBudget(max_rounds=1)), policy=policy).rounds
    assert rounds[0].seed == 0 == policy.seed
    assert {row["name"]: row for row in rounds[0].candidates} == direct["candidates"]
    assert rounds[0].inserted_at == direct["choice"]
    assert torch.equal(model.fc.weight, digits_resnet().fc.weight)  # nothing above modified the user's model


@pytest.mark.parametrize("build, message", [
    (lambda: TrialSettings(groups=5), r"^trials: groups must be a list of lists of candidate names, got int$"),
    (lambda: TrialSettings(groups=["ab"]), r"^trials: groups must be a list of lists of candidate names, got a group str$"),
    (lambda: TrialSettings(groups=[[0, 1]]), r"^trials: groups: a group's entries must be candidate names \(str\)"),
    (lambda: TrialSettings(max_trials=-1), r"^trials: max_trials must be a positive integer, got -1$"),
    (lambda: TrialSettings(schedule="fast"), r"^trials: schedule must be 'halving' or 'even', got 'fast'$"),
    (lambda: GrowthBudget(max_rounds=-1), r"^growth: max_rounds must be a whole number >= 0, got -1$"),
    (lambda: GrowthBudget(max_depth=-2), r"^growth: max_depth must be a whole number >= 0, got -2$"),
    (lambda: GrowthCriteria(tolerance=0.1, alpha=2.0), r"^growth: alpha must be a number in \[0, 1\], got 2\.0$"),
    (lambda: GrowthOptions().deciding(first_order=True), r"^growth options: criteria: the growth loop needs tolerance="),
])
def test_options_refuse_a_field_when_built_in_one_input_error_naming_it(build, message):
    """Each options object checks its fields when built (docs/api.md "Options"), with its own prefix: no
    ``decide:`` where no decide ran, no raw ``TypeError`` from iterating a number."""
    with pytest.raises(InputError, match=message):
        build()
    assert TrialSettings(groups=[["a", "b"], ("head",)]).groups == (("a", "b"), ("head",))


def test_probe_config_refuses_a_family_the_probe_would_refuse_when_built():
    torch_adapter = pytest.importorskip("satcore.adapters.torch")
    from torch import nn

    for family in ("nope", {"layer1": "mlp", "layer2": "nope"}):
        with pytest.raises(InputError, match=r"^probe: family: unknown family 'nope'; choose 'auto', one of"):
            torch_adapter.ProbeConfig(family=family)
    for family in ("auto", "native", "mlp", "conv", nn.Identity(), {"layer1": "native", "layer2": nn.Identity()}):
        assert torch_adapter.ProbeConfig(family=family).family is family


@pytest.mark.parametrize("seed, message", [
    (-1, r"^probe: seed: -1 is not in the range 0\.\.9223372036854775807$"),
    (2**70, r"^probe: seed: 1180591620717411303424 is not in the range 0\.\.9223372036854775807$"),
    (1.5, r"^probe: seed must be a whole number, got 1\.5 \(float\)$"),
    (True, r"^probe: seed must be a whole number, got True \(bool\)$"),
])
def test_probe_config_refuses_a_seed_outside_the_policys_range_when_built(seed, message):
    """A probe's seed is checked when its ``ProbeConfig`` is built, in the range of a ``DecisionPolicy``'s: -1 and
    1.5 reached NumPy's generator at the first batch (its ``ValueError`` / ``TypeError``), True and 2**70 passed."""
    torch_adapter = pytest.importorskip("satcore.adapters.torch")
    with pytest.raises(InputError, match=message):
        torch_adapter.ProbeConfig(seed=seed)
    with pytest.raises(InputError, match=message.replace("probe: seed", "policy: seed")):
        DecisionPolicy(Recipe("sgd", 0.1, 4, 32), seed=seed)  # the same range
    assert torch_adapter.ProbeConfig(seed=2**63 - 1).seed == 2**63 - 1


def test_expansion_options_check_their_fields_when_built():
    torch_adapter = pytest.importorskip("satcore.adapters.torch")
    for fields, message in (({"layout": "diagonal"}, r"^expansion options: layout must be one of ranked, grouped, got "
                                                      r"'diagonal'$"),
                            ({"init": "zero"}, r"^expansion options: init must be one of copy, fresh, got 'zero'$"),
                            ({"decision": "vote"}, r"^expansion options: decision must be one of trial, screen"),
                            ({"train_new_only": "yes"}, r"^expansion options: train_new_only must be True or False"),
                            ({"max_blocks": 0}, r"^expansion options: max_blocks: 0 is not in the range 1\.\.")):
        with pytest.raises(InputError, match=message):
            torch_adapter.ExpansionOptions(**fields)
    assert torch_adapter.ExpansionOptions(max_blocks=np.int64(2)).max_blocks == 2
