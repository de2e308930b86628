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
    quantiles=(-52.667954, -43.984371, -39.12971, -26.898514, -15.461335, -5.338737, -2.454076, -1.77743, -1.438769, -1.289939, -0.93332, -0.615296, -0.323043, 0.220972, 0.602061, 0.873883, 1.186566, 1.713362, 2.237631, 4.267913, 9.574031, 13.635834, 28.752917),
    p_threshold=0.5,
    tolerance=0.0,
    source='bench/decision_validity.py, every model set (digits, fashion, llama-linux, llama-pydoc)',
    trend_scale=0.0,
    logit_intercept=-0.20916707288564196,
    logit_slope=0.9258220045305358,
)
