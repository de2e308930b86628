"""What turns scores into a report: the tests' criteria and Proposition 1's options, as frozen objects.

Scoring and deciding are separate steps.  :meth:`satcore.DepthStatistics.score`
(or :func:`satcore.score`) gives scores whose fold tests are computed once, when
first asked for; a :class:`Criteria` then turns them into verdicts, and another
``Criteria`` (another ``alpha``, another tolerance) re-reads the same scores
without scoring again::

    scores = statistics.score()
    strict = scores.report(Criteria(alpha=0.01))
    loose = scores.report(Criteria(alpha=0.1, tolerance=1e-3, rho=0.01))

:class:`Prop1Options` holds the options of Proposition 1's distribution-free
separated test, reported under its own name next to the verdicts.  How an
inserted block is trained is :class:`satcore.Recipe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import Enum

from .._shared.errors import InputError

DEFAULT_ALPHA = 0.05


class Verdict(str, Enum):
    """The three words a first-order test can say (:mod:`satcore._decisions.verdicts`, Proposition 1's test).

    A ``str``: ``Verdict.IMPROVABLE == "improvable"``, and JSON writes the value.
    """

    IMPROVABLE = "improvable"
    SATURATED = "saturated"
    INCONCLUSIVE = "inconclusive"

    __str__ = str.__str__  # the word itself in messages and f-strings, not "Verdict.IMPROVABLE"
    __format__ = str.__format__


def _finite(name: str, value, *, low: float, low_open: bool, optional: bool = False, high: float | None = None):
    """``value`` as a float, refused by name unless a finite number in the stated range."""
    if value is None and optional:
        return None
    if high is not None:
        in_range = not (isinstance(value, bool) or not isinstance(value, (int, float))) and low < value < high
        if not in_range:
            raise InputError(f"{name} must be in ({low:g}, {high:g}), got {value!r}")
        return float(value)
    sign = ">" if low_open else ">="
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value < low or (low_open and value == low)):
        raise InputError(f"{name} must be a finite number {sign} {low:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Criteria:
    """How scores become verdicts (:func:`satcore._decisions.verdicts.decide`).

    Parameters
    ----------
    alpha : float
        Level of the per-candidate sign-flip tests (Holm across candidates) and
        of the intervals, in ``(0, 1)``.
    tolerance : float
        The gain that does not matter, ``>= 0``: in loss units when ``rho`` is
        given (turned into growth-value units by ``tau = tolerance / (rho ||z||_S)``),
        else in growth-value units.  ``"saturated"`` needs a tolerance ``> 0``.
    rho : float, optional
        Relative size ``||h||_S / ||z||_S`` of the inserted block; with it each
        candidate also gets its predicted first-order gain ``rho ||z||_S V``.

    Examples
    --------
    >>> Criteria(tolerance=1e-3, rho=0.01).units
    'loss'
    >>> Criteria(alpha=2)
    Traceback (most recent call last):
    ...
    satcore._shared.errors.InputError: alpha must be in (0, 1), got 2
    """

    alpha: float = DEFAULT_ALPHA
    tolerance: float = 0.0
    rho: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "alpha", _finite("alpha", self.alpha, low=0.0, low_open=True, high=1.0))
        object.__setattr__(self, "tolerance", _finite("tolerance", self.tolerance, low=0.0, low_open=False))
        object.__setattr__(self, "rho", _finite("rho", self.rho, low=0.0, low_open=True, optional=True))

    @property
    def units(self) -> str:
        """The tolerance's units: ``"loss"`` with ``rho``, else ``"growth value"``."""
        return "growth value" if self.rho is None else "loss"

    def to_dict(self) -> dict:
        """The tolerance as a report states it: ``{"value", "units", "rho"}``."""
        return {"value": self.tolerance, "units": self.units, "rho": self.rho}


@dataclass(frozen=True)
class Prop1Options:
    """Options of Proposition 1's separated test (:func:`satcore._formulas.certification.saturation_test`).

    Parameters
    ----------
    delta : float
        Tolerance ``delta`` on ``Gamma = max_l ||C_l||_F``, ``>= 0``.
    t : float, optional
        Separation ``t >= 0`` (0 only where the probe holds no noise).
    error : float, optional
        Error level ``a`` in ``(0, 1)``; without ``t`` and ``error`` the test runs
        at the criteria's ``alpha``.
    detector_scale : float, optional
        Also run Theorem 3's detector ``Gamma_hat <= S n^-1/4`` with this ``S > 0``.
    """

    delta: float = 0.0
    t: float | None = None
    error: float | None = None
    detector_scale: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "delta", _finite("delta", self.delta, low=0.0, low_open=False))
        object.__setattr__(self, "t", _finite("t", self.t, low=0.0, low_open=False, optional=True))
        object.__setattr__(self, "error", _finite("error", self.error, low=0.0, low_open=True, optional=True,
                                                  high=1.0))
        object.__setattr__(self, "detector_scale", _finite("detector_scale", self.detector_scale, low=0.0,
                                                           low_open=True, optional=True))


def split_options(options: dict) -> tuple[dict, dict, dict]:
    """Keyword options of a report call, sorted into ``(criteria, prop1, step)`` fields; others refused.

    The keywords ``alpha``, ``tolerance``, ``rho`` (:class:`Criteria`), ``delta``,
    ``t``, ``error``, ``detector_scale`` (:class:`Prop1Options`) and ``optimizer``,
    ``lr``, ``steps`` (the predicted step) are a shorthand for the objects.
    """
    names = ({f.name for f in fields(Criteria)}, {f.name for f in fields(Prop1Options)}, {"optimizer", "lr", "steps"})
    unknown = sorted(set(options) - set().union(*names))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    return tuple({k: v for k, v in options.items() if k in group} for group in names)


__all__ = ["Criteria", "Prop1Options", "Verdict", "DEFAULT_ALPHA"]
