"""Per-sample residual-parameter gradients ``xi_i = vec(Q_i^T Psi_i)`` at one candidate.

The probe keeps only sums; the train/held-out alignment statistics
(docs/core.md, Train/held-out alignment) need the per-sample kernel ``k_ij = xi_i^T xi_j``.  We tap the
stream with the adapter's own :class:`StreamTaps` and feature map, so ``q``
and ``psi`` are exactly those the probe used.  For the gradient-matched block
the relevant metric is ``K^+`` (its first-order change is
``-alpha <C_eval, C_fit K^+>``), so the gradients are whitened,
``y_i = X_i U diag(lam^-1/2)`` with ``K = U diag(lam) U^T``, and ``y_i^T y_j`` is the kernel in that metric.
(Forming ``X_i`` is cheap here because ``N r`` is small; ``satcore.xi_kernel``
works position by position and is slow for image candidates with many pixels.)
"""

from __future__ import annotations

import numpy as np
import torch

from satcore import psd_spectrum
from satcore.adapters.torch import StreamTaps, positions
from satcore.adapters.torch.probe import eval_mode


def per_sample_xi(model, data, loss_fn, candidate, feature_map) -> np.ndarray:
    """``X_i = Q_i^T Psi_i`` as ``(n, N, r)`` float64 for ``candidate`` (a ``Candidate``)."""
    out = []
    with eval_mode(model), StreamTaps(model, (candidate,)) as taps:
        for inputs, targets in data:
            taps.clear()
            total = loss_fn(model(inputs), targets).sum()
            (grad,) = taps.gradients(total, [candidate.name])  # batch-first, as the streams
            with torch.no_grad():
                psi = feature_map(taps.streams[candidate.name])
                out.append(torch.einsum("mtn,mtr->mnr", positions(grad).to(psi.dtype), psi).to(torch.float64).numpy())
    return np.concatenate(out)


def whitened_kernel(X: np.ndarray, K: np.ndarray) -> np.ndarray:
    """``k_ij = tr(X_i K^+ X_j^T)`` from ``y_i = X_i U diag(lam^-1/2)`` (the core's ``PsdSpectrum.whiten``)."""
    Y = psd_spectrum(K).whiten(X).reshape(len(X), -1)
    return Y @ Y.T
