"""Where to probe in an ONNX graph: tensor types and residual candidates.

A candidate is a name mapped to a tensor: :func:`residual_blocks` finds the block inputs
of residual ``Add`` nodes with the search shared with the Keras adapter
(:mod:`satcore.adapters.graph`) and names them after their scope (``blocks.0``);
``head`` is the last block's output; any activation tensor's own name is accepted too
(:func:`resolve_candidates`), and :func:`check_candidates` refuses names that are not
activations of the graph.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from satcore.adapters.base import refuse_named_twice

from .errors import OnnxProbeError
from .loading import describe_node, node_reads, topological_nodes, topological_order

FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True, slots=True)
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


class TensorInfos(dict):
    """``{tensor name: TensorInfo}``; ``missing(name)`` says why a tensor has none (one clause)."""

    inference_error: str | None = None
    first_lost: str | None = None  # the first node, in topological order, whose outputs inference left shapeless

    def missing(self, name: str) -> str:
        if self.inference_error:
            return f"ONNX shape inference failed: {self.inference_error}"
        if self.first_lost:
            return f"ONNX shape inference found none for {name!r}; it first found none at {self.first_lost}"
        return f"ONNX shape inference found none for {name!r}; the file declares no value_info for it"


def first_lost_shape(model, infos: TensorInfos) -> str | None:
    """The first node (topological order) with shaped inputs whose outputs shape inference left without a shape,
    and why where it can say: an op without a schema, else its inputs' shapes; ``None`` where there is none.

    Every tensor after it goes shapeless too, so a later refusal names a tensor (the loss's) far from the cause.
    """
    import onnx

    functions = {(f.domain, f.name) for f in model.functions}
    for node in topological_nodes(model.graph):
        inputs = [i for i in node.input if i]
        if any(infos.get(i) is None or infos[i].shape is None for i in inputs):
            continue
        if all(o in infos and infos[o].shape is not None for o in node.output if o):
            continue
        domain = "" if node.domain == "ai.onnx" else node.domain
        if not onnx.defs.has(node.op_type, domain) and (node.domain, node.op_type) not in functions:
            return f"{describe_node(node)}, an op onnx has no schema for (domain {node.domain or 'ai.onnx'!r})"
        shapes = ", ".join(f"{i} {list(infos[i].shape)}" for i in inputs)
        return f"{describe_node(node)} (inputs {shapes or 'none'})"
    return None


def tensor_infos(model) -> TensorInfos:
    """Types and shapes of every named tensor, after ONNX shape inference (nodes in topological order)."""
    import onnx

    out = TensorInfos()
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # inference is a convenience: unknown shapes are refused where needed, with this
        out.inference_error = " ".join(str(exc).split())[:200]
        inferred = model
    g = inferred.graph
    out.update((vi.name, _info(vi)) for vi in itertools.chain(g.value_info, g.input, g.output))
    for init in g.initializer:
        out[init.name] = TensorInfo(init.data_type, tuple(init.dims))
    if out.inference_error is None:
        out.first_lost = first_lost_shape(model, out)
    return out


def constant_names(graph) -> set[str]:
    """Initializers and outputs of ``Constant`` nodes: never candidates."""
    names = {i.name for i in graph.initializer}
    names.update(o for n in graph.node if n.op_type == "Constant" for o in n.output)
    return names


SHAPE_OPS = ("Shape", "Size")  # their outputs carry no gradient: not data paths
HEAD = "head"  # the output of the last residual block, as the torch adapter's candidate of that name
# what to do where the residual search finds no block or cannot finish, in both spellings (the probe's, the CLI's)
NAME_THEM = "pass candidates=[tensor names] (satcore probe: --candidates NAME,...)"
# steps of the residual search per tensor of the graph (a block's search visits the block's own
# tensors, so real networks use a few per tensor); past it the graph is refused, not walked for minutes
SEARCH_STEPS_PER_TENSOR = 4
MIN_SEARCH_STEPS = 50_000


@dataclass(frozen=True)
class Block:
    """One residual ``Add``: its readable name, its block input (``skip``) and output tensors."""

    name: str
    skip: str
    output: str


def residual_blocks(model) -> list[Block]:
    """The residual ``Add`` nodes of ``model``, upstream first (nodes in topological order).

    An ``Add(a, b)`` is residual when one input (the skip, ``a``) is an
    ancestor of the other (the branch output ``b``): ``a`` is the input of a
    block ``a + f(a)``.  With a projection shortcut, ``Add(g(x), f(x))``, the
    block input is the latest floating-point tensor both inputs derive from
    (``x``); :func:`satcore.adapters.graph.residual_block` finds it in time
    linear in the block's size.  Ancestry follows data edges only (not through
    ``Shape``/``Size``), so a mask built from a tensor's shape does not make
    its ``Add`` residual; bias additions (a constant input) are never
    residual, nor is an ``Add`` whose skip does not depend on a graph input (a
    mask made from shapes), whose output is shaped unlike its identity skip (a
    broadcast mask), or whose branch applies no weight (a constant of more
    than one element; e.g. the ``x + 0.044715 x^3`` inside a tanh GELU).

    A block's name is its ``Add`` node's scope: ``/blocks.0/Add_1`` (the torch
    exporter's names) is ``blocks.0``, the module whose input the skip is, as
    the torch adapter names it; a second residual ``Add`` in that scope keeps
    its op's name too (``blocks.0/Add_2``); a node without a scope gives the
    skip tensor's name.  Refuses, in one line, a graph whose search
    would take more than ``SEARCH_STEPS_PER_TENSOR`` steps per tensor.
    """
    from satcore.adapters.graph import Ancestry, SearchLimitError, residual_block

    graph = model.graph
    order = topological_order(graph)
    constants = constant_names(graph)
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}  # indices: nodes read when needed
    declared = {i.name: i.type.tensor_type.elem_type for i in graph.input if i.name not in constants}
    inferred: dict = {}

    def infos() -> dict:  # shape inference holds a copy of the graph: run only when a type is needed
        if not inferred:
            inferred.update(tensor_infos(model))
        return inferred

    def eligible(t) -> bool:
        if t in constants:
            return False
        elem = declared.get(t) or getattr(infos().get(t), "elem_type", 0)
        return elem in FLOAT_TYPES

    inputs = set(declared)
    # parameters: constants of more than one element (a block's branch applies some)
    weights = {i.name for i in graph.initializer if np.prod(i.dims, dtype=np.int64) > 1}
    weights.update(o for n in graph.node if n.op_type == "Constant" for o in n.output
                   if n.attribute and n.attribute[0].name == "value" and np.prod(n.attribute[0].t.dims, dtype=np.int64) > 1)
    for n in graph.node:  # exporters share equal weights through Identity nodes
        if n.op_type == "Identity" and n.input[0] in weights:
            weights.add(n.output[0])
    carries_data = set(inputs)  # tensors computed from a graph input along data edges
    for n in topological_nodes(graph):
        if n.op_type not in SHAPE_OPS and any(i in carries_data for i in node_reads(n)):
            carries_data.update(o for o in n.output if o)

    def parents(name):
        node = graph.node[producer[name]] if name in producer else None
        return [] if node is None or node.op_type in SHAPE_OPS else node_reads(node)

    ancestry = Ancestry(parents, max_steps=MIN_SEARCH_STEPS + SEARCH_STEPS_PER_TENSOR * len(producer))
    found: list[tuple] = []  # (Add node, skip, output)
    skips: set[str] = set()
    for k in order:
        node = graph.node[k]
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        a, b = node.input
        if a in constants or b in constants or a == b or not {a, b} <= carries_data:
            continue  # a mask made from shapes and constants carries no sample's data
        try:
            block = residual_block(ancestry, a, b, eligible)
        except SearchLimitError as exc:
            raise OnnxProbeError(f"{exc} at {describe_node(node)} ({len(order)} nodes); {NAME_THEM}") from None
        if block is None or block[0] in skips:
            continue
        skip, branch = block
        if skip in (a, b) and not _same_shape(infos().get(skip), infos().get(node.output[0])):
            continue  # an identity skip broadcast into the sum (an attention mask, say) is no block x + f(x)
        # the branch's nodes (computed after the skip) must apply a weight, shared ones included;
        # x + 0.0447 x^3 inside a GELU applies none: no block
        if any(t in producer and any(i in weights for i in graph.node[producer[t]].input) for t in branch):
            skips.add(skip)
            found.append((node, skip, node.output[0]))
    taken: set[str] = set()
    named = []
    for node, skip, output in found:  # the scope; its second residual Add keeps its own name; else the tensor's
        name = next((n for n in _scope_names(node) if n not in taken and n != HEAD), skip)
        taken.add(name)
        named.append(Block(name, skip, output))
    return named


# the dynamo exporter's node metadata: the module path down to the op, e.g. "['', 'layer1', 'layer1.0', 'add_40']"
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
MAX_NAME_SCOPES_CHARS = 4096  # a module path's list; a longer value is not read (a hostile file's)


def _scope_names(node) -> list[str]:
    """``["blocks.0", "blocks.0/Add_1"]`` for the node ``/blocks.0/Add_1``: scope, then scope and op; [] without a
    scope.  The TorchScript exporter puts the scope in the node's name; the dynamo exporter (``torch.onnx.export``'s
    default from torch 2.9) names the node ``node_add_40`` and puts the module path in its metadata
    (``NAME_SCOPES_KEY``: ``['', 'layer1', 'layer1.0', 'add_40']`` gives ``layer1.0``, the torch adapter's name)."""
    parts = [p for p in node.name.split("/") if p]
    if len(parts) < 2:
        parts = _metadata_scopes(node)
    return [parts[-2], f"{parts[-2]}/{parts[-1]}"] if len(parts) >= 2 else []


def _metadata_scopes(node) -> list[str]:
    """The non-empty entries of the node's ``NAME_SCOPES_KEY`` metadata (a Python list of strings, read as a
    literal, never evaluated); [] where it is absent, too long or not such a list."""
    import ast

    value = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES_KEY), "")
    if not value or len(value) > MAX_NAME_SCOPES_CHARS:
        return []
    try:
        scopes = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return []
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        return []
    return [s for s in scopes if s]


def residual_candidates(model) -> list[str]:
    """Names of the residual blocks (:func:`residual_blocks`), upstream first."""
    return [block.name for block in residual_blocks(model)]


def resolve_candidates(model, names=None, *, head: bool = True) -> dict[str, str]:
    """``{candidate name: tensor}``: the residual blocks and ``head`` by default, or the names given.

    A name is a block's name (:func:`residual_blocks`), ``head`` (the output
    of the last residual block) or any activation tensor of the graph (the raw
    names earlier releases used).  ``head`` joins the default list when
    ``head`` is true.
    """
    graph = model.graph
    if names is not None:
        names = list(names)
        if not names:
            raise OnnxProbeError("candidates is empty; pass None for the residual blocks")
        bad = next((n for n in names if not isinstance(n, str)), None)
        if bad is not None:
            raise OnnxProbeError(f"candidate {bad!r} is not a name")
    known = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    blocks = residual_blocks(model) if names is None or any(n == HEAD or n not in known for n in names) else []
    by_name = {b.name: b.skip for b in blocks}
    if blocks:
        by_name[HEAD] = blocks[-1].output
    if names is None:
        if not blocks:
            raise OnnxProbeError(f"no residual Add found in the graph; {NAME_THEM}")
        return {n: t for n, t in by_name.items() if head or n != HEAD}
    refuse_named_twice(names, OnnxProbeError)
    out = {}
    for name in names:
        tensor = by_name.get(name, name)
        check_candidates(model, [tensor], blocks=[b.name for b in blocks])
        out[name] = tensor
    if len(set(out.values())) != len(out):
        raise OnnxProbeError(f"candidates {names} name one tensor twice")
    return out


def _same_shape(one, other) -> bool:
    """False only where both shapes are known and differ (rank, or a static extent)."""
    if one is None or other is None or one.shape is None or other.shape is None:
        return True
    if len(one.shape) != len(other.shape):
        return False
    return all(not (isinstance(p, int) and isinstance(q, int)) or p == q for p, q in zip(one.shape, other.shape))


def check_candidates(model, names, blocks=()) -> None:
    """Refuse names that are not tensors of the graph (or are constants); ``blocks``: names to suggest."""
    graph = model.graph
    known = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    constants = constant_names(graph)
    for name in names:
        if name in constants:
            raise OnnxProbeError(f"candidate {name!r} is a constant (initializer), not an activation")
        if name not in known:
            hint = f"; the residual blocks are {list(blocks)} (or {HEAD!r})" if blocks else ""
            raise OnnxProbeError(f"candidate tensor {name!r} is not in the ONNX graph{hint}")
