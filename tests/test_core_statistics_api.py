"""CandidateStatistics' public sums API: equality and repr reflect the sums; accumulate equals one pass
over both sample sets (against from_samples on the concatenation); add_counts/set_sums refuse what they
cannot hold."""

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


def test_add_counts_and_set_sums():
    stats = CandidateStatistics(2, 3)
    stats.add_counts(4, n_batches=1, n_vectors=4).set_sums(sum_q_sq=2.0, sum_cross=np.ones((2, 3)))
    assert (stats.n_samples, stats.n_batches, stats.n_vectors, stats.sum_q_sq) == (4, 1, 4, 2.0)
    assert stats.sum_cross.sum() == 6
    stats.add_counts(n_vectors=None)
    assert stats.n_vectors is None
    with pytest.raises(ValueError, match="shape"):
        stats.set_sums(sum_gram=np.ones((2, 2)))
    with pytest.raises(ValueError, match="not a running sum"):
        stats.set_sums(n_samples=3)
