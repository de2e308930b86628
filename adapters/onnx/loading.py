"""Loading untrusted ONNX files: sizes and locations checked before reading, nodes in one order.

``onnx.load`` follows each external tensor's ``location`` relative to the
model's folder; absolute paths, ``..`` components and symlinks leaving the
folder would let a hostile file read anything on disk (onnx path-traversal
CVEs), and without a ``length`` it reads the whole file (a 256-byte tensor
pointing at a 6 GiB file).  We load the graph without external data, check
every location and every tensor's stored bytes against its declared shape,
and only then read the data.  The nodes are put in one topological order
(:func:`topological_order`, with the tensors that subgraphs read from outer
scopes as edges) that every walk over the graph uses; ONNX Runtime accepts
any listed order, and a graph whose data edges form a cycle is refused.
"""

from __future__ import annotations

import heapq
import math
import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from satcore.adapter_api import file_kind, note_input, regular_file

from .errors import OnnxProbeError

# How a model saved in another framework's format is probed instead, by its file's suffix: the ONNX reader's own
# error (DecodeError) does not say that the file is a Keras or torch save, nor where such a model goes.
OTHER_FORMATS = {
    **dict.fromkeys((".keras", ".h5"), "a Keras model: probe it in Python with satcore.adapters.tensorflow.probe and "
                    "result.save(DUMP) for 'satcore score', or export it to ONNX (tf2onnx)"),
    **dict.fromkeys((".pt", ".pth", ".bin", ".safetensors"), "torch weights: export the model to ONNX "
                    "(torch.onnx.export) or pass the Hugging Face checkpoint folder that holds them"),
}
MAX_PROTO_BYTES = 2**31 - 1  # protobuf's limit on one message: a larger file is no ONNX model


def _tensors(graph):
    """Every TensorProto of ``graph`` and its subgraphs (initializers and attributes)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def external_locations(model) -> list[tuple[str, str]]:
    """``(tensor name, location)`` for every tensor stored outside the model file."""
    from onnx import TensorProto

    out = []
    for tensor in _tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            out.append((tensor.name, entries.get("location", "")))
    return out


def check_location(tensor: str, location: str, folder: Path) -> Path:
    """The resolved file of one external location, refused unless inside ``folder``."""
    if not location:
        raise OnnxProbeError(f"external data of tensor {tensor!r} has no location")
    for pure in (PurePosixPath(location), PureWindowsPath(location)):
        if pure.is_absolute() or pure.drive or ".." in pure.parts:
            raise OnnxProbeError(
                f"external data of tensor {tensor!r} points outside the model folder: {location!r}"
            )
    root = folder.resolve()
    target = (root / location).resolve()  # follows symlinks
    if target != root and root not in target.parents:
        raise OnnxProbeError(
            f"external data of tensor {tensor!r} resolves outside the model folder: {location!r} -> {target}"
        )
    if not target.is_file():
        raise OnnxProbeError(f"external data file of tensor {tensor!r}, {location!r}, is "
                             f"{file_kind(target.stat().st_mode)}, not a regular file; refused" if target.exists()
                             else f"external data file of tensor {tensor!r} not found: {location!r}")
    note_input(target)  # read by the running command: `probe -o` may not replace the model's weights
    return target


def subgraphs(node):
    """The graphs in ``node``'s attributes (the branches of ``If``, the bodies of ``Loop`` and ``Scan``)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def outer_reads(graph) -> set[str]:
    """Tensors ``graph`` reads from enclosing scopes: read by its nodes or outputs, not made inside it.

    ONNX lets a subgraph read any tensor of the graphs around it by name; these are
    the edges a node with subgraphs has beyond its ``input`` list.
    """
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    local.update(s.values.name for s in graph.sparse_initializer)
    local.update(o for n in graph.node for o in n.output if o)
    read = {o.name for o in graph.output}
    for node in graph.node:
        read.update(i for i in node.input if i)
        for sub in subgraphs(node):
            read |= outer_reads(sub)
    return read - local


def node_reads(node) -> list[str]:
    """Every tensor ``node`` reads: its inputs, then what its subgraphs read from outside them."""
    reads = [i for i in node.input if i]
    for sub in subgraphs(node):
        reads += sorted(outer_reads(sub) - set(reads))
    return reads


def topological_order(graph) -> list[int]:
    """Indices of ``graph``'s nodes in a topological order (producers before readers), the one every walk uses.

    Kahn's algorithm over the data edges, subgraphs' outer-scope reads included,
    taking the listed order wherever it is valid (a sorted graph keeps its order).
    Runs in ``O(nodes + edges)`` with no recursion, holding integers only (node
    objects are read one at a time: a list of them costs ~0.5 kB per node).
    Refuses, in one line, a tensor made by two nodes and a cycle (naming a
    tensor on it).
    """
    nodes = graph.node
    producer: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for o in node.output:
            if o and producer.setdefault(o, k) != k:
                raise OnnxProbeError(f"tensor {o!r} is made by two nodes ({describe_node(nodes[producer[o]])} and "
                                     f"{describe_node(node)}); ONNX tensors have one producer")
    users: list[list[int]] = [[] for _ in range(len(nodes))]
    waiting = [0] * len(nodes)
    for k, node in enumerate(nodes):
        for p in {producer[i] for i in node_reads(node) if i in producer}:
            users[p].append(k)
            waiting[k] += 1
    del producer
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
        users[k] = []
    if len(order) < len(nodes):
        stuck = next(k for k, w in enumerate(waiting) if w > 0)
        tensor = next((o for o in nodes[stuck].output if o), nodes[stuck].name)
        raise OnnxProbeError(f"the ONNX graph has a cycle (through tensor {tensor!r}); ONNX graphs are acyclic")
    return order


def topological_nodes(graph):
    """``graph``'s nodes in :func:`topological_order` (an iterator: each node is read when it is reached)."""
    return (graph.node[k] for k in topological_order(graph))


def sort_graph(graph, *, check_only: bool = False) -> bool:
    """Put the nodes of ``graph`` and of every subgraph in :func:`topological_order`, in place.

    Returns whether they already were; ``check_only`` only checks (and refuses
    what :func:`topological_order` refuses).
    """
    stack, was_sorted = [graph], True
    while stack:
        g = stack.pop()
        order = topological_order(g)
        if any(k != j for j, k in enumerate(order)):
            was_sorted = False
            if check_only:
                continue
            ordered = [copy_node(g.node[k]) for k in order]
            del g.node[:]
            g.node.extend(ordered)
        stack.extend(sub for n in g.node if n.attribute for sub in subgraphs(n))
    return was_sorted


def prune_to_outputs(graph) -> None:
    """Drop, in place, the nodes of ``graph`` that none of its outputs reads, directly or through other nodes.

    ONNX Runtime runs every node of a session's graph, fetched or not: the
    model's other heads would cost every batch their work, and a hostile
    file's ``Loop`` of 10^15 trips that no output reads would run forever.
    """
    producer = {o: k for k, node in enumerate(graph.node) for o in node.output if o}
    needed: set[int] = set()
    stack = [o.name for o in graph.output]
    while stack:
        k = producer.get(stack.pop())
        if k is not None and k not in needed:
            needed.add(k)
            stack.extend(node_reads(graph.node[k]))
    if len(needed) < len(graph.node):
        kept = [copy_node(graph.node[k]) for k in sorted(needed)]
        del graph.node[:]
        graph.node.extend(kept)


def copy_node(node):
    from onnx import NodeProto

    out = NodeProto()
    out.CopyFrom(node)
    return out


def describe_node(node) -> str:
    return f"{node.op_type} node {node.name or next((o for o in node.output if o), '')!r}"


def check_tensor_sizes(proto, folder: Path | None) -> None:
    """Refuse tensors whose bytes are not exactly what their shape and type declare.

    Inline ``raw_data`` must hold ``prod(dims) * itemsize`` bytes, typed fields
    the values of ``prod(dims)`` elements (:func:`check_typed_values`).  External
    data (``folder``: the model's) is checked from ``stat`` alone, before a
    byte is read: its location must stay in ``folder``, and the tensor's
    ``prod(dims) * itemsize`` must equal its ``length`` entry (or, without
    one, the rest of the file after ``offset``, which is what ``onnx`` would
    read), lie inside the file, and all of them together fit the memory
    budget (``SATCORE_MEMORY_BUDGET``).
    """
    from onnx import TensorProto, helper

    from satcore.adapter_api import check_memory

    total = 0
    for tensor in _tensors(proto.graph):
        external = tensor.data_location == TensorProto.EXTERNAL
        if not external and not tensor.HasField("raw_data"):
            check_typed_values(tensor)
            continue
        if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            raise OnnxProbeError(f"tensor {tensor.name!r}: raw bytes of type {tensor.data_type} are not read")
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            raise OnnxProbeError(f"tensor {tensor.name!r} has an unknown data type {tensor.data_type}") from None
        if any(d < 0 for d in tensor.dims):
            raise OnnxProbeError(f"tensor {tensor.name!r} declares a negative dimension {list(tensor.dims)}")
        declared = math.prod(tensor.dims) * itemsize  # Python ints: a declared shape cannot wrap
        if not external:
            if len(tensor.raw_data) != declared:
                raise OnnxProbeError(f"tensor {tensor.name!r} holds {len(tensor.raw_data)} bytes but its shape "
                                     f"{list(tensor.dims)} and type declare {declared}")
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        if folder is None:
            raise OnnxProbeError(f"tensor {tensor.name!r} refers to external data; pass the .onnx path")
        target = check_location(tensor.name, entries.get("location", ""), folder)
        try:
            offset = int(entries.get("offset", 0))
            length = int(entries["length"]) if "length" in entries else None
        except ValueError:
            raise OnnxProbeError(f"external data of tensor {tensor.name!r}: offset and length must be integers") \
                from None
        size = target.stat().st_size
        available = size - offset
        if offset < 0 or (length is not None and length < 0) or available < (length or 0):
            raise OnnxProbeError(f"external data of tensor {tensor.name!r} ({offset=}, {length=}) lies outside "
                                 f"its file {entries['location']!r} of {size} bytes")
        stored = length if length is not None else available
        if stored != declared:
            raise OnnxProbeError(
                f"external data of tensor {tensor.name!r} holds {stored} bytes in {entries['location']!r} but its "
                f"shape {list(tensor.dims)} and type declare {declared}")
        total += declared
    if total:
        check_memory(total, "the model's external data")


def check_typed_values(tensor) -> None:
    """Refuse a tensor stored in typed fields (``float_data``, ...) holding fewer values than its shape declares.

    Left unchecked, ONNX shape inference gives the graph after it no shapes and the
    refusal names a tensor far from this one (the loss's).  onnx's own check counts
    the values in its packing (sub-byte types, complex pairs) without converting them.
    """
    from onnx.checker import ValidationError, check_tensor

    try:
        check_tensor(tensor)
    except ValidationError as exc:
        raise OnnxProbeError(" ".join(str(exc).split())) from None


def load_model(model):
    """A ``ModelProto`` from a path or a ``ModelProto``: sizes and external data checked, nodes sorted.

    Every tensor's stored bytes are checked against its declared shape and the
    external data's locations against the model's folder before any external
    byte is read; the nodes are put in :func:`topological_order` (a copy when
    given a ``ModelProto`` listed otherwise: the caller's model is left as it was).  A
    ``ModelProto`` that still refers to external data is refused (its folder is
    unknown); pass the file path instead.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    if isinstance(model, onnx.ModelProto):
        pending = external_locations(model)
        if pending:
            raise OnnxProbeError(
                f"model refers to external data ({pending[0][1]!r}); pass the .onnx path so it can be checked"
            )
        check_tensor_sizes(model, None)
        if sort_graph(model.graph, check_only=True):
            return model
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        sort_graph(proto.graph)
        return proto
    path = Path(os.fspath(model))
    if not regular_file(path, str(path), OnnxProbeError):
        raise OnnxProbeError(f"no ONNX file at {str(path)!r}")
    other = OTHER_FORMATS.get(path.suffix.lower())
    hint = f"; the name says {other}" if other else ""
    size = path.stat().st_size
    if size == 0:  # protobuf parses no bytes as an empty model: "the graph has no nodes" hid that the file is empty
        raise OnnxProbeError(f"{path}: the file is empty (0 bytes), not an ONNX model{hint}")
    if size > MAX_PROTO_BYTES:  # onnx.load would read it all before the parser refuses it
        raise OnnxProbeError(f"{path}: {size:,} bytes, more than an ONNX file holds ({MAX_PROTO_BYTES:,}, protobuf's "
                             f"limit: larger weights are stored as external data); not read{hint}")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise OnnxProbeError(f"{path}: not a readable ONNX model ({type(exc).__name__}){hint}") from None
    if not proto.graph.node:  # also what some other formats' bytes parse as
        raise OnnxProbeError(f"{path}: the ONNX graph has no nodes{hint}")
    try:
        sort_graph(proto.graph)
        check_tensor_sizes(proto, path.parent)
    except OnnxProbeError as exc:
        raise OnnxProbeError(f"{path}: {exc}") from None
    if external_locations(proto):
        try:
            load_external_data_for_model(proto, str(path.parent))
        except Exception as exc:
            raise OnnxProbeError(f"{path}: external data could not be read ({exc})") from None
    return proto
