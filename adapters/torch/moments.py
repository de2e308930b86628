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
    ``sum_gram = sum Psi_i^T Psi_i``, ``sum_xi_sq = sum ||Q_i^T Psi_i||_F^2``
    (by the ``T x T`` kernels ``<Q_i Q_i^T, Psi_i Psi_i^T>`` when cheaper),
    ``sum_xtx = sum X_i^T X_i`` when ``variance``, and the eq. (2) batch norm
    ``||Q_b||_F / |b|``.
    """
    q, psi = q.to(dtype), psi.to(dtype)
    M, T, N = q.shape
    r = psi.shape[2]
    sum_q_sq = (q * q).sum()
    out = {
        "n_samples": M,
        "sum_q_sq": float(sum_q_sq),
        "sum_cross": _numpy(torch.einsum("mtn,mtr->nr", q, psi)),
        "sum_gram": _numpy(torch.einsum("mtr,mts->rs", psi, psi)),
        "batch_grad_norm": math.sqrt(float(sum_q_sq)) / M,
    }
    if variance or T * (N + r) >= N * r:
        X = torch.einsum("mtn,mtr->mnr", q, psi)
        out["sum_xi_sq"] = float((X * X).sum())
        if variance:
            out["sum_xtx"] = _numpy(torch.einsum("mnr,mns->rs", X, X))
    else:
        kq = torch.einsum("mtn,msn->mts", q, q)
        kp = torch.einsum("mtr,msr->mts", psi, psi)
        out["sum_xi_sq"] = float((kq * kp).sum())
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
