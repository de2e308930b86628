"""TensorFlow / Keras 3 adapter: ``probe`` a Keras model with ``tf.GradientTape``.

Import this module only when TensorFlow is wanted: ``import satcore`` never
imports it.  Candidates are found in functional models (residual ``Add``
layers) or named (a layer's input); features use the core's seeded families
(channels-last streams are laid out like the channels-first core); statistics
are summed across replicas with ``strategy.reduce(SUM)``.  ``grow`` inserts the
gradient-matched (or zero) block at a candidate of a functional model; ``decide``
verifies where to insert by short trials of a recipe, through the core's decision loop.
"""

from satcore.adapter_api import require

require("tensorflow", extra="tensorflow", by="satcore.adapters.tensorflow")

from .callbacks import KerasCallback
from .decide import decide
from .features import feature_map
from .grow import InsertedResidual, grow
from .growth import grow_until_saturated
from .locate import Candidate, named_candidates, residual_candidates
from .probe import Probe, ProbeConfig, probe, total_loss

__all__ = ["Candidate", "InsertedResidual", "KerasCallback", "decide", "Probe", "ProbeConfig", "feature_map", "grow", "grow_until_saturated",
           "named_candidates",
           "probe", "residual_candidates", "total_loss"]
