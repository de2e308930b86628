"""satcore: first-order residual depth saturation, from arrays to verdicts.

Implements the criterion of "Quantifying Depth Sufficiency in Residual Neural
Networks: A First-Order Criterion" (Liu, Zhang, Zhang, Tan, Gao, Liu and Cheng;
Theorems 1-3, Lemma 4, Proposition 1, Appendices C-H; docs/references.md): for each insertion
candidate, the growth value ``V_S = ||Pi_S q_S||_S`` tells whether inserting a
zero-output residual block there can decrease the loss to first order.

Only NumPy and SciPy are imported here; framework adapters live in
``satcore.adapters.<framework>`` and are imported on demand.  docs/api.md lists
every name below with its formula (docs/core.md) and the file implementing it.

The design card keeps the front-ends in the top-level ``adapters/`` and ``cli/``
folders.  They install as ``satcore.adapters`` and ``satcore.cli`` (pyproject's
package-dir), and in a checkout the symlinks ``satcore/adapters -> ../adapters``
and ``satcore/cli -> ../cli`` make them the same subpackages without installing.
"""

from ._formulas.psd import DEFAULT_RTOL, PsdSpectrum, psd_spectrum
from ._formulas.alignment import (
    AlignmentEstimate,
    alignment_moments,
    estimate_alignment,
    misalignment_bound,
    split_inner_product,
    xi_kernel,
)
from ._formulas.certification import (
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
from ._decisions.criteria import Criteria, Prop1Options, Verdict
from ._statistics.depth import DepthStatistics, score
from ._io.dump import DumpError, read_dump, write_dump
from ._formulas.families import FAMILIES, Family, FamilySettings, make_family
from ._formulas.insertion import (
    InsertionPlan,
    alpha_for_relative_update,
    matched_projection,
    plan_insertion,
    predicted_loss_change,
)
from ._formulas.optim import (
    adam_zero_state,
    descent_bound,
    gradient_descent,
    is_descent_compatible,
    joint_descent_exists,
    joint_gradient,
    preconditioned,
)
from ._decisions.predictors import (
    CandidateGain,
    HeldoutGain,
    PredictedGains,
    adam_step_gain,
    heldout_gain,
    kronecker_adam_gain,
    kronecker_sgd_gain,
    predict_gains,
    sgd_step_gain,
    virtual_layer_sensitivity,
)
from ._io.probe_result import ProbeResult
from ._formulas.quantities import (
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
from ._shared.errors import GrowthLogError, InputError, ModelOnDataError, ProbeError, SatcoreError
from ._growth.loop import (
    FirstOrderDecide,
    GrowthBudget,
    GrowthCriteria,
    GrowthOptions,
    GrowthResult,
    GrowthRound,
    HeldoutGuard,
    RoundDecision,
    StopReason,
    run_growth,
)
from ._growth.log import GrowthLogContents, read_growth_log
from ._decisions.recipe import Recipe
from ._decisions.trials import CandidateDecision, InsertionDecision, TrialCurve
from ._decisions.resolution import HeldoutResolution, heldout_resolution
from ._decisions.trial_loop import TrialSettings
from ._decisions.policy import DecisionPolicy
from ._decisions.reporting import depth_report
from ._decisions.report import REPORT_SCHEMA, DepthReport
from ._scores.scores import CandidateScore, DepthScores, growth_noise_floor
from ._statistics.moments import BatchMoments, batch_moments
from ._statistics.candidate import CandidateStatistics
from ._decisions.sweep import (
    SWEEP_SCHEMA,
    Plateau,
    Sweep,
    SweepPoint,
    depth_sweep,
    find_plateau,
    sweep_point,
)

from ._moved import install as _install_moved_modules

_install_moved_modules()

__version__ = "0.1.0"


__all__ = [
    # quantities (docs/core.md, Quantities)
    "ag",
    "ag_batch",
    "ag_normalized",
    "cross_gradient",
    "depth_max",
    "feature_gram",
    "feature_rank",
    "growth_value",
    "growth_value_from_moments",
    "growth_value_jacobian",
    "projected_growth_value",
    "projector",
    "realizability",
    "tangent_complete",
    "DEFAULT_RTOL",
    "PsdSpectrum",
    "psd_spectrum",
    # streaming statistics and reports (docs/core.md, Streaming statistics)
    "CandidateStatistics",
    "BatchMoments",
    "batch_moments",
    "DepthStatistics",
    "depth_report",
    "score",
    "DepthScores",
    "CandidateScore",
    "DepthReport",
    "REPORT_SCHEMA",
    "ProbeResult",
    # what turns scores into a report (satcore._decisions.criteria)
    "Criteria",
    "Prop1Options",
    "Verdict",
    # certification (docs/core.md, Certification)
    "SaturationTest",
    "debiased_energy",
    "detection_threshold",
    "interval_half_width",
    "noise_floor",
    "prop1_bound",
    "required_probe_size",
    "saturation_test",
    "variance_estimate",
    # depth sweeps (docs/dump-format.md, Depth sweeps)
    "SWEEP_SCHEMA",
    "Plateau",
    "Sweep",
    "SweepPoint",
    "depth_sweep",
    "find_plateau",
    "growth_noise_floor",
    "sweep_point",
    # gradient-matched insertion (docs/core.md, Gradient-matched insertion)
    "InsertionPlan",
    "alpha_for_relative_update",
    "matched_projection",
    "plan_insertion",
    "predicted_loss_change",
    # train/held-out alignment (docs/core.md, Train/held-out alignment)
    "AlignmentEstimate",
    "alignment_moments",
    "estimate_alignment",
    "misalignment_bound",
    "split_inner_product",
    "xi_kernel",
    # optimizer direction maps and joint insertion (docs/core.md, Optimizers and joint insertion)
    "adam_zero_state",
    "descent_bound",
    "gradient_descent",
    "is_descent_compatible",
    "joint_descent_exists",
    "joint_gradient",
    "preconditioned",
    # predictors of what a trained inserted block does (docs/predictive-validity.md)
    "CandidateGain",
    "HeldoutGain",
    "PredictedGains",
    "adam_step_gain",
    "heldout_gain",
    "kronecker_adam_gain",
    "kronecker_sgd_gain",
    "predict_gains",
    "sgd_step_gain",
    "virtual_layer_sensitivity",
    # feature families (docs/core.md, Feature families)
    "FAMILIES",
    "Family",
    "FamilySettings",
    "make_family",
    # errors: one root (satcore._shared.errors)
    "SatcoreError",
    "InputError",
    "ProbeError",
    "ModelOnDataError",
    "GrowthLogError",
    # how an inserted block is trained (satcore._decisions.recipe)
    "Recipe",
    # the growth loop and its log (satcore._growth.loop, satcore._growth.log; docs/growth.md)
    "run_growth",
    "FirstOrderDecide",
    "RoundDecision",
    "StopReason",
    "GrowthCriteria",
    "GrowthBudget",
    "HeldoutGuard",
    "GrowthOptions",
    "GrowthResult",
    "GrowthRound",
    "GrowthLogContents",
    "read_growth_log",
    # the decision a user acts on (satcore._decisions.trials)
    "InsertionDecision",
    "CandidateDecision",
    "TrialCurve",
    "TrialSettings",
    "DecisionPolicy",
    # whether a stop's held-out data resolves it (satcore._decisions.resolution)
    "HeldoutResolution",
    "heldout_resolution",
    # dumps (docs/dump-format.md)
    "DumpError",
    "read_dump",
    "write_dump",
]
