"""Hooks that tap the residual stream and its per-sample gradient.

At a candidate the hook replaces the stream tensor ``z`` by two fresh copies:
``tap = z.clone()`` (kept, never shown to the model) and ``tap.clone()``
(handed on).  Clones are identities for values and gradients, so outputs and
parameter gradients are unchanged; because the model never sees ``tap``,
in-place operations inside the block cannot rebase it, and
``autograd.grad(loss, tap)`` is exactly ``d loss / d z`` at the insertion
point (the gradient through the block's skip and branch, nothing else).
Forward pre-hooks use ``with_kwargs=True`` so blocks called with keyword
streams (``hidden_states=...``) work.  The streams and gradients handed out
are batch-first: at a ``sequence_first`` candidate (``(T, B, d)``, see
:mod:`.locate`) they are transposed views, so dim 0 is always the sample.
Hooks live only inside the :class:`StreamTaps` context and are removed on
exit, also on exceptions.
"""

from __future__ import annotations

import torch
from torch import nn

from satcore import ProbeError

from .locate import Candidate
from .masks import applies, drop_absent
from .moments import squared_norm

STREAM_KWARGS = ("hidden_states", "x", "input", "src", "inputs_embeds")


def stream_argument(args, kwargs):
    """Where the residual stream is among a block's arguments: ``(0, None)`` or ``(None, key)``."""
    if args and torch.is_tensor(args[0]):
        return 0, None
    for key in STREAM_KWARGS:
        if torch.is_tensor(kwargs.get(key)):
            return None, key
    raise ProbeError("cannot find the residual stream: no positional tensor and none of " + ", ".join(STREAM_KWARGS))


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


def update_energy(z, out, keep) -> torch.Tensor | None:
    """``sum_i ||block(z_i) - z_i||^2`` over the positions ``keep`` marks as data where it
    :func:`~.masks.applies` (``None`` when the block changes the shape)."""
    if out.shape != z.shape:
        return None
    update = out.detach() - z
    return squared_norm(drop_absent(update, keep) if applies(keep, z) else update)


class StreamTaps:
    """Context manager tapping ``candidates`` during every forward of ``model``.

    After a forward: ``taps[name]`` is the tensor to differentiate (in the
    model's layout; :meth:`gradients` gives ``q`` batch-first),
    ``streams[name]`` the detached stream ``z`` batch-first, ``updates[name]``
    the batch's ``sum_i ||block(z_i) - z_i||^2`` for input candidates (``None``
    when shapes differ).  Call :meth:`clear` between batches, with the batch's
    padding mask (:mod:`.masks`) if it has one.
    """

    def __init__(self, model: nn.Module, candidates: tuple[Candidate, ...]):
        self.model = model
        self.candidates = candidates
        self.by_name = {c.name: c for c in candidates}
        self.handles: list = []
        self.clear()

    def clear(self, keep: torch.Tensor | None = None):
        self.keep = keep
        self.taps: dict[str, torch.Tensor] = {}
        self.streams: dict[str, torch.Tensor] = {}
        self.updates: dict[str, torch.Tensor | None] = {}
        self.calls: dict[str, tuple] = {}  # the (args, kwargs) each candidate's module was called with

    def batch_first(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """``x``, a tensor in candidate ``name``'s layout, with the samples in dim 0."""
        if not self.by_name[name].sequence_first:
            return x
        if x.dim() != 3:
            raise ProbeError(
                f"candidate {name!r} reads (T, B, d) (batch_first=False) but its stream has shape {tuple(x.shape)}"
            )
        return x.transpose(0, 1)

    def gradients(self, total: torch.Tensor, names) -> list[torch.Tensor]:
        """``d total / d z`` at each of ``names``, batch-first (zeros where ``total`` does not reach)."""
        grads = torch.autograd.grad(total, [self.taps[n] for n in names], allow_unused=True)
        return [
            torch.zeros_like(self.streams[n]) if g is None else self.batch_first(n, g) for n, g in zip(names, grads)
        ]

    def _record(self, name, z):
        if name in self.taps:
            raise ProbeError(f"candidate {name!r} ran twice in one forward pass; candidates must run once")
        if not z.is_floating_point():
            side = "input" if self.by_name[name].position == "input" else "output"
            raise ProbeError(
                f"candidate {name!r}: its {side} is a {z.dtype} tensor, not a floating-point activation; "
                "name a module that reads the residual stream"
            )
        tap, passed = _tap(z)
        self.taps[name] = tap
        # the tap's values, not z itself: nothing here keeps the block's input past the block
        self.streams[name] = self.batch_first(name, tap.detach())
        return passed

    def _input_hook(self, name):
        def hook(module, args, kwargs):
            passed = self._record(name, get_stream(args, kwargs))
            # the call's other arguments (a feature map that reads them puts its own stream in)
            self.calls[name] = with_stream(args, kwargs, self.taps[name].detach())
            return with_stream(args, kwargs, passed)

        return hook

    def _update_hook(self, name):
        def hook(module, args, kwargs, output):
            with torch.no_grad():
                self.updates[name] = update_energy(self.streams[name], self.batch_first(name, get_output(output)),
                                                   self.keep)

        return hook

    def _output_hook(self, name):
        def hook(module, args, kwargs, output):
            self.calls[name] = (args, kwargs)
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
                    self.handles.append(module.register_forward_hook(self._output_hook(c.name), with_kwargs=True))
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
