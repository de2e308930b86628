"""The trial decision's loop in the core (:func:`satcore.adapter_api.trial_decision`) and torch ``decide`` on it.

* The loop against a trial protocol written here in NumPy (losses linear in the steps taken, in closed form):
  which candidates are started, to which steps they run, which are set aside and resumed, and the curves,
  cost, choice and paired margin against the closed form.
* torch ``decide`` after its loop moved into the core: three small fixed decisions (the even plan, successive
  halving, a grouped plan with a screen-only row) against the values the earlier ``decide`` (its own loop)
  recorded on the same models, data and seeds.  On the recording host they are equal to the bit (the whole
  ``to_dict()``); elsewhere float32 round-off of other kernels is allowed for (tolerances below).
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


# -- torch decide on the core loop: values recorded from the earlier decide ---------------------------------------
torch = pytest.importorskip("torch")
from zoo.models_torch import digits, digits_resnet, per_sample_ce  # noqa: E402

EPS32 = float(np.finfo(np.float32).eps)

from satcore.adapters.torch import decide  # noqa: E402

NAMES = ["layer1.0", "layer1.1", "layer2.1"]
# name: (screen change, eliminated, (steps, held-out changes, training changes, held-out se) or None)
RECORDED = {
    "even": {
        "call": dict(recipe=Recipe("adam", 1e-2, 24, 16, "block"), seed=2),
        "decision": ("layer1.0", None, 24, 0.10126138445642141, (0.033402404275580756, 0.04011637853735851)),
        "candidates": {
            "layer1.1": (-7.088664377574001, False, ((2, 4, 8), (0.06871358067169808, -0.028361969883775373,
                         -0.010275832341960722), (0.05021690541282927, -0.0051791853387233786, -0.004053614768963602),
                         0.005205918593123744)),
            "layer1.0": (-3.8794064849394263, False, ((2, 4, 8), (0.17519195886407601, -0.0762050355118955,
                         -0.059679658539142366), (0.11364164631565168, -0.00028982378495830824, -0.005658852289892973),
                         0.039596345545010826)),
            "layer2.1": (-3.867447026705803, False, ((2, 4, 8), (0.03645039175887632, -0.009448770775946969,
                         -0.005826428354396285), (0.007421382351064189, 0.000581590377350949, -0.00032953314818466584),
                         0.004493554423782533)),
        },
    },
    "halving": {
        "call": dict(recipe=Recipe("adam", 1e-2, 24, 16, "terminal"), seed=2, schedule="halving"),
        # recorded as "no_credible_decrease"; layer1.1's trial, +0.188 +- 1.96 * 0.096, reaches past minus the stop
        # tolerance: the held-out data (64 samples) does not resolve the stop
        "decision": (None, "heldout_too_small", 24, 0.10126138445642141, None),
        "candidates": {
            "layer1.1": (-7.088664377574001, True, ((1, 2, 4), (-0.037052786335600274, 0.1585271955371752,
                         0.1875690070449716), (0.06826679463741434, 0.1533864921998429, 0.4533171464703753),
                         0.09644942700421227)),
            "layer1.0": (-3.8794064849394263, False, ((2, 5, 10), (0.1759393871898567, -0.0151715929558347,
                         0.048384618708830374), (0.11043042829267807, 0.12998629774206893, 0.14514137320065856),
                         0.04773184518869513)),
            "layer2.1": (-3.867447026705803, False, ((2, 5, 10), (0.11575187051030866, -0.0389901202045122,
                         0.01125246257474366), (0.05259990163456981, 0.042807782533638296, -0.010817393802350733),
                         0.03732456546146325)),
        },
    },
    "grouped": {
        "call": dict(recipe=Recipe("sgd", 5e-2, 12, 16, "block"), seed=1, max_trials=2,
                     groups=[["layer1.0", "layer1.1"], ["layer2.1"]]),
        "decision": ("layer2.1", None, 12, 0.10126138445642141, (0.07003917772905766, 0.016373130879754224)),
        "candidates": {
            "layer1.1": (-2.2206084714513423, False, ((1, 3, 6), (0.04170533654219877, 0.01251784973558756,
                         0.00946427199221489), (0.2583003318783371, 0.006392553746233411, 0.005117338183026732),
                         0.00904179461806883)),
            "layer1.0": (-0.4499418491581512, False, None),
            "layer2.1": (-0.21529113176663456, False, ((1, 3, 6), (-0.029723672661305045, 0.006014414016235037,
                         -0.0288070347319902), (0.0033510267027547017, -0.0039809196829689135, -0.012563855901362334),
                         0.01863251635812743)),
        },
    },
}


@pytest.mark.parametrize("plan", sorted(RECORDED))
def test_torch_decide_gives_the_decision_recorded_before_its_loop_moved_into_the_core(plan):
    X, y = digits()
    train = [(X[i : i + 32], y[i : i + 32]) for i in range(0, 96, 32)]
    heldout = [(X[i : i + 32], y[i : i + 32]) for i in range(1200, 1264, 32)]
    recorded = RECORDED[plan]
    call = dict(recorded["call"])
    trials = TrialSettings(max_trials=call.pop("max_trials", 4), schedule=call.pop("schedule", "even"),
                           calibration=NORMAL, groups=call.pop("groups", None))
    d = decide(digits_resnet(), train, heldout, per_sample_ce,
               policy=DecisionPolicy(call.pop("recipe"), trials=trials, candidates=NAMES, **call))
    choice, stop_reason, cost, heldout_loss, margin = recorded["decision"]
    assert (d.choice, d.stop_reason, d.cost_block_steps) == (choice, stop_reason, cost)
    assert list(d.candidates) == list(recorded["candidates"])
    # float32 losses averaged in float64: a forward pass's round-off, relative to the loss
    assert d.heldout_loss == pytest.approx(heldout_loss, rel=16 * EPS32)
    # the trials' steps carry each step's float32 round-off on (loss scale ~0.1-1, at most 24 steps)
    tol = 16 * EPS32 * (1 + cost)
    assert (d.margin is None) == (margin is None)
    if margin is not None:
        np.testing.assert_allclose(d.margin, margin, rtol=0, atol=tol)
    for name, (screen_change, eliminated, trial) in recorded["candidates"].items():
        c = d.candidates[name]
        # the screen: float64 sums of float32 gradients, through K's pseudo-inverse
        assert c.screen_heldout_change == pytest.approx(screen_change, rel=1e-4)
        assert (c.eliminated, c.verified) == (eliminated, trial is not None)
        if trial is not None:
            steps, heldout_change, training_change, se = trial
            assert c.trial.steps == steps
            np.testing.assert_allclose(c.trial.heldout_change, heldout_change, rtol=0, atol=tol)
            np.testing.assert_allclose(c.trial.training_change, training_change, rtol=0, atol=tol)
            assert c.trial.heldout_se == pytest.approx(se, rel=0, abs=tol)
