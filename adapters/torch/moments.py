"""Per-batch sums on the model's device, handed to the core in float64.

:func:`batch_moments` is the torch twin of :func:`satcore.batch_moments`
(same fields, same choice of the cheaper ``sum ||X_i||^2`` route); it runs in
``dtype`` (float64 by default, float32 for speed) and returns float64 NumPy
values for :meth:`satcore.CandidateStatistics.add_moments`, where the totals
are always float64.

Position subsampling (:func:`subsample_positions`): keep ``T'`` of ``T``
positions, drawn uniformly without replacement once per batch, and scale
both ``q`` and ``psi`` by ``sqrt(T / T')``.  Each position is kept with
probability ``T'/T``, so every sum that is linear in the position products
``q_t psi_t^T``, ``psi_t psi_t^T`` and ``||q_t||^2`` (``sum_cross``,
``sum_gram``, ``sum_q_sq``) is unbiased.  ``sum_xi_sq`` and ``sum_xtx`` then
describe the per-sample spread of the SUBSAMPLED gradient, which is the
variance the finite-sample test needs for the estimator actually used.
"""

from __future__ import annotations

import math

import torch


def _numpy(x: torch.Tensor):
    return x.detach().to(device="cpu", dtype=torch.float64).numpy()


def batch_moments(q: torch.Tensor, psi: torch.Tensor, *, variance: bool = False, dtype=torch.float64) -> dict:
    """Sums of one batch for ``add_moments``; ``q`` ``(M, T, N)``, ``psi`` ``(M, T, r)``.

    ``sum_q_sq = sum ||Q_i||^2``, ``sum_cross = sum Q_i^T Psi_i``,
    ``sum_gram = sum Psi_i^T Psi_i``, ``sum_xi_sq = sum ||X_i||_F^2`` and, when
    ``variance``, ``sum_xtx = sum X_i^T X_i`` with ``X_i = Q_i^T Psi_i``, plus
    the eq. (2) batch norm ``||Q_b||_F / |b|``.  As in the core, ``X_i`` is
    formed only when cheaper than the ``T x T`` kernel ``K_i = Q_i Q_i^T``
    (``||X_i||^2 = <K_i, Psi_i Psi_i^T>``, ``X_i^T X_i = Psi_i^T K_i Psi_i``).
    """
    q, psi = q.to(dtype), psi.to(dtype)
    M, T, N = q.shape
    r = psi.shape[2]
    q2, p2 = q.reshape(M * T, N), psi.reshape(M * T, r)
    sum_q_sq = float((q2 * q2).sum())
    out = {
        "n_samples": M,
        "sum_q_sq": sum_q_sq,
        "sum_cross": _numpy(q2.T @ p2),
        "sum_gram": _numpy(p2.T @ p2),
        "batch_grad_norm": math.sqrt(sum_q_sq) / M,
    }
    kernel_cost = T * T * (N + r) + (T * r * r if variance else 0)
    gradient_cost = T * N * r + (N * r * r if variance else 0)
    if kernel_cost <= gradient_cost:
        kq = q @ q.transpose(1, 2)
        if variance:
            w = kq @ psi  # K_i Psi_i
            out["sum_xi_sq"] = float((w * psi).sum())
            out["sum_xtx"] = _numpy(p2.T @ w.reshape(M * T, r))
        else:
            out["sum_xi_sq"] = float((kq * (psi @ psi.transpose(1, 2))).sum())
    else:
        X = (q.transpose(1, 2) @ psi).reshape(M * N, r)
        out["sum_xi_sq"] = float((X * X).sum())
        if variance:
            out["sum_xtx"] = _numpy(X.T @ X)
    return out


def position_index(T: int, keep: int | None, generator: torch.Generator) -> torch.Tensor | None:
    """Uniform ``keep``-subset of ``range(T)`` (sorted), or ``None`` to keep all."""
    if keep is None or keep >= T:
        return None
    if keep < 1:
        raise ValueError(f"position_subsample must be >= 1, got {keep}")
    return torch.randperm(T, generator=generator)[:keep].sort().values


def subsample_positions(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """``x[:, index] * sqrt(T / T')`` for ``x`` ``(M, T, width)`` (identity when ``index`` is None)."""
    if index is None:
        return x
    T = x.shape[1]
    return x[:, index.to(x.device)] * math.sqrt(T / index.numel())
