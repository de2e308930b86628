"""Three-way verdicts from the fold tests: improvable, saturated within a tolerance, or inconclusive.

Per candidate (growth value's metric, :mod:`satcore._formulas.folds`):

* ``improvable`` when Holm's adjusted sign-flip p-value is below ``alpha``:
  some inserted block lowers the loss to first order there (Theorem 1);
* ``saturated`` when the upper end of the ``1 - alpha`` interval for the
  growth value lies below the tolerance ``tau``: whatever first-order gain is
  left is smaller than the user said matters (checked first, so a gain that
  is real but below the tolerance reads as saturated *within* it);
* ``inconclusive`` otherwise, with the probe size estimated to decide it.

Depth-wide: ``improvable`` when some candidate is (Holm controls the chance of
any false "improvable" at ``alpha``), ``saturated`` when every candidate is,
else ``inconclusive``.  Without a tolerance (``tau = 0``) nothing can be
certified saturated: a growth value is never shown to be exactly zero.

Tolerance in loss units.  A block whose output has empirical norm
``rho ||z||_S`` (``rho`` its size relative to the residual stream ``z``)
changes the loss to first order by at most ``rho ||z||_S V`` in magnitude, and
by exactly that for the best block of the candidate's family: the inner product
of ``q`` with an output in the tangent range is largest along the projection
``Pi q``, whose norm is ``V``.  So a loss tolerance ``eps`` at relative size
``rho`` is the growth-value tolerance ``tau = eps / (rho ||z||_S)``, and the
predicted first-order gain at ``rho`` is ``rho ||z||_S sqrt(max(U, 0))``, with
``U`` the fold-unbiased estimate of ``V^2`` (the bound holds at the population
``V_pop``, and ``U`` is unbiased for ``V_pop^2``) and the interval of ``V``
carried over.

Probe size to decide.  The jackknife ``se`` shrinks like ``n^-1/2`` (or
faster, under ``H0``); at the current estimate ``U`` the probe that would
decide has ``se (n / n')^1/2`` small enough for ``U`` to clear
``z_{1 - alpha/k} se'`` (improvable, ``k`` candidates: Holm's strictest
step) or for ``U + z_{1-alpha/2} se' < tau^2`` (saturated):
``n' = n (z se / U)^2`` or ``n (z se / (tau^2 - U))^2``.  Since it assumes
the estimate stays put, it is a planning number, not a promise.

Enlarging a probe until it decides.  Testing again each time batches are
added and stopping at the first decision would spend ``alpha`` once per look.
:func:`look_schedule` fixes the looks in advance instead: after ``initial``
batches, then twice as many each time, the last at ``total``, so there are at
most ``L = 1 + ceil(log2(total / initial))`` of them, at sizes that do not
depend on the data.  The level is split in
advance: ``alpha_final`` (half of ``alpha`` by default) at the look that holds
every batch and ``alpha_early = (alpha - alpha_final) / (L - 1)`` at each look
before it.  The look at size ``n_j`` is reached or not depending on the
data, but it rejects only if the fixed-size test on the first ``n_j`` batches
does, so by the union bound over the ``L`` fixed sizes the chance of any false
"improvable" (or any wrong "saturated") in the whole sequence stays at most
``alpha``.  (Jumping to a size estimated from the data would break that: the
size would depend on the very batches the next look reuses.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# scipy.special, not scipy.stats (whose ppf/cdf call these): a third of the import time, paid by every CLI run
from scipy.special import ndtri

from .criteria import DEFAULT_ALPHA, Criteria, Verdict
from .._shared.errors import InputError
from .._formulas.folds import holm

IMPROVABLE, SATURATED, INCONCLUSIVE = Verdict.IMPROVABLE, Verdict.SATURATED, Verdict.INCONCLUSIVE
METHOD = "fold sign-flip test, Holm across candidates, jackknife interval"


@dataclass(frozen=True)
class PredictedGain:
    """First-order loss decrease ``rho ||z||_S sqrt(max(U, 0))`` of the best block of relative size ``rho``.

    ``U``: the fold-unbiased ``V^2`` (module docstring); ``interval``: the
    growth value's interval times ``rho ||z||_S``.
    """

    rho: float
    value: float
    interval: tuple[float, float]

    def to_dict(self) -> dict:
        return {"rho": self.rho, "value": self.value, "interval": list(self.interval)}


@dataclass(frozen=True)
class CandidateTest:
    """One candidate's test and verdict (module docstring).

    ``statistic``: ``T(1) = sum_{a != b} w_a w_b G_ab``;
    ``growth_value_sq_unbiased``: ``U``, unbiased for ``V_pop^2``;
    ``growth_value_interval``: ``[sqrt(max(0, lo)), sqrt(max(0, hi))]`` from
    the ``1 - alpha`` interval of ``U``; ``tolerance``: ``tau`` in growth-value
    units; ``probe_size_to_decide``: ``None`` once decided or where no probe
    size can decide (no tolerance and no signal); ``reason``: why a candidate
    could not be tested, if so.
    """

    name: str
    statistic: float | None
    p_value: float
    p_value_adjusted: float
    verdict: Verdict
    growth_value_sq_unbiased: float | None
    growth_value_interval: tuple[float, float] | None
    se: float | None
    n_folds: int
    tolerance: float
    predicted_gain: PredictedGain | None
    probe_size_to_decide: int | None
    reason: str | None = None

    def to_dict(self) -> dict:
        interval = self.growth_value_interval
        return {
            "statistic": _finite(self.statistic),
            "p_value": self.p_value,
            "p_value_adjusted": self.p_value_adjusted,
            "verdict": self.verdict,
            "growth_value_sq_unbiased": _finite(self.growth_value_sq_unbiased),
            "growth_value_interval": None if interval is None else [_finite(v) for v in interval],
            "se": _finite(self.se),
            "n_folds": self.n_folds,
            "tolerance": self.tolerance,
            "predicted_gain": None if self.predicted_gain is None else self.predicted_gain.to_dict(),
            "probe_size_to_decide": self.probe_size_to_decide,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DepthVerdict:
    """The depth-wide answer: ``verdict``, the level ``alpha``, the tolerance as stated
    (``{"value", "units", "rho"}``), ``best_candidate`` (the improvable candidate with the
    largest unbiased ``V^2``, else the candidate of largest unbiased ``V^2``) and the ``method``."""

    verdict: Verdict
    alpha: float
    tolerance: dict
    best_candidate: str
    method: str
    reason: str | None = None

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "alpha": self.alpha, "tolerance": dict(self.tolerance),
                "best_candidate": self.best_candidate, "method": self.method, "reason": self.reason}


def _finite(x):
    return x if x is None or math.isfinite(x) else None


def growth_tolerances(names, criteria: Criteria, stream_rms: dict | None) -> list[float]:
    """Per-candidate ``tau``: the tolerance itself, or ``tolerance / (rho ||z||_S)`` in loss units."""
    if criteria.rho is None:
        return [criteria.tolerance] * len(names)
    missing = [n for n in names if not stream_rms or not (stream_rms.get(n) or 0) > 0]
    if missing:
        raise InputError(f"a tolerance in loss units needs the stream RMS ||z||_S of every candidate; "
                         f"none for {missing[0]!r} (give the tolerance in growth-value units, without rho)")
    return [criteria.tolerance / (criteria.rho * stream_rms[n]) for n in names]


def _probe_size(n: int, unbiased: float, se: float, tau: float, z_improve: float, z_saturate: float):
    if not (math.isfinite(se) and se > 0 and math.isfinite(unbiased)):
        return None
    if unbiased >= tau * tau:
        if unbiased <= 0:
            return None  # no signal and no tolerance: no probe size decides
        need = n * (z_improve * se / unbiased) ** 2
    else:
        need = n * (z_saturate * se / (tau * tau - unbiased)) ** 2
    return max(n + 1, math.ceil(need)) if math.isfinite(need) else None


def decide(scores, criteria: Criteria | None = None, *,
           stream_rms: dict | None = None) -> tuple[tuple[CandidateTest, ...], DepthVerdict]:
    """Per-candidate tests and the depth-wide verdict from scored candidates (module docstring).

    Parameters
    ----------
    scores : sequence of CandidateScore
        Depth order; each gives its ``fold_test`` when asked (``None`` for
        statistics without folds, which are then inconclusive with a reason).
    criteria : Criteria, optional
        ``alpha`` (level of the tests and of the intervals), ``tolerance``
        (in loss units when ``rho`` is given, else in growth-value units) and
        ``rho`` (relative size ``||h||_S / ||z||_S`` of the inserted block).
        Default ``Criteria()``.
    stream_rms : dict, optional
        ``||z||_S`` per candidate name, for a tolerance in loss units.

    Returns
    -------
    tests : tuple of CandidateTest
    verdict : DepthVerdict
    """
    criteria = Criteria() if criteria is None else criteria
    alpha, tolerance, rho = criteria.alpha, criteria.tolerance, criteria.rho
    scores = tuple(scores)
    names = [s.name for s in scores]
    taus = growth_tolerances(names, criteria, stream_rms)
    raw_p = [1.0 if s.fold_test is None else s.fold_test.p_value for s in scores]
    adjusted = holm(raw_p)
    k = len(scores)
    z_improve = float(ndtri(1 - alpha / k))
    z_saturate = float(ndtri(1 - alpha / 2))
    tests = []
    for s, tau, p_adj in zip(scores, taus, adjusted):
        ft = s.fold_test
        if ft is None or ft.n_folds < 2:
            reason = ("these statistics keep no folds (written before satcore kept them): no per-candidate test"
                      if ft is None else f"only {ft.n_folds} fold(s) hold samples: at least 2 are needed")
            tests.append(CandidateTest(s.name, None, 1.0, 1.0, INCONCLUSIVE, None, None, None,
                                       0 if ft is None else ft.n_folds, tau, None, None, reason))
            continue
        lo, hi = ft.interval(alpha)
        v_interval = (math.sqrt(max(0.0, lo)), math.sqrt(max(0.0, hi)) if math.isfinite(hi) else math.inf)
        if tau > 0 and v_interval[1] < tau:
            verdict = SATURATED
        elif p_adj < alpha:
            verdict = IMPROVABLE
        else:
            verdict = INCONCLUSIVE
        gain = None
        if rho is not None:
            scale = rho * stream_rms[s.name]
            v_hat = math.sqrt(max(0.0, ft.unbiased))
            gain = PredictedGain(rho, scale * v_hat, (scale * v_interval[0], scale * v_interval[1]))
        size = None if verdict != INCONCLUSIVE else _probe_size(
            s.n_samples, ft.unbiased, ft.se, tau, z_improve, z_saturate)
        tests.append(CandidateTest(s.name, ft.statistic, ft.p_value, float(p_adj), verdict, ft.unbiased,
                                   v_interval, ft.se, ft.n_folds, tau, gain, size))
    verdicts = [t.verdict for t in tests]
    if IMPROVABLE in verdicts:
        overall = IMPROVABLE
        pool = [t for t in tests if t.verdict == IMPROVABLE]
    else:
        overall = SATURATED if all(v == SATURATED for v in verdicts) else INCONCLUSIVE
        pool = tests
    best = max(pool, key=lambda t: -math.inf if t.growth_value_sq_unbiased is None else t.growth_value_sq_unbiased)
    reasons = {t.reason for t in tests if t.reason}
    weak = sorted({t.n_folds for t in tests if t.reason is None and 2.0 ** -(t.n_folds - 1) >= alpha / k})
    if weak:
        needed = fewest_batches_to_reject(k, alpha)
        reasons.add(f"only {weak[0]} fold(s) hold samples: the smallest sign-flip p-value 2^-{weak[0] - 1} cannot "
                    f"pass Holm's alpha/{k}; folds are made of batches, so the limit is the number of batches, not "
                    f"samples: probe at least {needed} batches (satcore probe: a smaller --batch-size)")
    if overall == INCONCLUSIVE and tolerance == 0 and not reasons:
        reasons.add("no tolerance given: 'saturated' needs one (a growth value is never shown to be exactly 0)")
    verdict = DepthVerdict(overall, alpha, criteria.to_dict(), best.name, METHOD, "; ".join(sorted(reasons)) or None)
    return tuple(tests), verdict


def fewest_batches_to_reject(n_candidates: int, alpha: float) -> int:
    """The fewest probe batches (one fold each, up to the folds) whose smallest sign-flip p-value ``2^-(m-1)`` passes
    Holm's strictest step ``alpha / n_candidates``: with fewer, no candidate can be called improvable."""
    # log2(k) - log2(alpha), as k / alpha overflows a subnormal alpha
    return 2 + math.floor(math.log2(n_candidates) - math.log2(alpha))


@dataclass(frozen=True)
class LookSchedule:
    """Planned looks of a probe enlarged until it decides (module docstring).

    ``initial`` and ``total``: batches at the first and at the largest look;
    ``looks``: ``L``, the most looks the schedule can take; ``alpha``: the
    sequence's level, spent as ``alpha_final`` at the look that holds every
    batch and ``alpha_early`` at each of the (at most ``L - 1``) looks before
    it, so that ``alpha_final + (L - 1) alpha_early = alpha``.
    """

    initial: int
    total: int
    looks: int
    alpha: float
    alpha_early: float
    alpha_final: float

    def alpha_at(self, used: int) -> float:
        """The level of a look at ``used`` batches."""
        return self.alpha_final if used >= self.total else self.alpha_early

    @property
    def sizes(self) -> tuple[int, ...]:
        """Batches at each planned look: ``initial * 2^k``, the last one ``total``."""
        return tuple(min(self.total, self.initial * 2**k) for k in range(self.looks))

    def enlarge(self, report_at):
        """Look at :attr:`sizes` in turn until the depth-wide verdict is not inconclusive.

        ``report_at(n_batches, alpha)``: the report of the first ``n_batches``
        batches at level ``alpha`` (an incremental probe fed up to there).
        Returns ``(report, batches used, looks taken)``.
        """
        for look, used in enumerate(self.sizes, start=1):
            report = report_at(used, self.alpha_at(used))
            if report.verdict.verdict != INCONCLUSIVE:
                break
        return report, used, look


def look_schedule(initial: int, total: int, alpha: float = DEFAULT_ALPHA, *,
                  final_share: float | None = 0.5) -> LookSchedule:
    """Looks at ``initial``, then doubling, up to ``total`` batches; ``alpha`` split across them.

    Parameters
    ----------
    initial, total : int
        Batches of the first look and of the whole probe split (``1 <= initial``).
    alpha : float
        The level of the whole sequence of looks.
    final_share : float or None, optional
        The share of ``alpha`` kept for the look at every batch (the rest is
        split evenly over the ``L - 1`` looks before it); ``None``: ``alpha / L``
        at every look.  The default 0.5 keeps more of the whole probe's power
        for weak signals, which only the last look decides (docs/growth.md has
        the measured comparison).

    Examples
    --------
    >>> s = look_schedule(4, 20)
    >>> s.sizes, s.alpha_early, s.alpha_final
    ((4, 8, 16, 20), 0.008333333333333333, 0.025)
    >>> look_schedule(4, 20, final_share=None).alpha_final
    0.0125
    """
    if not (isinstance(initial, int) and isinstance(total, int) and 1 <= initial and 1 <= total):
        raise InputError(f"initial and total must be ints >= 1, got {initial!r} and {total!r}")
    if not 0 < alpha < 1:
        raise InputError(f"alpha must be in (0, 1), got {alpha}")
    if final_share is not None and not 0 < final_share < 1:
        raise InputError(f"final_share must be in (0, 1) or None, got {final_share}")
    initial = min(initial, total)
    looks = 1 + (math.ceil(math.log2(total / initial)) if total > initial else 0)
    if looks == 1:
        return LookSchedule(initial, total, 1, alpha, alpha, alpha)
    if final_share is None:
        return LookSchedule(initial, total, looks, alpha, alpha / looks, alpha / looks)
    return LookSchedule(initial, total, looks, alpha, alpha * (1 - final_share) / (looks - 1), alpha * final_share)
