"""CandidateStatistics' public sums API: equality and repr reflect the sums; accumulate equals one pass
over both sample sets (against from_samples on the concatenation); the totals of several batches handed
over as one BatchMoments are those batches added one by one."""

import dataclasses

import numpy as np
import pytest

from satcore import CandidateStatistics


def arrays(seed, M=5, T=3, N=4, r=6):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, T, N)), rng.standard_normal((M, T, r))


def test_equality_and_repr_reflect_the_sums():
    Q, Psi = arrays(0)
    filled = CandidateStatistics.from_samples(Q, Psi, batch_size=5)
    empty = CandidateStatistics(4, 6, 3, True)
    assert filled != empty and filled == CandidateStatistics.from_samples(Q, Psi, batch_size=5)
    assert "n_samples=5" in repr(filled) and "n_samples=0" in repr(empty) and repr(filled) != repr(empty)
    other = CandidateStatistics.from_samples(Q, Psi, batch_size=5)
    other.sum_cross[0, 0] += 1e-300 + abs(other.sum_cross[0, 0]) * 1e-15
    assert filled != other
    assert filled == CandidateStatistics.from_arrays(filled.to_arrays())


def test_accumulate_is_one_pass_over_both_in_place():
    (Q1, P1), (Q2, P2) = arrays(1), arrays(2)
    left = CandidateStatistics.from_samples(Q1, P1, batch_size=5)
    same = left
    left.accumulate(CandidateStatistics.from_samples(Q2, P2, batch_size=5))
    assert left is same
    union = CandidateStatistics.from_samples(np.concatenate([Q1, Q2]), np.concatenate([P1, P2]), batch_size=5)
    for field, value in union.to_arrays().items():
        np.testing.assert_allclose(left.to_arrays()[field], value, rtol=1e-12, err_msg=field)
    with pytest.raises(ValueError, match="cannot merge"):
        left.accumulate(CandidateStatistics(4, 5, 3))
    with pytest.raises(ValueError, match="sum_xtx"):
        left.accumulate(CandidateStatistics(4, 6, 3, variance=False))


def test_totals_of_several_batches_are_those_batches_added_one_by_one():
    """An adapter's device totals reach the statistics as one BatchMoments of ``n_batches`` batches (the
    sum of their eq. (2) terms and their folds): equal, to the bit, to adding the batches one by one."""
    from satcore import batch_moments

    Q, Psi = arrays(3, M=9)
    cuts = [(0, 2), (2, 5), (5, 9)]
    one_by_one = CandidateStatistics(4, 6, 3, True, n_folds=2)
    for start, stop in cuts:
        one_by_one.add_moments(batch_moments(Q[start:stop], Psi[start:stop], variance=True))
    parts = [batch_moments(Q[start:stop], Psi[start:stop], variance=True) for start, stop in cuts]
    totals = dataclasses.replace(parts[0] + parts[1] + parts[2], n_batches=3,
                                 batch_grad_norm=parts[0].batch_grad_norm + parts[1].batch_grad_norm
                                 + parts[2].batch_grad_norm)
    folds = (np.stack([parts[0].sum_cross + parts[2].sum_cross, parts[1].sum_cross]), np.array([2 + 4, 3]))
    handed = CandidateStatistics(4, 6, 3, True, n_folds=2).add_moments(totals, folds=folds)
    assert (handed.n_samples, handed.n_batches, handed.n_vectors) == (9, 3, 27)
    assert handed == one_by_one
    assert handed.score().growth_value == one_by_one.score().growth_value


def test_repr_describes_huge_and_infinite_sums_without_a_warning():
    """repr squared the cross sum to print its norm: sums of 1e300 printed NumPy's overflow RuntimeWarning (and
    ||sum_cross||_F=inf, though the norm is 2.45e300); it scales now, and an infinite sum reads as inf, quietly."""
    import math
    import warnings

    huge = CandidateStatistics.from_samples(np.ones((4, 3)), np.ones((4, 2)))
    huge.sum_cross[...] = 1e300
    huge.sum_gram[...] = 1e300
    infinite = CandidateStatistics.from_samples(np.ones((4, 3)), np.ones((4, 2)))
    infinite.sum_cross[0, 0] = np.inf
    infinite.sum_gram[0, 0] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shown = repr(huge), repr(infinite)
    # the norm of six entries of 1e300 is 1e300 sqrt(6); the trace is the two diagonal entries'
    assert shown[0].endswith(f"||sum_cross||_F={1e300 * math.sqrt(6):.6g}, tr(sum_gram)=2e+300)")
    assert shown[1].endswith("||sum_cross||_F=inf, tr(sum_gram)=inf)")
