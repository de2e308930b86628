"""The Cholesky route to G^- (``gram_inverse``) against independent references: ``numpy.linalg.inv``,
the explicit projector of the features (SVD), and the eigen route where the shortcuts must not apply."""

import numpy as np
import pytest

from satcore._formulas.psd import GramInverse, PsdSpectrum, gram_inverse, psd_spectrum

EPS = np.finfo(np.float64).eps


def features(rng, n, r, scales=0.0):
    """``n`` rows of ``r`` correlated features (tanh of a random mix), columns on scales ``e^(N(0, scales))``."""
    mixed = np.tanh(rng.standard_normal((n, r)) @ rng.standard_normal((r, r)) / np.sqrt(r))
    return mixed * rng.lognormal(0.0, scales, r)


@pytest.mark.parametrize("scales", [0.0, 3.0])
def test_full_rank_is_the_inverse(scales):
    rng = np.random.default_rng(0)
    Psi = features(rng, 400, 60, scales)
    K = Psi.T @ Psi / 400
    inverse = gram_inverse(K)
    assert isinstance(inverse, GramInverse) and inverse.triangular and inverse.rank == 60
    reference = np.linalg.inv(K)
    cond = np.linalg.cond(K)
    assert np.abs(inverse.pinv() - reference).max() <= 100 * cond * EPS * np.abs(reference).max()
    C = rng.standard_normal((5, 60))
    want = np.trace(C @ reference @ C.T)
    assert inverse.quadratic_form(C) == pytest.approx(want, rel=100 * cond * EPS)
    assert 0 < inverse.lowest <= np.linalg.eigvalsh(K / np.sqrt(np.outer(np.diag(K), np.diag(K))))[0]


@pytest.mark.parametrize("n", [50, 25])  # the hinted factor blocked (dpstrf), and unblocked (dpstf2: n <= r / 4)
def test_rank_deficient_is_the_projector(n):
    """Fewer rows than features: rank and growth value of the explicit projector onto Psi's row space."""
    rng = np.random.default_rng(1)
    r, N = 120, 7
    Psi = features(rng, n, r, 2.0)
    Q = rng.standard_normal((n, N))
    K, C = Psi.T @ Psi / n, Q.T @ Psi / n
    inverse = gram_inverse(K)
    assert isinstance(inverse, GramInverse) and not inverse.triangular
    U, sv, _ = np.linalg.svd(Psi / np.linalg.norm(Psi, axis=0), full_matrices=False)
    kept = U[:, sv > 1e-5 * sv[0]]  # the cut on singular values of the unit-column features
    assert inverse.rank == kept.shape[1] == n
    projector_value = np.sum((kept.T @ Q) ** 2) / n  # ||Pi Q||^2 / n = tr(C K^- C^T)
    assert inverse.quadratic_form(C) == pytest.approx(projector_value, rel=1e-10)
    assert inverse.quadratic_form(C) == pytest.approx(psd_spectrum(K).quadratic_form(C), rel=1e-12)
    hinted = gram_inverse(K, rank_bound=n)  # the row count: the full-rank route is skipped, the same answer
    assert hinted.rank == n and hinted.quadratic_form(C) == pytest.approx(projector_value, rel=1e-10)
    full = Psi[:, : n - 10]  # full rank; a wrong hint (dpstf2 where n = 50, dpstrf where 25): only slower
    assert gram_inverse(full.T @ full, rank_bound=10).rank == n - 10


@pytest.mark.parametrize("case", ["float32 sums", "ill-conditioned", "zero feature", "not finite"])
def test_falls_back_to_the_eigen_route(case):
    """Where a shortcut cannot prove it keeps the eigenvalue cut's directions, the eigen route answers."""
    rng = np.random.default_rng(2)
    if case == "float32 sums":  # null directions at float32 round-off, either sign
        Psi = features(rng, 40, 100).astype(np.float32)
        K = (Psi.T @ Psi).astype(np.float64)
        K = (K + K.T) / 2
    elif case == "ill-conditioned":  # full rank, smallest eigenvalue next to the cut
        U = np.linalg.qr(rng.standard_normal((30, 30)))[0]
        K = (U * np.geomspace(1.0, 3e-10, 30)) @ U.T
    elif case == "zero feature":
        Psi = features(rng, 200, 20)
        Psi[:, 3] = 0.0
        K = Psi.T @ Psi
    else:
        K = np.array([[1e-320, 1e300], [1e300, 1e-320]])
    got, want = gram_inverse(K), psd_spectrum(K)
    if case == "zero feature":  # rank-deficient by an exact zero: the pivoted route, the same numbers
        assert isinstance(got, GramInverse) and got.rank == want.rank == 19
        assert np.allclose(got.pinv(), want.pinv(), rtol=1e-9, atol=1e-12 * np.abs(want.pinv()).max())
        return
    assert isinstance(got, PsdSpectrum)
    assert got.rank == want.rank and got.lowest == want.lowest
