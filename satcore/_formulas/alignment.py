"""Train/held-out gradient alignment (docs/core.md, Train/held-out alignment).

Two independent means ``g1`` (``n1`` samples) and ``g2`` (``n2`` samples) of
per-sample gradients ``xi`` with mean ``mu`` and covariance ``Sigma`` satisfy,
exactly and with finite second moments only,

    E <g1, g2>   = ||mu||^2
    Var <g1, g2> = mu^T Sigma mu (1/n1 + 1/n2) + tr(Sigma^2) / (n1 n2).

Cantelli then bounds the chance that the two splits disagree in direction:
``P(<g1, g2> <= 0) <= Var / (Var + ||mu||^4)``.

The moments are estimated from the per-sample kernel
``k_ij = xi_i^T xi_j = <Q_i^T Psi_i, Q_j^T Psi_j>_F`` (no ``p = N r``-vectors)
by U-statistics, with ``A = E (x1.x2)^2``, ``B = E (x1.x2)(x1.x3)`` and
``D = E (x1.x2)(x3.x4)`` over distinct indices:
``||mu||^4 = D``, ``mu^T Sigma mu = B - D``, ``tr(Sigma^2) = A - 2B + D``.

Effective alignment dimension: ``d_eff = tr(Sigma)^2 / tr(Sigma^2)`` (the
participation ratio of the spectrum of ``Sigma``; ``1 <= d_eff <= p``).  It is
the number of equally strong noise directions that would produce the same
``tr(Sigma^2)`` for the same total variance.

References: docs/core.md, Train/held-out alignment; the exact moments and the
Cantelli bound follow the effective-alignment-dimension study of train/test
gradient alignment (docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._shared.arrays import as_pair
from .._shared.errors import InputError
from .quantities import cross_gradient


def alignment_moments(mu, Sigma, n1: int, n2: int) -> tuple[float, float]:
    """Exact ``(E<g1,g2>, Var<g1,g2>)`` for known ``mu`` (``p``) and ``Sigma`` (``p x p``).

    ``E<g1,g2> = ||mu||^2`` and
    ``Var<g1,g2> = mu^T Sigma mu (1/n1 + 1/n2) + tr(Sigma^2) / (n1 n2)``.

    Parameters
    ----------
    mu : array_like, shape (p,)
        Population mean of the per-sample gradients.
    Sigma : array_like, shape (p, p)
        Their covariance.
    n1, n2 : int
        Sizes of the two independent splits.

    Returns
    -------
    (float, float)
        The mean and the variance of ``<g1, g2>``.

    References
    ----------
    docs/core.md, Train/held-out alignment; docs/references.md (effective
    alignment dimension).

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.alignment_moments(np.array([1.0, 0.0]), np.eye(2), 10, 10)  # 1 * 0.2 + 2 / 100
    (1.0, 0.22)
    """
    mu = np.asarray(mu, dtype=np.float64)
    Sigma = np.asarray(Sigma, dtype=np.float64)
    mean = float(mu @ mu)
    var = float(mu @ Sigma @ mu) * (1 / n1 + 1 / n2) + float(np.sum(Sigma * Sigma.T)) / (n1 * n2)
    return mean, var


def misalignment_bound(mean: float, var: float) -> float:
    """Cantelli: ``P(<g1,g2> <= 0) <= Var / (Var + mean^2)`` for ``mean = ||mu||^2 > 0``.

    Parameters
    ----------
    mean : float
        ``E<g1, g2> = ||mu||^2``.
    var : float
        ``Var<g1, g2>``.

    Returns
    -------
    float
        The bound on the probability that the two splits' gradients disagree
        in direction; 1 when ``mean <= 0`` (no direction to agree on).

    References
    ----------
    docs/core.md, Train/held-out alignment.

    Examples
    --------
    >>> import satcore
    >>> round(satcore.misalignment_bound(1.0, 0.22), 6), satcore.misalignment_bound(0.0, 1.0)
    (0.180328, 1.0)
    """
    if mean <= 0:
        return 1.0
    return var / (var + mean * mean)


def xi_kernel(Q, Psi, chunk: int = 256, max_bytes: int = 2**28) -> np.ndarray:
    """Per-sample gradient kernel ``k_ij = <Q_i^T Psi_i, Q_j^T Psi_j>_F`` (``n x n``).

    Equals ``sum_{t,s} (q_it . q_js)(psi_it . psi_js)``; with one position it is
    ``(Q Q^T) * (Psi Psi^T)``.  With positions, the per-sample ``X_i`` (``N x r``)
    are formed when they fit in ``max_bytes`` (then ``k = X X^T``, one product);
    otherwise the ``T x T`` position kernels are used in chunks of samples, so
    memory stays ``O(chunk^2 T^2)`` and no ``p = N r`` vector is formed.

    Parameters
    ----------
    Q : array_like, shape (n, N) or (n, T, N)
        Per-sample activation gradients.
    Psi : array_like, shape (n, r) or (n, T, r)
        Features of the candidate block.
    chunk : int, optional
        Sample-position pairs per block of the chunked path.
    max_bytes : int, optional
        Largest ``n N r`` float64 array the direct path may form.

    Returns
    -------
    numpy.ndarray, shape (n, n)
        ``xi_i^T xi_j`` with ``xi_i = vec(Q_i^T Psi_i)``.

    References
    ----------
    docs/core.md, Train/held-out alignment.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> satcore.xi_kernel(Q, Psi)
    array([[1., 0., 1.],
           [0., 0., 0.],
           [1., 0., 2.]])
    """
    q, psi = as_pair(Q, Psi)
    n, T, N = q.shape
    r = psi.shape[2]
    if T == 1:
        return (q[:, 0] @ q[:, 0].T) * (psi[:, 0] @ psi[:, 0].T)
    if n * N * r * 8 <= max_bytes:
        X = (q.transpose(0, 2, 1) @ psi).reshape(n, N * r)
        return X @ np.ascontiguousarray(X.T)
    step = max(1, chunk // T)
    out = np.empty((n, n))
    for a in range(0, n, step):
        for b in range(0, n, step):
            kq = np.einsum("atn,bsn->abts", q[a : a + step], q[b : b + step])
            kp = np.einsum("atr,bsr->abts", psi[a : a + step], psi[b : b + step])
            out[a : a + step, b : b + step] = np.einsum("abts,abts->ab", kq, kp)
    return out


@dataclass(frozen=True)
class AlignmentEstimate:
    """U-statistic estimates of the moments in the module docstring."""

    n_samples: int
    mean_energy: float  # ||mu||^2
    mu_sigma_mu: float  # mu^T Sigma mu
    trace_sigma: float  # tr(Sigma)
    trace_sigma_sq: float  # tr(Sigma^2)
    effective_dimension: float  # tr(Sigma)^2 / tr(Sigma^2)

    def predicted(self, n1: int, n2: int) -> tuple[float, float, float]:
        """``(E<g1,g2>, Var<g1,g2>, Cantelli bound)`` for splits of sizes ``n1``, ``n2``."""
        var = self.mu_sigma_mu * (1 / n1 + 1 / n2) + self.trace_sigma_sq / (n1 * n2)
        var = max(var, 0.0)
        return self.mean_energy, var, misalignment_bound(self.mean_energy, var)


def estimate_alignment(kernel) -> AlignmentEstimate:
    """Unbiased U-statistics from a per-sample kernel (needs ``n >= 4``).

    With ``A = E (x1.x2)^2``, ``B = E (x1.x2)(x1.x3)`` and
    ``D = E (x1.x2)(x3.x4)`` averaged over distinct indices:
    ``||mu||^4 = D``, ``mu^T Sigma mu = B - D``, ``tr(Sigma^2) = A - 2B + D``;
    ``||mu||^2`` and ``tr(Sigma)`` come from the off-diagonal mean and the
    diagonal.

    Parameters
    ----------
    kernel : array_like, shape (n, n)
        ``k_ij = xi_i^T xi_j`` (:func:`xi_kernel`).

    Returns
    -------
    AlignmentEstimate
        ``||mu||^2``, ``mu^T Sigma mu``, ``tr(Sigma)``, ``tr(Sigma^2)`` and
        ``d_eff = tr(Sigma)^2 / tr(Sigma^2)``.

    References
    ----------
    docs/core.md, Train/held-out alignment.

    Examples
    --------
    Gradients ``x_i = mu + noise`` with ``mu = e_1`` and unit noise in 3
    directions: ``||mu||^2 = 1`` and ``d_eff = 3``.

    >>> import numpy as np, satcore
    >>> x = np.random.default_rng(0).standard_normal((2000, 3)) + np.array([1.0, 0.0, 0.0])
    >>> est = satcore.estimate_alignment(x @ x.T)
    >>> round(est.effective_dimension, 2), bool(abs(est.mean_energy - 1) < 0.1)
    (3.0, True)
    """
    k = np.asarray(kernel, dtype=np.float64)
    n = k.shape[0]
    if n < 4 or k.shape != (n, n):
        raise InputError("need a square kernel over at least 4 samples")
    diag = np.diag(k).copy()
    off = k - np.diag(diag)
    S = off.sum()  # sum over ordered pairs i != j
    P2 = np.sum(off * off)  # sum_{i != j} k_ij^2
    row = off.sum(axis=1)
    P3 = np.sum(row * row) - P2  # sum over distinct i, j, l of k_ij k_il
    P4 = S * S - 2 * P2 - 4 * P3  # four distinct indices
    A = P2 / (n * (n - 1))
    B = P3 / (n * (n - 1) * (n - 2))
    D = P4 / (n * (n - 1) * (n - 2) * (n - 3))
    mean_energy = S / (n * (n - 1))
    trace_sigma = diag.mean() - mean_energy  # E||x||^2 - ||mu||^2
    trace_sigma_sq = A - 2 * B + D
    d_eff = trace_sigma**2 / trace_sigma_sq if trace_sigma_sq > 0 else float("nan")
    return AlignmentEstimate(n, float(mean_energy), float(B - D), float(trace_sigma), float(trace_sigma_sq), float(d_eff))


def split_inner_product(Q1, Psi1, Q2, Psi2) -> float:
    """Observed ``<g1, g2> = <C1, C2>_F`` for the standard block on two splits.

    Parameters
    ----------
    Q1, Psi1 : array_like
        Gradients and features of the first split (shapes as :func:`satcore.cross_gradient`).
    Q2, Psi2 : array_like
        The same for the second split.

    Returns
    -------
    float
        The Frobenius inner product of the two cross-gradients.

    References
    ----------
    docs/core.md, Train/held-out alignment.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> round(satcore.split_inner_product(Q, Psi, Q, Psi) * 9, 12)  # ||3 C||_F^2 = 4 + 1
    5.0
    """
    return float(np.sum(cross_gradient(Q1, Psi1) * cross_gradient(Q2, Psi2)))
