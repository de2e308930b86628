"""Hooks that tap the residual stream and its per-sample gradient.

At a candidate the hook replaces the stream tensor ``z`` by two fresh copies:
``tap = z.clone()`` (kept, never shown to the model) and ``tap.clone()``
(handed on).  Clones are identities for values and gradients, so outputs and
parameter gradients are unchanged; because the model never sees ``tap``,
in-place operations inside the block cannot rebase it, and
``autograd.grad(loss, tap)`` is exactly ``d loss / d z`` at the insertion
point (the gradient through the block's skip and branch, nothing else).
Forward pre-hooks use ``with_kwargs=True`` so blocks called with keyword
streams (``hidden_states=...``) work.  Hooks live only inside the
:class:`StreamTaps` context and are removed on exit, also on exceptions.
"""

from __future__ import annotations

import torch
from torch import nn

from .locate import Candidate
from .moments import squared_norm

STREAM_KWARGS = ("hidden_states", "x", "input", "src", "inputs_embeds")


def stream_argument(args, kwargs):
    """Where the residual stream is among a block's arguments: ``(0, None)`` or ``(None, key)``."""
    if args and torch.is_tensor(args[0]):
        return 0, None
    for key in STREAM_KWARGS:
        if torch.is_tensor(kwargs.get(key)):
            return None, key
    raise ValueError("cannot find the residual stream: no positional tensor and none of " + ", ".join(STREAM_KWARGS))


def get_stream(args, kwargs):
    index, key = stream_argument(args, kwargs)
    return args[0] if key is None else kwargs[key]


def with_stream(args, kwargs, value):
    """``(args, kwargs)`` with the stream replaced by ``value``."""
    index, key = stream_argument(args, kwargs)
    if key is None:
        return (value,) + tuple(args[1:]), kwargs
    return args, {**kwargs, key: value}


def get_output(output):
    """The stream tensor of a block's output (a tensor, or the first item of a tuple)."""
    return output if torch.is_tensor(output) else output[0]


def with_output(output, value):
    if torch.is_tensor(output):
        return value
    return type(output)((value,) + tuple(output[1:])) if isinstance(output, tuple) else [value] + list(output[1:])


def _tap(z):
    tap = z.clone()
    if not tap.requires_grad:
        tap.requires_grad_()  # a stream with no upstream graph: nothing is cut
    return tap, tap.clone()


def update_energy(z, out) -> torch.Tensor | None:
    """``sum_i ||block(z_i) - z_i||^2`` (``None`` when the block changes the shape)."""
    if out.shape != z.shape:
        return None
    return squared_norm(out.detach() - z)


class StreamTaps:
    """Context manager tapping ``candidates`` during every forward of ``model``.

    After a forward: ``taps[name]`` is the tensor to differentiate (gives
    ``q``), ``streams[name]`` the detached stream ``z``, ``updates[name]`` the
    batch's ``sum_i ||block(z_i) - z_i||^2`` for input candidates (``None`` when
    shapes differ).  Call :meth:`clear` between batches.
    """

    def __init__(self, model: nn.Module, candidates: tuple[Candidate, ...]):
        self.model = model
        self.candidates = candidates
        self.handles: list = []
        self.clear()

    def clear(self):
        self.taps: dict[str, torch.Tensor] = {}
        self.streams: dict[str, torch.Tensor] = {}
        self.updates: dict[str, torch.Tensor | None] = {}

    def _record(self, name, z):
        if name in self.taps:
            raise RuntimeError(f"candidate {name!r} ran twice in one forward pass; candidates must run once")
        tap, passed = _tap(z)
        self.taps[name] = tap
        self.streams[name] = z.detach()
        return passed

    def _input_hook(self, name):
        def hook(module, args, kwargs):
            return with_stream(args, kwargs, self._record(name, get_stream(args, kwargs)))

        return hook

    def _update_hook(self, name):
        def hook(module, args, kwargs, output):
            with torch.no_grad():
                self.updates[name] = update_energy(self.streams[name], get_output(output))

        return hook

    def _output_hook(self, name):
        def hook(module, args, output):
            return with_output(output, self._record(name, get_output(output)))

        return hook

    def __enter__(self):
        modules = dict(self.model.named_modules())
        try:
            for c in self.candidates:
                module = modules[c.module]
                if c.position == "input":
                    self.handles.append(module.register_forward_pre_hook(self._input_hook(c.name), with_kwargs=True))
                    self.handles.append(module.register_forward_hook(self._update_hook(c.name), with_kwargs=True))
                else:
                    self.handles.append(module.register_forward_hook(self._output_hook(c.name)))
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.clear()

    def __exit__(self, *exc):
        self.remove()
        return False
