"""Where to probe in an ONNX graph: tensor types and residual candidates.

A candidate is a tensor name; :func:`residual_candidates` finds the block inputs of
residual ``Add`` nodes with the search shared with the Keras adapter
(:mod:`satcore.adapters.graph`), :func:`check_candidates` refuses names that are not
activations of the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import OnnxProbeError

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
    from satcore.adapters.graph import Ancestry, residual_skip

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
