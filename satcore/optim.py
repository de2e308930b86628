"""Optimizer direction maps (Assumption 2), joint insertion (Cor. 2), Cor. 1 bound.

A direction map ``d`` turns the residual gradient ``g`` into the first update
``theta+ = eta d(g)``.  Assumption 2 asks ``d(0) = 0`` and ``g^T d(g) < 0`` for
``g != 0``; then a first-order improvement exists iff ``g != 0`` (Theorem 1
item 5).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

DirectionMap = Callable[[np.ndarray], np.ndarray]


def gradient_descent() -> DirectionMap:
    """``d(g) = -g``."""
    return lambda g: -np.asarray(g, dtype=np.float64)


def preconditioned(P) -> DirectionMap:
    """``d(g) = -P g`` for a symmetric positive-definite preconditioner ``P``."""
    P = np.asarray(P, dtype=np.float64)
    if not np.allclose(P, P.T) or np.linalg.eigvalsh(P).min() <= 0:
        raise ValueError("preconditioner must be symmetric positive definite")
    return lambda g: -(P @ np.asarray(g, dtype=np.float64))


def adam_zero_state(eps: float = 1e-8) -> DirectionMap:
    """First bias-corrected Adam/AdamW step from zero state: ``d(g)_j = -g_j / (|g_j| + eps)``.

    Decoupled weight decay adds nothing at ``theta = 0``.
    """
    if eps <= 0:
        raise ValueError("eps must be > 0")
    return lambda g: -np.asarray(g, dtype=np.float64) / (np.abs(g) + eps)


def is_descent_compatible(direction: DirectionMap, g) -> bool:
    """Check Assumption 2 at ``g``: ``d(0) = 0`` and, if ``g != 0``, ``g^T d(g) < 0``."""
    g = np.asarray(g, dtype=np.float64)
    if np.any(direction(np.zeros_like(g)) != 0):
        return False
    if not np.any(g):
        return True
    return float(g.ravel() @ np.asarray(direction(g)).ravel()) < 0


def joint_gradient(gradients) -> np.ndarray:
    """Joint first-order gradient of several disjoint insertions: the concatenation (Cor. 2)."""
    return np.concatenate([np.asarray(g, dtype=np.float64).ravel() for g in gradients])


def joint_descent_exists(gradients) -> bool:
    """A strict joint descent direction exists iff some candidate's gradient is nonzero (Cor. 2)."""
    return bool(np.any(joint_gradient(gradients) != 0))


def descent_bound(g_norm_sq: float, smoothness: float, eta: float) -> float:
    """Guaranteed decrease of one GD step, Cor. 1: ``eta (1 - L eta / 2) ||g||^2``, for ``0 < eta <= 1/L``."""
    if smoothness <= 0 or not 0 < eta <= 1 / smoothness:
        raise ValueError("need L > 0 and 0 < eta <= 1/L")
    return eta * (1 - smoothness * eta / 2) * g_norm_sq
