"""Depth sweeps: the ``AG_max`` / growth-value curve over model depth and its low-signal plateau.

The paper (Section 5, Figure 1) reads saturation off a sweep of models of
increasing depth: ``AG_max`` falls quickly at shallow depths and then enters a
"stable low-signal plateau"; it argues for that plateau, "rather than a
universal threshold" such as 5e-3, as the practical indicator.  This module
makes the plateau a precise rule.

Noise floor of a growth value.  ``E V_hat^2 = V^2 + f^2`` with
``f^2 = sigma_K^2 / n`` the sampling variance of ``g_hat`` in the ``K^+``
metric (docs/core.md, "Noise floor"), and an unbiased ``V^2`` (from
``sum X^T X`` or from the folds) is ``V_hat^2 - f^2``, so
``f = sqrt(V_hat^2 - V2_unbiased)``: the value a saturated candidate shows on
``n`` probe samples (:func:`satcore._scores.scores.growth_noise_floor`).

Plateau rule.  With depth-ordered values ``v_0 .. v_{L-1}`` (``growth_value_max``
or ``ag_max``), noise floors ``f_j`` (0 where unknown, and for ``ag_max``) and
a relative tolerance ``rel_tol``, the plateau starts at the smallest ``k``
with at least ``min_points`` depths from ``k`` on such that

    v_j <= (1 + rel_tol) * min_{i >= k} v_i + f_j     for every j >= k,

i.e. no later depth exceeds the tail's minimum by more than the tolerance plus
its own sampling noise: the curve has stopped falling.  The rule is monotone
(if it holds from ``k`` it holds from ``k + 1``).  The plateau is *low signal*
when moreover ``v_j <= noise_factor * f_j`` for every ``j >= k``: the values
there are what sampling noise alone produces: every depth from ``k`` on has
a floor and a depth-wide verdict that is not ``improvable`` (the fold tests
of :mod:`satcore._decisions.verdicts` found no first-order gain there).

Depth.  A point's depth is the dump's ``model_depth`` when it states one,
else its number of candidates other than the ``head`` endpoint (the
residual blocks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .._shared.errors import InputError
from .criteria import Verdict
from .._scores.scores import growth_noise_floor
from .report import DepthReport

SWEEP_SCHEMA = "satcore-sweep/2"
METRICS = ("growth_value", "ag")


@dataclass(frozen=True)
class SweepPoint:
    """One model depth: the depth-wide maxima of its report and the growth value's noise floor at the argmax."""

    depth: int
    label: str
    ag_max: float
    ag_argmax: str
    growth_value_max: float
    argmax: str
    growth_noise_floor: float | None
    n_samples: int
    verdict: str | None = None


@dataclass(frozen=True)
class Plateau:
    start_index: int
    start_depth: int
    low_signal: bool


@dataclass(frozen=True)
class Sweep:
    """Sweep points in depth order and the plateau (``None`` when later depths do not stay near the tail minimum)."""

    points: tuple[SweepPoint, ...]
    metric: str
    rel_tol: float
    noise_factor: float
    min_points: int
    plateau: Plateau | None

    def values(self) -> list[float]:
        return [_value(p, self.metric) for p in self.points]

    def to_dict(self) -> dict:
        return {
            "schema": SWEEP_SCHEMA,
            "metric": self.metric,
            "rel_tol": self.rel_tol,
            "noise_factor": self.noise_factor,
            "min_points": self.min_points,
            "points": [asdict(p) for p in self.points],
            "plateau": asdict(self.plateau) if self.plateau else None,
        }


def _value(point: SweepPoint, metric: str) -> float:
    return point.growth_value_max if metric == "growth_value" else point.ag_max


def sweep_point(depth: int, label: str, report: DepthReport) -> SweepPoint:
    """One model's point of the sweep: its report's maxima, the noise floor at the argmax, its verdict.

    Parameters
    ----------
    depth : int
        The model's depth (a dump's ``meta["model_depth"]``).
    label : str
        A name for the point (the CLI uses the dump's path).
    report : DepthReport
        The model's report.

    Returns
    -------
    SweepPoint

    References
    ----------
    docs/dump-format.md, Depth sweeps.

    Examples
    --------
    >>> import numpy as np, satcore
    >>> rng = np.random.default_rng(0)
    >>> scores = [satcore.score(rng.standard_normal((50, 4)), rng.standard_normal((50, 2)), name=n) for n in "ab"]
    >>> point = satcore.sweep_point(2, "model-2", satcore.depth_report(scores))
    >>> point.depth, point.n_samples, point.argmax in ("a", "b")
    (2, 50, True)
    """
    best = report[report.argmax]
    return SweepPoint(
        depth=int(depth),
        label=label,
        ag_max=report.ag_max,
        ag_argmax=report.ag_argmax,
        growth_value_max=report.growth_value_max,
        argmax=report.argmax,
        growth_noise_floor=growth_noise_floor(best),
        n_samples=min(c.n_samples for c in report.candidates),
        verdict=None if report.verdict is None else report.verdict.verdict,
    )


def find_plateau(values, floors, *, rel_tol=0.25, noise_factor=2.0, min_points=2, verdicts=None):
    """The plateau rule of the module docstring: ``(start_index, low_signal)`` or ``None``.

    ``verdicts``: each depth's depth-wide verdict (``None``: not tested);
    low signal needs none of them ``improvable``.

    Parameters
    ----------
    values : sequence of float
        Depth-ordered values ``v_j``.
    floors : sequence of float or None
        Their noise floors ``f_j`` (``None`` counts as 0).
    rel_tol : float, optional
        Relative tolerance above the tail's minimum.
    noise_factor : float, optional
        A plateau is low-signal when every ``v_j <= noise_factor * f_j``.
    min_points : int, optional
        Fewest depths a plateau spans.
    verdicts : sequence of str or None, optional
        Each depth's depth-wide verdict.

    Returns
    -------
    (int, bool) or None
        The first index of the plateau and whether it is low-signal; ``None``
        when no tail of ``min_points`` depths stays within the tolerance.

    References
    ----------
    Paper, Section 5 (the "stable low-signal plateau"); docs/dump-format.md, Depth sweeps.

    Examples
    --------
    >>> from satcore import find_plateau
    >>> find_plateau([1.0, 0.5, 0.3, 0.29, 0.31], [0.0] * 5)
    (2, False)
    >>> find_plateau([1.0, 0.5, 0.3, 0.29, 0.31], [0.2] * 5)  # 0.5 is within its noise of 0.29
    (1, False)
    >>> find_plateau([1.0, 0.5, 0.3, 0.2, 0.1], [0.0] * 5) is None  # still falling
    True
    """
    floors = [f or 0.0 for f in floors]
    verdicts = list(verdicts) if verdicts is not None else [None] * len(values)
    for k in range(0, len(values) - min_points + 1):
        tail_min = min(values[k:])
        if all(v <= (1 + rel_tol) * tail_min + f for v, f in zip(values[k:], floors[k:])):
            low = all(f > 0 and v <= noise_factor * f and d != Verdict.IMPROVABLE
                      for v, f, d in zip(values[k:], floors[k:], verdicts[k:]))
            return k, low
    return None


def depth_sweep(points, *, metric="growth_value", rel_tol=0.25, noise_factor=2.0, min_points=2) -> Sweep:
    """Order ``points`` (:class:`SweepPoint`) by depth and locate the plateau.

    Parameters
    ----------
    points : iterable of SweepPoint
        One per model; depths must differ.
    metric : {"growth_value", "ag"}, optional
        Which maximum the curve follows (``ag`` uses no noise floor).
    rel_tol, noise_factor, min_points : optional
        As :func:`find_plateau`.

    Returns
    -------
    Sweep
        The ordered points, the options and the plateau (or ``None``).

    References
    ----------
    docs/dump-format.md, Depth sweeps.

    Examples
    --------
    >>> from satcore import SweepPoint, depth_sweep
    >>> points = [SweepPoint(d, f"d{d}", v, "a", v, "a", None, 100) for d, v in [(4, 0.3), (2, 1.0), (6, 0.29)]]
    >>> sweep = depth_sweep(points)
    >>> [p.depth for p in sweep.points], sweep.plateau.start_depth
    ([2, 4, 6], 4)
    """
    if metric not in METRICS:
        raise InputError(f"metric must be one of {METRICS}, got {metric!r}")
    if rel_tol < 0 or noise_factor <= 0 or min_points < 2:
        raise InputError("need rel_tol >= 0, noise_factor > 0 and min_points >= 2")
    ordered = tuple(sorted(points, key=lambda p: p.depth))
    for a, b in zip(ordered, ordered[1:]):
        if a.depth == b.depth:
            raise InputError(f"two dumps have depth {a.depth}: {a.label} and {b.label}")
    values = [_value(p, metric) for p in ordered]
    floors = [p.growth_noise_floor if metric == "growth_value" else None for p in ordered]
    found = find_plateau(values, floors, rel_tol=rel_tol, noise_factor=noise_factor, min_points=min_points,
                         verdicts=[p.verdict for p in ordered])
    plateau = Plateau(found[0], ordered[found[0]].depth, found[1]) if found else None
    return Sweep(ordered, metric, rel_tol, noise_factor, min_points, plateau)
