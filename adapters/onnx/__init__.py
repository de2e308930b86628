"""ONNX adapter: ``probe`` an ``.onnx`` model with ONNX Runtime training gradients.

Gradients ``q_i`` at candidate tensors come from ONNX Runtime (imported
lazily, it imports torch); features from the captured activations with
:mod:`satcore.families` in NumPy.  Untrusted files are loaded with their
external data confined to the model's folder (:mod:`.loading`).
"""

from satcore.probe_result import ProbeResult

from .errors import OnnxProbeError
from .graph import residual_candidates
from .loading import load_model
from .probe import GradientSession, per_sample_gradients, probe

__all__ = [
    "GradientSession",
    "OnnxProbeError",
    "ProbeResult",
    "load_model",
    "per_sample_gradients",
    "probe",
    "residual_candidates",
]
