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
    quantiles=(-51.976762, -42.172837, -39.067076, -26.349906, -15.096582, -5.218769, -2.56569, -1.874093, -1.541944, -1.348892, -0.942515, -0.622407, -0.230301, 0.224495, 0.570873, 0.867067, 1.160785, 1.605527, 2.174907, 3.879639, 9.503277, 15.46858, 26.365126),
    p_threshold=0.5,
    tolerance=0.0,
    source='bench/decision_validity.py, every model set (digits, fashion, llama-linux, llama-pydoc)',
    trend_scale=0.0,
    logit_intercept=-0.09187578612857981,
    logit_slope=0.9017038469480244,
)
