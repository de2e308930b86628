"""Whether the held-out data resolves a stop's claim that no block pays, and how many samples would.

A stop of the trial decision (:func:`~satcore._decisions.trials.choose`) claims that no trialled
candidate lowers the held-out loss by the stop tolerance ``eps`` (loss units).  Each trial measured
its held-out change ``d_c`` (loss after minus before, on the held-out samples) with the paired
standard error ``se_c`` of the per-sample differences, so the data alone places the change within

.. math::

    d_c \\pm h_c, \\qquad h_c = z_{0.975} \\, se_c

at 95% (``h_c``: the candidate's *held-out resolution*, the 95% half-width).  The claim holds on
that data only where every interval lies above minus the tolerance, ``d_c - h_c >= -eps`` for every
candidate ``c``; a stop where some interval still reaches past ``-eps`` is *unresolved*: the
held-out data cannot tell a gain of the tolerance from none.

The half-width is a standard error of a mean of ``n`` paired differences, so it shrinks as
``1 / sqrt(n)``: on ``n'`` samples it is ``h_c sqrt(n / n')``.  With the change staying at ``d_c``,
the interval clears ``-eps`` (on either side: the change shown above it, or a gain shown beyond it)
once ``h_c sqrt(n / n') < |d_c + eps|``, that is on

.. math::

    n'_c = n \\left(\\frac{h_c}{|d_c + eps|}\\right)^2

samples; the stop needs the largest ``n'_c`` over the candidates whose interval reaches past
``-eps``.  Like the probe's size to decide (:mod:`satcore._decisions.verdicts`), it assumes the
estimate stays where it is: a planning number, not a promise.

*Where the count means nothing.*  The distance ``|d_c + eps|`` the count divides by is itself read
with the standard error ``se_c``.  Within one standard error of the tolerance, ``|d_c + eps| < se_c``,
the distance's own one-standard-error band ``|d_c + eps| +- se_c`` reaches 0, so the count's band
``n (h_c / (|d_c + eps| -+ se_c))^2`` reaches infinity: the split does not tell whether a little more
data or no amount settles the stop, and a count read there swings with the noise (one dataset's
growing splits named 180, 76008, 472 and 2249 samples).  With ``h_c = z_{0.975} se_c`` the condition
is, on the samples factor,

.. math::

    \\frac{n'_c}{n} = \\left(\\frac{h_c}{|d_c + eps|}\\right)^2 > z_{0.975}^2 \\approx 3.84,

so a count is named only up to :data:`SAMPLES_FACTOR_NAMED` times the samples read; beyond it the
change *sits at the tolerance* (:attr:`HeldoutResolution.at_tolerance`) and no number is named.  On the decision
bench's 300-step stops read again on a held-out split 4 times larger, the stops with a named count
(factors 1.0-3.7) were resolved there in 8 of 12 and 7 of 8, and the counts beyond it (5.6 to 30,000
times the split) were no bound (studies/decision-validity.md, "Stops the held-out data cannot
resolve").  A tolerance the data resolves with fewer samples is a practical one the user states
(:class:`~satcore.TrialSettings` ``tolerance``); the least one the samples read resolve is
``max_c (h_c - d_c)`` (:func:`resolved_tolerance`): every interval then lies above its minus.

Only the part of the prediction's error that the held-out sample size sets is read here; the
calibrated interval of a :class:`~satcore.CandidateDecision` also carries the extrapolation's
error (the trial's trend), which more held-out data does not shrink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from .._shared.errors import InputError

RESOLUTION_LEVEL = 0.95  # the held-out resolution's interval: the decision's own intervals' level
_Z = float(ndtri(0.5 + RESOLUTION_LEVEL / 2))
# the largest samples factor a count is named for: (h / |d + eps|)^2 <= z^2, i.e. |d + eps| >= se (module docstring)
SAMPLES_FACTOR_NAMED = _Z ** 2


@dataclass(frozen=True)
class HeldoutResolution:
    """What the held-out data resolves of a stop (:func:`heldout_resolution`; module docstring).

    Attributes
    ----------
    candidate : int
        The index of the candidate it rests on: the one needing the most samples among those whose interval
        reaches past ``-tolerance``, or, where none does, the one whose interval comes nearest to it.
    half_width : float
        Its held-out resolution ``h = z_{0.975} se`` (loss units).
    tolerance : float
        The stop tolerance ``eps`` the interval is read against (loss units).
    resolved : bool
        Whether every interval lies above ``-tolerance`` (the stop's claim holds on this data).
    samples_factor : float or None
        ``n' / n`` (the samples needed over those read, ``(h / |d + eps|)^2``; ``inf`` where the change sits
        exactly at ``-eps`` or its standard error is infinite); None where resolved.  Above
        :data:`SAMPLES_FACTOR_NAMED` the change sits at the tolerance and :meth:`samples_needed` names no count.
    """

    candidate: int
    half_width: float
    tolerance: float
    resolved: bool
    samples_factor: float | None

    @property
    def at_tolerance(self) -> bool:
        """Whether the stop is unresolved with its binding change within one standard error of ``-tolerance``
        (``samples_factor > SAMPLES_FACTOR_NAMED``: ``|d + tolerance| < se``): no count is named."""
        return self.samples_factor is not None and self.samples_factor > SAMPLES_FACTOR_NAMED

    def samples_needed(self, samples: int) -> int | None:
        """``ceil(samples * samples_factor)``: the held-out samples that would resolve the stop, ``samples`` read;
        None where resolved or where the change sits at the tolerance (:attr:`at_tolerance`: the count's own
        band reaches infinity, a change exactly at ``-tolerance`` included)."""
        if self.samples_factor is None or self.at_tolerance:
            return None
        return max(samples + 1, math.ceil(samples * self.samples_factor))


def samples_at_one_standard_error(samples: int) -> int:
    """``ceil(z_{0.975}^2 samples)``: the held-out samples that would resolve a stop whose change were one standard
    error from minus the tolerance (the largest count named, :data:`SAMPLES_FACTOR_NAMED`), ``samples`` read: the
    first step the decision suggests where its change sits at the tolerance and no count is named.

    >>> samples_at_one_standard_error(160)
    615
    """
    return math.ceil(SAMPLES_FACTOR_NAMED * samples)


def heldout_resolution(changes, standard_errors, tolerance: float) -> HeldoutResolution:
    """Whether the trials' held-out changes resolve a stop at ``tolerance``, and the samples factor that would.

    Parameters
    ----------
    changes : sequence of float
        Each trialled candidate's held-out change ``d_c`` (loss after minus before; a gain is negative).
    standard_errors : sequence of float
        Their paired standard errors ``se_c`` (``>= 0``; ``inf``: resolves nothing).
    tolerance : float
        The stop tolerance ``eps >= 0`` in loss units.

    Returns
    -------
    HeldoutResolution
        ``h_c = z_{0.975} se_c``; unresolved where some ``d_c - h_c < -eps``, then
        ``samples_factor = max_c (h_c / |d_c + eps|)^2`` over those ``c`` (module docstring).

    Examples
    --------
    Two trials read on the held-out samples, a tolerance of 0.01: the first interval, ``-0.004 +- 0.0196``,
    reaches past -0.01, so the stop is unresolved; with the change staying at -0.004 the half-width must
    fall under ``|-0.004 + 0.01| = 0.006``, ``(0.0196 / 0.006)^2 = 10.7`` times the samples.

    >>> r = heldout_resolution([-0.004, 0.02], [0.01, 0.01], 0.01)
    >>> r.candidate, round(r.half_width, 4), r.resolved, round(r.samples_factor, 2)
    (0, 0.0196, False, 10.67)

    That count is not named: the change, 0.006 from -0.01, is within its standard error (0.01) of it, so
    the distance the count divides by is not resolved either (10.7 > 1.96^2):

    >>> r.at_tolerance, r.samples_needed(160)
    (True, None)

    A change 0.015 from the tolerance is beyond its standard error: ``(0.0196 / 0.015)^2 = 1.71`` times:

    >>> heldout_resolution([0.005], [0.01], 0.01).samples_needed(160)
    274

    Four times the samples halve the half-width; then it resolves:

    >>> heldout_resolution([-0.004, 0.02], [0.005 / 2, 0.005], 0.01).resolved
    True
    """
    d = np.asarray(changes, np.float64)
    se = np.asarray(standard_errors, np.float64)
    if d.ndim != 1 or d.size == 0 or se.shape != d.shape or not np.isfinite(d).all():
        raise InputError("held-out resolution: as many changes (finite) as standard errors, at least one")
    # an infinite standard error (a trial read on fewer than 2 samples) resolves nothing: no finite n is named
    if not (se >= 0).all() or not (math.isfinite(tolerance) and tolerance >= 0):
        raise InputError("held-out resolution: the standard errors and the tolerance must be numbers >= 0")
    half = _Z * se
    reaching = d - half < -tolerance
    if not reaching.any():
        nearest = int(np.argmin(d - half))
        return HeldoutResolution(nearest, float(half[nearest]), float(tolerance), True, None)
    distance = np.abs(d + tolerance)
    # a candidate whose interval does not reach needs nothing; one whose change sits exactly at -eps, no finite n
    factor = np.full(d.shape, -np.inf)
    factor[reaching] = np.inf
    sized = reaching & (distance > 0)
    factor[sized] = (half[sized] / distance[sized]) ** 2
    binding = int(np.argmax(factor))
    return HeldoutResolution(binding, float(half[binding]), float(tolerance), False, float(factor[binding]))


def stop_resolution(candidates, stop_tolerance: float) -> tuple:
    """``(name, HeldoutResolution)``: whether the trials of ``candidates`` (:class:`~satcore.CandidateDecision`; the
    verified ones a decision may choose: not eliminated) resolve a stop at ``stop_tolerance`` (:func:`heldout_resolution` of their held-out
    changes at the trials' ends and paired standard errors), and the candidate it rests on."""
    trialled = _trialled(candidates)
    read = heldout_resolution([c.trial.heldout_change[-1] for c in trialled], [c.trial.heldout_se for c in trialled],
                              stop_tolerance)
    return trialled[read.candidate].name, read


def _trialled(candidates) -> list:
    """The verified candidates a decision may choose (not eliminated): those whose trials a stop rests on."""
    return [c for c in candidates if c.verified and not c.eliminated]


def resolved_tolerance(candidates) -> float:
    """The least stop tolerance (loss units) at which the trials of ``candidates`` (:func:`stop_resolution`'s) resolve
    a stop: ``max_c (h_c - d_c)``, ``h_c = z_{0.975} se_c`` (0 where every interval lies above 0), so that every
    interval ``d_c +- h_c`` lies above its minus (module docstring).

    Examples
    --------
    >>> from types import SimpleNamespace as C
    >>> trial = lambda d, se: C(verified=True, eliminated=False, trial=C(heldout_change=[d], heldout_se=se))
    >>> round(resolved_tolerance([trial(-0.004, 0.01), trial(0.02, 0.01)]), 4)   # 0.0196 + 0.004
    0.0236
    """
    trialled = _trialled(candidates)
    return max(0.0, *(_Z * c.trial.heldout_se - c.trial.heldout_change[-1] for c in trialled))


__all__ = ["HeldoutResolution", "RESOLUTION_LEVEL", "SAMPLES_FACTOR_NAMED", "heldout_resolution",
           "resolved_tolerance", "samples_at_one_standard_error", "stop_resolution"]
