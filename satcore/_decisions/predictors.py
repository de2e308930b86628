"""What an inserted zero-output block will do once it is trained: predicted training and held-out gains.

A zero-output block ``h(z) = V psi(z)`` inserted at a candidate starts at
``V = 0``; the gradient of the mean loss with respect to ``V`` there is the
cross-gradient ``g = C = E_i[Q_i^T Psi_i]`` (``N x r``).  Every predictor here
is a pure function of the statistics a probe keeps (``C``, the feature Gram
``K``, the fold sums) and, for the second-order ones, the activation-gradient
second moment ``F = E_i[Q_i^T Q_i]`` (``N x N``, summed over positions).
Gains are loss *decreases* (positive = the loss goes down), in loss units.

First order (the paper's Assumption 2 direction maps, one step ``eta d(g)``):

* SGD, ``d(g) = -g``: ``eta ||g||_F^2``;
* zero-state Adam, ``d(g)_j = -g_j / (|g_j| + eps)``:
  ``eta sum_j g_j^2 / (|g_j| + eps)`` (``~ eta ||g||_1``);
* the gradient-matched block of relative size ``rho`` (paper Appendix H):
  ``rho ||z||_S V`` with ``V`` the growth value.

``steps`` repeats the step with the gradient held at ``g`` (the first-order
model of ``steps`` identical updates).

Second order (Kronecker-factored quadratic model).  The per-sample gradient of
``V`` is ``X_i = sum_t q_it psi_it^T``; its second moment ``E[vec X vec X^T]``
(the empirical Fisher, a Gauss-Newton proxy for the Hessian of the loss in
``V``) is approximated, as K-FAC does for convolutions (positions
uncorrelated and alike), by ``H = (F kron K) / T`` with ``T`` positions per
sample.  In the eigenbases ``F = A diag(f) A^T``, ``K = B diag(k) B^T`` the
model ``L(V) - L(0) = <g, V> + 1/2 vec(V)^T H vec(V)`` separates into
coordinates ``G = A^T g B`` with curvatures ``h_ab = f_a k_b / T``.
``steps`` full-batch gradient steps of size ``eta`` from ``V = 0`` reach
``v_ab = -(G_ab / h_ab) (1 - (1 - eta h_ab)^S)`` and decrease the modelled
loss by ``sum_ab G_ab^2 / (2 h_ab) (1 - (1 - eta h_ab)^{2S})`` (``S eta G^2``
where ``h = 0``).  For Adam the model is taken along the zero-state Adam
direction ``d``: the step length ``s`` is ``min(S eta, <g, d> / d^T H d)``
(the model's minimiser along ``d`` when it comes first).

Held-out (the training-fitted step priced on an independent split).  A step
``V`` fitted on the training split changes the held-out loss to first order
by ``<g_heldout, V>``; with the held-out fold means ``g_a`` (the probe's fold
sums) the per-fold values ``y_a = <g_a, V>`` are independent given ``V``, so
``ybar = sum_a w_a y_a = <g_heldout, V>`` has the standard error
``se^2 = m / (m - 1) sum_a w_a^2 (y_a - ybar)^2`` and a Student-t interval on
``m - 1`` degrees of freedom; the fold test's probability that the held-out
gain is positive is ``F_t(-(ybar + c) / se)`` where ``c`` is the (fixed)
second-order term when a curvature is given.  That is a statement about the
step's first-order held-out gain, not a probability that a block trained with
the recipe lowers the held-out loss (no trial verifies it: ``p_decrease`` is
``None``; :class:`HeldoutGain`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
# scipy.special, not scipy.stats (whose ppf/cdf call these): a third of the import time, paid by every CLI run
from scipy.special import stdtr, stdtrit

from .._formulas.psd import DEFAULT_RTOL
from .criteria import Criteria
from .._shared.arrays import frobenius_norm, power_of_two_scale
from .._shared.errors import InputError
from .recipe import Recipe
from .trials import NOT_VERIFIED

OPTIMIZERS = ("sgd", "adam", "matched")  # the steps modelled (a Recipe's "adamw" without decay is "adam")
ADAM_EPS = 1e-8


def virtual_layer_sensitivity(statistics) -> dict[str, float]:
    """Per candidate, the sensitivity that Sensitivity-Based Layer Insertion ranks places by (Kreis, Herberg,
    Köhne, Schiela, Herzog, "Sensitivity-Based Layer Insertion for Neural Networks"): the squared Frobenius norm
    of the mean loss gradient with respect to the terminal map ``V`` of a zero-initialised "virtual" layer at the
    candidate, ``||C||_F^2 = ||sum_cross||_F^2 / n^2`` from the probe's sums (``C = E_i[Q_i^T Psi_i]``, the
    family's features ``Psi`` as the layer's inner part).  The raw cousin of the growth value
    ``V = sqrt(tr(C K^+ C^T))``: no feature whitening, no held-out split, no recipe; SensLI inserts where it is
    largest.  A baseline of the decision bench (docs/predictive-validity.md).

    Parameters
    ----------
    statistics : Mapping[str, CandidateStatistics]
        A probe's statistics (its ``statistics``), on the training split as SensLI reads it.

    Examples
    --------
    >>> import numpy as np
    >>> from satcore import CandidateStatistics
    >>> rng = np.random.default_rng(0)
    >>> Q, Psi = rng.normal(size=(64, 3)), rng.normal(size=(64, 2))
    >>> stats = {"b0": CandidateStatistics.from_samples(Q, Psi)}
    >>> value = virtual_layer_sensitivity(stats)["b0"]
    >>> bool(np.isclose(value, np.sum((Q.T @ Psi / 64) ** 2)))
    True
    """
    return {name: float(np.sum(stats.sum_cross ** 2)) / float(stats.n_samples) ** 2
            for name, stats in statistics.items()}


def sgd_step_gain(C, lr: float, steps: int = 1) -> float:
    """First-order decrease of ``steps`` SGD steps: ``steps * lr * ||C||_F^2``."""
    C = np.asarray(C, dtype=np.float64)
    return float(steps * lr * np.sum(C * C))


def adam_direction(C, eps: float = ADAM_EPS) -> np.ndarray:
    """Zero-state Adam's first update direction ``-g_j / (|g_j| + eps)`` (bias-corrected, Assumption 2)."""
    C = np.asarray(C, dtype=np.float64)
    return -C / (np.abs(C) + eps)


def adam_step_gain(C, lr: float, steps: int = 1, eps: float = ADAM_EPS) -> float:
    """First-order decrease of ``steps`` zero-state Adam steps: ``steps * lr * sum_j g_j^2 / (|g_j| + eps)``."""
    C = np.asarray(C, dtype=np.float64)
    return float(-steps * lr * np.sum(C * adam_direction(C, eps)))


def _eigen(M) -> tuple[np.ndarray, np.ndarray]:
    lam, U = np.linalg.eigh(0.5 * (np.asarray(M, dtype=np.float64) + np.asarray(M, dtype=np.float64).T))
    return np.clip(lam, 0.0, None), U


def kronecker_curvature(F, K, n_positions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, h)``: eigenbases of ``F`` and ``K`` and the curvatures ``h_ab = f_a k_b / T``."""
    f, A = _eigen(F)
    k, B = _eigen(K)
    return A, B, np.outer(f, k) / float(n_positions)


def kronecker_quadratic(V, F, K, n_positions: int) -> float:
    """``1/2 vec(V)^T (F kron K / T) vec(V) = tr(V^T F V K) / (2 T)``."""
    V = np.asarray(V, dtype=np.float64)
    return float(np.sum((np.asarray(F) @ V) * (V @ np.asarray(K)))) / (2.0 * n_positions)


def kronecker_sgd_point(C, F, K, n_positions: int, lr: float, steps: int = 1) -> np.ndarray:
    """``V`` after ``steps`` full-batch SGD steps on the Kronecker quadratic model (module docstring)."""
    A, B, h = kronecker_curvature(F, K, n_positions)
    G = A.T @ np.asarray(C, dtype=np.float64) @ B
    x = lr * h
    # (1 - (1 - x)^S) / h, its limit S * lr where h = 0; through expm1/log1p so that a curvature
    # at round-off level (x ~ 1e-19) keeps the full S * lr instead of cancelling to 0; x >= 1 (an
    # unstable step, which the model lets oscillate or diverge) by the power itself
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        stable = -np.expm1(steps * np.log1p(-np.minimum(x, 0.5)))
        shrink = np.where(x < 0.5, stable, 1.0 - np.power(1.0 - x, steps))
        reach = np.where(h > 0, shrink / np.where(h > 0, h, 1.0), steps * lr)
    return A @ (-G * reach) @ B.T


def kronecker_sgd_gain(C, F, K, n_positions: int, lr: float, steps: int = 1) -> float:
    """Modelled decrease ``sum_ab G_ab^2 / (2 h_ab) (1 - (1 - lr h_ab)^{2S})`` of ``steps`` SGD steps."""
    V = kronecker_sgd_point(C, F, K, n_positions, lr, steps)
    return -(float(np.sum(np.asarray(C) * V)) + kronecker_quadratic(V, F, K, n_positions))


def kronecker_adam_point(C, F, K, n_positions: int, lr: float, steps: int = 1, eps: float = ADAM_EPS) -> np.ndarray:
    """``s d`` with ``d`` the zero-state Adam direction and ``s = min(steps lr, <g, -d> / d^T H d)``."""
    C = np.asarray(C, dtype=np.float64)
    d = adam_direction(C, eps)
    slope = -float(np.sum(C * d))
    curvature = 2.0 * kronecker_quadratic(d, F, K, n_positions)
    s = steps * lr if curvature <= 0 else min(steps * lr, slope / curvature)
    return s * d


def kronecker_adam_gain(C, F, K, n_positions: int, lr: float, steps: int = 1, eps: float = ADAM_EPS) -> float:
    """Modelled decrease at :func:`kronecker_adam_point`."""
    V = kronecker_adam_point(C, F, K, n_positions, lr, steps, eps)
    return -(float(np.sum(np.asarray(C) * V)) + kronecker_quadratic(V, F, K, n_positions))


@dataclass(frozen=True)
class HeldoutGain:
    """Predicted held-out decrease of a fixed step ``V``: value, the fold test's ``1 - alpha`` interval and its
    probability that the value is positive.

    ``fold_test_p_positive`` is ``F_t(gain / se)``: under the fold test (Student t over the held-out folds) the
    probability that *this step's* held-out gain is positive.  It omits the predictor's own error and is not a
    probability that a block trained with the recipe lowers the held-out loss: read as one, its largest gap per
    bin was 0.17-0.21 with Adam on 30-step recipes and 0.32 / 0.47 on the decision bench's 300- / 1000-step
    recipes (studies/screen-probability.md).  No trial verifies the step, so ``p_decrease`` is ``None``: a
    candidate no trial verified carries no ``P(decrease)``, as in :class:`satcore.CandidateDecision`.
    """

    value: float
    interval: tuple[float, float]
    se: float
    fold_test_p_positive: float
    n_folds: int

    p_decrease = None  # not verified (class docstring): the contract's field, null in the JSON

    def to_dict(self) -> dict:
        return {"value": self.value, "interval": list(self.interval), "se": self.se,
                "fold_test_p_positive": self.fold_test_p_positive, "p_decrease": self.p_decrease,
                "n_folds": self.n_folds}


def heldout_gain(V, fold_sums, fold_counts, *, second_order: float = 0.0, alpha: float = 0.05) -> HeldoutGain:
    """Held-out decrease ``-(<g_heldout, V> + second_order)`` with its fold interval (module docstring).

    Parameters
    ----------
    V : array_like, shape (N, r)
        The step, fitted on the training split (independent of the held-out folds).
    fold_sums, fold_counts : array_like, shapes (m, N, r) and (m,)
        The held-out statistics' ``fold_cross`` and ``fold_samples``.
    second_order : float
        Modelled quadratic change of the held-out loss at ``V`` (held fixed).
    alpha : float
        The interval's level is ``1 - alpha`` (Student t over the folds, ``m - 1`` degrees of freedom).
    """
    sums = np.asarray(fold_sums, dtype=np.float64)
    counts = np.asarray(fold_counts, dtype=np.float64)
    keep = counts > 0
    sums, counts = sums[keep], counts[keep]
    w = counts / counts.sum()
    step = np.asarray(V, dtype=np.float64)
    scale = power_of_two_scale(step)  # a huge lr's step (1e300) would overflow the per-fold values' squared spread
    y = np.tensordot(sums / counts[:, None, None], step / scale, axes=([1, 2], [0, 1]))
    mean = float(w @ y)
    gain = -(scale * mean + second_order)
    m = len(w)
    if m < 2:
        return HeldoutGain(gain, (-math.inf, math.inf), math.inf, 0.5, m)
    se = scale * math.sqrt(m / (m - 1) * float(np.sum(w * w * (y - mean) ** 2)))
    if se == 0:
        return HeldoutGain(gain, (gain, gain), 0.0, float(gain > 0), m)
    half = float(stdtrit(m - 1, 1 - alpha / 2)) * se  # Student t quantile and cdf, m - 1 degrees of freedom
    return HeldoutGain(gain, (gain - half, gain + half), se, float(stdtr(m - 1, gain / se)), m)


@dataclass(frozen=True)
class CandidateGain:
    """One candidate's predicted gains for a stated step; ``splits`` says where each number comes from.
    ``evidence`` is ``"not verified"``: no trial of the recipe ran (:class:`HeldoutGain`)."""

    name: str
    training_gain: float
    training_gain_second_order: float | None
    heldout: HeldoutGain
    step_norm: float

    evidence = NOT_VERIFIED

    def to_dict(self) -> dict:
        return {"name": self.name, "evidence": self.evidence, "predicted_training_gain": self.training_gain,
                "predicted_training_gain_second_order": self.training_gain_second_order,
                "predicted_heldout_gain": self.heldout.to_dict(), "step_norm": self.step_norm}


@dataclass(frozen=True)
class PredictedGains:
    """Per-candidate predicted gains (:func:`predict_gains`), in loss units (positive = decrease)."""

    optimizer: str
    step: dict
    alpha: float
    candidates: tuple[CandidateGain, ...]
    splits: dict

    def __getitem__(self, name: str) -> CandidateGain:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"optimizer": self.optimizer, "step": dict(self.step), "alpha": self.alpha,
                "splits": dict(self.splits), "candidates": [c.to_dict() for c in self.candidates]}


def _step(stats, optimizer, lr, steps, rho, stream_rms, fisher, rtol):
    """``(V, first-order training gain, second-order training gain or None)`` of one candidate's step."""
    C, K = stats.cross_gradient(), stats.feature_gram()
    if optimizer == "matched":
        spectrum = stats.feature_gram_inverse(rtol)
        growth = math.sqrt(spectrum.quadratic_form(C))
        if growth == 0:
            return np.zeros_like(C), 0.0, None
        alpha = rho * stream_rms / growth  # the block of relative size rho (Appendix H)
        return -alpha * (C @ spectrum.pinv()), alpha * growth**2, None
    T = stats.n_positions
    if optimizer == "sgd":
        first = sgd_step_gain(C, lr, steps)
        if fisher is None:
            return -steps * lr * C, first, None
        V = kronecker_sgd_point(C, fisher, K, T, lr, steps)
    else:
        first = adam_step_gain(C, lr, steps)
        if fisher is None:
            return steps * lr * adam_direction(C), first, None
        V = kronecker_adam_point(C, fisher, K, T, lr, steps)
    return V, first, -(float(np.sum(C * V)) + kronecker_quadratic(V, fisher, K, T))


def check_paired(train_stats, heldout_stats) -> None:
    """Refuse training and held-out statistics that are not of the same candidates, in the same order and
    with the same block shape (``N`` hidden units, ``r`` features): a step fitted on one is priced on the other.

    Raises
    ------
    InputError
        Naming the first candidate that differs and both shapes.
    """
    if list(train_stats) != list(heldout_stats):
        raise InputError(f"candidate lists differ: training {list(train_stats)} vs held-out {list(heldout_stats)}")
    for name, tr in train_stats.items():
        ho = heldout_stats[name]
        if (tr.n_hidden, tr.n_features) != (ho.n_hidden, ho.n_features):
            raise InputError(f"candidate {name!r}: the training statistics are N = {tr.n_hidden} "
                             f"hidden x r = {tr.n_features} features, the held-out ones N = {ho.n_hidden} x "
                             f"r = {ho.n_features}: not the same block")


def predict_gains(train_stats, heldout_stats, recipe: Recipe | None = None, *, criteria: Criteria | None = None,
                  stream_rms: dict | None = None, train_fisher: dict | None = None,
                  heldout_fisher: dict | None = None, rtol: float = DEFAULT_RTOL) -> PredictedGains:
    """Predicted training and held-out gains per candidate for one stated step.

    Parameters
    ----------
    train_stats, heldout_stats : DepthStatistics
        The same candidates probed on the training split (the step is fitted
        there) and on an independent held-out split (with folds).
    recipe : Recipe, optional
        The step: ``recipe.steps`` full-batch updates of ``recipe.optimizer``
        (``"sgd"``, or ``"adam"`` from a zero state; ``"adamw"`` without weight
        decay is the same step) at ``recipe.lr`` (the recipe's batch size plays
        no part).  Without a recipe: the gradient-matched block of relative
        size ``criteria.rho`` (needs ``stream_rms``: ``||z||_S`` per candidate).
    criteria : Criteria, optional
        Its ``alpha`` sets the held-out intervals' level (default 0.05), its
        ``rho`` the matched block's size.
    stream_rms : dict, optional
        The stream RMS ``||z||_S`` per candidate name: read only without a
        recipe (the matched block), where every candidate needs one.
    train_fisher, heldout_fisher : dict, optional
        ``F = E[Q^T Q]`` per candidate on each split (default: the statistics'
        own ``sum_qq / n`` where they keep it, ``curvature=True``); with one the
        step is the Kronecker model's (module docstring) and the training gain
        gets its second-order value; with the held-out one too, the held-out
        gain includes the held-out quadratic term.
    rtol : float, optional
        Relative eigenvalue cut of ``K`` (docs/core.md, Rank tolerance).

    Returns
    -------
    PredictedGains
    """
    criteria = Criteria() if criteria is None else criteria
    alpha, rho = criteria.alpha, criteria.rho
    check_paired(train_stats, heldout_stats)
    if recipe is None:
        missing = [name for name in train_stats if not (stream_rms or {}).get(name)]
        if rho is None or missing or not (rho > 0):
            raise InputError("the matched block (no recipe) needs criteria with rho > 0 and stream_rms, the stream RMS "
                             "||z||_S of every candidate" + (f" (none for {missing})" if missing else ""))
        optimizer, lr, steps = "matched", None, 1
        step = {"rho": float(rho)}
    else:
        if recipe.optimizer == "adamw" and recipe.weight_decay > 0:
            raise InputError("predicted gains model AdamW only without weight decay (then it is Adam's step)")
        optimizer = "sgd" if recipe.optimizer == "sgd" else "adam"
        lr, steps = recipe.lr, recipe.steps
        step = {"lr": lr, "steps": steps}
    out = []
    for name, tr in train_stats.items():
        ho = heldout_stats[name]
        if not ho.n_folds:
            raise InputError(f"candidate {name!r}: the held-out statistics keep no folds (n_folds = 0)")
        fisher = train_fisher[name] if train_fisher is not None else tr.gradient_moment() if tr.curvature else None
        V, first, second = _step(tr, optimizer, lr, steps, rho, stream_rms[name] if optimizer == "matched" else None,
                                 fisher, rtol)
        quad = 0.0
        held_fisher = (heldout_fisher[name] if heldout_fisher is not None
                       else ho.gradient_moment() if ho.curvature and fisher is not None else None)
        V_held = V
        if optimizer == "adam":
            # measured (docs/predictive-validity.md): Adam's held-out gain ranks best priced on its
            # first-order step with no held-out quadratic term; with both, it predicted increases where
            # every realized change on the pretrained MiniLM was a decrease
            V_held = _step(tr, optimizer, lr, steps, rho, None, None, rtol)[0]
        elif held_fisher is not None and optimizer != "matched":
            quad = kronecker_quadratic(V, held_fisher, ho.feature_gram(), ho.n_positions)
        out.append(CandidateGain(name, first, second,
                                 heldout_gain(V_held, ho.fold_cross, ho.fold_samples, second_order=quad, alpha=alpha),
                                 frobenius_norm(V)))
    splits = {"predicted_training_gain": "training split (the step is fitted there)",
              "predicted_heldout_gain": "held-out split (folds give the interval)"}
    return PredictedGains(optimizer, step, alpha, tuple(out), splits)
