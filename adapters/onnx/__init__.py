"""ONNX adapter: ``probe`` an ``.onnx`` model with gradients from our own backward graph on ONNX Runtime.

Gradients ``q_i`` at candidate tensors come from a backward graph of standard
ONNX ops built by :mod:`.autodiff` and run by plain ``onnxruntime`` (imported
lazily); features from the captured activations with
:mod:`satcore._formulas.families` in NumPy.  Untrusted files are loaded with their
external data confined to the model's folder (:mod:`.loading`); the probe graph and its gradient session are :mod:`.capture`, candidates :mod:`.locate`.
"""

from satcore.adapter_api import require

require("onnx", "onnxruntime", extra="onnx", by="satcore.adapters.onnx")

from satcore import ProbeResult

from .autodiff import supported_ops
from .errors import OnnxProbeError
from .locate import residual_candidates
from .loading import load_model
from .probe import GradientSession, Probe, ProbeConfig, per_sample_gradients, probe

__all__ = [
    "GradientSession",
    "OnnxProbeError",
    "Probe",
    "ProbeConfig",
    "ProbeResult",
    "load_model",
    "per_sample_gradients",
    "probe",
    "residual_candidates",
    "supported_ops",
]
