"""Pseudo-inverse and rank of a symmetric positive semi-definite Gram matrix.

Every growth value is ``g^T G^+ g`` for some Gram matrix ``G`` (paper Lemma 4),
so the one tolerance that decides which directions of ``G`` count lives here.

Scaling.  The spectrum is taken of the Jacobi-scaled ``S G S`` with
``S = diag(G)^-1/2`` (1 where a diagonal entry is 0): the Gram of the features
rescaled to unit norm, a diagonal reparameterisation ``theta = S alpha``.  The
growth value does not depend on the parameterisation (Theorem 2;
docs/core.md, identity 3), but an eigenvalue cut does: without the scaling, features on
scales 1e5 apart (a bias column next to large activations, channels with
massive activations) would lose directions to the cut.  The inverse used is
``G^- = S (S G S)^+ S``, a generalised inverse of ``G`` (``G G^- G = G``) equal
to ``G^{-1}`` whenever ``G`` is nonsingular at the cut.  On the probe's own
data every quantity built from it (``tr(C G^- C^T)``, ``<G^-, sum X_i^T X_i>``,
the fitted outputs ``V psi_i``) is the same for any generalised inverse, since
``C`` and the ``X_i`` live in the row space of the features, and
``tr(C G^- C^T)`` is the squared norm of ``Q``'s projection onto the kept
feature directions, as the explicit projector computes it.  Where ``G`` is
singular, ``G^-`` is chosen over the Moore-Penrose ``G^+`` on purpose: the
matched block ``V* = -alpha C G^-`` is then the minimum-norm fit of the
unit-scaled features, so the function it inserts (``V* psi`` on any input) does
not change when features are rescaled (the reparameterisation invariance of
Theorem 2 carried to the block itself), and its first-order change on the
fitting split is exactly ``-alpha growth_value^2``; with ``G^+`` both fail
(0.5% off on a small GPT-2 whose cut left rank 111 of 128).  A held-out
split's ``C'`` is not in the row space: its prediction ``-alpha tr(C' G^- C^T)``
is the first-order change of that same block.

Tolerance.  An eigenvalue ``lam`` of ``S G S`` is treated as zero when
``lam <= rtol * lam_max`` with ``DEFAULT_RTOL = 1e-10`` (or below the round-off
floor, next paragraph).  Eigenvalues of a Gram
matrix are squared singular values of the feature matrix, so this drops
(scaled) feature directions whose singular value is below ``1e-5`` of the
largest.  The choice sits between two error sources: float32 features carry
relative noise near ``1e-7`` (eigenvalues near ``1e-14``, dropped), and float64
accumulation of ``10^8`` rows leaves eigenvalue errors far below ``1e-10``.

Round-off floor.  Sums added up in float32 per batch (an adapter's
``batch_dtype=float32``) perturb ``G`` by ``E`` with ``||E||`` near ``1e-8`` of the
largest eigenvalue, far above that cut: with fewer positions than features
(``r > M T``), the null directions of ``G`` then come out as eigenvalues of
either sign at that level, and whitening by them inflates the growth value
past ``ag``.  A Gram matrix has no negative eigenvalues, so the most negative
one measures the perturbation (Weyl: every eigenvalue moved by at most
``||E||``), and eigenvalues below ``ROUNDOFF_FACTOR`` times its magnitude are
cut too; they cannot be told apart from zero.  Float64 sums leave that floor
near ``1e-16`` of the largest, under the ``rtol`` cut.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

DEFAULT_RTOL = 1e-10
ROUNDOFF_FACTOR = 10.0  # the round-off's positive eigenvalues stayed within 3x its most negative one (MiniLM, float32 sums)
ROW_STEP = 256  # rows of a matrix handled at a time while they are in cache (:func:`_residual_norm`, :func:`_unit_diagonal`)


class _Whitening:
    """What every growth value reads of a generalised inverse ``G^-``: ``whiten``, and ``tr(A G^- B^T)`` through it."""

    def quadratic_form(self, A: np.ndarray, B: np.ndarray | None = None) -> float:
        """``tr(A G^- B^T)`` (``B = A`` when omitted) through the whitened factors.

        Going through the whitened ``A`` rather than an explicit ``G^-`` keeps
        full precision when eigenvalues sit just above the cut.
        """
        wa = self.whiten(np.asarray(A, dtype=np.float64))
        wb = wa if B is None else self.whiten(np.asarray(B, dtype=np.float64))
        return float(np.sum(wa * wb))


@dataclass(frozen=True)
class PsdSpectrum(_Whitening):
    """The kept part of the Jacobi-scaled eigen-decomposition of a PSD matrix ``G``."""

    eigenvalues: np.ndarray  # kept eigenvalues of S G S, > tolerance
    basis: np.ndarray  # (dim, rank): S times their orthonormal eigenvectors
    tolerance: float
    lowest: float  # the smallest eigenvalue of S G S: far below 0 means G is not a Gram matrix
    highest: float

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.size)

    def whiten(self, C: np.ndarray) -> np.ndarray:
        """``C S U diag(lam^-1/2)``: its squared Frobenius norm is ``tr(C G^- C^T)``."""
        return (C @ self.basis) / np.sqrt(self.eigenvalues)

    def pinv(self) -> np.ndarray:
        """``G^- = S (S G S)^+ S`` at this tolerance (``G^+`` when ``G`` is nonsingular; module docstring)."""
        return (self.basis / self.eigenvalues) @ self.basis.T

    def of_mean(self, n: float) -> "PsdSpectrum":
        """The same inverse of ``G / n``: ``(G / n)^- = n G^-``, the basis scaled by ``sqrt(n)`` (``S G S`` is unchanged)."""
        return replace(self, basis=self.basis * np.sqrt(n))


@dataclass(frozen=True)
class GramInverse(_Whitening):
    """The same ``G^- = S (S G S)^+ S`` as :class:`PsdSpectrum`, held as one factor: ``G^- = W W^T``.

    Made by :func:`gram_inverse` from a Cholesky factorisation where that
    provably keeps the directions the eigenvalue cut keeps.  ``factor`` is
    ``W`` (``dim x rank``); at full rank it is ``S L^-T`` (times ``sqrt(mean_of)``),
    upper triangular (``triangular``), held as the transposed view of the Fortran-ordered
    ``L^-1 S`` LAPACK's ``dtrtri`` gave (scaled in place, no copy), and
    whitening is one triangular product, half the multiply-adds of a general one.  ``lowest`` is a lower bound on the
    smallest eigenvalue of ``S G S`` (not the eigenvalue itself) and
    ``highest`` the largest (at full rank, an upper bound on it).
    """

    factor: np.ndarray
    triangular: bool
    tolerance: float
    lowest: float
    highest: float

    @property
    def rank(self) -> int:
        return int(self.factor.shape[1])

    def whiten(self, C: np.ndarray) -> np.ndarray:
        """``C W`` (over the last axis of ``C``): its squared Frobenius norm is ``tr(C G^- C^T)``."""
        C = np.asarray(C, dtype=np.float64)
        rows = C.reshape(-1, C.shape[-1])
        if self.triangular:
            from scipy.linalg.blas import dtrmm

            # (W^T rows^T)^T with W^T = factor.T, lower triangular: every transpose is a view (W^T Fortran-ordered,
            # the C-ordered rows read as columns), so BLAS copies nothing
            out = dtrmm(1.0, self.factor.T, rows.T, lower=1).T
        else:
            out = rows @ self.factor
        return out.reshape(C.shape[:-1] + (self.rank,))

    def pinv(self) -> np.ndarray:
        """``G^- = W W^T``."""
        return self.factor @ self.factor.T

    def of_mean(self, n: float) -> "GramInverse":
        """The same inverse of ``G / n``: ``(G / n)^- = n G^-``, the factor scaled by ``sqrt(n)`` (``S G S`` is unchanged)."""
        return replace(self, factor=self.factor * np.sqrt(n))


def jacobi_scale(G: np.ndarray) -> np.ndarray:
    """``diag(G)^-1/2``, with 1 where the diagonal is not positive (an all-zero feature)."""
    d = np.diagonal(G)
    return np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 1.0)


def psd_spectrum(G: np.ndarray, rtol: float = DEFAULT_RTOL) -> PsdSpectrum:
    """The kept spectrum of ``S G S``; ``lowest`` far below 0 (``-inf`` at worst) says ``G`` is no Gram matrix.

    The one generalised inverse ``G^- = S (S G S)^+ S`` (``S = diag(G)^-1/2``)
    every growth value uses, ``V^2 = tr(C K^- C^T)`` (Lemma 4 of Liu et al.);
    this module's docstring says why ``G^-`` and which eigenvalues count.

    Parameters
    ----------
    G : ndarray, shape (r, r)
        A symmetric positive semi-definite matrix (a feature Gram ``K``).
    rtol : float, optional
        Eigenvalues of ``S G S`` at or below ``rtol`` times the largest are zero.

    Returns
    -------
    PsdSpectrum
        ``rank``, ``whiten(C)`` (``||whiten(C)||_F^2 = tr(C G^- C^T)``),
        ``quadratic_form(A, B)`` and ``pinv()``.

    Examples
    --------
    A rank-one Gram matrix: the growth value of ``C`` is the norm of its part
    along the one feature direction.

    >>> import numpy as np
    >>> from satcore import psd_spectrum
    >>> K = np.array([[1.0, 2.0], [2.0, 4.0]])
    >>> spec = psd_spectrum(K)
    >>> spec.rank
    1
    >>> C = np.array([[1.0, 2.0]])
    >>> round(spec.quadratic_form(C), 12)  # tr(C K^- C^T): C = (1, 2) lies in K's row space
    1.0
    >>> bool(np.allclose(K @ spec.pinv() @ K, K))  # a generalised inverse
    True

    A Gram matrix has ``|G_jk| <= sqrt(G_jj G_kk)`` (Cauchy-Schwarz), so every
    entry of ``S G S`` lies in ``[-1, 1]``.  An entry that overflows to infinity
    (``[[1e-320, 1e300], [1e300, 1e-320]]``: ``1e300 * 1e160 * 1e160``) breaks
    that bound by any measure: its 2x2 principal block ``[[1, x], [x, 1]]``
    has the eigenvalue ``1 - |x|``, an upper bound on the smallest eigenvalue
    (Cauchy interlacing).  Such a matrix is reported as ``lowest = -inf``,
    ``highest = 1`` (the mean eigenvalue of a unit diagonal, a lower bound on
    the largest) and no kept directions, rather than handed to ``eigh``, whose
    NaNs would make every later comparison false.
    """
    s, scaled = _unit_diagonal(G)
    if not np.isfinite(scaled).all():
        return PsdSpectrum(eigenvalues=np.zeros(0), basis=np.zeros((scaled.shape[0], 0)), tolerance=0.0,
                           lowest=-np.inf, highest=1.0)
    return _eigen_spectrum(s, scaled, rtol)


def _unit_diagonal(G, symmetric: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``S`` (:func:`jacobi_scale`) and ``S G S``, symmetrised: accumulated sums are symmetric only up to round-off.

    An exactly ``symmetric`` ``G`` is scaled as it is: ``(G + G^T) / 2`` would be ``G``'s very bits
    (``2 g`` times ``s_i / 2`` is ``g s_i`` rounded once), and the transposed read is most of the pass.
    A packed ``G`` (:func:`_matrix`) is exactly symmetric, made whole into a new array and scaled there.
    """
    G, owned = _matrix(G)
    s = jacobi_scale(G)
    with np.errstate(over="ignore", invalid="ignore"):
        if symmetric or owned:
            return s, _scaled_by_slabs(G, s, s, G if owned else np.empty_like(G))
        scaled = G + G.T  # one r x r array, scaled in place: a fresh one per step page-faults at large r
        scaled *= 0.5 * s[:, None]
        scaled *= s[None, :]
    return s, scaled


def _unit_upper(G) -> tuple[np.ndarray, np.ndarray]:
    """``S`` (:func:`jacobi_scale`) and the upper triangle of ``S G S``, zeros below, of a packed ``G`` (``upper()``:
    :meth:`satcore.adapter_api.PackedGram.upper`), in a new array: all that the Cholesky factorisation of its
    Fortran-ordered view (``lower``) reads, without the lower triangle :func:`_unit_diagonal` mirrors and scales
    (making it and scaling it: 3 of a candidate's score's 57 ms at ``r = 1024``); the triangle's bits are
    :func:`_unit_diagonal`'s."""
    scaled = G.upper()
    s = jacobi_scale(scaled)
    with np.errstate(over="ignore", invalid="ignore"):
        return s, _scaled_by_slabs(scaled, s, s, scaled, upper=True)


def _scaled_by_slabs(matrix: np.ndarray, rows: np.ndarray, columns: np.ndarray | None, out: np.ndarray,
                     upper: bool = False) -> np.ndarray:
    """``out[i, j] = matrix[i, j] rows[i] columns[j]`` (``columns`` ``None``: 1), a slab of :data:`ROW_STEP` rows at a
    time, scaled by both sides while it is in cache: one pass, each entry rounded as ``(m r_i) c_j``.  ``upper``: only
    the columns from each slab's first row on (the upper triangle, and below the diagonal within the slab's diagonal
    block, where a triangular ``matrix`` holds zeros that stay zeros); ``out`` is returned."""
    for i in range(0, matrix.shape[0], ROW_STEP):
        first = i if upper else 0
        slab = np.multiply(matrix[i : i + ROW_STEP, first:], rows[i : i + ROW_STEP, None],
                           out=out[i : i + ROW_STEP, first:])
        if columns is not None:
            slab *= columns[None, first:]
    return out


def _matrix(G) -> tuple[np.ndarray, bool]:
    """``G`` as a float64 array, and whether that array is a new one this module may overwrite: a Gram held
    packed (:class:`satcore.adapter_api.PackedGram`, anything with ``whole()``) is made whole into a new array,
    which the unit-diagonal scaling then takes over (no second ``r x r`` array; the packed sums stay packed)."""
    if hasattr(G, "whole"):
        return G.whole(), True
    return np.asarray(G, dtype=np.float64), False


def _eigen_spectrum(s: np.ndarray, scaled: np.ndarray, rtol: float) -> PsdSpectrum:
    """:func:`psd_spectrum` of the finite ``scaled = S G S``."""
    lam, U = np.linalg.eigh(scaled)
    top = float(lam[-1]) if lam.size else 0.0
    low = float(lam[0]) if lam.size else 0.0
    tol = max(rtol * top, ROUNDOFF_FACTOR * -low) if top > 0 else 0.0
    keep = lam > tol if top > 0 else np.zeros(lam.shape, dtype=bool)
    return PsdSpectrum(eigenvalues=lam[keep], basis=s[:, None] * U[:, keep], tolerance=tol, lowest=low, highest=top)


CERTIFIED_MARGIN = 2.0  # full rank: the smallest eigenvalue's lower bound must clear the cut by this factor
RESIDUAL_SHARE = 0.01  # rank-deficient: the factor's residual may move eigenvalues by this share of the cut
CHOLESKY_ERROR = 64.0  # a computed Cholesky factor is that of S G S + E, ||E|| <= this * dim * eps * ||S G S||
UNBLOCKED_RANK_SHARE = 0.25  # a rank bound at most this share of dim: the unblocked pivoted factor (gram_inverse)


def gram_inverse(G: np.ndarray, rtol: float = DEFAULT_RTOL, rank_bound: int | None = None,
                 symmetric: bool = False, mean_of: float = 1.0) -> GramInverse | PsdSpectrum:
    """``G^- = S (S G S)^+ S`` at :func:`psd_spectrum`'s cut, from a pivoted Cholesky factor where it suffices.

    The same generalised inverse, rank and cut as :func:`psd_spectrum` (it is
    returned where the shortcuts below cannot prove that), for about a tenth of
    an eigen-decomposition's work.  The pivoted Cholesky factorisation
    ``P^T (S G S) P = L L^T`` (LAPACK ``dpstrf`` or ``dpstf2``, stopping at pivots under
    ``dim * eps``) gives the rank-``k`` factor ``L``:

    * ``k = dim`` (full rank): ``1 / tr((S G S)^-1) = 1 / ||L^-1||_F^2`` is a
      lower bound on the smallest eigenvalue and ``||S G S||_F`` an upper bound
      on the largest.  When the bound clears the cut ``rtol * ||S G S||_F``
      by :data:`CERTIFIED_MARGIN` (plus the factor's own round-off, Higham,
      *Accuracy and Stability of Numerical Algorithms*, Thm 10.3), the
      eigenvalue cut keeps every direction and ``G^- = G^-1 = W W^T`` with
      ``W = S P L^-T``.
    * ``k < dim``: the nonzero eigenvalues of ``L L^T`` are those of the
      ``k x k`` ``L^T L = V diag(mu) V^T``, with eigenvectors ``L V mu^-1/2``.
      ``S G S`` differs from ``P L L^T P^T`` by the residual ``R`` (zero but
      for round-off), which moves every eigenvalue by at most
      ``||R||_2 <= ||R||_F`` (Weyl); when that is below :data:`RESIDUAL_SHARE`
      of the cut ``rtol * mu_max``, the cut keeps exactly the ``mu`` above it
      (up to eigenvalues within 1% of the cut), the round-off floor
      (:data:`ROUNDOFF_FACTOR` times ``||R||``) stays under it, and
      ``W = S P L V_kept diag(mu_kept)^-1``.

    ``rank_bound``: the rank expected at most (a Gram of ``n`` rows has rank
    at most ``n``); below ``dim`` the full-rank route is not tried.  It only
    picks the route: a wrong one costs time, never the answer.  ``symmetric``: ``G`` is exactly
    symmetric (a statistics' own Gram), so the symmetrising pass over ``G`` and its transpose is
    skipped: the same bits, a tenth of the work at ``r = 2048``; a ``G`` held packed
    (:class:`satcore.adapter_api.PackedGram`) is exactly symmetric and is unpacked here only, into the
    array the route scales and factors in place: tried at full rank, as the one triangle the factorisation
    reads (:func:`_unit_upper`), made whole only for the routes after a failed certificate.  ``mean_of``: the inverse returned is that of
    ``G / mean_of``, ``mean_of G^-`` (``of_mean(mean_of)``), its factor scaled in the pass that applies
    ``S`` rather than copied (an ``r x r`` array less per candidate of a report).  Otherwise (an ill-conditioned full-rank Gram, float32 sums whose residual
    passes the cut, an indefinite or non-finite matrix) this is
    :func:`psd_spectrum`.  ``lowest`` of a :class:`GramInverse` is the lower
    bound above (``-||R||_F`` when rank-deficient), ``highest`` the bound or
    ``mu_max``.

    Examples
    --------
    >>> import numpy as np
    >>> K = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> inverse = gram_inverse(K)
    >>> inverse.rank, bool(np.allclose(inverse.pinv(), np.linalg.inv(K)))
    (2, True)
    >>> gram_inverse(np.array([[1.0, 2.0], [2.0, 4.0]])).rank  # rank one, as psd_spectrum says
    1
    """
    from scipy.linalg import lapack

    # a packed G tried at full rank: unpacked as the one triangle the factorisation reads (zeros below)
    upper = hasattr(G, "upper") and (rank_bound is None or rank_bound >= G.order)
    s, scaled = _unit_upper(G) if upper else _unit_diagonal(G, symmetric)
    dim = scaled.shape[0]
    if not np.isfinite(scaled).all():
        return psd_spectrum(G, rtol).of_mean(mean_of)
    if rank_bound is None or rank_bound >= dim:
        inverse = _certified_inverse(scaled, rtol, zeros_below=upper)
        if inverse is not None:
            triangle, lowest, top = inverse
            # W = sqrt(mean_of) S L^-T is the transpose of L^-1 S sqrt(mean_of): the Fortran-ordered triangle's
            # columns scaled in place (its transposed view's rows, on and above the diagonal: below it, zeros), which
            # BLAS reads as it is when whitening (no r x r product and copy: 3.3 ms at r = 1024)
            _scaled_by_slabs(triangle.T, s * np.sqrt(mean_of), None, triangle.T, upper=True)
            return GramInverse(triangle.T, True, rtol * top, lowest, top)
        s, scaled = _unit_diagonal(G, symmetric)  # the factorisation took scaled's array
    # scaled.T: the Fortran-ordered view LAPACK reads as it is (its lower triangle, scaled's upper one), where
    # the C-ordered scaled would be copied transposed first (at r = 2048 that copy was as long as the factorisation),
    # factored in place: the factorisation does not reference the strict upper triangle of what it is given (LAPACK's
    # documentation), scaled's strict lower one, which with the diagonal kept aside is all the residual and the
    # eigen route (numpy's eigh reads the lower triangle) read of scaled afterwards: no second r x r array.
    # Where the rank is at most a quarter of dim, LAPACK's unblocked dpstf2 (the same contract): it computes each
    # factor column from the ones before it and leaves the unfactored block alone, where the blocked dpstrf updates
    # that whole block after each block of columns, which the residual computes again (r = 2048: 9 against 20 ms
    # at rank 128, 20 against 33 at 256); from about a third of dim dpstrf's level-3 updates win (157 against 96
    # ms at rank 1024)
    unblocked = rank_bound is not None and UNBLOCKED_RANK_SHARE * dim >= rank_bound
    diagonal = np.diagonal(scaled).copy()
    factor, pivots, rank, info = (lapack.dpstf2 if unblocked else lapack.dpstrf)(scaled.T, lower=1, overwrite_a=1)
    L = factor[:, :rank].copy(order="C")  # before the diagonal it shares with scaled is put back
    L[:rank] = np.tril(L[:rank])  # above the factor's diagonal: scaled's lower triangle, not the factor
    np.fill_diagonal(scaled, diagonal)
    order = pivots - 1  # row i of the factor is feature order[i]
    if info == 0:  # full rank, but the bound did not clear the cut
        return _eigen_spectrum(s, scaled, rtol).of_mean(mean_of)
    mu, V = np.linalg.eigh(L.T @ L)
    top, spread = (float(mu[-1]) if rank else 0.0), _residual_norm(scaled, order[rank:], L[rank:])
    if info < 0 or top <= 0 or spread > RESIDUAL_SHARE * rtol * top:
        return _eigen_spectrum(s, scaled, rtol).of_mean(mean_of)
    keep = mu > rtol * top
    W = np.empty((dim, int(keep.sum())))
    W[order] = L @ (V[:, keep] / mu[keep])  # back in feature order
    return GramInverse((s * np.sqrt(mean_of))[:, None] * W, False, rtol * top, -spread, top)


def _residual_norm(scaled: np.ndarray, unfactored: np.ndarray, rows: np.ndarray) -> float:
    """``||R||_F`` of the residual ``R = scaled[u, u] - rows rows^T`` (``u = unfactored``), read from ``scaled``'s
    lower triangle and diagonal only (its upper triangle may hold anything: :func:`gram_inverse` factors it in
    place), symmetric: one ``dsyrk`` into its lower triangle (half the multiply-adds of the general product) and
    ``||R||_F^2 = 2 ||strict lower||^2 + ||diagonal||^2``."""
    from scipy.linalg.blas import dsyrk

    if not unfactored.size:
        return 0.0
    # the norm does not depend on the order of the unfactored features: in ascending order the gather
    # streams through scaled's rows (half the time of the pivot order at r = 2048), and the block's lower
    # triangle is scaled's
    order = np.argsort(unfactored, kind="stable")
    unfactored, rows = unfactored[order], rows[order]
    block = np.take(np.take(scaled, unfactored, 0), unfactored, 1)  # rows, then columns: 0.6 of the time of np.ix_
    if rows.shape[1]:
        # the block's lower triangle is the upper one of its transpose, a Fortran-ordered view BLAS updates in place
        dsyrk(-1.0, rows, beta=1.0, c=block.T, trans=0, lower=0, overwrite_c=1)
    n, step, off_diagonal = block.shape[0], ROW_STEP, 0.0
    for i in range(0, n, step):  # strictly lower part, a slab of rows at a time (np.tril would copy it all)
        head = np.tril(block[i : i + step, i : i + step], -1)
        tail = block[i : i + step, :i]
        off_diagonal += float(np.sum(head * head)) + float(np.einsum("ij,ij->", tail, tail))
    diagonal = np.diagonal(block)
    return float(np.sqrt(2.0 * off_diagonal + np.dot(diagonal, diagonal)))


def _certified_inverse(scaled: np.ndarray, rtol: float,
                       zeros_below: bool = False) -> tuple[np.ndarray, float, float] | None:
    """``(L^-1, 1 / tr(scaled^-1), ||scaled||_F)`` from the unpivoted Cholesky factor ``scaled = L L^T`` when the
    lower bound ``1 / tr(scaled^-1)`` on its smallest eigenvalue clears the cut (:func:`gram_inverse`), else ``None``
    (``dpotrf`` stops at the first non-positive pivot: a rank-deficient Gram costs little here).

    Factored and inverted in ``scaled``'s own array (its transposed view; ``L^-1`` is returned in it, the rest
    zeroed), so ``scaled`` no longer holds the matrix afterwards, whatever the answer: no second ``r x r`` array,
    whose fresh pages cost as much as half the factorisation (a report's Grams at ``r = 1024``).  ``zeros_below``:
    ``scaled`` holds the matrix in its upper triangle and zeros below (:func:`_unit_upper`), which are the factor's
    zeros as they are, where SciPy's ``clean`` would write them column by column across the rows (3 ms at
    ``r = 1024``, a fifth of the factorisation), and ``||scaled||_F^2`` is twice the triangle's less the diagonal's.
    """
    from scipy.linalg import lapack

    if zeros_below:
        flat, diagonal = scaled.ravel(), np.diagonal(scaled)
        top = float(np.sqrt(2.0 * float(np.dot(flat, flat)) - float(np.dot(diagonal, diagonal))))
    else:
        top = float(np.linalg.norm(scaled))
    # the Fortran-ordered view, factored where it is: no transposed copy, no copy at all
    factor, info = lapack.dpotrf(scaled.T, lower=1, clean=int(not zeros_below), overwrite_a=1)
    if info != 0:
        return None
    inverse, info = lapack.dtrtri(factor, lower=1, overwrite_c=1)  # in the factor's own array: no second r x r
    flat = inverse.ravel(order="K")  # a view of the Fortran-ordered triangle: ||L^-1||_F^2 without a squared copy
    lowest = 1.0 / float(np.dot(flat, flat))
    if info != 0 or not lowest > (CERTIFIED_MARGIN * rtol + CHOLESKY_ERROR * scaled.shape[0] * np.finfo(float).eps) * top:
        return None
    return inverse, lowest, top
