"""Optimizer direction maps (Assumption 2), joint insertion (Cor. 2), Cor. 1 bound.

A direction map ``d`` turns the residual gradient ``g`` into the first update
``theta+ = eta d(g)``.  Assumption 2 asks ``d(0) = 0`` and ``g^T d(g) < 0`` for
``g != 0``; then a first-order improvement exists iff ``g != 0`` (Theorem 1
item 5).  Formulas: docs/core.md, Optimizers and joint insertion.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .._shared.errors import InputError

DirectionMap = Callable[[np.ndarray], np.ndarray]


def gradient_descent() -> DirectionMap:
    """The gradient-descent direction map ``d(g) = -g``.

    Returns
    -------
    callable
        ``g -> -g`` (float64).

    References
    ----------
    Paper, Assumption 2; docs/core.md, Optimizers and joint insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.gradient_descent()(np.array([1.0, -2.0]))
    array([-1.,  2.])
    """
    return lambda g: -np.asarray(g, dtype=np.float64)


def preconditioned(P) -> DirectionMap:
    """``d(g) = -P g`` for a symmetric positive-definite preconditioner ``P``.

    Parameters
    ----------
    P : array_like, shape (p, p)
        Symmetric positive definite (otherwise ``ValueError``).

    Returns
    -------
    callable
        ``g -> -P g``.

    References
    ----------
    Paper, Assumption 2; docs/core.md, Optimizers and joint insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.preconditioned(np.diag([2.0, 1.0]))(np.array([1.0, 1.0]))
    array([-2., -1.])
    """
    P = np.asarray(P, dtype=np.float64)
    if not np.allclose(P, P.T) or np.linalg.eigvalsh(P).min() <= 0:
        raise InputError("preconditioner must be symmetric positive definite")
    return lambda g: -(P @ np.asarray(g, dtype=np.float64))


def adam_zero_state(eps: float = 1e-8) -> DirectionMap:
    """First bias-corrected Adam/AdamW step from zero state: ``d(g)_j = -g_j / (|g_j| + eps)``.

    Decoupled weight decay adds nothing at ``theta = 0``.

    Parameters
    ----------
    eps : float, optional
        Adam's ``eps`` (``> 0``).

    Returns
    -------
    callable
        ``g -> -g / (|g| + eps)``.

    References
    ----------
    Paper, Assumption 2; docs/core.md, Optimizers and joint insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.adam_zero_state(eps=1.0)(np.array([1.0, -3.0]))
    array([-0.5 ,  0.75])
    """
    if eps <= 0:
        raise InputError("eps must be > 0")
    return lambda g: -np.asarray(g, dtype=np.float64) / (np.abs(g) + eps)


def is_descent_compatible(direction: DirectionMap, g) -> bool:
    """Check Assumption 2 at ``g``: ``d(0) = 0`` and, if ``g != 0``, ``g^T d(g) < 0``.

    Parameters
    ----------
    direction : callable
        A direction map ``g -> d(g)``.
    g : array_like
        The gradient to check at.

    Returns
    -------
    bool
        Whether both conditions hold.

    References
    ----------
    Paper, Assumption 2; docs/core.md, identity 7.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> g = np.array([0.5, -1.0])
    >>> satcore.is_descent_compatible(satcore.adam_zero_state(), g)
    True
    >>> satcore.is_descent_compatible(lambda v: v, g)  # ascent
    False
    """
    g = np.asarray(g, dtype=np.float64)
    if np.any(direction(np.zeros_like(g)) != 0):
        return False
    if not np.any(g):
        return True
    return float(g.ravel() @ np.asarray(direction(g)).ravel()) < 0


def joint_gradient(gradients) -> np.ndarray:
    """Joint first-order gradient of several disjoint insertions: the concatenation (Cor. 2).

    Parameters
    ----------
    gradients : iterable of array_like
        Each candidate's residual-parameter gradient (e.g. its ``C``).

    Returns
    -------
    numpy.ndarray
        The flattened gradients, concatenated in order.

    References
    ----------
    Paper, Corollary 2; docs/core.md, identity 6.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.joint_gradient([np.zeros((1, 2)), np.array([3.0])])
    array([0., 0., 3.])
    """
    return np.concatenate([np.asarray(g, dtype=np.float64).ravel() for g in gradients])


def joint_descent_exists(gradients) -> bool:
    """A strict joint descent direction exists iff some candidate's gradient is nonzero (Cor. 2).

    Parameters
    ----------
    gradients : iterable of array_like
        Each candidate's residual-parameter gradient.

    Returns
    -------
    bool
        Whether any entry of the joint gradient is nonzero.

    References
    ----------
    Paper, Corollary 2; docs/core.md, identity 6.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> satcore.joint_descent_exists([np.zeros(2), np.zeros(3)])
    False
    >>> satcore.joint_descent_exists([np.zeros(2), np.array([0.0, 1e-9])])
    True
    """
    return bool(np.any(joint_gradient(gradients) != 0))


def descent_bound(g_norm_sq: float, smoothness: float, eta: float) -> float:
    """Guaranteed decrease of one GD step, Cor. 1: ``eta (1 - L eta / 2) ||g||^2``, for ``0 < eta <= 1/L``.

    Parameters
    ----------
    g_norm_sq : float
        ``||g||^2``.
    smoothness : float
        The smoothness constant ``L > 0``.
    eta : float
        Step size, ``0 < eta <= 1 / L``.

    Returns
    -------
    float
        The lower bound on the loss decrease.

    References
    ----------
    Paper, Corollary 1; docs/core.md, Optimizers and joint insertion.

    Examples
    --------
    >>> import satcore
    >>> satcore.descent_bound(4.0, smoothness=1.0, eta=0.5)  # 0.5 * 0.75 * 4
    1.5
    """
    if smoothness <= 0 or not 0 < eta <= 1 / smoothness:
        raise InputError("need L > 0 and 0 < eta <= 1/L")
    return eta * (1 - smoothness * eta / 2) * g_norm_sq
