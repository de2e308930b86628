"""Per-sample activation gradients on plain ONNX Runtime, from our own backward graph.

:func:`~.autodiff.gradient_model` turns the probe graph (the model, its summed
loss ``sum_i loss_i`` and the candidates as outputs) into one inference model
that also outputs ``d (sum_i loss_i) / d z`` at each candidate ``z``; that is
``q_i`` for every sample at once because an inference graph does not mix
samples.  Any current ``onnxruntime`` runs it, at any batch size, on the
execution providers given (CPU by default).

``onnxruntime`` is imported inside functions so that ``import satcore`` stays light.
"""

from __future__ import annotations

from .autodiff import GRAD_SUFFIX, gradient_model
from .errors import OnnxProbeError
from .graph import LOSS, tensor_infos

ROUTE = "backward-graph"


def one_line(exc: BaseException) -> str:
    """ORT's message without the C++ location and signature that precede it, on one line."""
    text = " ".join(str(exc).split())
    for marker in ("was false. ", "FAIL : "):
        if marker in text and text.rpartition(marker)[2].strip():
            text = text.rpartition(marker)[2]
    return text[-300:]


class GradientRunner:
    """One ONNX Runtime session over the probe graph plus its backward graph.

    ``runner(feeds)`` is ``(activations, gradients)``, each ``{candidate: array}``.
    """

    name = ROUTE

    def __init__(self, probe, candidates, graph_inputs, providers=None):
        import onnxruntime as ort

        self.candidates = list(candidates)
        self.graph_inputs = set(graph_inputs)
        model = gradient_model(probe, LOSS, self.candidates, tensor_infos(probe))
        options = ort.SessionOptions()
        options.log_severity_level = 4  # a refused batch raises one line here; ORT's own log would add another
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), options,
                                                providers=list(providers or ["CPUExecutionProvider"]))
        except Exception as exc:  # ORT's pybind errors (Fail, InvalidGraph, NotImplemented, ...)
            raise OnnxProbeError(f"ONNX Runtime refused the gradient graph: {one_line(exc)}") from None
        self.fetch = [LOSS]
        self.fetch += [n for n in self.candidates if n not in self.graph_inputs]
        self.fetch += [n + GRAD_SUFFIX for n in self.candidates]

    def __call__(self, feeds: dict) -> tuple[dict, dict]:
        try:
            values = dict(zip(self.fetch, self.session.run(self.fetch, feeds)))
        except Exception as exc:  # ORT raises its own exception types
            raise OnnxProbeError(f"ONNX Runtime failed on a batch: {one_line(exc)}") from None
        acts = {n: (feeds[n] if n in self.graph_inputs else values[n]) for n in self.candidates}
        return acts, {n: values[n + GRAD_SUFFIX] for n in self.candidates}
