"""PyTorch adapter: probe residual networks, insert gradient-matched blocks.

::

    from satcore.adapters.torch import probe, sequence_loss, grow
    result = probe(model, loader, sequence_loss, split="heldout")
    print(result.report().to_dict())          # the core's DepthReport
    result.save("probe.npz")                  # satcore-dump/1
    grown = grow(model, result, result.report().argmax, rho=1e-3)

See :func:`probe` (statistics), :func:`find_candidates` (where),
:mod:`.families` (feature maps with the core's seeded weights), :func:`grow`
(Appendix H insertion), :func:`insert_block` (a zero-output block of the
model's own kind; ``family="native"`` probes its tangent space) and :mod:`.diagnostics` (stream norms, NAG).
"""

from .capture import StreamTaps
from .diagnostics import StreamDiagnostics
from .families import FeatureMap, ResidualBranch, build_feature_map, positions
from .grow import Grown, InsertedResidual, grow
from .locate import HEAD, Candidate, find_blocks, find_candidates, named_candidates
from .growth import GrowthResult, GrowthRound, grow_until_saturated
from .native import NativeFeatures, insert_block, native_feature_map
from .moments import batch_moments, position_index, subsample_positions
from .probe import per_sample_losses, probe, sequence_loss
from .result import ProbeResult

__all__ = [
    "HEAD",
    "Candidate",
    "FeatureMap",
    "Grown",
    "InsertedResidual",
    "NativeFeatures",
    "ProbeResult",
    "ResidualBranch",
    "StreamDiagnostics",
    "StreamTaps",
    "batch_moments",
    "build_feature_map",
    "find_blocks",
    "find_candidates",
    "grow",
    "insert_block",
    "GrowthResult",
    "GrowthRound",
    "grow_until_saturated",
    "named_candidates",
    "native_feature_map",
    "per_sample_losses",
    "position_index",
    "positions",
    "probe",
    "sequence_loss",
    "subsample_positions",
]
