"""The growth loop on models without a native block kind, its held-out guard, and its weights files.

A user's own residual MLP in an ``nn.Sequential`` (no name or structure rule finds its blocks:
``candidates=[names]``), float64, trained on sklearn digits.  Against independent references:

* the generic block is the zero-output residual of the probed family at the round's seed: the
  grown model's outputs equal the old one's bit for bit, its feature map equals the probe's, and
  the autograd gradient of the mean probe loss w.r.t. its zero ``V`` equals the probe's ``C``;
* a ``train`` that harms the held-out loss beyond noise is rolled back: the result computes what
  the model before the round did, bit for bit, and the stop is ``heldout_knee``;
* a killed run resumes (generic blocks rebuilt from the logged family) to the uninterrupted log
  and weights;
* weights files: a planted link is replaced, not followed; a file that would inflate, another
  model's weights, and pickled code are refused in one line naming the file, before unpickling.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from zoo import models_torch as mt
from zoo.models_torch import Residual
from satcore import (DecisionPolicy, GrowthBudget, GrowthCriteria, GrowthLogError, GrowthOptions, InputError,
                     TrialSettings,
                     read_growth_log)
from satcore.adapters.torch import ProbeConfig, grow_until_saturated, probe
from satcore.adapters.torch.grow import InsertedResidual
from satcore.adapters.torch.growth import load_weights, save_weights

ROOT = Path(__file__).resolve().parents[1]  # the subprocess imports zoo and this checkout's satcore from here
CANDIDATES = ["1", "2"]


def residual_sequential(seed=0, steps=30):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), Residual(64), Residual(64), nn.Linear(64, 10)).double()
    X, y = mt.digits()
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        idx = torch.randint(0, 1000, (64,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx].double()), y[idx]).backward()
        opt.step()
    return model.eval()


def train_inserted(model, round_index, steps=20):
    """Adam on the inserted blocks' projections only, seeded by the round (deterministic)."""
    X, y = mt.digits()
    g = torch.Generator().manual_seed(100 + round_index)
    params = [m.branch.projection.weight for m in model.modules() if isinstance(m, InsertedResidual)]
    opt = torch.optim.Adam(params, lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, 1000, (64,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[idx].double()), y[idx]).backward()
        opt.step()
    return model


@pytest.fixture(scope="module")
def setup():
    model = residual_sequential()
    probe_data = mt.digits_batches(32, 16, start=1000, dtype=torch.float64)  # 16 batches: one per fold
    heldout = mt.digits_batches(60, 4, start=1550, dtype=torch.float64)
    return model, probe_data, heldout


def test_the_native_default_on_a_model_without_blocks_says_which_family_to_pass(setup):
    """``grow_until_saturated``'s default ``family="native"`` on a user's ``nn.Sequential``: the refusal
    names the family to pass, not the candidate the user named correctly ("unknown candidate '1'; the
    blocks of Sequential are []")."""
    from satcore import ProbeError

    model, probe_data, _ = setup
    with pytest.raises(ProbeError, match=r"no residual blocks recognised in Sequential.*"
                                         r"instead: options=GrowthOptions\(probe=ProbeConfig\(family='auto'\)\), a kind or an nn.Module"):
        grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), probe=ProbeConfig(family="native", candidates=CANDIDATES)))


def test_the_native_default_on_recognised_blocks_of_no_native_kind_says_which_family_to_pass(setup):
    """The user's residual blocks in ``self.blocks`` (recognised by name) but of their own class: the default
    ``family="native"`` is refused naming the family to pass, as for a model without recognised blocks."""
    from satcore import ProbeError

    class Net(nn.Module):
        def __init__(self, source):
            super().__init__()
            self.flat, self.blocks, self.out = source[0], nn.Sequential(source[1], source[2]), source[3]

        def forward(self, x):
            return self.out(self.blocks(self.flat(x)))

    model, probe_data, _ = setup
    with pytest.raises(ProbeError, match=r"no native insertion for Residual.*instead: options=GrowthOptions\(probe=ProbeConfig\(family='auto'\)\), a kind or an nn.Module$"):
        grow_until_saturated(Net(model), train_inserted, probe_data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1)))


def test_a_sequential_without_a_native_kind_grows_with_the_probed_family(setup):
    model, probe_data, heldout = setup
    result = grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=3), probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    for r in result.rounds:
        assert r.inserted_at in CANDIDATES and r.inserted_block["family"]["kind"] == "mlp"
        assert r.loss_after_insert == pytest.approx(r.train_loss_before, rel=1e-14)
    # measured: held-out -0.33 (se 0.14), -0.09 (0.09), then +0.06 (0.11): within noise, kept, and no gain
    first, last = result.rounds[0], result.rounds[-1]
    assert first.heldout_change < -2 * first.heldout_change_se
    assert 0 < last.heldout_change < 1.6448536269514722 * last.heldout_change_se
    assert result.stop_reason == "heldout gain below tolerance" and len(result.rounds) == 3
    assert not any(r.rolled_back for r in result.rounds) and result.depth == 5
    assert sum(isinstance(m, InsertedResidual) for m in result.model.modules()) == 3


def test_the_generic_block_is_the_one_the_probe_measured(setup):
    """Insert at round 0 without training; compare with a probe at the same seed."""
    model, probe_data, _ = setup
    result = grow_until_saturated(model, lambda m, k: m, probe_data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    (r,) = result.rounds
    grown = result.model
    x = torch.cat([b[0] for b in probe_data])
    assert torch.equal(grown(x), model(x))  # zero-output: bit for bit
    reference = probe(model, probe_data, mt.per_sample_ce, family="mlp", seed=r.seed, candidates=CANDIDATES)
    wrapper = grown.get_submodule(r.inserted_at)
    z = torch.randn(7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(wrapper.branch.features(z), reference.families[r.inserted_at](z))
    # autograd: d(mean probe loss)/dV at V = 0 is C = (1/M) sum_i q_i psi_i^T
    grown.zero_grad()
    losses = torch.cat([mt.per_sample_ce(grown(b[0]), b[1]) for b in probe_data])
    losses.mean().backward()
    gradient = wrapper.branch.projection.weight.grad.numpy()
    C = reference.statistics[r.inserted_at].cross_gradient()
    assert gradient == pytest.approx(C, rel=1e-9, abs=1e-12 * abs(C).max())


def _harm(model, round_index):
    """A 'training' that sets the new block's projection to large values: the held-out loss rises."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, InsertedResidual):
                w = m.branch.projection.weight
                w.copy_(torch.randn(w.shape, dtype=w.dtype, generator=torch.Generator().manual_seed(round_index)))
    return model


def test_a_harm_beyond_noise_is_rolled_back_to_the_model_before_the_round(setup):
    model, probe_data, heldout = setup
    result = grow_until_saturated(model, _harm, probe_data, mt.per_sample_ce, heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=3), probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    (r,) = result.rounds
    assert r.rolled_back and result.stop_reason == "heldout_knee" and result.depth == 2
    assert r.heldout_change > 1.6448536269514722 * r.heldout_change_se > 0
    x = torch.cat([b[0] for b in heldout])
    assert torch.equal(result.model(x), model(x))
    assert not any(isinstance(m, InsertedResidual) for m in result.model.modules())


@pytest.mark.slow
def test_a_killed_generic_run_resumes_to_the_same_log_and_weights(setup, tmp_path):
    model, probe_data, heldout = setup
    def kw(log_path):
        return dict(heldout_data=heldout, options=GrowthOptions(
            GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=3), guard=None,
            probe=ProbeConfig(family="mlp", candidates=CANDIDATES), log_path=log_path))

    whole = grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, **kw(tmp_path / "w.jsonl"))

    def die(m, k):
        if k == 2:
            raise KeyboardInterrupt
        return train_inserted(m, k)

    with pytest.raises(KeyboardInterrupt):
        grow_until_saturated(model, die, probe_data, mt.per_sample_ce, **kw(tmp_path / "p.jsonl"))
    resumed = grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, **kw(tmp_path / "p.jsonl"))
    drop = ("probe_seconds", "train_seconds")
    logs = [[{k: v for k, v in r.to_dict().items() if k not in drop} for r in read_growth_log(p).rounds]
            for p in (tmp_path / "w.jsonl", tmp_path / "p.jsonl")]
    assert logs[0] == logs[1] and len(logs[0]) == 3
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_planted_link_at_the_weights_name_is_replaced_not_followed(setup, tmp_path):
    model, probe_data, _ = setup
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "g.jsonl.round0.pt")
    grow_until_saturated(model, lambda m, k: m, probe_data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), log_path=tmp_path / "g.jsonl", probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    assert victim.read_text() == "keep me"
    weights = tmp_path / "g.jsonl.round0.pt"
    assert not weights.is_symlink() and weights.is_file()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".part")]


def test_weights_of_another_model_or_with_code_are_refused_naming_the_file(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    path = str(tmp_path / "w.pt")
    save_weights(nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 2)), path)
    with pytest.raises(GrowthLogError, match=r"w\.pt: key '0\.weight' has shape \(5, 4\), the model's \(3, 4\)"):
        load_weights(model, path)
    torch.save({"0.weight": torch.zeros(3, 4), "0.bias": torch.zeros(3), "1.weight": torch.zeros(2, 3),
                "1.bias": torch.zeros(2), "x": os.system}, path)  # a pickled callable
    with pytest.raises(GrowthLogError, match=r"w\.pt: cannot be read as weights"):
        load_weights(model, path)
    save_weights(model, path)
    assert load_weights(nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), path) is not None


INFLATING = """
import sys, zipfile, torch
big, path = sys.argv[1], sys.argv[2]
torch.save({"weight": torch.zeros(100_000_000)}, big)  # 400 MB of float32 zeros
with zipfile.ZipFile(big) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
    for info in source.infolist():
        with source.open(info) as src, out.open(info.filename, "w", force_zip64=True) as dst:
            while chunk := src.read(2**22):
                dst.write(chunk)
"""


@pytest.mark.slow
def test_weights_that_would_inflate_are_refused_before_reading(tmp_path):
    """The file torch.load would inflate to 400 MB (its tensor's storage deflated) is ~0.4 MB on disk."""
    path = str(tmp_path / "w.pt")
    subprocess.run([sys.executable, "-c", INFLATING, str(tmp_path / "big.pt"), path], check=True, timeout=300)
    os.unlink(tmp_path / "big.pt")
    assert os.path.getsize(path) < 2**20
    model = nn.Linear(4, 3, bias=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GrowthLogError, match=r"w\.pt: member '.*' is compressed"):
        load_weights(model, path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # kB: nothing inflated


@pytest.mark.slow
def test_a_full_disk_while_saving_weights_is_one_line_and_leaves_no_file(tmp_path):
    """RLIMIT_FSIZE (with SIGXFSZ ignored) makes the weights write fail as a full disk does."""
    code = f"""
import resource, signal
import torch
from torch import nn
from satcore import SatcoreError
from satcore import GrowthBudget, GrowthCriteria, GrowthOptions
from satcore.adapters.torch import ProbeConfig, grow_until_saturated
from zoo.models_torch import Residual
from zoo import models_torch as mt
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), Residual(64), Residual(64), nn.Linear(64, 10)).double()
data = mt.digits_batches(32, 16, dtype=torch.float64)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
try:
    grow_until_saturated(model, lambda m, k: m, data, mt.per_sample_ce, options=GrowthOptions(
        GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), probe=ProbeConfig(family="mlp", candidates=["1", "2"]),
        log_path={str(tmp_path / "g.jsonl")!r}))
except SatcoreError as e:
    print("ERROR", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR ") and "g.jsonl.round0.pt: cannot write" in lines[0], \
        out.stdout + out.stderr
    assert sorted(os.listdir(tmp_path)) == ["g.jsonl"]  # no weights, no partial file
    assert read_growth_log(tmp_path / "g.jsonl").rounds == ()  # the round is not claimed: a resume redoes it


class ConvResidual(nn.Module):
    """A user's own conv residual block (names no rule recognises)."""

    def __init__(self, channels):
        super().__init__()
        self.a, self.b = nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, z):
        return z + self.b(torch.relu(self.a(z)))


def test_a_users_own_conv_resnet_grows_with_the_conv_family():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), ConvResidual(4), ConvResidual(4), nn.Flatten(),
                          nn.Linear(4 * 64, 10)).double().eval()
    data = mt.digits_batches(16, 16, start=1000, dtype=torch.float64)
    result = grow_until_saturated(model, lambda m, k: m, data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), probe=ProbeConfig(family="conv", candidates=["1", "2"])))
    (r,) = result.rounds
    assert r.inserted_at is not None and r.inserted_block["family"]["kind"] == "conv" and result.depth == 3
    x = torch.cat([b[0] for b in data])
    assert torch.equal(result.model(x), model(x))
    wrapper = result.model.get_submodule("2" if r.inserted_at == "head" else r.inserted_at)  # head: after "2"
    result.model.zero_grad()
    torch.cat([mt.per_sample_ce(result.model(b[0]), b[1]) for b in data]).mean().backward()
    gradient = wrapper.branch.projection.weight.grad.reshape(4, -1).numpy()  # V as (C, C_mid * 9)
    reference = probe(model, data, mt.per_sample_ce, family="conv", seed=r.seed, candidates=["1", "2"])
    C = reference.statistics[r.inserted_at].cross_gradient()
    assert gradient == pytest.approx(C, rel=1e-9, abs=1e-12 * abs(C).max())


def test_a_recipe_decides_each_round_with_decide_on_the_same_model(setup, capsys):
    """``recipe=`` makes each round's decision :func:`decide`'s: the first round logs exactly the decision
    ``decide`` gives, called by hand on the same model, splits and seed (an independent call).  Called as
    docs/growth.md shows it, without the first-order ``tolerance`` that a recipe's decision does not read.
    Its progress bar counts the decision's batches of work, as many as ``decide`` reports by hand (a bar of
    rounds stood still through a whole round's trials)."""
    from satcore import Recipe
    from satcore.adapters.torch import decide

    model, probe_data, heldout = setup
    train_data = mt.digits_batches(64, 8, start=0, dtype=torch.float64)
    recipe = Recipe("adam", lr=1e-3, steps=16, batch_size=64, trainable="terminal")
    result = grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=heldout, train_data=train_data, options=GrowthOptions(budget=GrowthBudget(max_rounds=1), progress=True, probe=ProbeConfig(family="mlp", candidates=CANDIDATES)), policy=DecisionPolicy(recipe))
    err = capsys.readouterr().err
    counted = []
    by_hand = decide(model, train_data, probe_data, mt.per_sample_ce, policy=DecisionPolicy(recipe, seed=0, candidates=CANDIDATES, probe=ProbeConfig(family="mlp")), progress=counted.append)
    assert len(counted) > 8 and f"growth: {sum(counted)}batch " in err and "sample" not in err
    assert "round 0: depth " in err  # and the round's line
    first = result.rounds[0]
    assert by_hand.choice in CANDIDATES and first.inserted_at == by_hand.choice
    assert first.decision["cost_block_steps"] == by_hand.cost_block_steps <= recipe.steps
    assert first.decision["recipe"] == recipe.to_dict()
    with pytest.raises(ValueError, match="needs train_data"):
        grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, options=GrowthOptions(GrowthCriteria(tolerance=0.0), probe=ProbeConfig(family="mlp", candidates=CANDIDATES)), policy=DecisionPolicy(recipe))
    with pytest.raises(InputError, match="needs tolerance="):  # the first-order decision reads it
        grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, options=GrowthOptions(probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))


def test_the_policys_trials_reach_each_rounds_decision(setup):
    """The policy's trial settings (here the halving schedule) reach each round's decision: the first round logs
    the decision ``decide`` gives by hand under the same policy, at the round's seed, on the run's places and
    family (before: passed as ``decide_options={...}``, whose misplaced keys were refused by a guard of their own;
    the policy's fields are typed, so there is nothing to misplace)."""
    from satcore import Recipe
    from satcore.adapters.torch import decide

    model, probe_data, heldout = setup
    train_data = mt.digits_batches(64, 8, start=0, dtype=torch.float64)
    recipe = Recipe("adam", lr=1e-3, steps=16, batch_size=64, trainable="terminal")
    policy = DecisionPolicy(recipe, trials=TrialSettings(schedule="halving"))
    result = grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=heldout,
                                  train_data=train_data, policy=policy, options=GrowthOptions(
                                      budget=GrowthBudget(max_rounds=1),
                                      probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    by_hand = decide(model, train_data, probe_data, mt.per_sample_ce, policy=DecisionPolicy(
        recipe, trials=TrialSettings(schedule="halving"), candidates=CANDIDATES, probe=ProbeConfig(family="mlp")))
    logged = {row["name"]: row for row in result.rounds[0].candidates}
    assert logged == by_hand.to_dict()["candidates"]
    assert any(c.eliminated for c in by_hand.candidates.values())  # halving ran: the logged rows say so too


class _InsertAt:
    """A decide step that always inserts at ``at`` (no probe): the loop's own checks are under test."""

    def __init__(self, at):
        self.choice, self.stop_reason = at, None

    def __call__(self, model, seed):
        return self

    def to_dict(self):
        return {"candidates": {}}


def test_a_train_returning_none_or_empty_loss_data_is_one_line_naming_it(setup):
    """A ``train`` that trains in place and returns nothing, and a held-out or training split without
    batches, are refused as :class:`satcore.InputError` naming the cause, not numpy's or an attribute error."""
    from satcore import InputError

    model, probe_data, heldout = setup
    common = dict(policy=_InsertAt("1"), options=GrowthOptions(budget=GrowthBudget(max_rounds=1),
                                                              probe=ProbeConfig(family="mlp", candidates=CANDIDATES)))
    with pytest.raises(InputError, match=r"train\(model, 0\) returned None; it must return the trained model"):
        grow_until_saturated(model, lambda m, k: None, probe_data, mt.per_sample_ce, heldout_data=heldout, **common)
    with pytest.raises(InputError, match="grow_until_saturated's heldout_data holds no batches"):
        grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=[], **common)
    with pytest.raises(InputError, match="grow_until_saturated's train_data holds no batches"):
        grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, train_data=[], **common)


def test_a_heldout_split_of_the_probes_own_batches_warns_once_where_the_decision_reads_them(setup):
    """``heldout_data`` holding ``probe_data``'s batches (the same list, or the same batch objects reordered) makes
    the guard read the data each round's place was chosen on: one ``UserWarning`` per run, at the caller's line,
    for the first-order probe and for a ``DecisionPolicy`` (whose trials read ``probe_data`` as their held-out
    split).  Silent: a split of other batches, copies of the batches (values are not compared: that would read
    both splits whole) and a callable decide, which does not read ``probe_data``."""
    import warnings

    from satcore import Recipe

    model, probe_data, heldout = setup
    probed = ProbeConfig(family="mlp", candidates=CANDIDATES)
    rounds = GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=2), probe=probed)
    none = GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=0), probe=probed)
    policy = DecisionPolicy(Recipe("adam", lr=1e-3, steps=16, batch_size=64, trainable="terminal"))
    says = "heldout_data holds the same batches as probe_data"
    for same, options, by in [(probe_data, rounds, None), (probe_data[::-1], none, None),
                              (tuple(probe_data), none, policy)]:
        with pytest.warns(UserWarning, match=says) as caught:
            grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=same,
                                 train_data=heldout, options=options, policy=by)
        assert [w.filename for w in caught if says in str(w.message)] == [__file__]
    copies = [(x.clone(), y.clone()) for x, y in probe_data]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for other, by in [(heldout, None), (copies, None), (probe_data, _InsertAt("1")), (probe_data[:-1], None)]:
            grow_until_saturated(model, train_inserted, probe_data, mt.per_sample_ce, heldout_data=other,
                                 options=none, policy=by)


def test_a_user_feature_map_with_batchnorm_is_measured_and_grown_in_eval_mode(setup):
    """A user's ``nn.Module`` family holding a BatchNorm, in train mode as built: the probe reads its
    width and computes ``psi`` in eval mode (a train-mode BatchNorm refuses the one sample the width is
    read from, and would make ``psi_i`` depend on the batch), so the autograd gradient of the mean probe
    loss w.r.t. the grown block's zero ``V`` equals the probe's ``C``."""
    import numpy as np

    from satcore.adapters.torch import grow

    model, probe_data, _ = setup
    torch.manual_seed(3)
    user = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Tanh()).double()
    with torch.no_grad():  # running statistics away from the identity, so that eval mode shows
        user[1].running_mean.uniform_(-1.0, 1.0)
        user[1].running_var.uniform_(0.5, 2.0)
    result = probe(model, probe_data, mt.per_sample_ce, family=user, candidates=CANDIDATES)
    grown = grow(model, result, "1", zero=True).model
    x = torch.cat([b[0] for b in probe_data])
    assert torch.equal(grown(x), model(x))
    grown.zero_grad()
    torch.cat([mt.per_sample_ce(grown(b[0]), b[1]) for b in probe_data]).mean().backward()
    gradient = grown.get_submodule("1").branch.projection.weight.grad.numpy()
    C = result.statistics["1"].cross_gradient()
    # both are means of len(x) products accumulated in float64
    assert np.abs(gradient - C).max() <= len(x) * np.finfo(np.float64).eps * np.abs(C).max()


@pytest.mark.parametrize("bad, says", [
    (dict(candidates=None), "no residual blocks recognised in Sequential; pass candidates="),
    (dict(candidates=["9"]), "candidate '9' is not a submodule name of Sequential"),
    (dict(candidates=[]), "candidates is empty"),
    (dict(head=False), "policy: probe: the places are the policy's"),
    (dict(family="convv"), "unknown family 'convv'"),
    (dict(family="conv"), "family='conv' needs a"),
    (dict(family=nn.Flatten(0)), "feature map returned shape"),
    (dict(family={"7": "mlp"}), r"family given for unknown candidate\(s\) \['7'\]"),
    (dict(heldout=[]), "data yielded no batches"),
])
def test_what_decide_cannot_probe_is_one_satcore_error_naming_it(setup, bad, says):
    """A model without recognised blocks, a wrong candidate or family, a user feature map of the wrong
    shape and an empty split are refused as :class:`satcore.SatcoreError` (the one root), not a bare
    ``ValueError`` from inside the adapter."""
    from satcore import Recipe, SatcoreError
    from satcore.adapters.torch import decide

    model, probe_data, _ = setup
    options = dict(candidates=CANDIDATES, family="auto", heldout=probe_data) | bad
    heldout, candidates = options.pop("heldout"), options.pop("candidates")
    with pytest.raises(SatcoreError, match=says):
        policy = DecisionPolicy(Recipe("adam", lr=1e-3, steps=2, batch_size=32), candidates=candidates,
                                probe=ProbeConfig(**options))
        decide(model, probe_data[:2], heldout, mt.per_sample_ce, policy=policy)
