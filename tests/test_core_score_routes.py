"""The score's cheaper routes against independent float64 NumPy references: the growth value from the
whitened folds (``FoldSums.with_whitened_total``), the rank-deficient residual's norm by ``dsyrk``
(``psd._residual_norm``), statistics that adopt a probe's totals (``add_moments(adopt=True)``),
fold sums whose memory comes on first write (``lazy_zeros``) and the inverse of ``K = sum_gram / n`` from
``sum_gram``'s own (``of_mean``)."""

import numpy as np
import pytest

from satcore import BatchMoments, CandidateStatistics, InputError
from satcore._formulas import psd
from satcore._formulas.folds import FoldSums
from satcore._shared.arrays import LAZY_ZEROS_BYTES, lazy_zeros

EPS = np.finfo(np.float64).eps


def samples(rng, M, T, N, r):
    return rng.standard_normal((M, T, N)), np.tanh(rng.standard_normal((M, T, r)) @ rng.standard_normal((r, r)))


def projector_growth(Q, Psi):
    """``sqrt(tr(C K^- C^T))`` as the norm of ``Q``'s projection onto the unit-column features' kept row space
    (SVD, the cut of ``DEFAULT_RTOL`` on squared singular values), over ``sqrt(n)``."""
    M, T, _ = Q.shape
    P = Psi.reshape(M * T, -1)
    U, sv, _ = np.linalg.svd(P / np.linalg.norm(P, axis=0), full_matrices=False)
    kept = U[:, sv**2 > psd.DEFAULT_RTOL * sv[0] ** 2]
    X = Q.reshape(M * T, -1)
    # per sample: C = (1/M) sum_i Q_i^T Psi_i, the projector acts on the stacked positions
    return float(np.linalg.norm(kept.T @ X)) / np.sqrt(M), kept.shape[1]


@pytest.mark.parametrize("T, r", [(3, 20), (6, 40)])  # full rank (60 rows > 20) and rank-deficient (24 rows < 40)
@pytest.mark.parametrize("fold", ["consecutive", "scattered"])
def test_growth_value_from_the_whitened_folds(T, r, fold):
    rng = np.random.default_rng(3)
    Q, Psi = samples(rng, 4 * (5 if T == 3 else 1), T, 7, r)
    batches = np.split(np.arange(Q.shape[0]), 4)
    stats = CandidateStatistics(7, r, T, n_folds=16)
    plain = CandidateStatistics(7, r, T, n_folds=0)  # no folds: tr(C G^- C^T) through C's own whitening
    for b, idx in enumerate(batches):
        where = b if fold == "consecutive" else 3 * b + 1  # folds 1, 4, 7, 10: not one product
        stats.add_moments(_moments(Q[idx], Psi[idx]), fold=where)
        plain.update(Q[idx], Psi[idx])
    want, rank = projector_growth(Q, Psi)
    score, reference = stats.score("x"), plain.score("x")
    assert score.feature_rank == reference.feature_rank == rank
    cond = 1.0 if rank == r else 1e3  # the rank-deficient factor's round-off, relative (psd module docstring)
    assert score.growth_value == pytest.approx(want, rel=cond * 100 * EPS * r)
    assert score.growth_value == pytest.approx(reference.growth_value, rel=cond * 100 * EPS * r)
    # the fold Gram is what it was: the whitened fold sums' inner products
    sums, counts = stats.fold_cross, stats.fold_samples
    kept = np.flatnonzero(counts)
    spectrum = psd.psd_spectrum(stats.feature_gram())
    white = np.stack([spectrum.whiten(sums[a] / counts[a]) for a in kept]).reshape(kept.size, -1)
    np.testing.assert_allclose(score.fold_sums.gram, white @ white.T, rtol=cond * 100 * EPS * r,
                               atol=cond * 100 * EPS * r * np.abs(white @ white.T).max())


def _moments(Q, Psi):
    from satcore._statistics.moments import batch_moments

    return batch_moments(Q, Psi)


def test_with_whitened_total_is_whiten_of_the_sum():
    rng = np.random.default_rng(4)
    sums = rng.standard_normal((6, 5, 9))
    counts = np.array([2, 0, 3, 1, 0, 0])
    W = rng.standard_normal((9, 4))
    folds, total = FoldSums.with_whitened_total(sums, counts, lambda A: A @ W)
    np.testing.assert_allclose(total, sums[counts > 0].sum(0) @ W, rtol=0, atol=50 * EPS * np.abs(sums).sum(0).max()
                               * np.abs(W).sum(0).max())
    reference = FoldSums.of(sums, counts, lambda A: A @ W)
    np.testing.assert_allclose(folds.gram, reference.gram, rtol=1e-14)
    assert FoldSums.with_whitened_total(sums, np.zeros(6), lambda A: A @ W)[1] is None


@pytest.mark.parametrize("n, k", [(1, 1), (37, 5), (300, 0), (700, 64)])
def test_residual_norm_is_the_frobenius_norm(n, k):
    """Any symmetric block and rows (not only a Cholesky factor's), so the residual is O(1), not round-off."""
    rng = np.random.default_rng(5)
    A = rng.standard_normal((n + 10, n + 10))
    scaled = A + A.T
    unfactored = rng.permutation(n + 10)[:n]
    rows = rng.standard_normal((n, k))
    want = np.linalg.norm(scaled[np.ix_(unfactored, unfactored)] - rows @ rows.T)
    scale = np.linalg.norm(scaled) + np.linalg.norm(rows) ** 2
    assert psd._residual_norm(scaled, unfactored, rows) == pytest.approx(want, abs=10 * (n + k) * EPS * scale)
    assert psd._residual_norm(scaled, unfactored[:0], rows[:0]) == 0.0
    # the strict upper triangle is not read (gram_inverse factors it in place): NaN there changes nothing
    hidden = scaled.copy()
    hidden[np.triu_indices_from(hidden, 1)] = np.nan
    assert psd._residual_norm(hidden, unfactored, rows) == psd._residual_norm(scaled, unfactored, rows)


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


@pytest.mark.parametrize("r", [7, 8])  # the packed form's two layouts (r odd, r even)
def test_a_packed_gram_is_adopted_packed_and_read_whole(r):
    """A ``PackedGram`` (LAPACK's rectangular full packed upper triangle, packed here by ``dtrttf``) is held
    packed by statistics that adopt it, and ``sum_gram`` reads it as the whole matrix, element for element;
    statistics that add it (no ``adopt``) hold that matrix too."""
    from scipy.linalg.lapack import dtrttf

    from satcore.adapter_api import PackedGram

    rng = np.random.default_rng(r)
    m = totals(rng, 5, r)
    exact = np.triu(m.sum_gram) + np.triu(m.sum_gram, 1).T
    packed, _ = dtrttf(exact.T, transr="N", uplo="L")
    m = BatchMoments(**{**m.__dict__, "sum_gram": PackedGram(packed, r)})
    adopted = CandidateStatistics(5, r, 5).add_moments(m, adopt=True)
    assert isinstance(adopted._sum_gram, PackedGram)  # half the bytes until read
    assert np.array_equal(adopted.sum_gram, exact) and adopted.sum_gram.flags.c_contiguous
    assert adopted.sum_gram is adopted.sum_gram  # made whole once
    added = CandidateStatistics(5, r, 5).add_moments(m)
    assert np.array_equal(added.sum_gram, exact) and added == adopted


def test_lazy_zeros():
    small, large = lazy_zeros((3, 4)), lazy_zeros((4, LAZY_ZEROS_BYTES // 32 + 1))
    for a in (small, large):
        assert a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable and not a.any()
    large[1] += 2.0
    assert large.sum() == 2.0 * large.shape[1] and not large[0].any() and not large[2:].any()
    stats = CandidateStatistics(256, 1024, 1)
    assert stats.fold_cross.shape == (16, 256, 1024) and not stats.fold_cross[15].any()


@pytest.mark.parametrize("n", [30, 200])  # rank-deficient (pivoted factor) and full rank (certified inverse)
def test_an_exactly_symmetric_gram_skips_symmetrising_to_the_same_bits(n):
    rng = np.random.default_rng(7)
    P = np.tanh(rng.standard_normal((n, 60)) @ rng.standard_normal((60, 60))) * rng.lognormal(0, 2, 60)
    G = P.T @ P
    G = np.triu(G) + np.triu(G, 1).T  # exactly symmetric
    s0, plain = psd._unit_diagonal(G)
    s1, trusted = psd._unit_diagonal(G, symmetric=True)
    assert np.array_equal(s0, s1) and np.array_equal(np.tril(plain), np.tril(trusted))
    a, b = psd.gram_inverse(G), psd.gram_inverse(G, symmetric=True)
    assert a.rank == b.rank == min(n, 60) and np.array_equal(a.factor, b.factor)
    # C = A P in the features' row space: tr(C G^- C^T) = ||A Pi||^2, Pi the projector onto P's columns (SVD)
    A = rng.standard_normal((3, n))
    U = np.linalg.svd(P, full_matrices=False)[0]
    want = np.sum((A @ U) ** 2)
    assert b.quadratic_form(A @ P) == pytest.approx(want, rel=1e-8)


def test_statistics_trust_only_the_grams_they_summed():
    rng = np.random.default_rng(8)
    Q, P = rng.standard_normal((6, 4, 5)), rng.standard_normal((6, 4, 9))
    stats = CandidateStatistics(5, 9, 4)
    stats.update(Q[:3], P[:3]).update(Q[3:], P[3:])
    assert stats._exact_gram and np.array_equal(stats.sum_gram, stats.sum_gram.T)
    loaded = CandidateStatistics.from_arrays(stats.to_arrays())
    assert not loaded._exact_gram  # a dump's Gram is symmetric to its round-off only
    assert loaded.score("x").growth_value == stats.score("x").growth_value
    stats.sum_gram = stats.sum_gram * (1 + 1e-13 * rng.standard_normal((9, 9)))  # put there from outside
    assert not stats._exact_gram
    stats.update(Q[:1], P[:1])  # still not trusted after adding to it
    assert not stats._exact_gram
    merged = loaded.merge(loaded)  # summed by add_moments: exactly symmetric again
    assert merged._exact_gram and np.array_equal(merged.sum_gram, merged.sum_gram.T)


# (rows, features, scale): full rank (the certified inverse), rank-deficient (the pivoted factor), and a
# Gram whose columns span 1e6 in scale (the Jacobi scaling at work); n as a count of samples
@pytest.mark.parametrize("rows, r, spread", [(50, 12, 0.0), (8, 20, 0.0), (40, 15, 6.0)])
@pytest.mark.parametrize("route", ["gram_inverse", "psd_spectrum"])
def test_inverse_of_the_mean_gram_is_n_times_the_sums(rows, r, spread, route):
    """``of_mean(n)`` of the inverse of ``sum_gram`` is the inverse of ``K = sum_gram / n``: ``K^- = n sum_gram^-``
    against NumPy's pseudo-inverse of ``K`` in float64 (``pinv``), and whitening by it against whitening by
    the inverse computed from ``K`` itself (the route ``score`` took before)."""
    rng = np.random.default_rng(rows + r)
    P = rng.standard_normal((rows, r)) * np.logspace(0, spread, r)
    G = P.T @ P
    G = np.triu(G) + np.triu(G, 1).T
    n = 37
    K = G / n
    inverse = getattr(psd, route)
    got = inverse(G).of_mean(n)
    assert got.rank == min(rows, r)
    scale = 1.0 / np.sqrt(np.diag(K))  # compare the unit-diagonal inverses: K's spans 1e12 in scale
    want = np.linalg.pinv(K * scale[:, None] * scale, rcond=1e-12, hermitian=True)
    cond = np.linalg.cond(K * scale[:, None] * scale) if rows >= r else 1e4
    assert np.allclose(got.pinv() / scale[:, None] / scale, want, rtol=0, atol=1e3 * cond * EPS * np.abs(want).max())
    C = rng.standard_normal((3, r)) @ G  # in K's row space
    direct = inverse(K)
    assert got.quadratic_form(C) == pytest.approx(direct.quadratic_form(C), rel=1e3 * EPS * cond)


@pytest.mark.parametrize("rows, collinear, rank", [(200, 0.0, 60), (30, 0.0, 30), (200, 1e-6, 59)],
                         ids=["certified", "rank-deficient", "ill-conditioned"])
def test_a_packed_gram_takes_the_same_route_to_the_same_bits(rows, collinear, rank):
    """``gram_inverse`` of a packed exactly symmetric Gram (a probe's ``sum_gram`` until read) factors the array it
    unpacks it into: the same inverse, bit for bit, as from the whole matrix, also where the full-rank
    certificate is tried and fails (every route after it rebuilds the matrix the factorisation overwrote): rank
    deficient without a rank bound (``dpotrf`` stops midway) and full rank with two columns 1e-6 apart (the
    bound misses the cut; the eigen route cuts that direction).  ``mean_of`` is ``of_mean``'s inverse of
    ``G / n`` to round-off."""
    from scipy.linalg.lapack import dtrttf

    from satcore.adapter_api import PackedGram

    rng = np.random.default_rng(rows)
    P = rng.standard_normal((rows, 60)) * np.logspace(0, 3, 60)
    if collinear:
        P[:, -1] = P[:, 0] + collinear * rng.standard_normal(rows)
    G = P.T @ P
    G = np.triu(G) + np.triu(G, 1).T
    packed = PackedGram(dtrttf(np.asfortranarray(G), transr="N", uplo="L")[0], 60)
    assert np.array_equal(packed.whole(), G)
    whole, held = psd.gram_inverse(G, symmetric=True), psd.gram_inverse(packed, symmetric=True)
    assert type(whole) is type(held) and whole.rank == held.rank == rank
    assert np.array_equal(whole.pinv(), held.pinv())
    assert isinstance(held, psd.GramInverse) == (not collinear)
    n = 37
    mean = psd.gram_inverse(packed, symmetric=True, mean_of=n)
    # two orders of the same float64 operations: round-off relative to the unit-diagonal inverse's size, times the
    # conditioning of the spectrum kept (elementwise relative errors of its small entries are no bound: 1.2e-12 with
    # NumPy 2.5 against 7.6e-13 with 2.4, at the same 3e-16 of the largest entry)
    scale = np.sqrt(np.diag(G) / n)
    unit = G / n / scale[:, None] / scale
    kept = np.linalg.eigvalsh(unit)[-rank:]
    got, want = (inverse.pinv() * scale[:, None] * scale for inverse in (mean, held.of_mean(n)))
    assert np.abs(got - want).max() <= 60 * (kept[-1] / kept[0]) * EPS * np.abs(want).max()


def test_a_packed_gram_is_factored_from_its_upper_triangle_to_the_whole_matrixs_bits():
    """Tried at full rank, a packed Gram is unpacked as its upper triangle only (zeros below: no mirrored half) and
    factored there without SciPy's cleaning pass: against the whole matrix's route, the same unit-diagonal triangle,
    factor and certificate bound bit for bit, the factor exactly triangular (the zeros ``pinv`` reads), and
    ``||S G S||_F`` from the triangle within round-off of NumPy's norm of the whole matrix.  ``r = 600`` spans three
    slabs of :data:`~satcore._formulas.psd.ROW_STEP` rows."""
    from scipy.linalg.lapack import dtrttf

    from satcore.adapter_api import PackedGram

    r, n = 600, 37
    rng = np.random.default_rng(600)
    P = rng.standard_normal((2 * r, r)) * np.logspace(0, 3, r)
    G = P.T @ P
    G = np.triu(G) + np.triu(G, 1).T
    packed = PackedGram(dtrttf(np.asfortranarray(G), transr="N", uplo="L")[0], r)
    upper = packed.upper()
    assert upper.flags.c_contiguous and np.array_equal(upper, np.triu(G))
    s, scaled = psd._unit_upper(packed)
    s_whole, whole = psd._unit_diagonal(G, symmetric=True)
    assert np.array_equal(s, s_whole) and np.array_equal(scaled, np.triu(whole))
    held, full = (psd.gram_inverse(g, symmetric=True, mean_of=n) for g in (packed, G))
    assert isinstance(held, psd.GramInverse) and held.triangular and held.rank == r
    assert np.array_equal(held.factor, full.factor) and not np.tril(held.factor, -1).any()
    assert held.lowest == full.lowest
    assert held.highest == pytest.approx(np.linalg.norm(whole), rel=4 * r * EPS)
    assert full.highest == pytest.approx(np.linalg.norm(whole), rel=4 * r * EPS)
