"""The shipped calibrations of :mod:`satcore.decision`: written by ``bench/decision_validity.py --fit``.

Fitted on the long recipes (300 steps) of every model set of the bench (``source`` says which), one per
trial schedule of ``decide``: ``DEFAULT_CALIBRATION`` on the even plan's trials, ``HALVING_CALIBRATION`` on
successive halving's; the bench scores the same fitting procedure leave one model set out
(docs/predictive-validity.md).  Regenerate with ``python bench/decision_validity.py --fit``.
"""

from .decision import Calibration

DEFAULT_CALIBRATION = Calibration(
    trend_weight=0.0,
    relative_scale=0.0,
    levels=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99),
    quantiles=(-20.849533, -16.711129, -13.032542, -8.716034, -6.942652, -3.199654, -1.669169, -1.250059, -0.982215, -0.653792, -0.365422, -0.062672, 0.148207, 0.326252, 0.508418, 0.715296, 1.013727, 1.453786, 2.194133, 4.202752, 6.277011, 8.81984, 11.098391),
    p_threshold=0.7,
    tolerance=0.003,
    source='bench/decision_validity.py, the long recipes of every model set (digits, fashion, llama-linux, llama-pydoc), even trials',
    trend_scale=0.1,
    logit_intercept=-0.177347195252803,
    logit_slope=1.5190731560668909,
)


HALVING_CALIBRATION = Calibration(
    trend_weight=0.0,
    relative_scale=0.0,
    levels=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99),
    quantiles=(-22.53546, -21.364302, -8.01457, -5.503235, -3.363231, -2.3101, -1.641511, -1.044432, -0.8278, -0.641736, -0.42373, -0.218158, 0.002187, 0.222015, 0.395752, 0.632718, 1.052119, 1.37101, 1.735061, 2.968063, 5.779617, 12.983159, 19.291195),
    p_threshold=0.7,
    tolerance=0.0,
    source='bench/decision_validity.py, the long recipes of every model set (digits, fashion, llama-linux, llama-pydoc), halving trials',
    trend_scale=0.25,
    logit_intercept=-0.3753029329888848,
    logit_slope=2.278285253716912,
)
