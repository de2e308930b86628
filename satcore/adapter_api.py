"""Everything the front-ends may import from the core beyond ``satcore``'s own namespace.

The framework adapters (``satcore.adapters.torch``, ``.tensorflow``, ``.onnx``) and the command line
(``satcore.cli``) import the core from two places only: the package namespace ``satcore`` (the names
users rely on) and this module (what a front-end needs besides: the probe contract it implements, the
trial decision's loop and the protocol its trials implement, the feature-family registry its builders join,
the safe file readers and writers, the table's cells, and the one-line checks every front-end shares).  The
layer folders behind it (``satcore._formulas``, ``_statistics``, ``_scores``, ``_decisions``, ``_growth``, ``_io``,
``_rendering``, ``_shared``) are private: their modules may move.  A test checks that no front-end
imports them directly.
"""

from ._decisions.calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION
from ._decisions.criteria import DEFAULT_ALPHA
from ._decisions.frontier import (
    CARRY_PER_DOUBLING,
    MIN_HELDOUT,
    RACE_MARGIN,
    FrontierChoice,
    Prediction,
    TrialPlan,
    affordable_heldout,
    block_counts,
    carry_error,
    choose_blocks,
    credible,
    new_positions,
    plan_trials,
    racing,
    still_credible,
    predict_change,
    step_flops,
    uniform_groups,
    uniform_places,
    with_carry,
)
from ._decisions.policy import DecisionPolicy
from ._decisions.predictors import check_paired
from ._decisions.trial_loop import (
    ScreenRow,
    Trial,
    TrialSettings,
    TrialSteps,
    check_unexpanded_losses,
    grouped_trials,
    screen,
    trial_decision,
)
from ._decisions.trials import (
    choose,
    halving_plan,
    paired_standard_error,
    trial_checkpoints,
    trial_plan,
    verified_candidate,
    NOT_VERIFIED,
)
from ._decisions.verdicts import fewest_batches_to_reject
from ._formulas.families import (
    FAMILY_REGISTRY,
    FamilyRegistry,
    FamilySpec,
    family_builder,
    family_spec,
    positions,
    rebuild_family,
    register_builder,
    register_family,
    registered_families,
)
from ._formulas.folds import DEFAULT_FOLDS
from ._growth.loop import AdapterSteps, round_summary
from ._io.atomic import (OutputError, atomic_write, check_folder_writable, check_target, command_inputs, directory,
                         file_kind, note_input, regular_file)
from ._io.dump import Dump, read_dump_meta
from ._io.probe_result import Probe
from ._io.yaml_text import yaml_quoted
from ._io.zipnpy import NpyHeader, NpzArchive, NpzError
from ._rendering.table import (SCREEN_READING, decision_interval_notes, heldout_samples_words, num, render_decision,
                               render_report, table)
from ._scores.scores import StreamDiagnostics
from ._shared.arrays import check_feature_count, check_memory, memory_budget, statistics_bytes
from ._shared.display import display_name
from ._shared.json_keys import DuplicateKeyError, loads_unique
from ._shared.errors import MissingDependencyError
from ._shared.moved_keywords import MOVED_KEYWORDS, moved_keywords
from ._shared.numbers import (MAX_COUNT, MAX_SEED, derived_seed, finite_real, parse_whole_number, positive_count,
                              shown_value, whole_number)
from ._shared.option_names import option_given, options_named_by
from ._shared.optional import require
from ._shared.splits import (MAX_DATA_BATCHES, TRAINING_SPLIT_WARNING, is_training_split, no_batches, read_batches,
                             split_words)
from ._statistics.moments import PackedGram, complete_lower, forms_sample_gradients

__all__ = [
    # the trial decision's arithmetic and its shipped calibrations
    "DEFAULT_CALIBRATION", "HALVING_CALIBRATION", "choose", "halving_plan", "paired_standard_error",
    "trial_checkpoints", "trial_plan", "verified_candidate", "NOT_VERIFIED", "check_paired", "DEFAULT_ALPHA", "fewest_batches_to_reject",
    # the trial decision's loop: the protocol a framework implements, the screen, the schedules
    "DecisionPolicy", "ScreenRow", "Trial", "TrialSettings", "TrialSteps", "check_unexpanded_losses", "grouped_trials", "screen",
    "trial_decision",
    # the budgeted expansion decisions' arithmetic (the frontier over K, the placement check)
    "CARRY_PER_DOUBLING", "MIN_HELDOUT", "RACE_MARGIN", "FrontierChoice", "Prediction", "TrialPlan", "affordable_heldout",
    "block_counts", "carry_error", "choose_blocks", "credible", "new_positions", "plan_trials", "predict_change", "racing",
    "step_flops", "still_credible", "uniform_groups", "uniform_places", "with_carry",
    # the feature-family registry
    "FAMILY_REGISTRY", "FamilyRegistry", "FamilySpec", "family_builder", "family_spec", "positions",
    "rebuild_family", "register_builder", "register_family", "registered_families", "DEFAULT_FOLDS",
    "forms_sample_gradients",
    # the statistics' compact Gram (adopted packed, made whole when first read)
    "PackedGram", "complete_lower",
    # the contracts every adapter implements: its incremental probe, its side of a growth round
    "Probe", "AdapterSteps", "round_summary",
    # files: atomic writes, dumps, the safe .npz reader
    "OutputError", "atomic_write", "check_folder_writable", "check_target", "command_inputs", "directory", "file_kind", "note_input", "regular_file", "Dump", "read_dump_meta",
    "NpyHeader", "NpzArchive", "NpzError", "yaml_quoted", "DuplicateKeyError", "loads_unique",
    # rendering
    "SCREEN_READING", "decision_interval_notes", "heldout_samples_words", "num", "render_decision", "render_report", "table", "display_name", "StreamDiagnostics",
    # shared checks
    "check_feature_count", "check_memory", "memory_budget", "statistics_bytes", "MissingDependencyError", "require",
    "TRAINING_SPLIT_WARNING", "is_training_split", "split_words", "MAX_DATA_BATCHES", "no_batches", "read_batches",
    # an option named in a refusal as the user gave it: the Python keyword, or the running command's flag
    "option_given", "options_named_by",
    # the keywords the options objects replaced: a call passing one is told where it went
    "MOVED_KEYWORDS", "moved_keywords",
    # numbers from users: counts, seeds, reals (one reader for options, files and arguments)
    "MAX_COUNT", "MAX_SEED", "derived_seed", "finite_real", "parse_whole_number", "positive_count", "shown_value",
    "whole_number",
]
