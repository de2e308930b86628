"""One batch's sums as a typed record (satcore.BatchMoments): two batches' moments added up are the moments of
the concatenated batch (reference: satcore.batch_moments of the concatenation), to the round-off of the sums."""

import dataclasses

import numpy as np
import pytest

import satcore
from satcore._formulas.families import FamilySettings

EPS = float(np.finfo(np.float64).eps)


def gamma(n: int) -> float:
    """The bound ``n eps / (1 - n eps)`` on the relative error of a float64 sum or product of ``n`` terms."""
    return n * EPS / (1 - n * EPS)


def tolerances(ref: satcore.BatchMoments, n_ops: int) -> dict:
    """Per field, twice the round-off bound of a float64 sum (two evaluations, each within it) of terms whose absolute
    values add up to at most: the sum itself for sums of squares; ``sqrt(a_ii b_jj)`` (Cauchy-Schwarz) for the entry
    ``ij`` of a sum of products ``sum_k a_ki b_kj``; ``sum ||Q_i||^2 tr(sum Psi_i^T Psi_i)`` for ``sum ||X_i||^2``."""
    q_diag, psi_diag = np.diagonal(ref.sum_qq), np.diagonal(ref.sum_gram)
    bound = 2 * gamma(n_ops)
    out = {
        "sum_q_sq": bound * ref.sum_q_sq,
        "sum_z_sq": bound * ref.sum_z_sq,
        "sum_cross": bound * np.sqrt(np.outer(q_diag, psi_diag)),
        "sum_gram": bound * np.sqrt(np.outer(psi_diag, psi_diag)),
        "sum_qq": bound * np.sqrt(np.outer(q_diag, q_diag)),
        "sum_xi_sq": bound * ref.sum_q_sq * np.trace(ref.sum_gram),
        "batch_grad_norm": bound * ref.batch_grad_norm,
    }
    if ref.sum_xtx is not None:
        xtx_diag = np.diagonal(ref.sum_xtx)
        out["sum_xtx"] = bound * ref.sum_q_sq * np.trace(ref.sum_gram) + bound * np.sqrt(np.outer(xtx_diag, xtx_diag))
    return out


# (M, T, N, r): X_i formed (T = 1), the T x T kernel (T small against N and r), and its QR factor with variance
@pytest.mark.parametrize("shape", [(9, 1, 3, 4), (8, 2, 6, 7), (7, 5, 3, 2)])
@pytest.mark.parametrize("variance", [False, True])
@pytest.mark.parametrize("cut", [1, 4])
def test_merged_moments_are_the_moments_of_the_concatenated_batch(shape, variance, cut):
    M, T, N, r = shape
    rng = np.random.default_rng(sum(shape) + cut)
    Q, Psi, Z = rng.standard_normal((M, T, N)) + 0.5, rng.standard_normal((M, T, r)), rng.standard_normal((M, T, N))
    first = satcore.batch_moments(Q[:cut], Psi[:cut], variance=variance, curvature=True, z=Z[:cut])
    rest = satcore.batch_moments(Q[cut:], Psi[cut:], variance=variance, curvature=True, z=Z[cut:])
    merged, ref = first + rest, satcore.batch_moments(Q, Psi, variance=variance, curvature=True, z=Z)
    held = merged.as_dict()
    assert held.keys() == ref.as_dict().keys()
    assert (merged.n_samples, merged.n_vectors, merged.n_stream_vectors) == (M, M * T, M * T)
    atol = tolerances(ref, M * T * (N + r + T))
    assert atol.keys() == held.keys() - {"n_samples", "n_vectors", "n_stream_vectors"}
    for field, tolerance in atol.items():
        assert np.all(np.abs(held[field] - getattr(ref, field)) <= tolerance), field
    # not a sum of the two batches' terms of eq. (2): the concatenation's own, sqrt(sum ||Q_i||^2) / M
    assert merged.batch_grad_norm != pytest.approx(first.batch_grad_norm + rest.batch_grad_norm, rel=1e-3)
    # and the statistics fed the merged batch hold the concatenated batch's sums
    stats = satcore.CandidateStatistics(N, r, T, variance, curvature=True, stream=True).add_moments(merged)
    assert stats.n_batches == 1 and stats.sum_batch_grad_norm == merged.batch_grad_norm
    assert np.all(np.abs(stats.sum_cross - ref.sum_cross) <= atol["sum_cross"])


def test_a_merge_keeps_what_both_sides_hold():
    """An optional sum only one side tracked, or a side that is no training batch, leaves it out of the sum."""
    rng = np.random.default_rng(0)
    Q, Psi = rng.standard_normal((6, 2, 3)), rng.standard_normal((6, 2, 4))
    tracked = satcore.batch_moments(Q[:3], Psi[:3], variance=True, curvature=True)
    plain = satcore.batch_moments(Q[3:], Psi[3:])
    merged = tracked + plain
    assert merged.sum_xtx is None and merged.sum_qq is None and merged.sum_z_sq is None
    assert merged.batch_grad_norm == pytest.approx(np.sqrt(np.sum(Q * Q)) / 6, rel=1e-14)
    chunk = dataclasses.replace(plain, batch_grad_norm=None)
    assert (tracked + chunk).batch_grad_norm is None
    unknown = dataclasses.replace(plain, n_vectors=None)
    assert (tracked + unknown).n_vectors is None
    with pytest.raises(TypeError):
        tracked + tracked.as_dict()


def test_to_numpy_rounds_summed_counts_and_as_dict_round_trips():
    """Counts an all-reduce summed as floats come back whole; arrays float64; unheld fields stay None."""
    m = satcore.BatchMoments(n_samples=np.float64(3.0), n_vectors=np.float64(6.0), sum_q_sq=np.float32(2.5),
                             sum_cross=np.ones((2, 3), np.float32), sum_gram=np.eye(3), sum_xi_sq=np.array(1.25))
    got = m.to_numpy()
    assert (got.n_samples, got.n_vectors) == (3, 6) and isinstance(got.n_samples, int)
    assert got.sum_q_sq == 2.5 and isinstance(got.sum_q_sq, float) and got.sum_xi_sq == 1.25
    assert got.sum_cross.dtype == np.float64 and got.sum_xtx is None and got.sum_z_sq is None
    again = satcore.BatchMoments(**got.as_dict())
    assert again.as_dict().keys() == got.as_dict().keys()
    assert all(np.array_equal(getattr(again, k), v) for k, v in got.as_dict().items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.n_samples = 4


def test_statistics_refuse_moments_whose_gram_went_elsewhere():
    m = satcore.batch_moments(np.ones((2, 1, 3)), np.ones((2, 1, 4)))
    with pytest.raises(satcore.InputError, match="holds no sum_gram"):
        satcore.CandidateStatistics(3, 4).add_moments(dataclasses.replace(m, sum_gram=None))
    with pytest.raises(satcore.InputError, match="track the stream sums"):
        satcore.CandidateStatistics(3, 4, stream=True).add_moments(m)


def test_family_settings_as_an_object_or_as_keywords_draw_the_same_family():
    by_keywords = satcore.make_family("mlp", 5, seed=1, expansion=2, activation="relu")
    by_object = satcore.make_family("mlp", 5, seed=1, settings=FamilySettings(expansion=2, activation="relu"))
    assert by_keywords == by_object and by_object.n_features == 10 and by_object.activation == "relu"
    assert satcore.make_family("mlp", 5, seed=1) != by_object
    assert satcore.make_family("conv", 3, seed=7, mid_channels=2).n_features == 18
    with pytest.raises(TypeError):
        satcore.make_family("mlp", 5, expansions=2)
