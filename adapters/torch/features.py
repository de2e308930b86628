"""PyTorch feature maps of the candidate families, with the core's seeded weights.

Each built-in family is built from :func:`satcore._formulas.families.make_family` (the
same ``numpy.random.default_rng(seed)`` draw every framework uses) and its
weights are copied into tensors, so ``features`` here equals
``Family.features`` to float round-off and scores agree across frameworks.

Layouts (docs/core.md, Conventions): the stream ``z`` is ``(M, N)``, ``(M, T, N)`` or
channels-first ``(M, C, H, W)``; :func:`positions` views it as ``(M, T, N)``
(pixels row-major, ``T = H*W``), which is also the layout of ``Q``.  Features
are ``(M, T, r)``.

* ``mlp``: ``psi = act(W1 LN(z))``, LayerNorm with unit gain and zero bias,
  ``W1`` ``(r x N)``, ``r = 4N``.
* ``conv``: ``psi`` = zero-padded 3x3 patches (``F.unfold`` order) of
  ``relu(BN(conv3x3(z)))`` with BN in identity mode (running mean 0, var 1,
  unit affine); the terminal ``V`` is a 3x3 convolution.
* ``linear``: ``psi = z``.  ``bias``: ``psi = 1``.
* ``native``: the inputs of the zeroed terminal maps of the block
  :func:`~.native.insert_block` would insert there (:mod:`.native`, which
  registers it); it needs the model and the candidate, and reads the candidate
  block's other call arguments from ``context``.
* any other registered kind (:func:`satcore._formulas.families.register_family`): the
  torch builder registered for it.
* a user ``nn.Module`` ``f``: ``psi = f(z)`` of shape ``(M, r)`` or ``(M, T, r)``
  with positions in the layout of ``Q``.

Built-in maps compute in the dtype of their weights, which is the stream's but
at least float32 (:func:`build_feature_map`); a user map gets the stream as the
model produced it.

:class:`ResidualBranch` is the block ``h(z) = V psi(z)`` in ``z``'s layout;
``grow`` inserts it, and all its parameters (feature map included) are
ordinary trainable parameters for continued training.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init

from satcore.adapters.options import builtin_kind, family_record
from satcore import ProbeError
from satcore import make_family
from satcore.adapter_api import family_builder, family_spec, register_builder, registered_families

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


def positions(z: torch.Tensor) -> torch.Tensor:
    """``z`` as ``(M, T, N)``: ``(M, N) -> (M, 1, N)``, ``(M, C, H, W) -> (M, H*W, C)``.

    The torch twin of :func:`satcore._formulas.families.positions` (the one layout, docs/core.md,
    Conventions), for tensors that stay on the model's device and in its graph.
    """
    if z.dim() == 2:
        return z[:, None, :]
    if z.dim() == 3:
        return z
    if z.dim() == 4:
        return z.flatten(2).transpose(1, 2)
    raise ValueError(f"stream of shape {tuple(z.shape)}: expected (M, N), (M, T, N) or (M, C, H, W)")


def unpositions(h: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`positions` for a tensor shaped like ``like``."""
    if like.dim() == 4:
        return h.transpose(1, 2).reshape(like.shape)
    return h.reshape(like.shape)


def _tensor(array, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(np.asarray(array), dtype=like.dtype, device=like.device)


class FeatureMap(nn.Module):
    """Base: ``forward(z) -> (M, T, r)``; ``spec`` describes it for dump metadata.

    ``positionwise`` maps say each position's features depend on that
    position only (so positions can be subsampled before computing them).
    Maps with ``reads_context`` (``native``, which runs a block on ``z``) get
    ``context``: the ``(args, kwargs)`` of the candidate block's call in the
    current batch, set by the probe before it computes the batch's features.
    """

    kind = "user"
    positionwise = False
    reads_context = False
    context = None

    def __init__(self, width: int, n_features: int, spec: dict):
        super().__init__()
        self.width, self.n_features, self.spec = width, n_features, spec


class MLPFeatures(FeatureMap):
    kind, positionwise = "mlp", True

    def __init__(self, family, like):
        super().__init__(family.width, family.n_features, family_record(family))
        self.norm = nn.LayerNorm(family.width, eps=family.eps).to(like.dtype).to(like.device)
        # skip_init: the default (Kaiming) draw would be overwritten at once; it cost 1 ms per r x d map
        self.fc = skip_init(nn.Linear, family.width, family.n_features, bias=False, dtype=like.dtype,
                            device=like.device)
        with torch.no_grad():
            self.fc.weight.copy_(_tensor(family.params["w1"], like))
        self.act = ACTIVATIONS[family.activation]()

    def forward(self, z):
        return self.act(self.fc(self.norm(positions(z).to(self.fc.weight.dtype))))


class ConvFeatures(FeatureMap):
    kind = "conv"

    def __init__(self, family, like):
        super().__init__(family.width, family.n_features, family_record(family))
        conv1 = family.params["conv1"]
        self.mid_channels = conv1.shape[0]
        self.conv = skip_init(nn.Conv2d, family.width, self.mid_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(self.mid_channels, eps=family.eps)  # fresh: the identity in eval mode
        self.to(like.dtype).to(like.device)
        with torch.no_grad():
            self.conv.weight.copy_(_tensor(conv1, like))
        self.act = nn.ReLU()

    def hidden(self, z):
        """``relu(BN(conv3x3(z)))``, ``(M, C_mid, H, W)``."""
        return self.act(self.bn(self.conv(z.to(self.conv.weight.dtype))))

    def forward(self, z):
        return F.unfold(self.hidden(z), 3, padding=1).transpose(1, 2)


class LinearFeatures(FeatureMap):
    kind, positionwise = "linear", True

    def __init__(self, family, like):
        super().__init__(family.width, family.n_features, family_record(family))

    def forward(self, z):
        return positions(z)


class BiasFeatures(FeatureMap):
    kind, positionwise = "bias", True

    def __init__(self, family, like):
        super().__init__(family.width, 1, family_record(family))

    def forward(self, z):
        p = positions(z)
        return p.new_ones(p.shape[:2] + (1,))


class UserFeatures(FeatureMap):
    """A user feature map ``f``: ``psi = f(z)``, ``(M, r)`` read as ``(M, 1, r)``."""

    def __init__(self, module: nn.Module, z: torch.Tensor):
        # r from one sample, in eval mode as the probe computes psi (a train-mode BatchNorm refuses one sample)
        training = module.training
        module.eval()
        with torch.no_grad():
            r = _as_positions(module(z[:1]), 1).shape[2]
        module.train(training)
        super().__init__(positions(z).shape[2], r, {"kind": "user", "module": type(module).__name__, "n_features": r})
        self.module = module

    def forward(self, z):
        return _as_positions(self.module(z), z.shape[0])


def _as_positions(psi, m):
    psi = psi[:, None, :] if psi.dim() == 2 else psi
    if psi.dim() != 3 or psi.shape[0] != m:
        raise ProbeError(f"feature map returned shape {tuple(psi.shape)}; expected (M, r) or (M, T, r) with M = {m}")
    return psi




for _kind, _builder in (("mlp", MLPFeatures), ("conv", ConvFeatures), ("linear", LinearFeatures),
                        ("bias", BiasFeatures)):
    register_builder("torch", _kind, _builder)


def build_feature_map(family, z: torch.Tensor, *, seed: int = 0, init_std: float | None = None, model=None,
                      candidate=None, n_features: int | None = None) -> FeatureMap:
    """The feature map for a candidate whose stream looks like ``z``.

    ``family`` is ``"auto"``, a registered kind (:func:`satcore._formulas.families.registered_families`:
    the built-in ``mlp``, ``conv``, ``linear``, ``bias``, and ``native``), or an ``nn.Module``.
    A drawn kind's weights come from ``make_family(kind, width, seed=seed, init_std=init_std)``
    and its torch builder (registered with ``register_builder("torch", kind, builder)``) is
    ``builder(family, like) -> FeatureMap``, ``like`` an empty tensor of the dtype and device to
    compute in; ``init_std`` only concerns kinds that take it (``mlp``: the model's init scale,
    e.g. GPT-2's ``initializer_range``; ``conv`` keeps its He-normal default).  A kind built
    from the model (``native``: needs ``model`` and the :class:`~.locate.Candidate`
    ``candidate``; ``seed`` draws the fresh block as ``insert_block`` does) has the builder
    ``builder(z, seed=, model=, candidate=)``.  ``n_features``: a drawn family's ``r``
    (``make_family``'s), default its own.
    """
    if isinstance(family, nn.Module):
        return UserFeatures(family, z).to(z.device)
    kind = builtin_kind(family, z.shape, others="pass an nn.Module")
    spec, builder = family_spec(kind), family_builder("torch", kind)
    if not spec.drawn:
        return builder(z, seed=seed, model=model, candidate=candidate)
    width = z.shape[1] if z.dim() == 4 else z.shape[-1]
    init_std = init_std if spec.takes_init_std else None
    # half-precision round-off in LayerNorm and W1 moved growth_value by 3% (bfloat16 GPT-2); the
    # stream's values are exact in float32, so half-precision streams get float32 weights
    like = z.new_empty(0, dtype=torch.promote_types(z.dtype, torch.float32))
    family = make_family(kind, width, seed=seed, init_std=init_std, n_features=n_features)
    feature_map = builder(family, like).eval()
    if spec.takes_init_std:
        feature_map.spec["init_std"] = init_std  # None: the family's default width**-0.5
    return feature_map


def rebuildable(record: dict) -> bool:
    """Whether a recorded feature map is a drawn family :func:`rebuild_feature_map` can build again."""
    return record.get("kind") in registered_families() and family_spec(record["kind"]).drawn


def rebuild_feature_map(record: dict, dtype, device) -> FeatureMap:
    """A drawn family's feature map from its ``record`` (as stored in dump metadata)."""
    spec = family_spec(record["kind"])
    shape = (1, record["width"], 1, 1) if spec.images_only else (1, record["width"])
    like = torch.zeros(shape, dtype=dtype, device=device)
    return build_feature_map(record["kind"], like, seed=record["seed"], init_std=record.get("init_std"),
                             n_features=record.get("n_features") if spec.sized != "fixed" else None)


class ResidualBranch(nn.Module):
    """The inserted block ``h(z) = V psi(z)`` in the layout of ``z``.

    ``V`` (``N x r``) is the terminal projection: a bias-free ``Linear`` over
    positions, or for ``conv`` a 3x3 ``Conv2d`` whose weight is ``V`` reshaped
    to ``(C, C_mid, 3, 3)`` (the unfold order of the patches).
    """

    def __init__(self, features: FeatureMap, projection: torch.Tensor):
        super().__init__()
        self.features = features
        if isinstance(features, ConvFeatures):
            self.projection = nn.Conv2d(features.mid_channels, features.width, 3, padding=1, bias=False)
            weight = projection.reshape(features.width, features.mid_channels, 3, 3)
        else:
            self.projection = nn.Linear(features.n_features, projection.shape[0], bias=False)
            weight = projection
        self.projection.to(projection.dtype).to(projection.device)
        with torch.no_grad():
            self.projection.weight.copy_(weight)

    def forward(self, z):
        if isinstance(self.features, ConvFeatures):
            return self.projection(self.features.hidden(z))
        return unpositions(self.projection(self.features(z)), z)
