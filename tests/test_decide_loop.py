"""The trial decision's loop in the core (:func:`satcore.adapter_api.trial_decision`) and torch ``decide`` on it.

* The loop against a trial protocol written here in NumPy (losses linear in the steps taken, in closed form):
  which candidates are started, to which steps they run, which are set aside and resumed, and the curves,
  cost, choice and paired margin against the closed form.
* torch ``decide`` on the core loop: three small decisions (the even plan, successive halving, a grouped plan
  with a screen-only row) against the core's loop run on the recipe's trials written out plainly in torch
  (:class:`PlainTorchTrials`), on the same model, probe, data and seed: the trials' curves, the choice, the stop
  reason, the cost and the margin.  Both run this host's kernels, so the test holds on any host and thread count
  (values recorded from a zoo model trained on one CPU do not: its float32 round-off differs on another).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from satcore import DecisionPolicy, InputError, Recipe, TrialSettings
from satcore._decisions.trials import Calibration, TrialCurve
from satcore.adapter_api import ScreenRow, check_unexpanded_losses, trial_decision

NORMAL = Calibration(1.0, 0.0, (0.025, 0.16, 0.5, 0.84, 0.975), (-1.96, -0.994, 0.0, 0.994, 1.96), 0.5, 0.0,
                     "normal residuals (test)")


class LinearTrials:
    """Trials whose per-sample losses after ``t`` steps are ``before + rate * t * weights`` (closed form), logging
    every call the loop makes."""

    def __init__(self, before: dict, rates: dict, weights: dict):
        self.before, self.rates, self.weights, self.log = before, rates, weights, []

    def losses_after(self, name: str, split: str, steps: int) -> np.ndarray:
        return self.before[split] + self.rates[name] * steps * self.weights[split]

    def start(self, at: str):
        self.log.append((at, "start", 0))
        return LinearTrial(self, at)


class LinearTrial:
    def __init__(self, source: LinearTrials, at: str):
        self.source, self.at, self.done, self.suspended = source, at, 0, False

    def run_to(self, step: int) -> None:
        assert not self.suspended and step >= self.done
        self.source.log.append((self.at, "run_to", step))
        self.done = step

    def losses(self, split: str) -> np.ndarray:
        assert not self.suspended
        return self.source.losses_after(self.at, split, self.done)

    def suspend(self) -> None:
        self.source.log.append((self.at, "suspend", self.done))
        self.suspended = True

    def resume(self) -> None:
        self.source.log.append((self.at, "resume", self.done))
        self.suspended = False


def _linear_problem():
    rng = np.random.default_rng(0)
    before = {"heldout": rng.uniform(1, 2, 40), "train": rng.uniform(1, 2, 60)}
    weights = {"heldout": rng.uniform(0.5, 1.5, 40), "train": rng.uniform(0.5, 1.5, 60)}
    # a: gains fastest, b: slower, c: harms; d: screen only (the screen ranks it last)
    rates = {"a": -0.004, "b": -0.002, "c": 0.003}
    screened = [ScreenRow("c", -0.3, -0.3, (-0.5, -0.1), 0.9), ScreenRow("a", -0.2, -0.25, (-0.4, 0.0), 0.8),
                ScreenRow("d", -0.05, -0.1, (-0.2, 0.1), 0.6), ScreenRow("b", -0.1, -0.1, (-0.3, 0.1), 0.7)]
    return LinearTrials(before, rates, weights), screened


def _closed_curve(trials: LinearTrials, name: str, points) -> TrialCurve:
    after = {s: np.stack([trials.losses_after(name, s, t) for t in points]) for s in ("heldout", "train")}
    return TrialCurve.from_losses(points, trials.before["heldout"], after["heldout"], trials.before["train"],
                                  after["train"])


def test_the_even_plan_runs_each_trial_once_to_its_checkpoints():
    """24 steps over the screen's first 3 (c, a, b): each started once and run to 2, 4 and 8 steps, never set
    aside; its curve is the closed form's; the harmful one is not chosen, the fastest gain is."""
    trials, screened = _linear_problem()
    recipe = Recipe("adam", 1e-3, 24, 8)
    d = trial_decision(trials, screened, trials.before, recipe, TrialSettings(max_trials=3, calibration=NORMAL))
    assert list(d.candidates) == ["c", "a", "b", "d"]  # the screen's order
    assert trials.log == [(n, e, s) for n in "cab" for e, s in (("start", 0), ("run_to", 2), ("run_to", 4),
                                                                  ("run_to", 8))]
    for name in "cab":
        assert d.candidates[name].trial == _closed_curve(trials, name, (2, 4, 8))
    row = d.candidates["d"]  # not trialled: the screen's prediction, never chosen
    assert not row.verified and row.predicted_heldout_change == row.screen_heldout_change == -0.05
    assert d.choice == "a" and d.runner_up == "b" and d.cost_block_steps == 24 and d.heldout_samples == 40
    difference = trials.losses_after("b", "heldout", 8) - trials.losses_after("a", "heldout", 8)
    assert d.margin_se == pytest.approx(difference.std(ddof=1) / math.sqrt(40), rel=1e-12)


def test_halving_sets_every_trial_aside_and_resumes_only_the_finalists():
    """halving_plan(3 of 24 steps) = (3, T1 4, 2 finalists, T2 10): every trial runs to 1, 2, 4 and is set aside;
    the two lowest held-out changes at 4 steps (a, b) are resumed and run on to 5 and 10; c is eliminated
    with its T1 curve and never chosen."""
    trials, screened = _linear_problem()
    recipe = Recipe("adam", 1e-3, 24, 8)
    d = trial_decision(trials, screened, trials.before, recipe,
                       TrialSettings(max_trials=3, schedule="halving", calibration=NORMAL))
    first = [(n, e, s) for n in "cab" for e, s in (("start", 0), ("run_to", 1), ("run_to", 2), ("run_to", 4),
                                                    ("suspend", 4))]
    assert trials.log == first + [(n, e, s) for n in "ab" for e, s in (("resume", 4), ("run_to", 5), ("run_to", 10))]
    assert d.candidates["c"].eliminated and d.candidates["c"].trial == _closed_curve(trials, "c", (1, 2, 4))
    for name in "ab":
        assert not d.candidates[name].eliminated and d.candidates[name].trial == _closed_curve(trials, name,
                                                                                                (2, 5, 10))
    assert d.choice == "a" and d.cost_block_steps == 3 * 4 + 2 * (10 - 4) == 24


class FamilyTrials(LinearTrials):
    """:class:`LinearTrials` whose trials name the family they train, each candidate its own."""

    def __init__(self, trials: LinearTrials, families: dict):
        super().__init__(trials.before, trials.rates, trials.weights)
        self.families = families

    def start(self, at: str):
        trial = super().start(at)
        trial.family = self.families[at]
        return trial


@pytest.mark.parametrize("schedule", ["even", "halving"])
def test_the_decision_records_the_family_each_trial_trained_and_the_family_requested(schedule):
    """Each verified candidate's ``trial_family`` is the one its trial named (eliminated ones too), a screen-only
    row has none, the decision carries the requested family as given; a trial that names none (the protocol before
    the field) leaves ``trial_family`` None and the printed decision without the line."""
    linear, screened = _linear_problem()
    families = {"a": "conv", "b": "mlp", "c": "conv", "d": "linear"}
    settings = TrialSettings(max_trials=3, schedule=schedule, calibration=NORMAL)
    recipe = Recipe("adam", 1e-3, 24, 8)
    d = trial_decision(FamilyTrials(linear, families), screened, linear.before, recipe, settings,
                       requested_family="auto")
    assert {n: c.trial_family for n, c in d.candidates.items()} == {"c": "conv", "a": "conv", "d": None, "b": "mlp"}
    assert d.requested_family == "auto"
    assert d.to_dict()["requested_family"] == "auto"
    assert {n: c["trial_family"] for n, c in d.to_dict()["candidates"].items()} == \
        {"c": "conv", "a": "conv", "d": None, "b": "mlp"}
    assert "\ntrials trained: conv branch at c, a; mlp branch at b (family auto)\n" in str(d)
    # the rows are the screen's ranking, and the legend says so (they read as unordered beside the trials' numbers)
    rows = [line.split()[0] for line in str(d).splitlines() if line.split()[:1] and line.split()[0] in families]
    screen = {row.name: row.heldout_change for row in screened}
    assert rows == sorted(screen, key=screen.get) == list(d.candidates)
    assert "rows: in the first-order screen's ranking (its largest decrease first)" in str(d)
    silent = trial_decision(linear, screened, linear.before, recipe, settings)
    assert all(c.trial_family is None for c in silent.candidates.values()) and silent.requested_family is None
    assert "trials trained" not in str(silent)
    # the rest of the decision does not depend on the families recorded
    assert silent.to_dict() == d.to_dict() | {
        "requested_family": None,
        "candidates": {n: c | {"trial_family": None} for n, c in d.to_dict()["candidates"].items()}}


def test_grouped_trials_and_the_settings_refusals():
    """Groups spread the trials (each group's first in the screen's order); the settings refuse a schedule or
    max_trials they cannot run and default the calibration by schedule; losses no trial can start from are
    refused."""
    trials, screened = _linear_problem()
    d = trial_decision(trials, screened, trials.before, Recipe("sgd", 0.1, 12, 8),
                       TrialSettings(max_trials=2, calibration=NORMAL, groups=(("a", "c"), ("b", "d"))))
    assert [n for n, c in d.candidates.items() if c.verified] == ["c", "b"]
    assert {e for _, e, _ in trials.log} == {"start", "run_to"}
    with pytest.raises(InputError, match="schedule must be 'halving' or 'even'"):
        TrialSettings(schedule="thirds")
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(InputError, match="max_trials must be a positive integer"):
            TrialSettings(max_trials=bad)
    assert TrialSettings(max_trials=np.int64(2)).max_trials == 2
    assert TrialSettings(schedule="halving").calibration != TrialSettings().calibration
    with pytest.raises(InputError, match="holds 1 sample"):
        check_unexpanded_losses({"heldout": np.ones(1), "train": np.ones(3)})
    with pytest.raises(InputError, match="not finite on 1 of 3 training samples"):
        check_unexpanded_losses({"heldout": np.ones(2), "train": np.array([1.0, np.nan, 1.0])})


# -- torch decide on the core loop, against trials written out plainly here --------------------------------------
torch = pytest.importorskip("torch")
from zoo.models_torch import digits, digits_resnet, per_sample_ce  # noqa: E402

from satcore.adapters.torch import decide, grow, probe_splits  # noqa: E402
from satcore.adapters.torch.decide import decision_probe_options, screen  # noqa: E402

EPS32 = float(np.finfo(np.float32).eps)
NAMES = ["layer1.0", "layer1.1", "layer2.1"]


class PlainTorchTrials:
    """The trials :func:`satcore.adapters.torch.decide` documents, written out with torch alone: the zero-output
    block of the probe's family inserted in a copy (:func:`grow` with ``zero=True``), the recipe's scope trained
    (``"terminal"``: the branch's zero-initialised projection; ``"block"``: the whole branch; the rest frozen), in
    eval mode, by the recipe's optimizer on ``batch_size`` minibatches of the pooled training samples (a fresh
    permutation each pass from a generator seeded with the policy's seed, the remainder dropped), on the mean of
    the per-sample losses.  A trial is never set aside: ``suspend``/``resume`` keep it as it is, so the adapter's
    rebuilt-and-restored trials are checked against uninterrupted ones."""

    def __init__(self, model, probed, recipe: Recipe, train: list, evaluate: dict, seed: int):
        self.model, self.probed, self.recipe, self.evaluate, self.seed = model, probed, recipe, evaluate, seed
        self.inputs, self.targets = torch.cat([x for x, _ in train]), torch.cat([t for _, t in train])

    def minibatches(self):
        gen, n, size = torch.Generator().manual_seed(self.seed), len(self.inputs), self.recipe.batch_size
        while True:
            order = torch.randperm(n, generator=gen)
            for start in range(0, n - size + 1, size):
                idx = order[start : start + size]
                yield self.inputs[idx], self.targets[idx]

    def start(self, at: str):
        return PlainTorchTrial(self, at)


class PlainTorchTrial:
    """One candidate's trial of :class:`PlainTorchTrials`: its copy, optimizer and minibatch stream."""

    def __init__(self, source: PlainTorchTrials, at: str):
        self.source, self.done = source, 0
        self.model = grow(source.model, source.probed, at, zero=True).model.eval()
        branch = self.model.get_submodule(at).branch
        scope = branch.projection if source.recipe.trainable == "terminal" else branch
        self.model.requires_grad_(False)
        scope.requires_grad_(True)
        optimizer = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[source.recipe.optimizer]
        self.optimizer = optimizer(scope.parameters(), lr=source.recipe.lr)
        self.stream = source.minibatches()

    def run_to(self, step: int) -> None:
        for _ in range(step - self.done):
            x, y = next(self.stream)
            self.optimizer.zero_grad()
            per_sample_ce(self.model(x), y).mean().backward()
            self.optimizer.step()
        self.done = step

    def losses(self, split: str) -> np.ndarray:
        return plain_losses(self.model, self.source.evaluate[split])

    def suspend(self) -> None:
        pass

    def resume(self) -> None:
        pass


@torch.no_grad()
def plain_losses(model, batches) -> np.ndarray:
    return torch.cat([per_sample_ce(model(x), y) for x, y in batches]).double().numpy()


# the recipes' steps, shared by the trials: even, 3 trials of 8 steps read at 2, 4, 8; halving, 3 trials to 4 steps
# (read at 1, 2, 4) and the 2 finalists resumed to 10 (curves read at 2, 5, 10); grouped, 1 trial per group of 6 steps
PLANS = {
    "even": (dict(recipe=Recipe("adam", 1e-2, 24, 16, "block"), seed=2), {(2, 4, 8): 3}, 0),
    "halving": (dict(recipe=Recipe("adam", 1e-2, 24, 16, "terminal"), seed=2, schedule="halving"),
                {(1, 2, 4): 1, (2, 5, 10): 2}, 1),
    "grouped": (dict(recipe=Recipe("sgd", 5e-2, 12, 16, "block"), seed=1, max_trials=2,
                     groups=[["layer1.0", "layer1.1"], ["layer2.1"]]), {(1, 3, 6): 2}, 0),
}


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_torch_decide_is_the_core_loop_on_the_trials_its_recipe_describes(plan):
    """torch ``decide`` (even, halving, grouped) against the core's :func:`trial_decision` run on
    :class:`PlainTorchTrials` from the same probe: the same unexpanded losses, screen, curves, choice, stop
    reason, cost and margin.  Both train with this host's kernels, so the comparison holds on any host and
    thread count, where values recorded from one trained model do not (its 150 float32 Adam steps round off
    differently on other CPUs, and so do the model, the trials and the decision)."""
    X, y = digits()
    train = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 96, 32)]
    heldout = [(X[i : i + 32], y[i : i + 32]) for i in range(1200, 1264, 32)]
    call, curves, eliminated = PLANS[plan]
    call = dict(call)
    settings = TrialSettings(max_trials=call.pop("max_trials", 4), schedule=call.pop("schedule", "even"),
                             calibration=NORMAL, groups=call.pop("groups", None))
    policy = DecisionPolicy(call.pop("recipe"), trials=settings, candidates=NAMES, **call)
    model = digits_resnet()
    d = decide(model, train, heldout, per_sample_ce, policy=policy)

    before = {"heldout": plain_losses(model, heldout), "train": plain_losses(model, train)}
    splits = probe_splits(model, train, heldout, per_sample_ce, **decision_probe_options(policy))
    rows = screen(splits, policy.recipe)
    trials = PlainTorchTrials(model, splits.train, policy.recipe, train, {"heldout": heldout, "train": train},
                              policy.seed)
    ref = trial_decision(trials, rows.values(), before, policy.recipe, settings)

    # the plan's shape does not depend on the model's values
    assert d.cost_block_steps == policy.recipe.steps
    verified = {n: c for n, c in d.candidates.items() if c.verified}
    assert len(verified) == sum(curves.values())
    assert {s: sum(c.trial.steps == s for c in verified.values()) for s in curves} == curves
    assert sum(c.eliminated for c in verified.values()) == eliminated
    if plan == "grouped":  # one trial per group: layer2.1 and the screen's first of layer1.0 and layer1.1
        assert "layer2.1" in verified

    # float32 losses averaged in float64: a forward pass's round-off, relative to the loss
    assert d.heldout_loss == pytest.approx(before["heldout"].mean(), rel=16 * EPS32)
    assert d.heldout_samples == ref.heldout_samples == 64
    assert list(d.candidates) == list(ref.candidates) == list(rows)
    # the trials' steps carry each step's float32 round-off on (losses ~0.1-1, at most the recipe's 24 steps)
    tol = 16 * EPS32 * (1 + policy.recipe.steps)
    for name, c in d.candidates.items():
        r = ref.candidates[name]
        assert c.screen_heldout_change == pytest.approx(rows[name].heldout_change, rel=16 * EPS32)
        assert (c.verified, c.eliminated) == (r.verified, r.eliminated)
        assert c.trial_family == ("conv" if c.verified else None)  # the probe's family at every candidate
        if c.verified:
            assert c.trial.steps == r.trial.steps
            np.testing.assert_allclose(c.trial.heldout_change, r.trial.heldout_change, rtol=0, atol=tol)
            np.testing.assert_allclose(c.trial.training_change, r.trial.training_change, rtol=0, atol=tol)
            assert c.trial.heldout_se == pytest.approx(r.trial.heldout_se, rel=0, abs=tol)
    assert (d.choice, d.runner_up, d.stop_reason, d.cost_block_steps) == \
        (ref.choice, ref.runner_up, ref.stop_reason, ref.cost_block_steps)
    assert (d.margin is None) == (ref.margin is None) and (d.margin_se is None) == (ref.margin_se is None)
    if d.margin is not None:
        np.testing.assert_allclose(d.margin, ref.margin, rtol=0, atol=tol)
    if d.margin_se is not None:
        np.testing.assert_allclose(d.margin_se, ref.margin_se, rtol=0, atol=tol)
