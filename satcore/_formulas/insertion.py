"""Gradient-matched insertion (paper Appendix H) and its first-order prediction.

Fitting the terminal projection of a zero-output block to the target
``-alpha q_i`` by least squares,

    min_V (1 / 2M) sum_i ||V psi_i + alpha q_i||^2,

gives the normal equations ``V K = -alpha C`` and the minimum-norm solution
``V* = -alpha C K^+``.  The inserted block outputs ``-alpha (Pi q)_i`` and the
first-order change of the mean loss is ``<C_eval, V*>_F =
-alpha tr(C_eval K^+ C^T)``; on the fitting split this is
``-alpha growth_value^2``.  Formulas: docs/core.md, Gradient-matched insertion.

The examples use ``C = (2, 1)^T / 3`` and ``K = 2 / 3`` (three samples, one
feature), whose growth value is ``V^2 = 5 / 6``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .psd import DEFAULT_RTOL, psd_spectrum
from .._shared.errors import InputError
from .._shared.numbers import finite_real


def matched_projection(C, K, alpha: float, rtol: float = DEFAULT_RTOL) -> np.ndarray:
    """``V* = -alpha C K^+`` (``N x r``), the least-squares fit of Appendix H.

    Where ``K`` is singular, the minimum-norm fit of the unit-scaled features
    (:mod:`satcore._formulas.psd`): the inserted ``V* psi`` does not depend on how the
    features are scaled.

    Parameters
    ----------
    C : array_like, shape (N, r)
        Cross-gradient of the fitting split.
    K : array_like, shape (r, r)
        Feature Gram of the fitting split.
    alpha : float
        Step: the block is fitted to ``-alpha q_i``.
    rtol : float, optional
        Relative eigenvalue cut of ``K`` (docs/core.md, Rank tolerance).

    Returns
    -------
    numpy.ndarray, shape (N, r)
        The terminal projection ``V*``.

    References
    ----------
    Paper, Appendix H; docs/core.md, Gradient-matched insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> C, K = np.array([[2.0], [1.0]]) / 3, np.array([[2.0]]) / 3
    >>> satcore.matched_projection(C, K, alpha=0.1)
    array([[-0.1 ],
           [-0.05]])
    """
    return _projection(C, psd_spectrum(K, rtol), _step(alpha))


def _step(alpha) -> float:
    """``alpha`` as a finite float (a negative one steps up the gradient: the reverse of the fitted block), one line
    naming it otherwise: a NaN or infinite step gave a block of NaN or infinite weights without a word."""
    return finite_real(alpha, "alpha")


def _projection(C, inverse, alpha: float) -> np.ndarray:
    """``V* = -alpha C K^-`` through ``inverse``, a :mod:`satcore._formulas.psd` inverse of ``K``; refused (one
    line naming ``alpha``) where an entry passes float64's range, which NumPy announced with a RuntimeWarning and
    returned as inf weights."""
    with np.errstate(over="ignore", invalid="ignore"):  # an inf here is the answer, refused below
        projection = -alpha * (np.asarray(C, dtype=np.float64) @ inverse.pinv())
    if not np.isfinite(projection).all():
        raise InputError(f"alpha {alpha:.6g}: the block's weights -alpha C K^+ pass float64's range; give a smaller "
                         "step")
    return projection


def predicted_loss_change(C_fit, K, alpha: float, C_eval=None, rtol: float = DEFAULT_RTOL) -> float:
    """First-order loss change ``-alpha tr(C_eval K^+ C_fit^T)``.

    With ``C_eval`` omitted the evaluation split is the fitting split and the
    value is ``-alpha * growth_value^2``.  Otherwise it is ``<C_eval, V*>_F``,
    the first-order change of the block :func:`matched_projection` inserts
    (``K^+`` is :mod:`satcore._formulas.psd`'s generalised inverse, the same in both).
    Computed, like the growth value, from the whitened ``C S U diag(lam^-1/2)``
    (``tr(A K^+ B^T) = <A S U lam^-1/2, B S U lam^-1/2>_F``), so both agree to
    round-off even when ``K`` has eigenvalues just above the cut, where an
    explicit ``K^+`` loses digits.

    Parameters
    ----------
    C_fit : array_like, shape (N, r)
        Cross-gradient of the split the block is fitted on.
    K : array_like, shape (r, r)
        Feature Gram of that split.
    alpha : float
        The step of :func:`matched_projection`.
    C_eval : array_like, shape (N, r), optional
        Cross-gradient of the split whose loss change is predicted.
    rtol : float, optional
        Relative eigenvalue cut of ``K``.

    Returns
    -------
    float
        The first-order change of the mean loss on the evaluation split.

    References
    ----------
    Paper, Appendix H; docs/core.md, Gradient-matched insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> C, K = np.array([[2.0], [1.0]]) / 3, np.array([[2.0]]) / 3
    >>> round(satcore.predicted_loss_change(C, K, 0.1), 12)  # -alpha V^2
    -0.083333333333
    >>> round(satcore.predicted_loss_change(C, K, 0.1, C_eval=np.array([[1.0], [0.0]])), 12)
    -0.1
    """
    return _loss_change(psd_spectrum(K, rtol), _step(alpha), C_fit, C_eval)


def _loss_change(inverse, alpha: float, C_fit, C_eval=None) -> float:
    """``-alpha tr(C_eval K^- C_fit^T)`` through ``inverse``, a :mod:`satcore._formulas.psd` inverse of ``K``."""
    return -alpha * inverse.quadratic_form(C_fit, C_eval)


def alpha_for_relative_update(rho: float, stream_rms: float, growth: float) -> float:
    """The ``alpha`` whose inserted update has ``||h||_S / ||z||_S = rho``.

    The fitted block outputs ``-alpha Pi q``, of size ``alpha * growth_value``
    in the empirical norm; ``stream_rms = ||z||_S = sqrt(mean_i ||z_i||^2)``.
    An absolute ``alpha`` means nothing across models; a relative size does.

    Parameters
    ----------
    rho : float
        Wanted relative size of the inserted update.
    stream_rms : float
        ``||z||_S`` at the candidate.
    growth : float
        The candidate's growth value (``> 0``).

    Returns
    -------
    float
        ``rho * stream_rms / growth``.

    References
    ----------
    docs/core.md, Gradient-matched insertion.

    Examples
    --------
    >>> import satcore
    >>> satcore.alpha_for_relative_update(0.01, stream_rms=2.0, growth=0.5)
    0.04
    """
    rho, stream_rms = finite_real(rho, "rho"), finite_real(stream_rms, "stream_rms", low=0.0)
    if growth <= 0:
        raise InputError("growth value is zero: no first-order direction to insert")
    with np.errstate(over="ignore"):
        alpha = rho * stream_rms / growth
    if not np.isfinite(alpha):
        raise InputError(f"rho {rho:.6g}: its step rho ||z||_S / V ({rho:.6g} x {stream_rms:.6g} / {growth:.6g}) "
                         "passes float64's range")
    return alpha


@dataclass(frozen=True)
class InsertionPlan:
    """A gradient-matched block: its terminal projection and predicted effect."""

    alpha: float
    projection: np.ndarray  # V*, (N, r)
    predicted_change: float  # on the fitting split: -alpha V^2
    predicted_change_eval: float | None  # on a second split, -alpha tr(C' K^+ C^T)


def plan_insertion(stats_fit, alpha: float, stats_eval=None, rtol: float = DEFAULT_RTOL) -> InsertionPlan:
    """Plan an insertion from :class:`~satcore._statistics.candidate.CandidateStatistics`.

    Parameters
    ----------
    stats_fit : CandidateStatistics
        Statistics of the split the block is fitted on.
    alpha : float
        The step of :func:`matched_projection`.
    stats_eval : CandidateStatistics, optional
        Statistics of a second split for ``predicted_change_eval``.
    rtol : float, optional
        Relative eigenvalue cut of ``K``.

    Returns
    -------
    InsertionPlan
        ``V*`` and the predicted first-order changes.

    References
    ----------
    Paper, Appendix H; docs/core.md, Gradient-matched insertion.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> Q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    >>> Psi = np.array([[1.0], [0.0], [1.0]])
    >>> plan = satcore.plan_insertion(satcore.CandidateStatistics.from_samples(Q, Psi), alpha=0.1)
    >>> round(plan.predicted_change, 12), plan.predicted_change_eval
    (-0.083333333333, None)
    """
    # K^- as the statistics' own score reads it: the predicted change is -alpha times the report's V^2 to round-off
    alpha = _step(alpha)
    C, inverse = stats_fit.cross_gradient(), stats_fit.feature_gram_inverse(rtol)
    return InsertionPlan(
        alpha=alpha,
        projection=_projection(C, inverse, alpha),
        predicted_change=_loss_change(inverse, alpha, C),
        predicted_change_eval=None if stats_eval is None else _loss_change(inverse, alpha, C, stats_eval.cross_gradient()),
    )
