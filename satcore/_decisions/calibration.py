"""The shipped calibrations of :mod:`satcore._decisions.trials`: written by ``bench/decision_validity.py --fit``.

Fitted on the long recipes (300 steps) of every model set of the bench (``source`` says which), one per
trial schedule of ``decide``: ``DEFAULT_CALIBRATION`` on the even plan's trials, ``HALVING_CALIBRATION`` on
successive halving's; the error model (scale, residual quantiles, logistic) on the same trials read at two
held-out sizes, the bench's and 4 times it, so that it holds where a user's held-out split is larger than the
bench's; the bench scores the same fitting procedure leave one model set out
(docs/predictive-validity.md).  Regenerate with ``python bench/decision_validity.py --fit``.
"""

from .trials import Calibration

DEFAULT_CALIBRATION = Calibration(
    trend_weight=0.0,
    relative_scale=0.0,
    levels=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99),
    quantiles=(-23.048685, -17.862226, -14.510797, -10.064111, -7.446872, -4.569718, -2.244803, -1.416517, -1.020708, -0.634462, -0.305075, 0.099985, 0.351276, 0.560015, 0.912217, 1.413615, 1.837994, 2.229083, 3.100287, 5.355165, 8.097688, 11.093563, 14.929666),
    p_threshold=0.6,
    tolerance=0.003,
    source="bench/decision_validity.py, the long recipes of every model set (digits, fashion, llama-linux, llama-pydoc), even trials; the error model also on their trials read on a held-out split 4 times the bench's",
    trend_scale=0.1,
    logit_intercept=0.10143422292566247,
    logit_slope=1.2058409633126113,
)


HALVING_CALIBRATION = Calibration(
    trend_weight=0.0,
    relative_scale=0.0,
    levels=(0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.975, 0.99),
    quantiles=(-51.645627, -40.610339, -15.819548, -9.399828, -7.129133, -4.424737, -2.366246, -1.6102, -1.075572, -0.776066, -0.406048, -0.017006, 0.321708, 0.55966, 1.039183, 1.509573, 1.902486, 2.323365, 3.594802, 6.085891, 12.944788, 22.799052, 43.36763),
    p_threshold=0.6,
    tolerance=0.0,
    source="bench/decision_validity.py, the long recipes of every model set (digits, fashion, llama-linux, llama-pydoc), halving trials; the error model also on their trials read on a held-out split 4 times the bench's",
    trend_scale=0.1,
    logit_intercept=-0.08286469336789068,
    logit_slope=1.2905647574065806,
)

# the fewest and most held-out samples a fitted trial was read on: beyond the most, the error model is
# over-confident on the bench (docs/predictive-validity.md)
CALIBRATED_HELDOUT_SAMPLES = (96, 640)
