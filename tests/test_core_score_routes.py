"""The score's cheaper routes against independent float64 NumPy references: statistics that adopt a
probe's totals (``add_moments(adopt=True)``) and fold sums whose memory comes on first write (``lazy_zeros``)."""

import numpy as np
import pytest

from satcore import BatchMoments, CandidateStatistics, InputError
from satcore._shared.arrays import LAZY_ZEROS_BYTES, lazy_zeros


def totals(rng, N, r, *, variance=False):
    G = rng.standard_normal((40, r))
    return BatchMoments(n_samples=8, n_vectors=40, sum_q_sq=50.0, sum_cross=rng.standard_normal((N, r)),
                        sum_gram=G.T @ G, sum_xi_sq=60.0, sum_xtx=(G.T @ G) if variance else None,
                        batch_grad_norm=3.0, n_batches=4)


def test_adopting_totals_is_adding_them_to_zeros():
    rng = np.random.default_rng(6)
    m = totals(rng, 5, 7, variance=True)
    exact = np.triu(m.sum_gram) + np.triu(m.sum_gram, 1).T  # exactly symmetric, as a probe's totals are
    m = BatchMoments(**{**m.__dict__, "sum_gram": exact})
    m = BatchMoments(**{**m.__dict__, "sum_xtx": m.sum_gram.copy()})
    folds = (rng.standard_normal((16, 5, 7)), np.array([2, 2, 2, 2] + [0] * 12))
    folds[0][4:] = 0.0
    added = CandidateStatistics(5, 7, 5, variance=True).add_moments(m, folds=folds)
    adopted = CandidateStatistics(5, 7, 5, variance=True).add_moments(m, folds=folds, adopt=True)
    assert adopted == added  # every array element for element, every count
    assert adopted.sum_cross is m.sum_cross and adopted.fold_cross is folds[0]  # no copy
    with pytest.raises(InputError, match="hold no sums yet"):
        adopted.add_moments(m, adopt=True)
    # what is not a C-ordered float64 array of the right shape is added to the zeros as before
    loose = BatchMoments(**{**m.__dict__, "sum_cross": np.asfortranarray(m.sum_cross)})
    copied = CandidateStatistics(5, 7, 5, variance=True).add_moments(loose, folds=folds, adopt=True)
    assert copied == added and copied.sum_cross is not loose.sum_cross


def test_lazy_zeros():
    small, large = lazy_zeros((3, 4)), lazy_zeros((4, LAZY_ZEROS_BYTES // 32 + 1))
    for a in (small, large):
        assert a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable and not a.any()
    large[1] += 2.0
    assert large.sum() == 2.0 * large.shape[1] and not large[0].any() and not large[2:].any()
    stats = CandidateStatistics(256, 1024, 1)
    assert stats.fold_cross.shape == (16, 256, 1024) and not stats.fold_cross[15].any()
