"""What every adapter's ``grow`` shares (pure Python: no framework is imported).

* :class:`Grown`: the expanded copy, the first-order predicted change of the mean loss and
  the ``alpha`` used;
* :func:`insertion_step`: the ``alpha`` of one of ``alpha=``, ``rho=`` or ``zero=True``.
  ``rho`` is the relative size of the inserted update, ``||h||_S / ||z||_S = rho``, turned
  into ``alpha = rho ||z||_S / V`` by :func:`satcore.alpha_for_relative_update`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from satcore import InputError, alpha_for_relative_update
from satcore.adapter_api import finite_real


class Grown(NamedTuple):
    """The expanded copy, the first-order predicted change of the mean loss, and the ``alpha`` used."""

    model: object
    predicted_change: float
    alpha: float


def insertion_step(stats, stream_rms, alpha, rho, zero, rtol) -> float:
    """``alpha`` from exactly one of ``alpha``, ``rho`` (with the candidate's ``stream_rms``) or ``zero``."""
    if sum(x is not None and x is not False for x in (alpha, rho, zero)) != 1:
        raise InputError("give exactly one of alpha, rho or zero=True")
    if zero:
        return 0.0
    if rho is not None:
        if stream_rms is None:
            raise InputError("rho needs the candidate's stream RMS ||z||_S, which this probe result does not record; "
                             "give alpha instead")
        # through the K^- the report's growth value reads (CandidateStatistics.feature_gram_inverse)
        growth = math.sqrt(stats.feature_gram_inverse(rtol).quadratic_form(stats.cross_gradient()))
        return alpha_for_relative_update(rho, stream_rms, growth)
    return finite_real(alpha, "alpha")
