"""PyTorch adapter: probe residual networks, insert gradient-matched blocks.

::

    from satcore.adapters.torch import Probe, probe, sequence_loss, grow
    result = probe(model, loader, sequence_loss, split="heldout")
    # or batch by batch, e.g. inside a training loop (DataCollator batches need no loss_fn):
    running = Probe(model, split="heldout")
    for batch in collated_batches:
        running.update(batch)
    result = running.result()
    print(result.report().to_dict())          # the core's DepthReport
    result.save("probe.npz")                  # satcore-dump/1
    grown = grow(model, result, result.report().best_candidate, rho=1e-3)

See :func:`probe` (statistics), :func:`find_candidates` (where),
:mod:`.features` (feature maps with the core's seeded weights), :func:`grow`
(Appendix H insertion), :func:`insert_block` (a zero-output block of the
model's own kind; ``family="native"`` probes its tangent space), :func:`expand` (grow a pretrained
decoder by identity blocks where one decision on the user's data says; LLaMA-Pro copies, mergekit and
trainer exports); the stream norms (NAG) are the result's ``diagnostics``, from the statistics' stream sums.
"""

from satcore.adapter_api import require

require("torch", extra="torch", by="satcore.adapters.torch")

from satcore.adapter_api import StreamDiagnostics

from .capture import StreamTaps
from .decide import decide
from .features import FeatureMap, ResidualBranch, build_feature_map, positions
from .grow import Grown, InsertedResidual, grow
from .locate import HEAD, Candidate, find_blocks, find_candidates, named_candidates
from .growth import GrowthResult, GrowthRound, grow_until_saturated
from .native import NativeFeatures, insert_block, native_feature_map
from .expansion import Expansion, ExpansionOptions, expand, first_order_decision, insert_blocks
from .expansion_frontier import DecisionBudget, frontier_windows
from .moments import batch_moments, position_index, subsample_positions
from .hf import model_loss, per_sample_loss, sequence_loss
from .probe import MemoryPlan, Probe, ProbeConfig, per_sample_losses, plan, probe, probe_in_groups
from .result import ProbeResult
from .splits import SplitResults, probe_splits

# The callbacks subclass their framework's base class: imported on first use, so that the
# adapter needs neither transformers nor lightning.
_CALLBACKS = {"HFCallback": ".trainer_callback", "LightningCallback": ".lightning_callback"}


def __getattr__(name):
    if name in _CALLBACKS:
        import importlib

        return getattr(importlib.import_module(_CALLBACKS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HEAD",
    "HFCallback",
    "LightningCallback",
    "Candidate",
    "DecisionBudget",
    "Expansion",
    "ExpansionOptions",
    "FeatureMap",
    "frontier_windows",
    "Grown",
    "InsertedResidual",
    "NativeFeatures",
    "MemoryPlan",
    "Probe",
    "ProbeConfig",
    "ProbeResult",
    "ResidualBranch",
    "StreamDiagnostics",
    "StreamTaps",
    "batch_moments",
    "build_feature_map",
    "expand",
    "decide",
    "find_blocks",
    "first_order_decision",
    "find_candidates",
    "grow",
    "insert_block",
    "insert_blocks",
    "GrowthResult",
    "GrowthRound",
    "grow_until_saturated",
    "model_loss",
    "named_candidates",
    "native_feature_map",
    "per_sample_loss",
    "plan",
    "probe_splits",
    "SplitResults",
    "per_sample_losses",
    "position_index",
    "positions",
    "probe",
    "probe_in_groups",
    "sequence_loss",
    "subsample_positions",
]
