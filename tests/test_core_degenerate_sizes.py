"""Degenerate and oversized inputs of the array API: one InputError line, before any allocation.

An axis of extent 0 (no sample, no position, no column) leaves nothing to estimate: every
array-level function refuses it instead of returning 0.0 or NaN (a growth value of 0.0 from no
data reads as "saturated").  Sizes below 1 are refused by name; running sums larger than the
memory budget (``SATCORE_MEMORY_BUDGET``) are refused before they are allocated.  A streaming
update may still add an empty batch (it adds nothing).
"""

from __future__ import annotations

import numpy as np
import pytest

import satcore
from satcore import CandidateStatistics
from satcore._formulas.alignment import xi_kernel
from satcore._shared.errors import InputError

GOOD_Q, GOOD_PSI = np.ones((4, 3)), np.ones((4, 2))

FUNCTIONS = {
    "growth_value": lambda q, psi: satcore.growth_value(q, psi),
    "projected_growth_value": lambda q, psi: satcore.projected_growth_value(q, psi),
    "cross_gradient": lambda q, psi: satcore.cross_gradient(q, psi),
    "ag": lambda q, psi: satcore.ag(q),
    "feature_gram": lambda q, psi: satcore.feature_gram(psi),
    "feature_rank": lambda q, psi: satcore.feature_rank(psi),
    "from_samples": lambda q, psi: CandidateStatistics.from_samples(q, psi),
    "xi_kernel": lambda q, psi: xi_kernel(q, psi),
}

SHAPES = {  # (Q, Psi, the empty axis named in the message)
    "M = 0": (np.zeros((0, 3)), np.zeros((0, 2)), "no samples"),
    "T = 0": (np.zeros((4, 0, 3)), np.zeros((4, 0, 2)), "no positions"),
    "r = 0": (GOOD_Q, np.zeros((4, 0)), "no columns"),
    "N = 0": (np.zeros((4, 0)), GOOD_PSI, "no columns"),
}


READS_ONE = {"ag": "r = 0", "feature_gram": "N = 0", "feature_rank": "N = 0"}  # the array it does not read


@pytest.mark.parametrize("function,shape", [(f, s) for f in sorted(FUNCTIONS) for s in sorted(SHAPES)
                                            if READS_ONE.get(f) != s])
def test_an_empty_axis_is_one_input_error(function, shape):
    q, psi, words = SHAPES[shape]
    with pytest.raises(InputError, match=f"has {words} \\(an axis of extent 0\\); nothing to estimate") as e:
        FUNCTIONS[function](q, psi)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sizes,name", [
    ((-1, 3), "N"), ((3, -2), "r"), ((3, 0), "r"), ((0, 3), "N"), ((3, 2.5), "r"),
])
def test_sizes_below_one_are_refused_by_name(sizes, name):
    with pytest.raises(InputError, match=f"^{name} must be a whole number >= 1"):
        CandidateStatistics(*sizes)


def test_positions_below_one_are_refused():
    with pytest.raises(InputError, match="^n_positions must be a whole number >= 1, got 0"):
        CandidateStatistics(3, 2, 0)


@pytest.mark.parametrize("n_features", [-3, 0])
def test_feature_counts_below_one_are_refused(n_features):
    with pytest.raises(InputError, match=f"n_features={n_features} for family 'mlp': must be >= 1"):
        satcore.make_family("mlp", 4, n_features=n_features)


def test_a_family_over_the_budget_is_refused_before_its_weights_are_drawn(monkeypatch):
    """r = 10^6 features of width 8: its Gram alone would be 8 TB; the weights are never drawn."""
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", str(2**20))
    with pytest.raises(InputError, match=r"r = 1000000 features needs 8,000,064,000,000 bytes, over the memory "
                                         r"budget of 1,048,576 bytes \(set SATCORE_MEMORY_BUDGET to raise it\)"):
        satcore.make_family("mlp", 8, n_features=10**6)
    assert satcore.make_family("mlp", 8, n_features=64).n_features == 64  # 8 (8 * 64 + 64^2) bytes fit


def test_an_empty_batch_still_streams():
    """``update`` with ``M = 0`` adds nothing: the statistics equal those without it."""
    rng = np.random.default_rng(0)
    q, psi = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    with_empty = CandidateStatistics(3, 2).update(q, psi).update(np.zeros((0, 3)), np.zeros((0, 2)))
    plain = CandidateStatistics(3, 2).update(q, psi)
    assert with_empty.n_samples == plain.n_samples == 5
    np.testing.assert_array_equal(with_empty.sum_cross, plain.sum_cross)
    np.testing.assert_array_equal(with_empty.sum_gram, plain.sum_gram)


@pytest.mark.parametrize("call,what", [
    (lambda: satcore.projector(np.ones((3000, 1))), "the projector of 3000 position vectors needs 72,000,000 bytes"),
    (lambda: satcore.feature_gram(np.ones((2, 2000))), "the Gram of r = 2000 features needs 32,000,000 bytes"),
    (lambda: satcore.growth_value(np.ones((2, 4)), np.ones((2, 2000))), "the sums of N = 4 and r = 2000 needs"),
])
def test_array_functions_check_what_they_form_against_the_budget(monkeypatch, call, what):
    """An (M T)^2 projector, an r^2 Gram: refused before they are formed when over the budget."""
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", str(10**7))
    with pytest.raises(InputError, match=what):
        call()
