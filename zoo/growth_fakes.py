"""Fake callables for the core growth loop (no framework): a "model" is a tuple of block names, its
per-sample held-out losses follow a scripted curve by depth, and training is a deterministic no-op.

The held-out loss of sample ``i`` at depth ``d`` is ``curve[d] + noise[i]`` with ``noise`` fixed per
sample (the paired design the guard relies on) plus, with ``jitter``, a per-depth perturbation of
standard deviation ``jitter`` (so the paired change has a known spread).
"""

from __future__ import annotations

import json

import numpy as np

from satcore._growth.loop import GrowthCriteria, GrowthOptions, RoundDecision


class FakeSteps:
    weights_suffix = ".json"

    def __init__(self, curve, n=200, jitter=0.0, on_train=None):
        self.curve, self.jitter, self.on_train = dict(curve), jitter, on_train
        self.noise = np.random.default_rng(0).normal(0.0, 0.3, n)
        self.trained, self.saved = [], []

    def depth(self, model):
        return len(model)

    def insert(self, model, at, seed):
        i = model.index(at) if at in model else len(model)
        return model[:i] + (f"new{seed}",) + model[i:], None

    def replay(self, model, entry):
        return self.insert(model, entry.inserted_at, entry.seed)[0]

    def train(self, model, round_index):
        self.trained.append(round_index)
        if self.on_train is not None:
            self.on_train(model, round_index)
        return model

    def heldout(self, depth):
        extra = np.random.default_rng(1000 + depth).normal(0.0, self.jitter, self.noise.size) if self.jitter else 0.0
        return self.curve[depth] + self.noise + extra

    def losses(self, model, split):
        return self.heldout(len(model)) if split == "heldout" else np.full(4, 10.0 - len(model))

    def save(self, model, path):
        self.saved.append(path)
        with open(path, "w") as f:
            json.dump(list(model), f)

    def load(self, model, path):
        with open(path) as f:
            loaded = tuple(json.load(f))
        assert len(loaded) == len(model)  # the replayed structure matches the saved weights
        return loaded

    def settings(self):
        return {"framework": "fake"}


class FakeDecide:
    """Always the first block, or a scripted stop; counts its calls."""

    def __init__(self, stop_at_depth=None):
        self.calls, self.stop_at_depth = 0, stop_at_depth

    def __call__(self, model, seed):
        self.calls += 1
        rows = [{"name": b, "growth_value": float(len(b))} for b in model]
        if self.stop_at_depth is not None and len(model) >= self.stop_at_depth:
            return RoundDecision(None, "saturated", rows, "saturated")
        return RoundDecision(model[0], None, rows, "improvable")


def options(**budget):
    from satcore._growth.loop import GrowthBudget

    return GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(**budget))


def run_one(log_path, max_rounds=6):
    """A whole fake run on ``log_path`` (for the concurrent-runs test's processes)."""
    from satcore._growth.loop import run_growth

    steps = FakeSteps({d: 1.0 - 0.05 * d for d in range(1, 20)})
    return run_growth(("a", "b"), steps, FakeDecide(), options(max_rounds=max_rounds), log_path=log_path)
