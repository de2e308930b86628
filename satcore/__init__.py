"""satcore: first-order residual depth saturation, from arrays to verdicts.

Implements the criterion of "first-order residual depth saturation" (paper:
Theorems 1-2, Lemma 4, Proposition 1, Appendices C-H): for each insertion
candidate, the growth value ``V_S = ||Pi_S q_S||_S`` tells whether inserting a
zero-output residual block there can decrease the loss to first order.

Only NumPy and SciPy are imported here; framework adapters live in
``satcore.adapters.<framework>`` and are imported on demand.
"""

import os as _os

# The design card keeps the framework front-ends in top-level ``adapters/`` and ``cli/``
# folders that install as ``satcore.adapters`` and ``satcore.cli``.  When Python imports
# ``satcore`` from a source checkout instead (a script or ``python -c`` run in the repo
# root), look for those subpackages beside this folder, so the checkout behaves like the
# installed package.  Installed, ``satcore/adapters`` exists and is found first.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "adapters", "__init__.py")) and _os.path.isfile(
    _os.path.join(_checkout, "cli", "__init__.py")
):
    __path__.append(_checkout)

from ._psd import DEFAULT_RTOL
from .alignment import (
    AlignmentEstimate,
    alignment_moments,
    estimate_alignment,
    misalignment_bound,
    split_inner_product,
    xi_kernel,
)
from .certification import (
    SaturationTest,
    debiased_energy,
    detection_threshold,
    interval_half_width,
    noise_floor,
    prop1_bound,
    required_probe_size,
    saturation_test,
    variance_estimate,
)
from .depth import DepthStatistics, depth_report, score
from .dump import DumpError, read_dump, write_dump
from .families import FAMILIES, Family, make_family
from .insertion import (
    InsertionPlan,
    alpha_for_relative_update,
    matched_projection,
    plan_insertion,
    predicted_loss_change,
)
from .optim import (
    adam_zero_state,
    descent_bound,
    gradient_descent,
    is_descent_compatible,
    joint_descent_exists,
    joint_gradient,
    preconditioned,
)
from .predictors import (
    CandidateGain,
    HeldoutGain,
    PredictedGains,
    adam_step_gain,
    heldout_gain,
    kronecker_adam_gain,
    kronecker_sgd_gain,
    predict_gains,
    sgd_step_gain,
)
from .probe_result import ProbeResult
from .quantities import (
    ag,
    ag_batch,
    ag_normalized,
    cross_gradient,
    depth_max,
    feature_gram,
    feature_rank,
    growth_value,
    growth_value_from_moments,
    growth_value_jacobian,
    projected_growth_value,
    projector,
    realizability,
    tangent_complete,
)
from .results import REPORT_SCHEMA, CandidateScore, DepthReport
from .statistics import CandidateStatistics, batch_moments

__version__ = "0.1.0"

__all__ = [name for name in dir() if not name.startswith("_")]
