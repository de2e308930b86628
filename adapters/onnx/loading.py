"""Loading untrusted ONNX files: external data must stay inside the model's folder, the graph acyclic.

``onnx.load`` follows each external tensor's ``location`` relative to the
model's folder; absolute paths, ``..`` components and symlinks leaving the
folder would let a hostile file read anything on disk (onnx path-traversal
CVEs).  We load the graph without external data, check every location, and
only then read the data.  A graph whose data edges form a cycle is refused
(ONNX graphs are acyclic; a walk over a cyclic one, such as the candidate
search's ancestry, would never end).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from satcore._atomic import note_input

from .errors import OnnxProbeError


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
        raise OnnxProbeError(f"external data file of tensor {tensor!r} not found: {location!r}")
    note_input(target)  # read by the running command: `probe -o` may not replace the model's weights
    return target


def check_acyclic(graph) -> None:
    """Refuse a graph in which a node depends, through its inputs, on its own output (Kahn's algorithm).

    Runs in ``O(nodes + edges)`` with no recursion; names one tensor on a cycle.
    """
    producer = {o: k for k, node in enumerate(graph.node) for o in node.output if o}
    needs = [sorted({producer[i] for i in node.input if i in producer}) for node in graph.node]
    users: list[list[int]] = [[] for _ in graph.node]
    for k, parents in enumerate(needs):
        for p in parents:
            users[p].append(k)
    waiting = [len(p) for p in needs]
    ready = [k for k, w in enumerate(waiting) if w == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                ready.append(u)
    if done < len(needs):
        stuck = next(k for k, w in enumerate(waiting) if w > 0)
        tensor = next((o for o in graph.node[stuck].output if o), graph.node[stuck].name)
        raise OnnxProbeError(f"the ONNX graph has a cycle (through tensor {tensor!r}); ONNX graphs are acyclic")


def load_model(model):
    """A ``ModelProto`` from a path or a ``ModelProto``, external data checked before reading.

    A ``ModelProto`` that still refers to external data is refused (its folder
    is unknown); pass the file path instead.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    if isinstance(model, onnx.ModelProto):
        pending = external_locations(model)
        if pending:
            raise OnnxProbeError(
                f"model refers to external data ({pending[0][1]!r}); pass the .onnx path so it can be checked"
            )
        check_acyclic(model.graph)
        return model
    path = Path(os.fspath(model))
    if not path.is_file():
        raise OnnxProbeError(f"no ONNX file at {str(path)!r}")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise OnnxProbeError(f"{path}: not a readable ONNX model ({type(exc).__name__})") from None
    if not proto.graph.node:
        raise OnnxProbeError(f"{path}: the ONNX graph has no nodes")
    try:
        check_acyclic(proto.graph)
    except OnnxProbeError as exc:
        raise OnnxProbeError(f"{path}: {exc}") from None
    locations = external_locations(proto)
    for tensor, location in locations:
        check_location(tensor, location, path.parent)
    if locations:
        try:
            load_external_data_for_model(proto, str(path.parent))
        except Exception as exc:
            raise OnnxProbeError(f"{path}: external data could not be read ({exc})") from None
    return proto
