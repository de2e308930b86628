"""Problem settings for the core tests (BackPACK style): shapes, dtypes, ranks.

Rank deficiency is made exactly representable in float32 (duplicated and zero
feature columns), so the explicit-projector reference and the Gram form face
the same matrix and must make the same rank decision.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


def well_conditioned(rng, rows, cols):
    """Gaussian matrix with rows >= 2 cols or cols >= 2 rows (condition number < 6)."""
    return rng.standard_normal((rows, cols))


@st.composite
def problems(draw, allow_positions=True):
    """Draw ``(Q, Psi)`` covering: random, rank-deficient, positional, float32, tangent-complete."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    M = draw(st.integers(2, 12))
    T = draw(st.integers(1, 3)) if allow_positions else 1
    N = draw(st.integers(1, 5))
    kind = draw(st.sampled_from(["tall", "wide", "rank_deficient"]))
    rows = M * T
    if kind == "tall":  # r <= rows/2: features cannot span the samples
        r = max(1, rows // 2 - draw(st.integers(0, 2)))
        feats = well_conditioned(rng, rows, r)
    elif kind == "wide":  # r >= 2 rows: sample-wise tangent completeness
        r = 2 * rows + draw(st.integers(0, 3))
        feats = well_conditioned(rng, rows, r)
    else:
        k = max(1, min(rows // 2, 4))
        base = well_conditioned(rng, rows, k)
        zero = np.zeros((rows, draw(st.integers(0, 2))))
        feats = np.concatenate([base, base[:, : draw(st.integers(1, k))], zero], axis=1)
        feats = feats[:, rng.permutation(feats.shape[1])]
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    Psi = feats.reshape(M, T, -1).astype(dtype)
    Q = rng.standard_normal((M, T, N)).astype(dtype)
    if T == 1 and draw(st.booleans()):
        Q, Psi = Q[:, 0], Psi[:, 0]
    return Q, Psi


def explicit_jacobians(Psi, N):
    """``J_i`` rows ``(t, n)``: ``I_N kron psi_it^T`` stacked over positions (row-major ``vec V``)."""
    P = np.asarray(Psi, dtype=np.float64)
    if P.ndim == 2:
        P = P[:, None, :]
    M, T, r = P.shape
    return np.stack(
        [np.concatenate([np.kron(np.eye(N), P[i, t][None, :]) for t in range(T)], axis=0) for i in range(M)]
    )


def explicit_projector_parts(Q, Psi):
    """``(Pi Q, (I - Pi) Q)`` over the ``M*T`` sample-position rows, by the explicit projector."""
    import satcore

    q = np.asarray(Q, dtype=np.float64)
    q = q.reshape(-1, q.shape[-1])
    P = satcore.projector(Psi)
    return P @ q, q - P @ q
