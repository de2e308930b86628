"""The shipped calibration of :mod:`satcore.decision`: written by ``bench/decision_validity.py --fit``.

Fitted on every model set of the bench (``source`` says which); the bench scores the same
fitting procedure leave one model set out (docs/predictive-validity.md).  Regenerate with
``python bench/decision_validity.py --fit``.
"""

from .decision import Calibration

DEFAULT_CALIBRATION = Calibration(
    trend_weight=0.0,
    relative_scale=0.0,
    levels=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99),
    quantiles=(-59.46535, -44.607147, -40.130251, -28.609259, -15.297102, -4.998196, -2.448678, -1.765775, -1.426359, -1.274169, -0.865773, -0.584013, -0.036691, 0.319325, 0.652795, 0.939247, 1.360398, 1.76594, 2.540477, 4.54431, 11.171523, 14.174488, 30.34747),
    p_threshold=0.5,
    tolerance=0.0,
    source='bench/decision_validity.py, every model set (digits, fashion, llama-linux, llama-pydoc)',
    trend_scale=0.0,
    logit_intercept=-0.07683899380530451,
    logit_slope=0.8812883354473079,
)
