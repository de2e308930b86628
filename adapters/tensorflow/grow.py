"""``grow``: a functional Keras model with a gradient-matched block inserted at a candidate.

The block is ``h(z) = V psi(z)`` with the probe's feature map ``psi`` and
``V = -alpha C K^+`` (:func:`satcore.plan_insertion`), the least-squares fit of
``-alpha q`` (paper's Appendix H).  It outputs ``-alpha (Pi q)_i``, so the
first-order change of the mean per-sample loss on the probe data is
``-alpha * growth_value^2`` (docs/core.md, Gradient-matched insertion).
``rho`` gives the step as the relative size of the inserted update,
``||h||_S / ||z||_S = rho``, with the stream RMS the probe records;
``zero=True`` inserts ``V = 0`` (the paper's Growth arm, for continued
training: its predicted change is 0 and its gradient is ``C``).

The copy is the functional graph rebuilt by ``keras.models.clone_model`` with
the original's weights copied in, every consumer of the candidate tensor ``z``
reading ``z + V psi(z)`` from an :class:`InsertedResidual` layer, which
``model.save`` / ``keras.models.load_model`` round-trip.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from satcore import DEFAULT_RTOL, InputError
from satcore.adapters.insertion import Grown, insertion_step
from satcore.adapter_api import family_spec, rebuild_family
from satcore import plan_insertion

from .features import family_features
from .locate import is_functional


@keras.saving.register_keras_serializable(package="satcore")
class InsertedResidual(keras.layers.Layer):
    """``z -> z + V psi(z)`` with ``psi`` the seeded family ``family`` and ``V`` a trainable weight.

    ``family``: the probe's record of a built-in family (``kind``, ``width``,
    ``n_features``, ``seed`` and, for ``mlp``, ``init_std``), from which
    :func:`satcore.make_family` redraws the same weights.  ``psi`` and ``V psi``
    are computed in float64 (``psi`` equals the core's ``Family.features``) and
    the update is cast to the dtype of ``z``; ``V`` (``N x r``, float64) starts
    at zero, so the layer is the identity until ``V`` is assigned.
    """

    def __init__(self, family: dict, **kwargs):
        super().__init__(**kwargs)
        self.family_record = dict(family)
        self.family = rebuild_family(family)

    def build(self, input_shape):
        self.projection = self.add_weight(name="projection", shape=(self.family.width, self.family.n_features),
                                          initializer="zeros", dtype="float64", autocast=False)

    def call(self, z):
        psi = family_features(self.family, z)  # (M, T, r), positions as the probe laid them out
        update = tf.einsum("mtr,nr->mtn", psi, tf.convert_to_tensor(self.projection))
        return z + tf.cast(tf.reshape(update, tf.shape(z)), z.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "family": self.family_record}


def require_functional(model, by: str) -> None:
    """Refuse, naming ``by``, a model whose graph :func:`grow` cannot rebuild (a Sequential or subclassed one)."""
    if not is_functional(model):
        raise InputError(f"{by}: grow needs a functional Keras model; {type(model).__name__} is not one (a subclassed "
                         "model's graph cannot be rebuilt; a Sequential's can: keras.Model(model.inputs, "
                         "model.outputs))")


def _refuse_unless_growable(model, result, at):
    require_functional(model, "model")
    if result.meta.get("framework") != "tensorflow" or at not in result.statistics:
        raise InputError(f"at: unknown candidate {at!r}; the TensorFlow probe result has {list(result.statistics)}")
    family = result.meta["family"][at]
    if family["kind"] == "user" or family.get("given"):
        raise InputError(f"at={at!r}: grow rebuilds the probe's own seeded family (family='auto' or a kind), "
                         f"not a {'user feature map' if family['kind'] == 'user' else 'Family object'}")
    if family_spec(family["kind"]).takes_init_std and "init_std" not in family:  # written before it was recorded
        raise InputError(f"at={at!r}: this probe result does not record the {family['kind']} family's init_std, so its "
                         "psi cannot be redrawn; probe the model again")
    tap = result.meta["taps"][at]
    if tap["position"] != "model_input":
        top = {layer.name: layer for layer in model.layers}
        if tap["layer"] not in top or len(top[tap["layer"]]._inbound_nodes) != 1:
            raise InputError(f"at={at!r}: layer {tap['layer']!r} is not a layer called once at the top level of "
                             f"{model.name!r}; grow inserts only there")
    return family, tap


def grow(model, result, at: str, *, alpha=None, rho=None, zero: bool = False, rtol=DEFAULT_RTOL) -> Grown:
    """A new functional model: ``model`` with ``z -> z + V psi(z)`` at candidate ``at`` of ``result``.

    Parameters
    ----------
    model : keras.Model
        The functional model ``result`` was probed on (unchanged; its weights are copied).
    result : ProbeResult
        What :func:`satcore.adapters.tensorflow.probe` returned for ``model``.
    at : str
        The candidate.
    alpha, rho, zero
        Exactly one: the absolute step ``alpha``; ``rho``, the relative update size
        ``||h||_S / ||z||_S`` (``alpha = rho ||z||_S / V``); or ``zero=True`` for ``V = 0``.
        With ``alpha=0`` or ``zero=True`` the copy computes the original's outputs.
    rtol : float, optional
        Relative eigenvalue cut of ``K``.

    Returns
    -------
    Grown
        ``model`` (the new model), ``predicted_change`` (``-alpha V^2`` on the probe data;
        0 for ``zero=True``) and ``alpha``.

    References
    ----------
    Paper, Appendix H; docs/core.md, Gradient-matched insertion.
    """
    family, tap = _refuse_unless_growable(model, result, at)
    stats = result.statistics[at]
    alpha = insertion_step(stats, result.statistics.stream_rms(result.meta).get(at), alpha, rho, zero, rtol)
    plan = plan_insertion(stats, alpha, rtol=rtol)
    taken, name, k = {layer.name for layer in model.layers}, f"grow_{at}", 0
    while name in taken:
        k += 1
        name = f"grow_{at}_{k}"
    blocks = []

    def block(z):
        blocks.append(InsertedResidual(family, name=name, dtype=z.dtype))
        return blocks[-1](z)

    def call_function(layer, *args, **kwargs):
        if layer.name != tap["layer"]:
            return layer(*args, **kwargs)
        if tap["position"] == "input":
            return layer(block(args[0]), *args[1:], **kwargs)
        return block(layer(*args, **kwargs))

    if tap["position"] == "model_input":
        # every consumer of a model input reads it: the clone runs nested on the grown input
        inputs = [keras.Input(batch_shape=x.shape, dtype=x.dtype, name=x.name) for x in model.inputs]
        clone = keras.models.clone_model(model)
        grown_inputs = [block(x) if index == tap.get("input_index", 0) else x for index, x in enumerate(inputs)]
        expanded = keras.Model(inputs if len(inputs) > 1 else inputs[0],
                               clone(grown_inputs if len(inputs) > 1 else grown_inputs[0]), name=model.name)
        copies = clone
    else:
        expanded = copies = keras.models.clone_model(model, call_function=call_function)
    if len(blocks) != 1:
        raise InputError(f"at={at!r}: the tapped tensor was reached {len(blocks)} times while rebuilding {model.name!r}")
    for layer in model.layers:
        if layer.weights:  # clones keep the layer names (input layers get new ones, and hold no weights)
            copies.get_layer(layer.name).set_weights(layer.get_weights())
    blocks[0].projection.assign(np.zeros_like(plan.projection) if zero else plan.projection)
    return Grown(expanded, 0.0 if zero else plan.predicted_change, alpha)
