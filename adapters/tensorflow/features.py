"""TensorFlow feature maps of the candidate families, with the core's seeded weights.

Built-in families take their weights from :func:`satcore._formulas.families.make_family`
(the draw every framework uses) and compute in float64, so ``psi`` equals the
NumPy reference ``Family.features`` to round-off.  Keras is channels-last: a
4-d stream is ``(M, H, W, C)``; :func:`positions` views it as ``(M, H*W, C)``
(pixels row-major), which is the core's layout of ``Q`` for a conv candidate,
and ``conv`` features are the 3x3 patches in PyTorch ``unfold`` column order
``c*9 + ki*3 + kj`` (docs/core.md, Feature families), so scores match channels-first frameworks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from satcore.adapters.options import builtin_kind, family_record
from satcore import Family, InputError, ProbeError, make_family
from satcore.adapter_api import family_builder, family_spec, register_builder


def positions(z):
    """``(M, N) -> (M, 1, N)``; ``(M, T, N)`` unchanged; ``(M, H, W, C) -> (M, H*W, C)``.

    The TensorFlow twin of :func:`satcore._formulas.families.positions` (the one layout, docs/core.md,
    Conventions): a channels-last map gives the same ``(M, H*W, C)`` positions as the
    core's channels-first one, pixels row-major.
    """
    rank = z.shape.rank
    if rank == 2:
        return z[:, None, :]
    if rank == 3:
        return z
    if rank == 4:
        s = tf.shape(z)
        return tf.reshape(z, [s[0], s[1] * s[2], s[3]])
    raise ProbeError(f"a candidate's stream of shape {tuple(z.shape)}: expected (M, N), (M, T, N) or (M, H, W, C)")


def _patches3x3(x):
    """``(M, H, W, C) -> (M, H*W, C*9)`` zero-padded 3x3 patches in ``unfold`` order ``c*9 + ki*3 + kj``."""
    p = tf.image.extract_patches(x, sizes=[1, 3, 3, 1], strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")
    s = tf.shape(x)
    p = tf.reshape(p, [s[0], s[1] * s[2], 3, 3, s[3]])  # TF order: ki, kj, c
    p = tf.transpose(p, [0, 1, 4, 2, 3])
    return tf.reshape(p, [s[0], s[1] * s[2], s[3] * 9])


def _mlp(family: Family, z):
    zp = positions(z)
    mean, var = tf.nn.moments(zp, axes=[-1], keepdims=True)
    h = tf.matmul((zp - mean) / tf.sqrt(var + family.eps), tf.constant(family.params["w1"].T))
    if family.activation == "gelu":  # exact erf GELU; tf.nn.gelu rounds sqrt(2) to float32
        return 0.5 * h * (1.0 + tf.math.erf(h / np.sqrt(2.0)))
    return tf.nn.relu(h)


def _conv(family: Family, z):
    kernel = tf.constant(np.transpose(family.params["conv1"], (2, 3, 1, 0)))  # (3, 3, C, mid)
    pre = tf.nn.conv2d(z, kernel, strides=1, padding="SAME")
    # BatchNorm in identity mode: running mean 0, running var 1, unit affine
    mid = tf.nn.relu(pre / np.sqrt(1.0 + family.eps))
    return _patches3x3(mid)


for _kind, _builder in (("mlp", _mlp), ("conv", _conv), ("linear", lambda family, z: positions(z)),
                        ("bias", lambda family, z: tf.ones_like(positions(z)[:, :, :1]))):
    register_builder("tensorflow", _kind, _builder)


def family_features(family: Family, z):
    """``Family.features`` in TF (float64) for a channels-last ``z``: the TensorFlow builder registered
    for ``family.kind`` (:func:`satcore._formulas.families.register_builder`), ``builder(family, z) -> (M, T, r)``
    with ``z`` already float64."""
    return family_builder("tensorflow", family.kind)(family, tf.cast(z, tf.float64))


@dataclass(frozen=True)
class FeatureMap:
    """``psi`` of one candidate: a seeded :class:`Family` or a user Keras layer / callable.

    ``init_std``: the ``mlp`` weight scale the probe drew the family with (``None``: the
    default ``width^-1/2``), recorded so that ``grow`` redraws the same weights; ``given``: the
    family was passed as a :class:`Family` object, whose draw the record does not pin down.
    """

    family: Family | None
    user: object = None
    init_std: float | None = None
    given: bool = False

    def __call__(self, z):
        if self.user is None:
            return family_features(self.family, z)
        psi = tf.cast(self.user(z), tf.float64)
        return positions(psi)

    def describe(self) -> dict:
        if self.family is None:
            return {"kind": "user", "layer": getattr(self.user, "name", type(self.user).__name__)}
        record = family_record(self.family)
        if self.given:
            record["given"] = True
        elif family_spec(self.family.kind).takes_init_std:
            record["init_std"] = self.init_std
        return record


def feature_map(spec, z, *, seed: int = 0, init_std: float | None = None, n_features: int | None = None) -> FeatureMap:
    """Resolve ``"auto"`` (``conv`` for 4-d streams, else ``mlp``), a kind, a Family or a Keras layer
    (``n_features``: a built-in kind's ``r``, as ``make_family`` takes it)."""
    width = int(z.shape[-1])
    if isinstance(spec, Family):
        if spec.width != width:
            raise InputError(f"family: the Family's width {spec.width} does not match the stream's {width}")
        return FeatureMap(spec, given=True)
    if callable(spec):
        return FeatureMap(None, spec)
    kind = builtin_kind(spec, tuple(z.shape), image_layout="(M, H, W, C)", others="pass a Keras layer")
    family_builder("tensorflow", kind)  # a kind with no TensorFlow feature map is refused here, not per batch
    init_std = init_std if family_spec(kind).takes_init_std else None
    return FeatureMap(make_family(kind, width, seed=seed, init_std=init_std, n_features=n_features), init_std=init_std)
