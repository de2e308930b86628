"""Taps: a watched zero ``delta`` added at each candidate during one taped forward pass.

While :func:`taps` is active, each candidate layer's ``call`` is wrapped so
that its input (or output) ``z`` becomes ``z + delta`` with ``delta = 0``
watched by the current ``tf.GradientTape``.  The forward value is unchanged and
``d (sum_i loss_i) / d delta = q`` (per sample, the total gradient at ``z``).
State is thread-local: ``MirroredStrategy`` runs each replica in its own thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

from satcore import ProbeError

_local = threading.local()


class Recording:
    """What one replica's forward pass tapped: ``z`` and ``delta`` per candidate."""

    def __init__(self, tape):
        self.tape = tape
        self.z: dict = {}
        self.delta: dict = {}

    def tap(self, name: str, z):
        import tensorflow as tf

        if name in self.z:
            raise ProbeError(f"candidate {name!r} was reached twice in one forward pass (a shared layer?)")
        # tf.convert_to_tensor would stack a structure of tensors into one, silently changing what
        # the downstream layers receive
        if isinstance(z, (list, tuple, Mapping)):
            raise ProbeError(f"candidate {name!r}: the tapped value is a {type(z).__name__}, not one tensor")
        # a model-input candidate arrives as the user's batch (NumPy or any array Keras accepts);
        # everything downstream (features, positions, moments) reads tensor shapes
        try:
            z = tf.convert_to_tensor(z)
        except (TypeError, ValueError) as e:
            raise ProbeError(f"candidate {name!r}: the tapped value ({type(z).__name__}) is not an array: {e}") from None
        delta = tf.zeros_like(z)
        self.tape.watch(delta)
        self.z[name], self.delta[name] = z, delta
        return z + delta


@contextlib.contextmanager
def recording(tape):
    """Make ``tape`` the one the taps of this thread report to."""
    _local.current = Recording(tape)
    try:
        yield _local.current
    finally:
        _local.current = None


def _wrap(layer, candidate):
    original = layer.call

    def call(*args, **kwargs):
        rec = getattr(_local, "current", None)
        if rec is None:
            return original(*args, **kwargs)
        if candidate.position == "input":
            args = (rec.tap(candidate.name, args[0]), *args[1:])
            return original(*args, **kwargs)
        return rec.tap(candidate.name, original(*args, **kwargs))

    return call


@contextlib.contextmanager
def taps(model, candidates):
    """Wrap the candidate layers' ``call`` for the duration of the block (restored after)."""
    from .locate import all_layers

    layers = all_layers(model)
    patched = []
    try:
        for c in candidates:
            if c.position == "model_input":
                continue
            layer = layers[c.layer]
            if "call" in vars(layer):
                raise ProbeError(f"candidates: layer {c.layer!r} is tapped twice; candidates must be distinct tensors")
            object.__setattr__(layer, "call", _wrap(layer, c))
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            object.__delattr__(layer, "call")
