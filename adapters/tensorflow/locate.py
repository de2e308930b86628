"""Where to probe in a Keras 3 model.

A candidate is a tensor ``z`` at which a zero-output block ``z -> z + V psi(z)``
would be inserted, and ``q_i = d loss_i / d z_i`` is its TOTAL gradient:

* found automatically in functional models: every ``Add`` layer with two
  inputs of which one (the skip ``a``) is an ancestor of the other (the branch
  output ``f(a)``).  The candidate, named after the ``Add`` layer, is ``a``
  itself, tapped at the OUTPUT of the layer that produced it (or at the model
  input), so every consumer of ``a`` sees the inserted block;
* named explicitly (functional or subclassed models): the INPUT of the named
  layer, as that layer sees it (e.g. a residual block layer ``x + f(x)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from satcore import ProbeError
from satcore.adapters.base import refuse_named_twice


@dataclass(frozen=True)
class Candidate:
    """Tap ``position`` (``"input"``, ``"output"`` or ``"model_input"``) of ``layer`` (a name)."""

    name: str
    layer: str | None
    position: str = "input"
    input_index: int = 0


def all_layers(model) -> dict:
    """Every layer of ``model`` by name, nested ones included."""
    return {layer.name: layer for layer in model._flatten_layers(include_self=False, recursive=True)}


def _history(tensor):
    history = getattr(tensor, "_keras_history", None)
    if history is None:
        raise ProbeError(f"model: tensor {tensor!r} has no Keras history (not a functional model?); pass candidates=[layer names]")
    return history


def _node_inputs(tensor):
    operation, node_index, _ = _history(tensor)
    node = operation._inbound_nodes[node_index]
    return list(node.input_tensors)


def _tap_of(tensor, model, name: str) -> Candidate:
    operation, node_index, tensor_index = _history(tensor)
    inputs = model.inputs if isinstance(model.inputs, (list, tuple)) else [model.inputs]
    for k, x in enumerate(inputs):
        if x is tensor:
            return Candidate(name, None, "model_input", k)
    if len(operation._inbound_nodes) > 1 or tensor_index != 0:
        raise ProbeError(
            f"model: the skip input of {name!r} comes from shared or multi-output layer {operation.name!r}; "
            "name the candidate layers explicitly"
        )
    return Candidate(name, operation.name, "output")


def _block_input(a, b):
    """The skip tensor of ``Add(a, b)``, or None when the Add is not residual.

    ``a`` when ``b`` derives from it (``a + f(a)``); with a projection shortcut
    ``g(x) + f(x)``, the latest floating-point tensor both derive from (``x``);
    the search is :func:`satcore.adapters.graph.residual_skip`, shared with the ONNX adapter.
    """
    from satcore.adapters.graph import Ancestry, residual_skip

    tensors = {id(a): a, id(b): b}

    def parents(key):
        inputs = _node_inputs(tensors[key])
        tensors.update((id(t), t) for t in inputs)
        return [id(t) for t in inputs]

    skip = residual_skip(Ancestry(parents), id(a), id(b), lambda key: "float" in str(tensors[key].dtype))
    return None if skip is None else tensors[skip]


def residual_candidates(model) -> tuple[Candidate, ...]:
    """Block inputs at the residual ``Add`` layers of a functional model, upstream first."""
    import keras

    if not is_functional(model):
        raise ProbeError(f"model: {type(model).__name__} is not a functional Keras model; pass candidates=[layer names]")
    found = []
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Add) or len(layer._inbound_nodes) != 1:
            continue
        inputs = list(layer._inbound_nodes[0].input_tensors)
        if len(inputs) != 2:
            continue
        skip = _block_input(*inputs)
        if skip is not None:
            found.append(_tap_of(skip, model, layer.name))
    if not found:
        raise ProbeError(f"model: no residual Add layer found in {model.name!r}; pass candidates=[layer names]")
    return tuple(found)


def named_candidates(model, names) -> tuple[Candidate, ...]:
    """The input of each named layer (nested layers of subclassed models included).

    A :class:`Candidate` may be given instead of a name, e.g.
    ``Candidate("stage2", "block1_out", "output")`` to tap a layer's output.
    """
    layers = all_layers(model)
    cands = [c if isinstance(c, Candidate) else Candidate(c, c, "input") for c in names]
    if not cands:
        raise ProbeError("candidates is empty; name at least one layer")
    for c in cands:
        if c.position not in ("input", "output"):
            raise ProbeError(f"candidates: {c.name!r}: position must be 'input' or 'output', not {c.position!r}")
        if c.layer not in layers:
            raise ProbeError(f"candidates: {c.name!r}: {c.layer!r} is not a layer name of {model.name!r}")
    names = [c.name for c in cands]
    refuse_named_twice(names)
    if len({(c.layer, c.position) for c in cands}) != len(cands):  # two names, one tap: ONNX's words
        raise ProbeError(f"candidates {names} name one tensor twice")
    return tuple(cands)


def locate_candidates(model, names) -> tuple[Candidate, ...]:
    """The candidates ``names`` of ``model`` (:func:`named_candidates`); ``None``: its residual ones
    (:func:`residual_candidates`)."""
    return residual_candidates(model) if names is None else named_candidates(model, names)


def is_functional(model) -> bool:
    """A Keras 3 functional model (a graph of layers), as opposed to a subclassed one."""
    return hasattr(model, "_operations")  # keras Functional subclasses keras' Function graph
