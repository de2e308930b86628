"""Reading an ONNX graph: tensor types, residual candidates, and the probe graph.

The probe graph is the model plus (a) a per-sample loss summed over the batch,
``sum_i loss_i`` (for sequences ``loss_i`` is the mean over the counted
tokens), so that its gradient at a candidate tensor ``z`` is ``q_i = d loss_i /
d z_i`` for every sample at once (samples do not interact in an inference
graph), and (b) every candidate tensor as an extra graph output, so the
features can be computed from the captured activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import OnnxProbeError

LOSSES = ("cross_entropy", "mse")
TARGETS = "satcore_targets"
# weights turning the loss terms into ``sum_i loss_i``: a scalar 1 / (elements per sample) for
# mse and loss outputs, one weight per target for cross_entropy (see ``probe._cross_entropy_feeds``)
LOSS_SCALE = "satcore_loss_scale"
IGNORE_INDEX = -100  # PyTorch's and Hugging Face's label for a token left out of the loss
LOSS = "satcore_loss"
FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True)
class TensorInfo:
    """Element type (``onnx.TensorProto`` enum) and shape (ints, strings or None)."""

    elem_type: int
    shape: tuple | None


def _info(value_info) -> TensorInfo:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return TensorInfo(t.elem_type, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return TensorInfo(t.elem_type, dims)


def tensor_infos(model) -> dict[str, TensorInfo]:
    """Types and shapes of every named tensor, after ONNX shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a convenience; unknown shapes are handled later
        inferred = model
    g = inferred.graph
    out = {vi.name: _info(vi) for vi in list(g.value_info) + list(g.input) + list(g.output)}
    for init in g.initializer:
        out[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    return out


def constant_names(graph) -> set[str]:
    """Initializers and outputs of ``Constant`` nodes: never candidates."""
    names = {i.name for i in graph.initializer}
    names.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
    return names


SHAPE_OPS = ("Shape", "Size")  # their outputs carry no gradient: not data paths


def residual_candidates(model) -> list[str]:
    """Input tensors of residual blocks (skip inputs of residual ``Add`` nodes), upstream first.

    An ``Add(a, b)`` is residual when one input (the skip, ``a``) is an
    ancestor of the other (the branch output ``b``): ``a`` is the input of a
    block ``a + f(a)``.  With a projection shortcut, ``Add(g(x), f(x))``, the
    block input is the latest floating-point tensor both inputs derive from
    (``x``).  Ancestry follows data edges only (not through ``Shape``/``Size``),
    so a mask built from a tensor's shape does not make its ``Add`` residual;
    bias additions (a constant input) are never residual, nor is an ``Add``
    whose skip does not depend on a graph input (a mask made from shapes),
    whose output is shaped unlike its identity skip (a broadcast mask), or
    whose branch applies no weight (a constant of more than one element;
    e.g. the ``x + 0.044715 x^3`` inside a tanh GELU).
    """
    from satcore._graph import Ancestry, residual_skip

    graph = model.graph
    constants = constant_names(graph)
    producer = {o: n for n in graph.node for o in n.output}
    infos = tensor_infos(model)
    floating = {name for name, info in infos.items() if info.elem_type in FLOAT_TYPES}
    inputs = {i.name for i in graph.input} - constants
    # parameters: constants of more than one element (a block's branch applies some)
    weights = {i.name for i in graph.initializer if np.prod(i.dims, dtype=np.int64) > 1}
    weights.update(o for n in graph.node if n.op_type == "Constant" for o in n.output
                   if n.attribute and n.attribute[0].name == "value" and np.prod(n.attribute[0].t.dims, dtype=np.int64) > 1)
    for n in graph.node:  # exporters share equal weights through Identity nodes
        if n.op_type == "Identity" and n.input[0] in weights:
            weights.add(n.output[0])

    def parents(name):
        node = producer.get(name)
        return [] if node is None or node.op_type in SHAPE_OPS else [i for i in node.input if i]

    ancestry = Ancestry(parents)
    found: list[str] = []
    for node in graph.node:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        a, b = node.input
        if a in constants or b in constants or a == b:
            continue
        skip = residual_skip(ancestry, a, b, lambda t: t in floating and t not in constants)
        if skip is None or skip in found or not (skip in inputs or ancestry.of(skip) & inputs):
            continue  # a mask made from shapes and constants carries no sample's data
        if skip in (a, b) and not _same_shape(infos.get(skip), infos.get(node.output[0])):
            continue  # an identity skip broadcast into the sum (an attention mask, say) is no block x + f(x)
        # the branch's nodes (computed after the skip) must apply a weight, shared ones included;
        # x + 0.0447 x^3 inside a GELU applies none: no block
        branch = (ancestry.of(a) | ancestry.of(b) | {a, b}) - ancestry.of(skip) - {skip}
        if any(t in producer and any(i in weights for i in producer[t].input) for t in branch):
            found.append(skip)
    return found


def _same_shape(one, other) -> bool:
    """False only where both shapes are known and differ (rank, or a static extent)."""
    if one is None or other is None or one.shape is None or other.shape is None:
        return True
    if len(one.shape) != len(other.shape):
        return False
    return all(not (isinstance(p, int) and isinstance(q, int)) or p == q for p, q in zip(one.shape, other.shape))


def check_candidates(model, names) -> None:
    """Refuse names that are not tensors of the graph (or are constants)."""
    graph = model.graph
    known = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    constants = constant_names(graph)
    for name in names:
        if name in constants:
            raise OnnxProbeError(f"candidate {name!r} is a constant (initializer), not an activation")
        if name not in known:
            raise OnnxProbeError(f"candidate tensor {name!r} is not in the ONNX graph")


def _loss_nodes(model, loss: str, output: str, infos) -> tuple[list, list]:
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
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    batchnorm_as_affine(graph, infos)
    nodes, inputs = _loss_nodes(model, loss, output, infos)
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(LOSS, inputs[-1].type.tensor_type.elem_type, []))
    graph_inputs = {i.name for i in model.graph.input}
    for name in candidates:
        if name not in graph_inputs:
            elem = infos[name].elem_type if name in infos else onnx.TensorProto.FLOAT
            graph.output.append(helper.make_tensor_value_info(name, elem, None))
    return probe, output, infos
