"""``grow``: insert a gradient-matched residual block before a candidate (Appendix H).

The inserted block is ``h(z) = V psi(z)`` with the probe's feature map and
``V = -alpha C K^+`` (:func:`satcore.plan_insertion`): the least-squares fit
of ``-alpha q``.  It outputs ``-alpha (Pi q)_i``, so the first-order change of
the mean per-sample loss on the probe data is ``-alpha * growth_value^2``
(docs/core.md, Gradient-matched insertion).  ``rho`` gives the step as the relative size of the
inserted update, ``||h||_S / ||z||_S = rho``, converted by
:func:`satcore.alpha_for_relative_update` with the probe's stream RMS; an
absolute ``alpha`` means nothing across models.  ``zero=True`` inserts the
zero-output block (``V = 0``) of the paper's Growth arm for continued
training; its predicted change is 0 and its gradient is ``C``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from satcore import DEFAULT_RTOL, InputError
from satcore.adapters.insertion import Grown, insertion_step
from satcore.adapter_api import family_spec, registered_families
from satcore import plan_insertion

from .capture import get_output, get_stream, with_output, with_stream
from .features import ResidualBranch


class InsertedResidual(nn.Module):
    """``block`` with ``z -> z + branch(z)`` applied to its input (or, for ``head``, its output).

    At a ``sequence_first`` candidate (``(T, B, d)`` stream) the branch sees
    ``z`` batch-first, as the probe that fitted it did.  Attributes not found
    here are looked up on ``block``, so code that reads a wrapped layer's
    attributes keeps working.
    """

    def __init__(self, block: nn.Module, branch: nn.Module, position: str = "input", sequence_first: bool = False):
        super().__init__()
        self.block, self.branch, self.position, self.sequence_first = block, branch, position, sequence_first

    def _add_branch(self, z):
        if self.sequence_first:
            return z + self.branch(z.transpose(0, 1)).transpose(0, 1)
        return z + self.branch(z)

    def forward(self, *args, **kwargs):
        if self.position == "input":
            args, kwargs = with_stream(args, kwargs, self._add_branch(get_stream(args, kwargs)))
            return self.block(*args, **kwargs)
        out = self.block(*args, **kwargs)
        return with_output(out, self._add_branch(get_output(out)))

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("block"), name)


def grow(model: nn.Module, result, at: str, *, alpha=None, rho=None, zero: bool = False, rtol=DEFAULT_RTOL) -> Grown:
    """A deep copy of ``model`` with a residual block inserted at candidate ``at``.

    Exactly one of ``alpha`` (absolute step), ``rho`` (relative update size)
    or ``zero=True``.  With ``alpha=0`` or ``zero=True`` the copy's outputs are
    bit-identical to the original's.
    """
    if at not in result.statistics:
        raise InputError(f"at: unknown candidate {at!r}; the probe has {list(result.statistics)}")
    kind = getattr(result.families.get(at), "kind", None)
    if kind in registered_families() and not family_spec(kind).drawn:  # built from the model: 'native'
        raise InputError(f"{at}: a {kind!r} probe's block is inserted by insert_block(model, {at!r}, seed=...), "
                         "not by grow()")
    stats = result.statistics[at]
    alpha = insertion_step(stats, result.diagnostics[at].stream_rms, alpha, rho, zero, rtol)
    plan = plan_insertion(stats, alpha, rtol=rtol)
    candidate = next(c for c in result.candidates if c.name == at)
    expanded = insert_branch(model, candidate, result.families[at], None if zero else plan.projection)
    return Grown(expanded, 0.0 if zero else plan.predicted_change, alpha)


def insert_branch(model: nn.Module, candidate, features, projection=None) -> nn.Module:
    """A deep copy of ``model`` with ``z -> z + V psi(z)`` at ``candidate`` (a :class:`~.locate.Candidate`):
    ``psi`` a copy of the feature map ``features``, ``V`` the ``N x r`` array ``projection``, or zeros
    (``None``: the zero-output block, whose copy computes what ``model`` does)."""
    expanded = copy.deepcopy(model)
    block = expanded.get_submodule(candidate.module)
    reference = next(iter(block.parameters()), None)
    reference = next(expanded.parameters()) if reference is None else reference
    if projection is None:
        projection = torch.zeros(features.width, features.n_features, dtype=reference.dtype, device=reference.device)
    projection = torch.as_tensor(projection, dtype=reference.dtype, device=reference.device)
    features = copy.deepcopy(features).to(dtype=reference.dtype, device=reference.device)
    wrapper = InsertedResidual(block, ResidualBranch(features, projection), candidate.position,
                               candidate.sequence_first)
    parent_name, _, child = candidate.module.rpartition(".")
    setattr(expanded.get_submodule(parent_name), child, wrapper)
    return expanded
