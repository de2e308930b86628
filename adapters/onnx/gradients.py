"""Per-sample activation gradients with ONNX Runtime training.

Two routes give ``d (sum_i loss_i) / d z`` at candidate tensors ``z``, which is
``q_i`` for every sample because an inference graph does not mix samples:

* ``builder``: ORT's gradient graph builder (a private binding,
  ``onnxruntime.capi._pybind_state.GradientGraphBuilder``) differentiates the
  probe graph's loss with respect to the intermediate tensors themselves; the
  result is an ordinary inference model, so any batch size runs.  The private
  API is touched in :func:`_builder_gradient_model` only.
* ``artifacts``: the public ``onnxruntime.training.artifacts`` route.  A
  trainable zero ``delta`` of the batch's shape is added at each candidate
  (``z + delta`` feeds every consumer of ``z``), and its gradient after one
  training step is ``q``.  Batch sizes are fixed per artifact set, so one set
  is generated per distinct activation shape.

``onnxruntime`` is imported inside functions: it imports torch.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from .errors import OnnxProbeError
from .graph import LOSS

ROUTES = ("auto", "builder", "artifacts")


def one_line(exc: BaseException) -> str:
    """ORT's message without the C++ location and signature that precede it, on one line."""
    text = " ".join(str(exc).split())
    for marker in ("was false. ", "FAIL : "):
        if marker in text and text.rpartition(marker)[2].strip():
            text = text.rpartition(marker)[2]
    return text[-300:]


def _quiet_ort() -> None:
    import onnxruntime as ort

    # gradient builders log every graph transformer at INFO, and a refused batch would add ORT's own
    # error line to the one-line error satcore raises for it: fatal only
    ort.set_default_logger_severity(4)


def _builder_gradient_model(probe_bytes: bytes, wrt: list[str]) -> bytes:
    """The probe model with ``<name>_grad`` outputs (private ORT API, wrapped here only)."""
    from onnxruntime.capi._pybind_state import GradientGraphBuilder

    _quiet_ort()
    builder = GradientGraphBuilder(probe_bytes, {LOSS}, set(wrt), LOSS, _options())
    builder.build()
    return builder.get_model()


def _options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    return options


def _session(model_bytes: bytes):
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, _options(), providers=["CPUExecutionProvider"])


class BuilderRoute:
    """Gradients from one inference session over the builder's gradient model."""

    name = "builder"

    def __init__(self, probe, candidates, graph_inputs):
        self.candidates = list(candidates)
        self.graph_inputs = set(graph_inputs)
        try:
            grad_bytes = _builder_gradient_model(probe.SerializeToString(), self.candidates)
            self.session = _session(grad_bytes)
        except ImportError:
            raise  # no private builder in this build: gradient_route falls back
        except Exception as exc:  # ORT's pybind errors (Fail, InvalidGraph, ...)
            raise OnnxProbeError(f"no gradient graph from the candidates to the loss: {one_line(exc)}") from None
        self.fetch = [LOSS]
        self.fetch += [n for n in self.candidates if n not in self.graph_inputs]
        self.fetch += [f"{n}_grad" for n in self.candidates]

    def __call__(self, feeds: dict) -> tuple[dict, dict]:
        """``(activations, gradients)`` per candidate for one batch."""
        try:
            values = dict(zip(self.fetch, self.session.run(self.fetch, feeds)))
        except Exception as exc:  # ORT raises its own exception types
            raise OnnxProbeError(f"ONNX Runtime failed on a batch: {one_line(exc)}") from None
        acts = {n: (feeds[n] if n in self.graph_inputs else values[n]) for n in self.candidates}
        return acts, {n: values[f"{n}_grad"] for n in self.candidates}


class ArtifactsRoute:
    """Gradients of a zero trainable ``delta`` at each candidate (public ORT training API)."""

    name = "artifacts"

    def __init__(self, probe, candidates, graph_inputs):
        self.probe = probe
        self.candidates = list(candidates)
        self.graph_inputs = set(graph_inputs)
        self.forward = _session(probe.SerializeToString())
        self.forward_fetch = [n for n in self.candidates if n not in self.graph_inputs]
        self.modules: dict[tuple, tuple] = {}
        self.workdir = tempfile.TemporaryDirectory(prefix="satcore-ort-")

    def _delta_model(self, like: dict):
        """The probe graph with ``z + delta`` feeding every consumer of each candidate ``z``.

        ``like`` maps candidates and graph inputs to this batch's arrays: the
        training API wants every graph input and output fully shaped.
        """
        import onnx
        from onnx import helper, numpy_helper

        model = onnx.ModelProto()
        model.CopyFrom(self.probe)
        graph = model.graph
        for value in list(graph.input) + list(graph.output):
            if value.name in like and not value.type.tensor_type.HasField("shape"):
                shape = helper.make_tensor_type_proto(value.type.tensor_type.elem_type, like[value.name].shape)
                value.type.CopyFrom(shape)
        shifted = {n: f"satcore_shifted/{n}" for n in self.candidates}
        for node in graph.node:
            for k, name in enumerate(node.input):
                if name in shifted:
                    node.input[k] = shifted[name]
        adds, deltas = [], []
        for n in self.candidates:
            delta = f"satcore_delta/{n}"
            graph.initializer.append(numpy_helper.from_array(np.zeros_like(like[n]), delta))
            adds.append(helper.make_node("Add", [n, delta], [shifted[n]]))
            deltas.append(delta)
        # consumers must follow their producer: put each Add right after the node making z
        order = list(graph.node)
        for add in adds:
            z = add.input[0]
            pos = next((k + 1 for k, node in enumerate(order) if z in node.output), 0)
            order.insert(pos, add)
        del graph.node[:]
        graph.node.extend(order)
        return model, deltas

    def _module(self, acts: dict):
        key = tuple((k, v.shape, v.dtype.str) for k, v in sorted(acts.items()))
        if key not in self.modules:
            from onnxruntime.training import artifacts
            from onnxruntime.training.api import CheckpointState, Module

            _quiet_ort()
            model, deltas = self._delta_model(acts)
            folder = Path(self.workdir.name) / f"set{len(self.modules)}"
            folder.mkdir(parents=True)
            frozen = [i.name for i in model.graph.initializer if i.name not in deltas]
            extra = [n for n in self.candidates if n not in self.graph_inputs]
            try:
                artifacts.generate_artifacts(
                    model,
                    requires_grad=deltas,
                    frozen_params=frozen,
                    loss=None,
                    artifact_directory=folder,
                    additional_output_names=extra or None,
                    loss_input_names=[LOSS],
                )
                state = CheckpointState.load_checkpoint(str(folder / "checkpoint"))
                module = Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
            except Exception as exc:  # ORT's pybind errors (Fail, InvalidGraph, ...)
                raise OnnxProbeError(f"no gradient graph from the candidates to the loss: {one_line(exc)}") from None
            self.modules[key] = (module, state, deltas)
        return self.modules[key]

    def __call__(self, feeds: dict) -> tuple[dict, dict]:
        try:
            fwd = dict(zip(self.forward_fetch, self.forward.run(self.forward_fetch, feeds)))
            acts = {n: (feeds[n] if n in self.graph_inputs else fwd[n]) for n in self.candidates}
            module, state, deltas = self._module({**feeds, **acts})
            module.train()
            module.lazy_reset_grad()
            module(*[feeds[name] for name in module.input_names()])
            grads = {n: np.array(state.parameters[d].grad) for n, d in zip(self.candidates, deltas)}
        except OnnxProbeError:
            raise
        except Exception as exc:
            raise OnnxProbeError(f"ONNX Runtime training failed on a batch: {one_line(exc)}") from None
        return acts, grads


def gradient_route(probe, candidates, graph_inputs, route: str = "auto"):
    """The callable ``feeds -> (activations, gradients)``; ``auto`` tries the builder first."""
    if route not in ROUTES:
        raise OnnxProbeError(f"unknown gradient route {route!r}; choose one of {ROUTES}")
    if route in ("auto", "builder"):
        try:
            return BuilderRoute(probe, candidates, graph_inputs)
        except ImportError:
            if route == "builder":
                raise OnnxProbeError("this onnxruntime build has no GradientGraphBuilder") from None
    return ArtifactsRoute(probe, candidates, graph_inputs)
