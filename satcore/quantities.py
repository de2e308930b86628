"""Array-level quantities of the first-order depth-saturation criterion.

Notation (sample-first; the paper's matrices are the transposes):
``Q`` holds activation gradients ``q_i = d loss_i / d z_i`` of shape ``(M, N)`` or
``(M, T, N)``; ``Psi`` holds residual features ``psi(z_i)`` of shape ``(M, r)`` or
``(M, T, r)``; the standard zero-output block is ``h(z) = V psi(z)`` with ``V``
(``N x r``) at zero.  The empirical inner product is
``<a, b>_S = (1/M) sum_i <a_i, b_i>_F``.  Everything is computed in float64.
"""

from __future__ import annotations

import math

import numpy as np

from ._arrays import as_pair, as_samples
from ._psd import DEFAULT_RTOL, psd_spectrum


def ag(Q) -> float:
    """Activation-gradient score ``AG = ||q_S||_S = sqrt(sum_i ||Q_i||_F^2 / M)``.

    Paper Remark 1.  Equals the growth value when the signal is realizable
    (Theorem 2 item 2).
    """
    q = as_samples(Q, "Q")
    return float(np.sqrt(np.einsum("mtn,mtn->", q, q) / q.shape[0]))


def ag_normalized(Q) -> float:
    """Coordinate-normalised ``AG / sqrt(N)`` with ``N`` the hidden width (Remark 1).

    A visual scale only: it can reorder candidates of different widths.
    """
    q = as_samples(Q, "Q")
    return ag(q) / np.sqrt(q.shape[2])


def ag_batch(Q, batch_size: int) -> float:
    """The paper's logged statistic, eq. (2): ``mean_b ||dL_b/dH_b||_2``.

    ``L_b`` is the batch-MEAN loss, so ``dL_b/dH_b = Q_b / |b|`` for per-sample
    gradients ``Q_b``.  Batches are consecutive chunks of ``batch_size`` samples
    (the last one may be short), as a data loader without shuffling yields them.
    """
    q = as_samples(Q, "Q")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    norms = [
        np.linalg.norm(q[s : s + batch_size]) / q[s : s + batch_size].shape[0]
        for s in range(0, q.shape[0], batch_size)
    ]
    return float(np.mean(norms))


def cross_gradient(Q, Psi) -> np.ndarray:
    """Cross-gradient ``C = (1/M) sum_i Q_i^T Psi_i`` (``N x r``).

    Paper: ``C_S = M^-1 Q_S Psi_S^T``; ``vec(C)`` is the residual-parameter
    gradient ``g_S`` of the standard block (Appendix F).
    """
    q, psi = as_pair(Q, Psi)
    return np.einsum("mtn,mtr->nr", q, psi) / q.shape[0]


def feature_gram(Psi) -> np.ndarray:
    """Feature Gram ``K = (1/M) sum_i Psi_i^T Psi_i`` (``r x r``), paper ``Psi_S Psi_S^T / M``."""
    psi = as_samples(Psi, "Psi")
    return np.einsum("mtr,mts->rs", psi, psi) / psi.shape[0]


def growth_value_from_moments(C, K, rtol: float = DEFAULT_RTOL) -> float:
    """``V_S = sqrt(tr(C K^+ C^T))`` from the cross-gradient and the Gram.

    Lemma 4 with ``g = vec(C)`` and ``G = I_N (x) K``: ``g^T G^+ g = tr(C K^+ C^T)``.
    Never forms an ``M x M`` matrix.  ``rtol`` is the eigenvalue cut of
    :mod:`satcore._psd`.
    """
    return float(np.sqrt(psd_spectrum(K, rtol).quadratic_form(C)))


def growth_value(Q, Psi, rtol: float = DEFAULT_RTOL) -> float:
    """Empirical residual growth value ``V_S = ||Pi_S q_S||_S`` (Theorem 2, Lemma 4).

    Computed by the Gram form ``sqrt(tr(C K^+ C^T))``; equals
    ``||Q Pi_Psi||_F / sqrt(M)`` with the explicit projector of :func:`projector`.
    """
    return growth_value_from_moments(cross_gradient(Q, Psi), feature_gram(Psi), rtol)


def growth_value_jacobian(Q, J, rtol: float = DEFAULT_RTOL) -> float:
    """Growth value of a general residual family, Lemma 4: ``V^2 = g^T G^+ g``.

    ``J`` has shape ``(M, N, p)`` or ``(M, T*N, p)`` with rows ordered
    position-major (row ``t*N + n``), ``g = (1/M) sum_i J_i^T q_i`` and
    ``G = (1/M) sum_i J_i^T J_i``.
    """
    q = as_samples(Q, "Q")
    jac = np.asarray(J)
    if jac.ndim != 3 or jac.dtype.kind != "f":
        raise ValueError(f"J: expected a float array of shape (M, T*N, p), got {jac.shape} {jac.dtype}")
    jac = jac.astype(np.float64, copy=False)
    M, T, N = q.shape
    if jac.shape[:2] != (M, T * N):
        raise ValueError(f"J has shape {jac.shape}, expected ({M}, {T * N}, p) for Q of shape {q.shape}")
    flat_q = q.reshape(M, T * N)
    g = np.einsum("mkp,mk->p", jac, flat_q) / M
    G = np.einsum("mkp,mks->ps", jac, jac) / M
    return float(np.sqrt(psd_spectrum(G, rtol).quadratic_form(g[None, :])))


def projector(Psi, rtol: float = DEFAULT_RTOL) -> np.ndarray:
    """Explicit orthogonal projector ``Pi_Psi`` onto the row space of the paper's ``Psi_S``.

    Sample-first this is the ``(M*T) x (M*T)`` matrix ``P (P^T P)^+ P^T`` with
    ``P`` the features stacked as ``(M*T, r)`` rows.  Built from the SVD of
    ``P S`` (the columns scaled to unit norm, the Jacobi scaling of
    :mod:`satcore._psd`; same column space) with the singular-value cut
    ``sqrt(rtol)``, the same cut the Gram form uses on eigenvalues.  Memory is
    ``O((M*T)^2)``: a reference and teaching path.
    """
    psi = as_samples(Psi, "Psi")
    P = psi.reshape(-1, psi.shape[2])
    norms = np.linalg.norm(P, axis=0)
    U, s, _ = np.linalg.svd(P / np.where(norms > 0, norms, 1.0), full_matrices=False)
    keep = s > np.sqrt(rtol) * s[0] if s.size and s[0] > 0 else np.zeros(s.shape, dtype=bool)
    Uk = U[:, keep]
    # An explicit copy keeps NumPy off the syrk path: OpenBLAS 0.3.31's threaded syrk
    # segfaults on tall inputs (seen at 20000 x 256 with 2 threads).
    return Uk @ np.ascontiguousarray(Uk.T)


def projected_growth_value(Q, Psi, rtol: float = DEFAULT_RTOL) -> float:
    """Reference path: ``||Q Pi_Psi||_F / sqrt(M)`` with the explicit projector (Appendix F)."""
    q, psi = as_pair(Q, Psi)
    flat = q.reshape(-1, q.shape[2])
    projected = projector(psi, rtol) @ flat
    return float(np.linalg.norm(projected) / np.sqrt(q.shape[0]))


def realizability(growth: float, ag_value: float) -> float:
    """``growth_value / ag`` in ``[0, 1]``, i.e. ``sqrt(1 - eps_real^2)`` (Remark 3).

    ``nan`` when ``ag == 0`` (no signal to realise) or either value is ``nan``.  Round-off can push the
    ratio a few ulps above 1 in the tangent-complete case; it is capped at 1.
    """
    if ag_value == 0:
        return float("nan")
    ratio = growth / ag_value
    return float(ratio if math.isnan(ratio) else min(1.0, ratio))


def feature_rank(Psi, rtol: float = DEFAULT_RTOL) -> int:
    """``rank(K) = rank(Psi_S)`` with the eigenvalue cut of :mod:`satcore._psd`."""
    return psd_spectrum(feature_gram(Psi), rtol).rank


def tangent_complete(Psi, rtol: float = DEFAULT_RTOL) -> bool:
    """Sample-wise tangent completeness: ``rank(Psi_S) == M*T`` (Theorem 2 item 4).

    Only possible when ``r >= M*T``; then ``growth_value == ag``.
    """
    psi = as_samples(Psi, "Psi")
    return feature_rank(psi, rtol) == psi.shape[0] * psi.shape[1]


def depth_max(values) -> tuple[float, int]:
    """Depth-wide maximum and its index: ``V_depth = max_l V_l`` (paper, growth values)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("no candidates")
    idx = int(np.nanargmax(arr))
    return float(arr[idx]), idx
