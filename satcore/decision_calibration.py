"""The shipped calibration of :mod:`satcore.decision`: written by ``bench/decision_validity.py --fit``.

Fitted on every model set of the bench (its JSON says which); the bench scores the same
fit leave one model set out.  Regenerate with ``python bench/decision_validity.py --fit``.
"""

from .decision import Calibration

DEFAULT_CALIBRATION = Calibration(
    trend_weight=1.0,
    relative_scale=0.25,
    levels=(0.025, 0.16, 0.5, 0.84, 0.975),
    quantiles=(-1.96, -1.0, 0.0, 1.0, 1.96),
    p_threshold=0.5,
    tolerance=0.002,
    source="placeholder (normal residuals); not fitted yet",
)
