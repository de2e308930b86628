"""Array-level quantities of the first-order depth-saturation criterion.

Notation (sample-first; the paper's matrices are the transposes):
``Q`` holds activation gradients ``q_i = d loss_i / d z_i`` of shape ``(M, N)`` or
``(M, T, N)``; ``Psi`` holds residual features ``psi(z_i)`` of shape ``(M, r)`` or
``(M, T, r)``; the standard zero-output block is ``h(z) = V psi(z)`` with ``V``
(``N x r``) at zero.  The empirical inner product is
``<a, b>_S = (1/M) sum_i <a_i, b_i>_F``.  Everything is computed in float64.
Formulas: docs/core.md, Conventions and Quantities.

The examples share one tiny problem: three samples of a width-2 stream and one
feature, ``psi = (1, 0, 1)`` over the samples.  The first gradient coordinate
``(1, 0, 1)`` lies in the features' span, the second ``(0, 2, 1)`` projects to
``(0.5, 0, 0.5)``, so ``V^2 = (2 + 0.5) / 3`` while ``ag^2 = 7 / 3``.
"""

from __future__ import annotations

import math

import numpy as np

from .._shared.arrays import as_pair, as_samples, check_memory, squared_norm_in_range
from .psd import DEFAULT_RTOL, psd_spectrum
from .._shared.errors import InputError


def ag(Q) -> float:
    """Activation-gradient score ``AG = ||q_S||_S = sqrt(sum_i ||Q_i||_F^2 / M)``.

    Equals the growth value when the signal is realizable (Theorem 2 item 2).

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients ``q_i = d loss_i / d z_i``.

    Returns
    -------
    float
        ``sqrt(sum_i ||Q_i||_F^2 / M)``.

    References
    ----------
    Paper, Remark 1; docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> round(satcore.ag(Q) ** 2, 12)  # (1 + 4 + 2) / 3
    2.333333333333
    """
    q = as_samples(Q, "Q")
    return float(np.sqrt(np.einsum("mtn,mtn->", q, q) / q.shape[0]))


def ag_normalized(Q) -> float:
    """Coordinate-normalised ``AG / sqrt(N)`` with ``N`` the hidden width (Remark 1).

    A visual scale only: it can reorder candidates of different widths.

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients.

    Returns
    -------
    float
        ``ag(Q) / sqrt(N)`` (``N`` the last axis, not ``T * N``).

    References
    ----------
    Paper, Remark 1; docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.ones((4, 4, 16))  # 4 samples, 4 positions, width 16: ||Q_i||_F = 8
    >>> satcore.ag(Q), satcore.ag_normalized(Q)
    (8.0, 2.0)
    """
    q = as_samples(Q, "Q")
    return ag(q) / math.sqrt(q.shape[2])


def ag_batch(Q, batch_size: int) -> float:
    """The paper's logged statistic, eq. (2): ``mean_b ||dL_b/dH_b||_2``.

    ``L_b`` is the batch-MEAN loss, so ``dL_b/dH_b = Q_b / |b|`` for per-sample
    gradients ``Q_b``.  Batches are consecutive chunks of ``batch_size`` samples
    (the last one may be short), as a data loader without shuffling yields them.

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients, in loader order.
    batch_size : int
        Samples per batch (``>= 1``).

    Returns
    -------
    float
        ``mean_b ||Q_b||_F / |b|``.

    References
    ----------
    Paper, eq. (2); docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[3.0, 4.0], [3.0, 4.0], [0.0, 1.0]])
    >>> round(satcore.ag_batch(Q, 2), 12)  # batches {0, 1}: sqrt(50) / 2, {2}: 1
    2.267766952966
    """
    q = as_samples(Q, "Q")
    if batch_size < 1:
        raise InputError("batch_size must be >= 1")
    norms = [
        np.linalg.norm(q[s : s + batch_size]) / q[s : s + batch_size].shape[0]
        for s in range(0, q.shape[0], batch_size)
    ]
    return float(np.mean(norms))


def cross_gradient(Q, Psi) -> np.ndarray:
    """Cross-gradient ``C = (1/M) sum_i Q_i^T Psi_i`` (``N x r``).

    ``vec(C)`` is the gradient ``g_S`` of the mean loss in the terminal
    projection ``V`` of the standard block (Appendix F).

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients.
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block, same ``M`` (and ``T``).

    Returns
    -------
    numpy.ndarray, shape (N, r)
        ``C``, float64.

    References
    ----------
    Paper: ``C_S = M^-1 Q_S Psi_S^T``, Theorem 2 item 3, Appendix F;
    docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> satcore.cross_gradient(Q, Psi) * 3
    array([[2.],
           [1.]])
    """
    q, psi = as_pair(Q, Psi)
    return np.einsum("mtn,mtr->nr", q, psi) / q.shape[0]


def feature_gram(Psi) -> np.ndarray:
    """Feature Gram ``K = (1/M) sum_i Psi_i^T Psi_i`` (``r x r``), paper ``Psi_S Psi_S^T / M``.

    Parameters
    ----------
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.

    Returns
    -------
    numpy.ndarray, shape (r, r)
        ``K``, symmetric positive semi-definite, float64.

    References
    ----------
    Paper, Theorem 2 and Lemma 4 (``G = I_N (x) K``); docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Psi = np.array([[1.0, 0.0], [1.0, 2.0]])
    >>> satcore.feature_gram(Psi)
    array([[1., 1.],
           [1., 2.]])
    """
    psi = as_samples(Psi, "Psi")
    check_memory(8 * psi.shape[2] ** 2, f"the Gram of r = {psi.shape[2]} features")
    return np.einsum("mtr,mts->rs", psi, psi) / psi.shape[0]


def growth_value_from_moments(C, K, rtol: float = DEFAULT_RTOL) -> float:
    """``V_S = sqrt(tr(C K^+ C^T))`` from the cross-gradient and the Gram.

    Lemma 4 with ``g = vec(C)`` and ``G = I_N (x) K``: ``g^T G^+ g = tr(C K^+ C^T)``.
    Never forms an ``M x M`` matrix.

    Parameters
    ----------
    C : array_like, shape (N, r)
        Cross-gradient (:func:`cross_gradient`).
    K : array_like, shape (r, r)
        Feature Gram (:func:`feature_gram`).
    rtol : float, optional
        Relative eigenvalue cut of ``K`` (docs/core.md, Rank tolerance).

    Returns
    -------
    float
        The growth value.

    References
    ----------
    Paper, Theorem 2 and Lemma 4; docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> C = np.array([[2.0], [1.0]]) / 3
    >>> K = np.array([[2.0]]) / 3
    >>> round(satcore.growth_value_from_moments(C, K) ** 2, 12)  # (4 + 1) / 9 / (2 / 3)
    0.833333333333
    """
    return float(np.sqrt(psd_spectrum(K, rtol).quadratic_form(C)))


def growth_value(Q, Psi, rtol: float = DEFAULT_RTOL) -> float:
    """Empirical residual growth value ``V_S = ||Pi_S q_S||_S`` (Theorem 2, Lemma 4).

    Computed by the Gram form ``sqrt(tr(C K^+ C^T))``; equals
    ``||Pi_Psi Q||_F / sqrt(M)`` with the explicit projector of :func:`projector`.
    A first-order decrease of the loss by inserting the block exists iff it is
    positive (Theorem 1).

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients.
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.
    rtol : float, optional
        Relative eigenvalue cut of ``K`` (docs/core.md, Rank tolerance).

    Returns
    -------
    float
        ``V_S``, between 0 and :func:`ag`.

    References
    ----------
    Paper, Theorems 1-2 and Lemma 4; docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> round(satcore.growth_value(Q, Psi) ** 2, 12)  # (2 + 0.5) / 3
    0.833333333333
    >>> bool(np.isclose(satcore.growth_value(Q, Psi), satcore.projected_growth_value(Q, Psi)))
    True
    """
    return growth_value_from_moments(cross_gradient(Q, Psi), feature_gram(Psi), rtol)


def growth_value_jacobian(Q, J, rtol: float = DEFAULT_RTOL) -> float:
    """Growth value of a general residual family, Lemma 4: ``V^2 = g^T G^+ g``.

    ``g = (1/M) sum_i J_i^T q_i`` and ``G = (1/M) sum_i J_i^T J_i``.

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients.
    J : array_like, shape (M, N, p) or (M, T*N, p)
        Jacobians of the block's output in its ``p`` parameters at zero, rows
        ordered position-major (row ``t*N + n``).
    rtol : float, optional
        Relative eigenvalue cut of ``G`` (docs/core.md, Rank tolerance).

    Returns
    -------
    float
        ``sqrt(g^T G^+ g)``.

    References
    ----------
    Paper, Lemma 4; docs/core.md, Quantities.

    Examples
    --------
    The standard block is the family with ``J_i = I_N (x) psi_i^T``:

    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> J = np.stack([np.kron(np.eye(2), p[None, :]) for p in Psi])  # (3, 2, 2)
    >>> bool(np.isclose(satcore.growth_value_jacobian(Q, J), satcore.growth_value(Q, Psi)))
    True
    """
    q = as_samples(Q, "Q")
    jac = np.asarray(J)
    if jac.ndim != 3 or jac.dtype.kind != "f":
        raise InputError(f"J: expected a float array of shape (M, T*N, p), got {jac.shape} {jac.dtype}")
    jac = jac.astype(np.float64, copy=False)
    squared_norm_in_range(jac, "J")  # g and G are bounded by it and ||Q||^2: neither overflows
    M, T, N = q.shape
    if jac.shape[:2] != (M, T * N):
        raise InputError(f"J has shape {jac.shape}, expected ({M}, {T * N}, p) for Q of shape {q.shape}")
    flat_q = q.reshape(M, T * N)
    g = np.einsum("mkp,mk->p", jac, flat_q) / M
    G = np.einsum("mkp,mks->ps", jac, jac) / M
    return float(np.sqrt(psd_spectrum(G, rtol).quadratic_form(g[None, :])))


def projector(Psi, rtol: float = DEFAULT_RTOL) -> np.ndarray:
    """Explicit orthogonal projector ``Pi_Psi`` onto the row space of the paper's ``Psi_S``.

    Sample-first this is the ``(M*T) x (M*T)`` matrix ``P (P^T P)^+ P^T`` with
    ``P`` the features stacked as ``(M*T, r)`` rows.  Built from the SVD of
    ``P S`` (the columns scaled to unit norm, the Jacobi scaling of
    :mod:`satcore._formulas.psd`; same column space) with the singular-value cut
    ``sqrt(rtol)``, the same cut the Gram form uses on eigenvalues.  Memory is
    ``O((M*T)^2)``: a reference and teaching path.

    Parameters
    ----------
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.
    rtol : float, optional
        The eigenvalue cut; singular values below ``sqrt(rtol)`` of the
        largest are dropped.

    Returns
    -------
    numpy.ndarray, shape (M*T, M*T)
        The symmetric, idempotent projector onto the span of the feature
        columns, sample-position pairs in row-major order.

    References
    ----------
    Paper, Appendix F; docs/core.md, Quantities and Rank tolerance.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.projector(np.array([[1.0], [0.0], [1.0]]))
    array([[0.5, 0. , 0.5],
           [0. , 0. , 0. ],
           [0.5, 0. , 0.5]])
    """
    psi = as_samples(Psi, "Psi")
    P = psi.reshape(-1, psi.shape[2])
    check_memory(8 * P.shape[0] ** 2, f"the projector of {P.shape[0]} position vectors")
    norms = np.linalg.norm(P, axis=0)
    U, s, _ = np.linalg.svd(P / np.where(norms > 0, norms, 1.0), full_matrices=False)
    keep = s > np.sqrt(rtol) * s[0] if s.size and s[0] > 0 else np.zeros(s.shape, dtype=bool)
    Uk = U[:, keep]
    # An explicit copy keeps NumPy off the syrk path: OpenBLAS 0.3.31's threaded syrk
    # segfaults on tall inputs (seen at 20000 x 256 with 2 threads).
    return Uk @ np.ascontiguousarray(Uk.T)


def projected_growth_value(Q, Psi, rtol: float = DEFAULT_RTOL) -> float:
    """Reference path: ``||Pi_Psi Q||_F / sqrt(M)`` with the explicit projector (Appendix F).

    Parameters
    ----------
    Q : array_like, shape (M, N) or (M, T, N)
        Per-sample activation gradients.
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.
    rtol : float, optional
        The cut of :func:`projector`.

    Returns
    -------
    float
        The growth value computed through ``Pi_Psi``; equal to
        :func:`growth_value` (docs/core.md, identity 1).

    References
    ----------
    Paper, Appendix F; docs/core.md, Quantities.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> round(satcore.projected_growth_value(Q, Psi) ** 2, 12)
    0.833333333333
    """
    q, psi = as_pair(Q, Psi)
    flat = q.reshape(-1, q.shape[2])
    projected = projector(psi, rtol) @ flat
    return float(np.linalg.norm(projected) / np.sqrt(q.shape[0]))


def realizability(growth: float, ag_value: float) -> float:
    """``growth_value / ag`` in ``[0, 1]``, i.e. ``sqrt(1 - eps_real^2)`` (Remark 3).

    Round-off can push the ratio a few ulps above 1 in the tangent-complete
    case; it is capped at 1.

    Parameters
    ----------
    growth : float
        The growth value.
    ag_value : float
        :func:`ag` of the same gradients.

    Returns
    -------
    float
        ``min(1, growth / ag_value)``; ``nan`` when ``ag_value == 0`` (no
        signal to realise) or either value is ``nan``.

    References
    ----------
    Paper, Remark 3; docs/core.md, Quantities.

    Examples
    --------
    >>> import satcore
    >>> satcore.realizability(0.5, 2.0), satcore.realizability(0.0, 0.0)
    (0.25, nan)
    """
    if ag_value == 0:
        return float("nan")
    ratio = growth / ag_value
    return float(ratio if math.isnan(ratio) else min(1.0, ratio))


def feature_rank(Psi, rtol: float = DEFAULT_RTOL) -> int:
    """``rank(K) = rank(Psi_S)`` with the eigenvalue cut of :mod:`satcore._formulas.psd`.

    Parameters
    ----------
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.
    rtol : float, optional
        Relative eigenvalue cut (docs/core.md, Rank tolerance).

    Returns
    -------
    int
        The number of kept eigenvalues of the Jacobi-scaled ``K``.

    References
    ----------
    Paper, Theorem 2 item 4; docs/core.md, Quantities and Rank tolerance.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Psi = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])  # second feature = 2 x first
    >>> satcore.feature_rank(Psi)
    1
    """
    return psd_spectrum(feature_gram(Psi), rtol).rank


def tangent_complete(Psi, rtol: float = DEFAULT_RTOL) -> bool:
    """Sample-wise tangent completeness: ``rank(Psi_S) == M*T`` (Theorem 2 item 4).

    Only possible when ``r >= M*T``; then ``growth_value == ag`` for every ``Q``.

    Parameters
    ----------
    Psi : array_like, shape (M, r) or (M, T, r)
        Features of the candidate block.
    rtol : float, optional
        Relative eigenvalue cut (docs/core.md, Rank tolerance).

    Returns
    -------
    bool
        Whether the features span every sample-position direction.

    References
    ----------
    Paper, Theorem 2 item 4; docs/core.md, Quantities and identity 4.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.tangent_complete(np.eye(3)), satcore.tangent_complete(np.ones((3, 1)))
    (True, False)
    """
    psi = as_samples(Psi, "Psi")
    return feature_rank(psi, rtol) == psi.shape[0] * psi.shape[1]


def depth_max(values) -> tuple[float, int]:
    """Depth-wide maximum and its index: ``V_depth = max_l V_l``.

    Parameters
    ----------
    values : array_like of float
        One value per candidate in depth order; ``nan`` entries are ignored.

    Returns
    -------
    (float, int)
        The maximum and the index of the (first) candidate attaining it.

    References
    ----------
    Paper, Theorem 1 (the depth-wide growth value); docs/core.md, Quantities.

    Examples
    --------
    >>> import satcore
    >>> satcore.depth_max([0.1, 0.4, 0.2])
    (0.4, 1)
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise InputError("no candidates")
    idx = int(np.nanargmax(arr))
    return float(arr[idx]), idx
