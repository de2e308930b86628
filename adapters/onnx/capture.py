"""Capture: the probe graph and per-sample activation gradients on plain ONNX Runtime.

The probe graph (:func:`probe_graph`) is the model plus (a) a per-sample loss
summed over the batch, ``sum_i loss_i`` (for sequences ``loss_i`` is the mean
over the counted tokens), so that its gradient at a candidate tensor ``z`` is
``q_i = d loss_i / d z_i`` for every sample at once (samples do not interact in
an inference graph), and (b) every candidate tensor as an extra graph output,
so the features can be computed from the captured activations.

:class:`GradientRunner` runs it with :func:`~.autodiff.gradient_model`'s backward
graph appended: one inference model that also outputs ``d (sum_i loss_i) / d z`` at each candidate ``z``; that is
``q_i`` for every sample at once because an inference graph does not mix
samples.  Any current ``onnxruntime`` runs it, at any batch size, on the
execution providers given (CPU by default).

``onnxruntime`` is imported inside functions so that ``import satcore`` stays light.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from .autodiff import GRAD_SUFFIX, gradient_model
from .errors import OnnxProbeError
from .loading import prune_to_outputs
from .locate import check_candidates, tensor_infos

ROUTE = "backward-graph"
LOSSES = ("cross_entropy", "mse")
TARGETS = "satcore_targets"
# weights turning the loss terms into ``sum_i loss_i``: a scalar 1 / (elements per sample) for
# mse and loss outputs, one weight per target for cross_entropy (see ``probe._cross_entropy_feeds``)
LOSS_SCALE = "satcore_loss_scale"
IGNORE_INDEX = -100  # PyTorch's and Hugging Face's label for a token left out of the loss
LOSS = "satcore_loss"
RESERVED_PREFIX = "satcore_"  # the probe's own tensors: its loss's, its inputs', its backward graph's
# where in ORT's sources a message was raised: "/onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(...) "
CPP_LOCATION = re.compile(r"/[^\s:]+\.(?:cc|cpp|h|hpp):\d+ (?:[^ (]+ )*[^ (]+\([^)]*\)(?: const)? ")
MAX_ORT_CHARS = 300


def one_line(exc: BaseException) -> str:
    """ORT's message without the C++ locations and signatures in it, on one line: at most its last
    :data:`MAX_ORT_CHARS` characters (the specific part), cut at a word."""
    text = " ".join(CPP_LOCATION.sub(" ", str(exc)).split())
    for marker in ("was false. ", "FAIL : "):
        if marker in text and text.rpartition(marker)[2].strip():
            text = text.rpartition(marker)[2]
    return text if len(text) <= MAX_ORT_CHARS else "... " + text[-MAX_ORT_CHARS:].partition(" ")[2]


def _own_inputs_named(text: str) -> str:
    """ORT's message ``text`` with the probe's own inputs said what they are: a model with a fixed batch size (a
    legacy torch export's ``input.1``) can be refused first on ``satcore_targets``, a name that is nowhere in the
    user's model or data."""
    for name, what in ((TARGETS, "DATA's targets, as the probe feeds them to its loss"),
                       (LOSS_SCALE, "the weights the probe gives its loss terms")):
        text = text.replace(f"input: {name} ", f"input: {name} ({what}) ")
    return text


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
            raise OnnxProbeError(f"ONNX Runtime failed on a batch: {_own_inputs_named(one_line(exc))}") from None
        acts = {n: (feeds[n] if n in self.graph_inputs else values[n]) for n in self.candidates}
        return acts, {n: values[n + GRAD_SUFFIX] for n in self.candidates}


def _loss_nodes(loss: str, output: str, infos) -> tuple[list, list]:
    """Nodes computing ``LOSS = sum_i loss_i`` (terms weighted by ``LOSS_SCALE``) and the extra inputs they read."""
    from onnx import TensorProto, helper, numpy_helper

    info = infos.get(output)
    elem = info.elem_type if info is not None and info.elem_type else TensorProto.FLOAT
    scale = helper.make_tensor_value_info(LOSS_SCALE, elem, [])
    if loss == "cross_entropy":
        rank = len(info.shape) if info is not None and info.shape is not None else None
        if rank is None or rank < 2:
            raise OnnxProbeError(
                f"loss 'cross_entropy' needs output {output!r} of known rank >= 2 (batch, ..., classes)"
            )
        classes = info.shape[-1]
        if not isinstance(classes, int) or classes < 1:
            # targets are checked against it before a batch runs: an index past it is read out of bounds
            raise OnnxProbeError(
                f"loss 'cross_entropy' needs a fixed class count on output {output!r}; its shape is {info.shape}"
            )
        # -log softmax(logits)[target] per target as a one-hot contraction over the class axis, weighted
        # per sample (an ignored target weighs 0 and is fed as class 0)
        depth = numpy_helper.from_array(np.array(classes, dtype=np.int64), "satcore_classes")
        on_off = numpy_helper.from_array(np.array([0, 1], dtype=np.int64), "satcore_on_off")
        last = numpy_helper.from_array(np.array([-1], dtype=np.int64), "satcore_last_axis")
        nodes = [
            helper.make_node("Constant", [], [depth.name], value=depth),
            helper.make_node("Constant", [], [on_off.name], value=on_off),
            helper.make_node("Constant", [], [last.name], value=last),
            helper.make_node("LogSoftmax", [output], ["satcore_log_prob"], axis=-1),
            # int64 then cast: ORT's OneHot has no float64 output
            helper.make_node("OneHot", [TARGETS, depth.name, on_off.name], ["satcore_one_hot_int"], axis=-1),
            helper.make_node("Cast", ["satcore_one_hot_int"], ["satcore_one_hot"], to=elem),
            helper.make_node("Mul", ["satcore_log_prob", "satcore_one_hot"], ["satcore_picked"]),
            helper.make_node("ReduceSum", ["satcore_picked", last.name], ["satcore_target_log_prob"], keepdims=0),
            helper.make_node("Mul", ["satcore_target_log_prob", LOSS_SCALE], ["satcore_weighted"]),
            helper.make_node("ReduceSum", ["satcore_weighted"], ["satcore_log_likelihood"], keepdims=0),
            helper.make_node("Neg", ["satcore_log_likelihood"], [LOSS]),
        ]
        per_target = list(info.shape[:-1])
        targets = helper.make_tensor_value_info(TARGETS, TensorProto.INT64, per_target)
        return nodes, [targets, helper.make_tensor_value_info(LOSS_SCALE, elem, per_target)]
    if loss == "mse":
        nodes = [
            helper.make_node("Sub", [output, TARGETS], ["satcore_residual"]),
            helper.make_node("Mul", ["satcore_residual", "satcore_residual"], ["satcore_sq"]),
            helper.make_node("ReduceSum", ["satcore_sq"], ["satcore_sq_sum"], keepdims=0),
            helper.make_node("Mul", ["satcore_sq_sum", LOSS_SCALE], [LOSS]),
        ]
        shape = list(info.shape) if info is not None and info.shape is not None else None
        return nodes, [helper.make_tensor_value_info(TARGETS, elem, shape), scale]
    # ``loss`` names an output that already holds per-sample (per-token) losses
    nodes = [
        helper.make_node("ReduceSum", [output], ["satcore_loss_sum"], keepdims=0),
        helper.make_node("Mul", ["satcore_loss_sum", LOSS_SCALE], [LOSS]),
    ]
    return nodes, [scale]


def batchnorm_as_affine(graph, infos) -> None:
    """Rewrite inference ``BatchNormalization`` (constant statistics) as ``x * a + b``, in place.

    So the backward graph needs only ``Mul`` and ``Add`` for it; ``a = gamma /
    sqrt(var + eps)`` and ``b = beta - mean * a`` (float64, then the input's
    dtype) is what PyTorch's CPU kernel computes in eval mode, so gradients
    match autograd's to round-off.
    """
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in graph.initializer}
    for node in graph.node:  # exporters share weights through Identity nodes
        if node.op_type == "Identity" and node.input[0] in inits:
            inits[node.output[0]] = inits[node.input[0]]
    nodes = []
    for k, node in enumerate(graph.node):
        params = list(node.input[1:5])
        rank = len(infos[node.input[0]].shape or ()) if node.input and node.input[0] in infos else 0
        inference = node.op_type == "BatchNormalization" and len(node.output) == 1
        if not inference or not all(p in inits for p in params) or rank < 2:
            nodes.append(node)
            continue
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (numpy_helper.to_array(inits[p]).astype(np.float64) for p in params)
        a = gamma / np.sqrt(var + eps)
        b = beta - mean * a
        dtype = numpy_helper.to_array(inits[params[0]]).dtype
        shape = (-1,) + (1,) * (rank - 2)
        names = (f"satcore_bn{k}_scale", f"satcore_bn{k}_shift", f"satcore_bn{k}_scaled")
        graph.initializer.extend(
            [numpy_helper.from_array(a.reshape(shape).astype(dtype), names[0]),
             numpy_helper.from_array(b.reshape(shape).astype(dtype), names[1])]
        )
        nodes.append(helper.make_node("Mul", [node.input[0], names[0]], [names[2]]))
        nodes.append(helper.make_node("Add", [names[2], names[1]], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)


def check_reserved_names(graph, candidates) -> None:
    """Refuse a tensor of the model named as one the probe adds to its graph (``satcore_...``, a candidate's name
    with :data:`GRAD_SUFFIX`): the two would meet as a cycle or a duplicate definition, refused in those words."""
    reserved = {name + GRAD_SUFFIX for name in candidates}
    named = itertools.chain((v.name for v in itertools.chain(graph.input, graph.output, graph.initializer)),
                            (o for node in graph.node for o in node.output))
    clash = next((name for name in named if name.startswith(RESERVED_PREFIX) or name in reserved), None)
    if clash is not None:
        raise OnnxProbeError(f"tensor {clash!r}: the probe adds tensors of this name to the graph ({RESERVED_PREFIX}..., "
                             f"and each candidate's name + {GRAD_SUFFIX!r}); rename it in the model")


def probe_graph(model, candidates, *, loss: str, output: str | None = None):
    """``(probe model, logits/loss output name, infos)``: the model with summed loss and candidate outputs.

    ``loss`` is ``"cross_entropy"`` (integer targets), ``"mse"`` (targets
    shaped like the output) or the name of a graph output holding per-sample
    losses.  ``output`` picks the model output the loss reads (default: the
    first graph output).
    """
    import onnx
    from onnx import helper

    infos = tensor_infos(model)
    outputs = [o.name for o in model.graph.output]
    if loss not in LOSSES:
        if loss not in outputs:
            raise OnnxProbeError(f"loss {loss!r} is neither {' nor '.join(LOSSES)} nor a graph output {outputs}")
        output = loss
    output = output or outputs[0]
    if output not in outputs:
        raise OnnxProbeError(f"output {output!r} is not a graph output {outputs}")
    check_candidates(model, candidates)
    check_reserved_names(model.graph, candidates)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    batchnorm_as_affine(graph, infos)
    nodes, inputs = _loss_nodes(loss, output, infos)
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(LOSS, inputs[-1].type.tensor_type.elem_type, []))
    graph_inputs = {i.name for i in model.graph.input}
    for name in candidates:
        if name not in graph_inputs:
            elem = infos[name].elem_type if name in infos else onnx.TensorProto.FLOAT
            graph.output.append(helper.make_tensor_value_info(name, elem, None))
    prune_to_outputs(graph)  # the model's other outputs are no longer fetched: their nodes need not run
    return probe, output, infos
