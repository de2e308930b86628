"""Where to insert a block, whether it will lower the held-out loss under the user's recipe, and when to stop.

The first-order statistics rank every candidate at once but do not predict what
hundreds of Adam steps do to the held-out loss (docs/predictive-validity.md).  A
decision is therefore made in two stages:

1. **Screen.**  The probe's predicted held-out gains (:func:`satcore.predict_gains`)
   order the candidates; the first ``max_trials`` are verified.
2. **Verify.**  At each verified candidate the zero-output block is inserted into a
   copy of the model and trained with the user's :class:`~satcore.Recipe`, the trials
   together costing at most one block trained with the recipe: by an even plan
   (:func:`trial_plan`, every trial ``T = recipe.steps // n_verified`` steps), or by
   successive halving (:func:`halving_plan`: every verified candidate trained ``T1``,
   half of ``T``; the half with the lowest held-out change at ``T1`` trained on to
   ``T2`` with the rest of the steps, and only those may be chosen, the others
   ``eliminated``).  The held-out loss is measured at a quarter, half and all of each
   trial (:class:`TrialCurve`).

The trial's held-out change ``d(t)`` (loss after minus loss before, a harm is
positive) is extrapolated to the recipe's ``S`` steps along its trend per doubling
of the steps,

.. math::

    \\hat d(S) = d(T) + \\beta \\, [d(T) - d(T/2)] \\, \\log_2(S / T),

and its error is modelled as ``realized - \\hat d = s z`` with the scale
``s = se + c |d(T) - d(T/2)| (1 + \\log_2(S/T)) + \\gamma |\\hat d|`` (``se``: the
standard error of ``d(T)`` from the paired per-sample held-out losses) and ``z``
drawn from the empirical distribution of normalised residuals measured on the bench
(split conformal prediction).  ``beta``, ``c``, ``gamma``, the quantiles of ``z``, the
``P(decrease)`` threshold and the stop tolerance's gap fraction are fitted on bench model sets
(:class:`Calibration`; ``studies/decision_validity.py`` fits and scores them leave one
model set out).  ``P(decrease) = 1 / (1 + exp(a + b \\hat d / s))`` (logistic calibration of
the standardised prediction, fitted on the bench; ``F_z(-\\hat d / s)`` where no logistic fit is
given); the ``1 - alpha`` interval is
``\\hat d + s [Q_z(alpha/2), Q_z(1 - alpha/2)]``.

The choice is the verified candidate with the lowest calibrated held-out change
among those with ``P(decrease) >= p_threshold``; the decision stops (``choice`` is
``None``) with ``stop_reason`` ``"no_credible_decrease"`` when no candidate reaches
the threshold, or ``"gain_below_tolerance"`` when the best predicted decrease is
below the stop tolerance, in loss units the larger of

.. math::

    f \\max(0, L_{heldout} - L_{train}) \\quad\\text{and}\\quad \\tau |L_{heldout}|

(``L``: the model's losses before insertion on the held-out split and on the trials'
training split; ``f``: ``generalization_gap_fraction``, fitted on the bench, so that a
model that over-fits needs a larger predicted decrease and one that does not needs
only a credible one; ``tau``: ``tolerance``, a user's practical share of the held-out
loss, 0 as shipped).  Either stop claims that no block pays; where the held-out data
cannot resolve that claim (some trial's 95% interval from its paired standard error
still reaches past minus the stop tolerance, :func:`~satcore.heldout_resolution`) the
stop is ``"heldout_too_small"`` instead, with the held-out samples that would resolve it.

The paper's first-order criterion (Liu et al., "Quantifying Depth Sufficiency in
Residual Neural Networks: A First-Order Criterion", Theorem 1) says whether a
zero-output block has a descent direction at all; it is the screen here, never the
decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .._shared.display import NOT_VERIFIED
from .._shared.errors import InputError
from .._shared.numbers import finite_real
from .recipe import Recipe
from .resolution import resolved_tolerance, stop_resolution

STOP_REASONS = ("no_credible_decrease", "gain_below_tolerance", "heldout_too_small", "no_candidates")
# the stop tolerance's terms (Calibration.stop_tolerance_terms): what each is a fraction of -> its calibration field
STOP_TOLERANCE_FRACTIONS = MappingProxyType({"generalization gap": "generalization_gap_fraction",
                                             "held-out loss": "tolerance"})


def paired_standard_error(differences):
    """The standard error of the mean of paired per-sample ``differences`` along the last axis,
    ``std(d, ddof=1) / sqrt(n)``: a trial's held-out change (losses after minus before on the same samples),
    or two trials' difference (both read on the same held-out samples); ``inf`` where ``n < 2``.

    Examples
    --------
    >>> round(paired_standard_error([0.1, 0.3, 0.2, 0.4]), 6)
    0.06455
    """
    d = np.asarray(differences, np.float64)
    n = d.shape[-1]
    if n < 2:
        return np.full(d.shape[:-1], math.inf) if d.ndim > 1 else math.inf
    se = d.std(-1, ddof=1) / math.sqrt(n)
    return float(se) if d.ndim == 1 else se


@dataclass(frozen=True)
class TrialCurve:
    """Held-out and training loss changes measured along one short trial.

    Attributes
    ----------
    steps : tuple of int
        Checkpoints (optimizer steps done), strictly increasing; the last is the trial's length.
    heldout_change, training_change : tuple of float
        Mean loss after minus mean loss before, at each checkpoint (a harm is positive).
    heldout_se : float
        Standard error of the last held-out change (paired per-sample differences).
    """

    steps: tuple
    heldout_change: tuple
    training_change: tuple
    heldout_se: float

    def __post_init__(self):
        steps = tuple(int(s) for s in self.steps)
        if not steps or any(b <= a for a, b in zip(steps, steps[1:])) or steps[0] < 1:
            raise InputError(f"trial curve: steps must be strictly increasing integers >= 1, got {steps}")
        for name in ("heldout_change", "training_change"):
            values = tuple(float(v) for v in getattr(self, name))
            if len(values) != len(steps) or not all(math.isfinite(v) for v in values):
                raise InputError(f"trial curve: {name} must hold {len(steps)} finite values")
            object.__setattr__(self, name, values)
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "heldout_se", float(self.heldout_se))

    @classmethod
    def from_losses(cls, steps, heldout_before, heldout_after, training_before, training_after) -> "TrialCurve":
        """From per-sample losses: ``*_before`` ``(n,)``, ``*_after`` ``(k, n)`` (one row per checkpoint)."""
        hb, ha = np.asarray(heldout_before, np.float64), np.atleast_2d(np.asarray(heldout_after, np.float64))
        tb, ta = np.asarray(training_before, np.float64), np.atleast_2d(np.asarray(training_after, np.float64))
        return cls(tuple(steps), tuple(ha.mean(1) - hb.mean()), tuple(ta.mean(1) - tb.mean()),
                   paired_standard_error(ha[-1] - hb))

    def at(self, step: float, which: str = "heldout") -> float:
        """The change at ``step`` (linear in ``log step`` between checkpoints, 0 at step 0, clamped at the end)."""
        values = self.heldout_change if which == "heldout" else self.training_change
        if step <= 0:
            return 0.0
        if step <= self.steps[0]:
            return values[0] * step / self.steps[0]
        return float(np.interp(math.log(step), np.log(self.steps), values))

    def trend(self, which: str = "heldout") -> float:
        """Change per doubling of the steps at the trial's end: ``d(T) - d(T/2)``."""
        T = self.steps[-1]
        values = self.heldout_change if which == "heldout" else self.training_change
        return values[-1] - self.at(T / 2, which)

    def to_dict(self) -> dict:
        return {"steps": list(self.steps), "heldout_change": list(self.heldout_change),
                "training_change": list(self.training_change), "heldout_se": self.heldout_se}


@dataclass(frozen=True)
class Calibration:
    """Fitted constants of the trial's extrapolation and its error model (module docstring).

    Attributes
    ----------
    trend_weight : float
        ``beta``: weight of the trial's trend per doubling in the extrapolation.
    relative_scale : float
        ``gamma``: share of ``|prediction|`` in the error scale.
    levels, quantiles : tuple of float
        The normalised residual ``z`` 's empirical quantiles at increasing levels in (0, 1).
    p_threshold : float
        Smallest ``P(decrease)`` a candidate may be chosen with.
    tolerance : float
        A practical smallest predicted decrease worth a block, as a fraction of the held-out loss before
        insertion (a user states one; 0 as shipped); :meth:`stop_tolerance_terms`.
    source : str
        Where the constants were fitted.
    trend_scale : float
        ``c``: weight of the trial's trend in the error scale.
    logit_intercept, logit_slope : float
        ``a``, ``b`` of ``P(decrease) = 1 / (1 + exp(a + b point / scale))``; with ``logit_slope``
        None, ``P(decrease) = F_z(-point / scale)``.
    heldout_samples : tuple of int, optional
        The fewest and most held-out samples the fitted trials were read on: beyond the most, the error
        model is not known to hold (the printed decision says so).
    optimizer_notes : tuple of (str, str)
        ``(optimizer, what the fit's evidence says of recipes with it)``, printed under a decision whose
        recipe uses that optimizer.
    generalization_gap_fraction : float
        The fitted smallest predicted decrease worth a block, as a fraction of the model's generalization gap
        (held-out minus training loss before insertion; 0 where the model does not over-fit):
        :meth:`stop_tolerance_terms`.

    Raises
    ------
    InputError
        ``tolerance`` or ``generalization_gap_fraction`` not a finite number ``>= 0``, or levels and quantiles
        that are not a distribution's.
    """

    trend_weight: float
    relative_scale: float
    levels: tuple
    quantiles: tuple
    p_threshold: float
    tolerance: float
    source: str = ""
    trend_scale: float = 1.0
    logit_intercept: float = 0.0
    logit_slope: float | None = None
    heldout_samples: tuple | None = None
    optimizer_notes: tuple = ()
    generalization_gap_fraction: float = 0.0

    def __post_init__(self):
        for name in STOP_TOLERANCE_FRACTIONS.values():
            object.__setattr__(self, name, finite_real(getattr(self, name), f"calibration: {name}", low=0.0))
        levels = tuple(float(v) for v in self.levels)
        quantiles = tuple(float(v) for v in self.quantiles)
        if len(levels) != len(quantiles) or len(levels) < 2:
            raise InputError("calibration: levels and quantiles must have the same length >= 2")
        if any(b <= a for a, b in zip(levels, levels[1:])) or not (0 < levels[0] and levels[-1] < 1):
            raise InputError("calibration: levels must increase strictly inside (0, 1)")
        if any(b < a for a, b in zip(quantiles, quantiles[1:])):
            raise InputError("calibration: quantiles must not decrease")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "quantiles", quantiles)
        if self.heldout_samples is not None:
            object.__setattr__(self, "heldout_samples", tuple(int(n) for n in self.heldout_samples))
        notes = self.optimizer_notes.items() if isinstance(self.optimizer_notes, dict) else self.optimizer_notes
        object.__setattr__(self, "optimizer_notes", tuple((str(k), str(v)) for k, v in notes))

    def cdf(self, z: float) -> float:
        """``F_z(z)``: linear between the stored quantiles, half the outer level beyond them."""
        q, p = np.asarray(self.quantiles), np.asarray(self.levels)
        if z < q[0]:
            return float(p[0] / 2)
        if z > q[-1]:
            return float(1 - (1 - p[-1]) / 2)
        # flat stretches of the quantile function (ties) take their upper level
        idx = np.searchsorted(q, z, side="right")
        if idx == 0:
            return float(p[0])
        if idx >= len(q):
            return float(p[-1])
        lo, hi = q[idx - 1], q[idx]
        return float(p[idx - 1] + (p[idx] - p[idx - 1]) * (z - lo) / (hi - lo)) if hi > lo else float(p[idx])

    def quantile(self, level: float) -> float:
        """``Q_z(level)``, linear between the stored levels, the outer quantile beyond them."""
        return float(np.interp(level, self.levels, self.quantiles))

    def to_dict(self) -> dict:
        return {"trend_weight": self.trend_weight, "relative_scale": self.relative_scale,
                "levels": list(self.levels), "quantiles": list(self.quantiles),
                "p_threshold": self.p_threshold, "tolerance": self.tolerance,
                "generalization_gap_fraction": self.generalization_gap_fraction, "source": self.source,
                "trend_scale": self.trend_scale, "logit_intercept": self.logit_intercept,
                "logit_slope": self.logit_slope,
                "heldout_samples": None if self.heldout_samples is None else list(self.heldout_samples),
                "optimizer_notes": dict(self.optimizer_notes)}

    def stop_tolerance_terms(self, heldout_loss: float, training_loss: float) -> dict[str, float]:
        """The stop tolerance's terms in loss units, by what they are a fraction of (:data:`STOP_TOLERANCE_FRACTIONS`):
        ``"generalization gap"``, ``generalization_gap_fraction * max(0, heldout_loss - training_loss)``, and
        ``"held-out loss"``, ``tolerance * |heldout_loss|`` (the losses of the model before insertion, on the held-out
        split and on the trials' training split); the stop tolerance is the larger (:func:`choose`).

        Examples
        --------
        >>> import dataclasses
        >>> from satcore import TrialSettings
        >>> cal = dataclasses.replace(TrialSettings().calibration, generalization_gap_fraction=0.01, tolerance=0.001)
        >>> {k: round(v, 6) for k, v in cal.stop_tolerance_terms(2.0, 1.5).items()}
        {'generalization gap': 0.005, 'held-out loss': 0.002}
        """
        bases = {"generalization gap": max(0.0, heldout_loss - training_loss), "held-out loss": abs(heldout_loss)}
        return {what: getattr(self, fraction) * bases[what] for what, fraction in STOP_TOLERANCE_FRACTIONS.items()}

    def p_decrease(self, standardised: float) -> float:
        """``P(decrease)`` of a prediction ``point / scale`` (class docstring)."""
        if self.logit_slope is None:
            return self.cdf(-standardised)
        x = self.logit_intercept + self.logit_slope * standardised
        return float(1.0 / (1.0 + math.exp(min(x, 700.0))))

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(**data)


def extrapolate(curve: TrialCurve, full_steps: int, trend_weight: float, which: str = "heldout") -> float:
    """``d(T) + beta [d(T) - d(T/2)] log2(S / T)``: the trial's change carried to ``full_steps``."""
    T = curve.steps[-1]
    values = curve.heldout_change if which == "heldout" else curve.training_change
    doublings = max(0.0, math.log2(full_steps / T))
    return values[-1] + trend_weight * curve.trend(which) * doublings


def error_scale(curve: TrialCurve, full_steps: int, point: float, relative_scale: float,
                trend_scale: float = 1.0) -> float:
    """``se + c |d(T) - d(T/2)| (1 + log2(S/T)) + gamma |point|``, the scale of the prediction's error."""
    doublings = max(0.0, math.log2(full_steps / curve.steps[-1]))
    se = curve.heldout_se if math.isfinite(curve.heldout_se) else 0.0
    return se + trend_scale * abs(curve.trend()) * (1.0 + doublings) + relative_scale * abs(point)


@dataclass(frozen=True)
class CandidateDecision:
    """One candidate's evidence.

    ``predicted_heldout_change`` / ``predicted_training_change``: loss after the recipe's
    training minus loss before (a harm is positive).  For a verified candidate (``trial``
    set) they are the trial's calibrated extrapolation, with its ``interval`` and
    ``P(decrease)``.  A candidate the screen left out (:meth:`screen_only`) is *not verified*:
    its changes are the first-order screen's, and it carries no ``interval`` and no
    ``p_decrease`` (both ``None``): on the decision bench a probability fitted to the screen's
    values missed the realized frequency by 0.19-0.81 in some bin on every set of recipes
    (docs/predictive-validity.md), and the screen's own fold interval, which omits the
    predictor's error, printed near-certain decreases where training the block raised the
    loss.  Such a candidate is never chosen.  ``eliminated``: trialled in the first stage of
    successive halving (:func:`halving_plan`) and dropped there; its ``trial`` is that shorter
    one, and it is never chosen.  ``trial_family``: the family of the block the trial trained, as resolved at
    this candidate (``"conv"``, ``"mlp"``, ``"native"``: the model's own kind, what ``insert_block`` inserts,
    ``"linear"``, ...; :attr:`InsertionDecision.requested_family` is what was asked for); None for a candidate
    no trial verified, or one built without it.

    Raises
    ------
    InputError
        An ``interval``, ``p_decrease`` or ``trial_family`` on a candidate without a ``trial``, or a verified
        one without an interval and ``p_decrease``.
    """

    name: str
    predicted_heldout_change: float
    predicted_training_change: float
    interval: tuple | None
    p_decrease: float | None
    screen_heldout_change: float
    trial: TrialCurve | None = None
    eliminated: bool = False
    trial_family: str | None = None

    def __post_init__(self):
        claims = (self.interval is not None, self.p_decrease is not None)
        if claims != (self.verified, self.verified) or (self.trial_family is not None and not self.verified):
            raise InputError(f"candidate {self.name!r}: " + ("a candidate no trial verified carries no interval, no "
                                                            "p_decrease and no trial_family (None)"
                                                            if not self.verified else
                                                            "a verified candidate needs its interval and p_decrease"))
        if self.interval is not None:
            object.__setattr__(self, "interval", tuple(float(v) for v in self.interval))

    @classmethod
    def screen_only(cls, name: str, heldout_change: float, training_change: float) -> "CandidateDecision":
        """A candidate no trial verified: the first-order screen's held-out and training changes of the
        recipe's step, no interval, no ``P(decrease)``."""
        return cls(name, float(heldout_change), float(training_change), None, None, float(heldout_change))

    @property
    def verified(self) -> bool:
        return self.trial is not None

    @property
    def evidence(self) -> str:
        """What the row rests on, in words: ``"trial"``, ``"trial (eliminated)"`` or ``"not verified"``."""
        if not self.verified:
            return NOT_VERIFIED
        return "trial (eliminated)" if self.eliminated else "trial"

    def to_dict(self) -> dict:
        return {"name": self.name, "predicted_heldout_change": self.predicted_heldout_change,
                "predicted_training_change": self.predicted_training_change,
                "interval": None if self.interval is None else list(self.interval), "p_decrease": self.p_decrease,
                "screen_heldout_change": self.screen_heldout_change, "verified": self.verified,
                "evidence": self.evidence, "eliminated": self.eliminated, "trial_family": self.trial_family,
                "trial": None if self.trial is None else self.trial.to_dict()}


def verified_candidate(name: str, curve: TrialCurve, full_steps: int, calibration: Calibration,
                       screen_heldout_change: float, alpha: float = 0.05) -> CandidateDecision:
    """A verified candidate's calibrated prediction, interval and ``P(decrease)`` (module docstring)."""
    point = extrapolate(curve, full_steps, calibration.trend_weight)
    scale = error_scale(curve, full_steps, point, calibration.relative_scale, calibration.trend_scale)
    training = extrapolate(curve, full_steps, 1.0, which="training")
    if scale > 0:
        interval = (point + scale * calibration.quantile(alpha / 2), point + scale * calibration.quantile(1 - alpha / 2))
        p_decrease = calibration.p_decrease(point / scale)
    else:
        interval, p_decrease = (point, point), float(point < 0)
    return CandidateDecision(name, float(point), float(training), tuple(float(v) for v in interval),
                             float(p_decrease), float(screen_heldout_change), curve)


# InsertionDecision.scalars' keys: the decision's, and each candidate's in the order it reads them
_DECISION_SCALARS = ("insert", "cost_block_steps", "close_call", "choice_index", "predicted_heldout_change")
_CANDIDATE_SCALARS = ("chosen", "not_verified", "predicted_heldout_change", "p_decrease", "interval_low",
                      "interval_high")


@dataclass(frozen=True)
class InsertionDecision:
    """Where to insert the next block under a recipe, or why not (:func:`choose`).

    Attributes
    ----------
    choice : str or None
        The candidate to insert at; ``None``: stop.
    stop_reason : str or None
        ``"no_credible_decrease"``, ``"gain_below_tolerance"``, ``"heldout_too_small"`` (either of the first two
        where the held-out data cannot resolve it: :attr:`heldout_samples_needed`) or ``"no_candidates"`` when
        ``choice`` is None.
    candidates : Mapping[str, CandidateDecision]
        Every candidate's evidence, in the screen's order.
    recipe : Recipe
        The recipe the predictions are for.
    heldout_loss : float
        The held-out loss before insertion.
    cost_block_steps : int
        The trials' optimizer steps of one inserted block, summed.
    calibration : Calibration
        The constants the predictions used.
    margin_se : float or None
        The standard error of :attr:`margin`'s difference from the paired per-sample differences of
        the choice's and the runner-up's held-out losses after their trials (``decide`` sets it);
        None: bounded by the two trials' standard errors alone (:attr:`margin`).
    stop_tolerance : float or None
        The smallest predicted held-out decrease (loss units) the decision inserts a block for: the larger of
        the calibration's ``generalization_gap_fraction`` of the generalization gap and its ``tolerance`` of
        the held-out loss (:func:`choose`, :attr:`stop_tolerance_rule`); None on decisions built without it.
    training_loss : float or None
        The training loss before insertion, on the trials' training split (:func:`choose`); None on decisions
        built without it.
    heldout_samples : int or None
        How many held-out samples the trials were read on (``decide`` sets it); the calibration's
        error model was fitted on trials read on ``calibration.heldout_samples``
        and is over-confident on many more (docs/predictive-validity.md).
    requested_family : str or None
        The probe family the trials were asked to train (``decide`` sets it from its probe's ``family``:
        ``"auto"``, ``"native"``, a kind, a feature map's class name, or ``"per candidate"`` for a mapping); each
        verified candidate's :attr:`CandidateDecision.trial_family` is what it resolved to there.  None on
        decisions built without it.
    heldout_resolution : float or None
        On a stop with verified candidates: the 95% half-width ``1.96 se`` (loss units) of the trial the stop's
        claim rests on (:func:`~satcore.heldout_resolution`: the one whose interval reaches furthest past minus
        the stop tolerance, by the samples it needs, or comes nearest to it); None with a choice.
    heldout_samples_needed : int or None
        On a ``"heldout_too_small"`` stop: about how many held-out samples would resolve it (the half-width
        shrinks as ``1 / sqrt(n)``; a planning number that assumes the trials' changes stay put).  None on any
        other decision, where the held-out count is not known, and where the binding trial's change sits within
        one standard error of minus the stop tolerance (:attr:`~satcore.HeldoutResolution.at_tolerance`): there the count's
        own uncertainty reaches infinity and no number is named (a practical tolerance settles it:
        :class:`~satcore.TrialSettings` ``tolerance``).
    heldout_binding_candidate : str or None
        On a stop with verified candidates: the candidate whose trial :attr:`heldout_resolution` is read on (the
        stop's claim rests on it); None with a choice.
    """

    choice: str | None
    stop_reason: str | None
    candidates: MappingProxyType
    recipe: Recipe
    heldout_loss: float
    cost_block_steps: int
    calibration: Calibration = field(repr=False)
    margin_se: float | None = None
    heldout_samples: int | None = None
    stop_tolerance: float | None = None
    training_loss: float | None = None
    requested_family: str | None = None
    heldout_resolution: float | None = None
    heldout_samples_needed: int | None = None
    heldout_binding_candidate: str | None = None

    def __post_init__(self):
        if (self.choice is None) == (self.stop_reason is None):
            raise InputError("decision: exactly one of choice and stop_reason is set")
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise InputError(f"decision: unknown stop_reason {self.stop_reason!r}")
        for role, name in (("choice", self.choice), ("heldout_binding_candidate", self.heldout_binding_candidate)):
            if name is not None and name not in self.candidates:
                raise InputError(f"decision: {role} {name!r} is not a candidate")
        object.__setattr__(self, "candidates", MappingProxyType(dict(self.candidates)))

    def __str__(self) -> str:
        """The decision's table and notes (``print(decision)``), as reports and callbacks show it."""
        from .._rendering.table import render_decision

        return render_decision(self)

    @property
    def stop_tolerance_rule(self) -> str | None:
        """What set :attr:`stop_tolerance`: the key of the larger of
        :meth:`Calibration.stop_tolerance_terms` (``"generalization gap"`` or ``"held-out loss"``; the gap's on a
        tie), or None where both are 0 or the decision was built without the training loss."""
        if self.training_loss is None or not self.stop_tolerance:
            return None
        terms = self.calibration.stop_tolerance_terms(self.heldout_loss, self.training_loss)
        return max(terms, key=terms.get)

    @property
    def heldout_resolved_share(self) -> float | None:
        """On a ``"heldout_too_small"`` stop, the least ``TrialSettings(tolerance=...)`` (a share of the held-out
        loss) at which these trials' held-out data resolves the stop: ``max_c (1.96 se_c - d_c) / |heldout_loss|``
        over the trials it rests on (:func:`~satcore._decisions.resolution.resolved_tolerance`), every 95% interval
        then above minus the tolerance; a decision again with it (same trials) stops resolved, with no block
        inserted.  None on other decisions or a held-out loss of 0."""
        if self.stop_reason != "heldout_too_small" or not self.heldout_loss:
            return None
        return resolved_tolerance(self.candidates.values()) / abs(self.heldout_loss)

    @property
    def credible_candidates(self) -> list:
        """The candidates the decision could choose: verified, not eliminated, ``p_decrease`` at least the
        calibration's threshold (a stop without any stops for no credible decrease, or, unresolved, for too small
        a held-out split)."""
        return [c for c in self.candidates.values() if c.verified and not c.eliminated
                and c.p_decrease >= self.calibration.p_threshold]

    @property
    def stop_tolerance_se(self) -> float | None:
        """:attr:`stop_tolerance` in units of what the held-out data resolves: over the paired standard error of
        the trial it was compared with (the credible verified candidate of lowest predicted change); None
        where there is no such candidate or tolerance, or that standard error is 0 or unknown.  On the decision
        bench the shipped tolerance (1% of the generalization gap) was a median 0.00-0.06 of them, depending on
        the set of recipes, where 0.3% of the held-out loss (shipped before) was 0.9-2.2
        (studies/decision-validity.md)."""
        credible = self.credible_candidates
        if self.stop_tolerance is None or not credible:
            return None
        se = min(credible, key=lambda c: c.predicted_heldout_change).trial.heldout_se
        return self.stop_tolerance / se if math.isfinite(se) and se > 0 else None

    @property
    def cost_fraction(self) -> float:
        """``cost_block_steps`` over the cost of training one block with the recipe."""
        return self.cost_block_steps / self.recipe.block_steps()

    @property
    def runner_up(self) -> str | None:
        """The chosen candidate's closest rival: among the other verified candidates that could be chosen (not
        eliminated), the one with the lowest ``predicted_heldout_change``; None without a choice or rival."""
        if self.choice is None:
            return None
        rivals = [c for n, c in self.candidates.items() if n != self.choice and c.verified and not c.eliminated]
        return min(rivals, key=lambda c: c.predicted_heldout_change).name if rivals else None

    @property
    def margin(self) -> tuple | None:
        """``(difference, standard error)``: the runner-up's predicted held-out change minus the choice's
        (negative where the runner-up predicts the larger decrease but was not credible enough to be chosen),
        and the standard error of that difference: :attr:`margin_se` where set (``decide``: paired over the
        held-out samples both trials are evaluated on), else ``sqrt(se_choice^2 + se_runner_up^2)`` from the
        two trials' own standard errors, which ignores that the two are evaluated on the same samples (their
        correlation is usually positive, so this overstates it); None without a runner-up.

        A difference below its standard error is a *close call*: the held-out data does not tell the two
        apart.  On the decision bench (docs/predictive-validity.md) close calls picked the best candidate
        less often than the others (41% against 61% of the choices)."""
        if self.runner_up is None:
            return None
        first, second = self.candidates[self.choice], self.candidates[self.runner_up]
        se = self.margin_se if self.margin_se is not None else math.hypot(first.trial.heldout_se,
                                                                           second.trial.heldout_se)
        return second.predicted_heldout_change - first.predicted_heldout_change, se

    @property
    def close_call(self) -> bool:
        """Whether the choice leads its runner-up by less than the standard error of the difference (:attr:`margin`)."""
        return self.margin is not None and self.margin[0] < self.margin[1]

    def scalars(self, prefix: str = "satcore/", per_candidate: bool = True,
                places: Sequence[str] | None = None) -> dict[str, float]:
        """Numbers for a metrics logger, keys starting with ``prefix + "decision/"`` (loggers keep numbers, not
        names): ``insert`` (1 to insert, 0 to stop), ``cost_block_steps``; with a choice ``close_call`` (1/0),
        ``predicted_heldout_change`` (the choice's) and, given ``places`` (the decision's places upstream
        first, as ``best_candidate_index`` counts them; :attr:`candidates` is in the screen's order, which
        changes between decisions), ``choice_index``, the choice's index among them; and, with
        ``per_candidate``, per candidate ``<name>/chosen`` (1/0), ``<name>/not_verified`` (1 where no trial
        verified it: its held-out change is then the first-order screen's, and it has no ``p_decrease`` or
        interval keys), ``<name>/predicted_heldout_change``, ``<name>/p_decrease``, ``<name>/interval_low``
        and ``<name>/interval_high``.  Values that are not finite are left out.

        Examples
        --------
        >>> from satcore import Recipe, TrialSettings
        >>> from satcore._decisions.trials import CandidateDecision, TrialCurve, choose
        >>> trial = TrialCurve((75, 150, 300), (-0.02, -0.04, -0.05), (-0.03, -0.06, -0.08), 0.01)
        >>> d = choose([CandidateDecision("b0", -0.05, -0.08, (-0.09, -0.01), 0.97, -0.02, trial),
        ...             CandidateDecision.screen_only("head", -2.6, -2.9)],
        ...            Recipe("adam", 1e-3, 300, 32), 2.0, 1.8, 300, TrialSettings().calibration)
        >>> {k: v for k, v in d.scalars().items() if "interval" not in k}  # doctest: +NORMALIZE_WHITESPACE
        {'satcore/decision/insert': 1.0, 'satcore/decision/cost_block_steps': 300.0,
         'satcore/decision/close_call': 0.0, 'satcore/decision/predicted_heldout_change': -0.05,
         'satcore/decision/b0/chosen': 1.0,
         'satcore/decision/b0/not_verified': 0.0, 'satcore/decision/b0/predicted_heldout_change': -0.05,
         'satcore/decision/b0/p_decrease': 0.97, 'satcore/decision/head/chosen': 0.0,
         'satcore/decision/head/not_verified': 1.0, 'satcore/decision/head/predicted_heldout_change': -2.6}
        >>> d.scalars(per_candidate=False, places=["b0", "head"])  # doctest: +NORMALIZE_WHITESPACE
        {'satcore/decision/insert': 1.0, 'satcore/decision/cost_block_steps': 300.0,
         'satcore/decision/close_call': 0.0, 'satcore/decision/choice_index': 0.0,
         'satcore/decision/predicted_heldout_change': -0.05}
        """
        head = f"{prefix}decision/"
        out = {f"{head}insert": float(self.choice is not None), f"{head}cost_block_steps": self.cost_block_steps}
        if self.choice is not None:
            out[f"{head}close_call"] = float(self.close_call)
            if places is not None and self.choice in places:
                out[f"{head}choice_index"] = float(list(places).index(self.choice))
            out[f"{head}predicted_heldout_change"] = self.candidates[self.choice].predicted_heldout_change
        for name, c in self.candidates.items() if per_candidate else ():
            values = (float(name == self.choice), float(not c.verified), c.predicted_heldout_change, c.p_decrease,
                      *(c.interval or (None, None)))
            out |= {f"{head}{name}/{key}": v for key, v in zip(_CANDIDATE_SCALARS, values, strict=True)}
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}

    @staticmethod
    def scalar_keys(names, prefix: str = "satcore/", per_candidate: bool = True) -> set[str]:
        """Every key :meth:`scalars` can give for candidates ``names`` (a callback checks a metric it is asked to
        monitor against them before training)."""
        return ({f"{prefix}decision/{k}" for k in _DECISION_SCALARS}
                | {f"{prefix}decision/{n}/{k}" for n in (names if per_candidate else ()) for k in _CANDIDATE_SCALARS})

    def to_dict(self) -> dict:
        margin = self.margin
        return {"choice": self.choice, "stop_reason": self.stop_reason,
                "candidates": {name: c.to_dict() for name, c in self.candidates.items()},
                "recipe": self.recipe.to_dict(), "heldout_loss": self.heldout_loss, "training_loss": self.training_loss,
                "cost_block_steps": self.cost_block_steps, "cost_fraction": self.cost_fraction,
                "runner_up": self.runner_up, "margin": None if margin is None else list(margin),
                "close_call": self.close_call, "heldout_samples": self.heldout_samples,
                "stop_tolerance": self.stop_tolerance, "stop_tolerance_se": self.stop_tolerance_se,
                "stop_tolerance_rule": self.stop_tolerance_rule, "requested_family": self.requested_family,
                "heldout_resolution": self.heldout_resolution, "heldout_samples_needed": self.heldout_samples_needed,
                "heldout_binding_candidate": self.heldout_binding_candidate, "calibration": self.calibration.to_dict()}


def choose(candidates, recipe: Recipe, heldout_loss: float, training_loss: float, cost_block_steps: int,
           calibration: Calibration, heldout_samples: int | None = None) -> InsertionDecision:
    """The decision over ``candidates`` (an iterable of :class:`CandidateDecision`, screen order).

    Among verified candidates with ``p_decrease >= calibration.p_threshold`` the one with the
    lowest ``predicted_heldout_change``; stop when there is none, or when its predicted decrease
    is below the stop tolerance, the larger of ``calibration.generalization_gap_fraction`` times
    ``max(0, heldout_loss - training_loss)`` and ``calibration.tolerance`` times ``|heldout_loss|``
    (:meth:`Calibration.stop_tolerance_terms`; ``heldout_loss``, ``training_loss``: the model's before
    insertion, on the held-out split and the trials' training split).  A user states a practical
    tolerance as a share of the held-out loss, ``dataclasses.replace(calibration, tolerance=...)``; the
    decision reports the stop tolerance in loss units, in the trial's standard errors
    (:attr:`InsertionDecision.stop_tolerance_se`) and which term set it
    (:attr:`InsertionDecision.stop_tolerance_rule`).

    A stop (no credible decrease, or one below the stop tolerance) is ``"heldout_too_small"`` where the verified
    candidates' trials do not resolve it (:func:`~satcore.heldout_resolution` at the stop tolerance); with
    ``heldout_samples`` (the held-out samples the trials were read on) the decision says how many would.
    """
    stop_tolerance = float(max(calibration.stop_tolerance_terms(heldout_loss, training_loss).values()))
    candidates = {c.name: c for c in candidates}
    verified = [c for c in candidates.values() if c.verified and not c.eliminated]
    if not verified:
        reason, choice = "no_candidates", None
    else:
        credible = [c for c in verified if c.p_decrease >= calibration.p_threshold]
        best = min(credible, key=lambda c: c.predicted_heldout_change) if credible else None
        if best is None:
            reason, choice = "no_credible_decrease", None
        elif -best.predicted_heldout_change < stop_tolerance:
            reason, choice = "gain_below_tolerance", None
        else:
            reason, choice = None, best.name
    resolution, needed, binding = None, None, None
    if choice is None and verified:
        binding, read = stop_resolution(verified, stop_tolerance)
        resolution = read.half_width
        if not read.resolved:
            reason = "heldout_too_small"
            needed = None if heldout_samples is None else read.samples_needed(int(heldout_samples))
    return InsertionDecision(choice, reason, candidates, recipe, float(heldout_loss), int(cost_block_steps),
                             calibration, stop_tolerance=stop_tolerance, training_loss=float(training_loss),
                             heldout_samples=heldout_samples, heldout_resolution=resolution,
                             heldout_samples_needed=needed, heldout_binding_candidate=binding)


def trial_checkpoints(steps: int) -> tuple:
    """Where a trial of ``steps`` steps is measured: a quarter, half and all of it (at least step 1)."""
    return tuple(sorted({max(1, steps // 4), max(1, steps // 2), steps}))


def trial_plan(n_candidates: int, recipe: Recipe, max_trials: int = 4) -> tuple[int, int, tuple]:
    """``(verified, trial steps, checkpoints)``: the first ``min(n, max_trials)`` candidates, each trained
    ``recipe.steps // verified`` steps (at least 1), measured at a quarter, half and all of it."""
    if n_candidates < 1:
        return 0, 0, ()
    verified = max(1, min(n_candidates, max_trials))
    T = max(1, recipe.steps // verified)
    return verified, T, trial_checkpoints(T)


def halving_plan(n_candidates: int, recipe: Recipe, max_trials: int = 4) -> tuple[int, int, int, int]:
    """``(verified, T1, finalists, T2)``: successive halving at the cost of :func:`trial_plan`.

    The ``verified`` candidates of :func:`trial_plan` are each trained ``T1``, half of its trial
    (at least 1 step); the ``finalists = ceil(verified / 2)`` with the lowest held-out change at
    ``T1`` are trained on to ``T2 = T1 + (S - verified T1) // finalists`` (``S = recipe.steps``), so
    that ``verified T1 + finalists (T2 - T1) <= max(S, verified)``.  One candidate gets one trial
    of ``S`` steps.
    """
    verified, T, _ = trial_plan(n_candidates, recipe, max_trials)
    if verified == 0:
        return 0, 0, 0, 0
    first = max(1, T // 2)
    finalists = math.ceil(verified / 2)
    return verified, first, finalists, first + max(0, recipe.steps - verified * first) // finalists


__all__ = ["Calibration", "CandidateDecision", "InsertionDecision", "NOT_VERIFIED", "STOP_REASONS",
           "STOP_TOLERANCE_FRACTIONS", "TrialCurve",
           "choose", "error_scale", "extrapolate", "halving_plan", "paired_standard_error",
           "trial_checkpoints", "trial_plan", "verified_candidate"]
