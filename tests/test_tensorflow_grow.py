"""``satcore.adapters.tensorflow.grow`` on functional Keras models trained a few steps on sklearn digits.

Settings (float64 models, so that round-off does not hide first-order effects): a residual MLP
whose first block's input is the model input (candidate ``model_input``) and whose second is a
layer's output (``mlp`` family), and a residual conv net (``conv`` family, channels-last).
Each is probed with the adapter's ``probe``; then, against independent references:

* ``zero=True`` and ``alpha=0`` give the original's outputs bit for bit;
* the measured change of the mean loss on the probe data at ``rho`` 1e-4 and 1e-3 equals the
  predicted ``-alpha V^2`` to 1% (its second-order error is ``O(rho)``);
* the gradient of the mean loss w.r.t. the inserted ``V`` at ``V = 0`` (``tf.GradientTape``)
  equals the probe's ``C``;
* ``model.save`` / ``keras.models.load_model`` give the same outputs and ``V``;
* the original model is unchanged and shares no weights; bad requests are refused;
* a float32 model at a named layer's input: the same, and one full-batch SGD step of ``fit``
  moves the zero block's ``V`` to ``-lr C``.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sklearn.datasets import load_digits  # noqa: E402

from satcore import InputError, growth_value_from_moments, make_family  # noqa: E402
from satcore.adapters.tensorflow import InsertedResidual, grow, probe  # noqa: E402

F64 = "float64"
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None, dtype=F64)


def residual_mlp():
    x = keras.Input((64,), dtype=F64)
    f = keras.layers.Dense(64, dtype=F64, name="fc2_0")(keras.layers.Dense(32, activation="relu", dtype=F64, name="fc1_0")(x))
    h = keras.layers.Dense(16, dtype=F64, name="stem")(keras.layers.Add(dtype=F64, name="add0")([x, f]))
    f = keras.layers.Dense(16, dtype=F64, name="fc2_1")(keras.layers.Dense(32, activation="relu", dtype=F64, name="fc1_1")(h))
    h = keras.layers.Add(dtype=F64, name="add1")([h, f])
    return keras.Model(x, keras.layers.Dense(10, dtype=F64, name="head")(h), name="residual_mlp")


def residual_conv():
    x = keras.Input((8, 8, 1), dtype=F64)
    h = keras.layers.Conv2D(4, 3, padding="same", dtype=F64, name="stem")(x)
    f = keras.layers.Conv2D(4, 3, padding="same", activation="relu", dtype=F64, name="conv1")(h)
    f = keras.layers.Conv2D(4, 3, padding="same", dtype=F64, name="conv2")(f)
    h = keras.layers.Add(dtype=F64, name="add0")([h, f])
    h = keras.layers.GlobalAveragePooling2D(dtype=F64, name="pool")(h)
    return keras.Model(x, keras.layers.Dense(10, dtype=F64, name="head")(h), name="residual_conv")


SETTINGS = {"mlp": (residual_mlp, (64,), "mlp"), "conv": (residual_conv, (8, 8, 1), "conv")}


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def trained(request):
    """``(model, x, y, result)``: the model trained 8 Adam steps, probed on 256 digits in two batches."""
    build, shape, family = SETTINGS[request.param]
    keras.utils.set_random_seed(0)
    X, y = load_digits(return_X_y=True)
    X = (X[:256] / 16.0).reshape((-1, *shape))
    y = y[:256]
    model = build()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, y, batch_size=64, epochs=2, verbose=0)
    result = probe(model, [(X[:128], y[:128]), (X[128:], y[128:])], LOSS, family=family)
    return model, X, y, result


def mean_loss(model, X, y) -> float:
    return float(tf.reduce_mean(LOSS(y, model(X, training=False))))


def inserted(grown) -> InsertedResidual:
    (block,) = [layer for layer in grown._flatten_layers(include_self=False) if isinstance(layer, InsertedResidual)]
    return block


def test_probe_records_what_grow_needs(trained):
    model, X, _, result = trained
    names = list(result.statistics)
    assert names == (["add0", "add1"] if model.name == "residual_mlp" else ["add0"])
    if model.name == "residual_mlp":
        assert result.meta["taps"]["add0"] == {"layer": None, "position": "model_input", "input_index": 0}
        rms = np.sqrt(np.mean(np.sum(X**2, axis=1)))  # ||z||_S of the model-input candidate
        assert result.dump_meta()["diagnostics"]["add0"]["stream_rms"] == pytest.approx(rms, rel=1e-12)
        assert result.statistics["add0"].stream_rms() == pytest.approx(rms, rel=1e-12)


@pytest.mark.parametrize("how", [{"zero": True}, {"alpha": 0.0}])
def test_zero_and_alpha_zero_blocks_keep_the_outputs(trained, how):
    model, X, _, result = trained
    before = model(X).numpy()
    for at in result.statistics:
        grown = grow(model, result, at, **how)
        assert grown.predicted_change == 0.0 and grown.alpha == 0.0
        np.testing.assert_array_equal(grown.model(X).numpy(), before)
        assert not np.any(inserted(grown.model).projection.numpy())


@pytest.mark.parametrize("rho", [1e-4, 1e-3])
def test_measured_loss_change_matches_the_prediction(trained, rho):
    model, X, y, result = trained
    base = mean_loss(model, X, y)
    for at in result.statistics:
        grown = grow(model, result, at, rho=rho)
        stats = result.statistics[at]
        growth = growth_value_from_moments(stats.cross_gradient(), stats.feature_gram())
        assert grown.predicted_change == pytest.approx(-grown.alpha * growth**2, rel=1e-9)
        assert grown.predicted_change < 0
        measured = mean_loss(grown.model, X, y) - base
        assert measured == pytest.approx(grown.predicted_change, rel=0.01), (at, rho)
        # the update's relative size is rho: ||h||_S = alpha * growth_value = rho ||z||_S
        assert grown.alpha * growth == pytest.approx(rho * result.diagnostics[at].stream_rms, rel=1e-9)


def test_gradient_at_the_zero_block_is_the_cross_gradient(trained):
    model, X, y, result = trained
    for at in result.statistics:
        grown = grow(model, result, at, zero=True).model
        V = inserted(grown).projection
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(LOSS(y, grown(X, training=False)))
        grad = tape.gradient(loss, V).numpy()
        C = result.statistics[at].cross_gradient()
        np.testing.assert_allclose(grad, C, rtol=1e-9, atol=1e-12 * np.abs(C).max())


def test_save_and_load_round_trip(trained, tmp_path):
    model, X, _, result = trained
    for at in result.statistics:
        grown = grow(model, result, at, rho=1e-3).model
        path = tmp_path / f"grown_{at}.keras"
        grown.save(path)
        loaded = keras.models.load_model(path)
        np.testing.assert_array_equal(loaded(X).numpy(), grown(X).numpy())
        np.testing.assert_array_equal(inserted(loaded).projection.numpy(), inserted(grown).projection.numpy())
        assert not np.array_equal(loaded(X).numpy(), model(X).numpy())


def test_the_original_is_unchanged_and_shares_no_weights(trained):
    model, X, _, result = trained
    before = model(X).numpy()
    grown = grow(model, result, list(result.statistics)[0], rho=1e-3).model
    originals = {id(v) for v in model.weights}
    assert originals.isdisjoint(id(v) for v in grown.weights)
    for v in grown.weights:
        v.assign(tf.zeros_like(v))
    np.testing.assert_array_equal(model(X).numpy(), before)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(10, dtype=F64)

    def call(self, x):
        return self.dense(x)


def test_refusals(trained):
    model, X, y, result = trained
    at = list(result.statistics)[0]
    with pytest.raises(InputError, match="^model: grow needs a functional Keras model; Subclassed is not one"):
        grow(Subclassed(), result, at, zero=True)
    with pytest.raises(InputError, match="^at: unknown candidate 'nowhere'"):
        grow(model, result, "nowhere", zero=True)
    with pytest.raises(InputError, match="^give exactly one of alpha, rho or zero=True"):
        grow(model, result, at, alpha=0.1, rho=1e-3)
    user = probe(model, [(X[:32], y[:32])], LOSS, family=keras.layers.Identity())
    with pytest.raises(InputError, match=f"^at={at!r}: grow rebuilds the probe's own seeded family .* user feature map"):
        grow(model, user, at, zero=True)
    width = result.statistics[at].cross_gradient().shape[0]  # a Family object: its record does not pin psi
    given = probe(model, [(X[:32], y[:32])], LOSS, family={at: make_family("linear", width)})
    with pytest.raises(InputError, match=f"^at={at!r}: .*Family object"):
        grow(model, given, at, zero=True)


def test_float32_model_at_a_named_layer_input_trains_the_inserted_block():
    """A float32 model probed at the input of ``head`` (a named candidate): the zero block keeps
    the outputs bit for bit, ``rho = 1e-3`` changes the loss as predicted (to 1%),
    and ``fit`` moves ``V`` from zero by its gradient ``C``."""
    keras.utils.set_random_seed(1)
    X, y = load_digits(return_X_y=True)
    X, y = (X[:256] / 16.0).astype(np.float32), y[:256]
    x = keras.Input((64,))
    h = keras.layers.Dense(16, activation="relu", name="stem")(x)
    model = keras.Model(x, keras.layers.Dense(10, name="head")(h))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(X, y, batch_size=64, epochs=2, verbose=0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    result = probe(model, [(X, y)], loss, candidates=["head"], family="mlp")
    zero = grow(model, result, "head", zero=True).model
    np.testing.assert_array_equal(zero(X).numpy(), model(X).numpy())
    grown = grow(model, result, "head", rho=1e-3)
    measured = float(np.mean(loss(y, grown.model(X)).numpy(), dtype=np.float64) - np.mean(loss(y, model(X)).numpy(), dtype=np.float64))
    assert measured == pytest.approx(grown.predicted_change, rel=0.01)
    zero.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert any(v is inserted(zero).projection for v in zero.trainable_weights)
    zero.fit(X, y, batch_size=256, epochs=1, verbose=0, shuffle=False)  # one full-batch SGD step
    V = inserted(zero).projection.numpy()
    # the first step on the mean loss moves V = 0 to -lr C
    C = result.statistics["head"].cross_gradient()
    np.testing.assert_allclose(V, -0.1 * C, rtol=1e-4, atol=1e-5 * 0.1 * np.abs(C).max())


class TwoLayers(keras.layers.Layer):
    """A layer with its own sublayers: a candidate inside it is not in the functional graph."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(10, dtype=F64, name="inner")

    def call(self, x):
        return self.inner(x)


def test_a_candidate_inside_a_layer_is_refused():
    x = keras.Input((64,), dtype=F64)
    model = keras.Model(x, TwoLayers(dtype=F64, name="outer")(keras.layers.Dense(8, dtype=F64, name="stem")(x)))
    X, y = load_digits(return_X_y=True)
    result = probe(model, [(X[:16] / 16.0, y[:16])], LOSS, candidates=["inner"], family="linear")
    with pytest.raises(InputError, match="^at='inner': layer 'inner' is not a layer called once at the top level"):
        grow(model, result, "inner", zero=True)
    outer = probe(model, [(X[:16] / 16.0, y[:16])], LOSS, candidates=["outer"], family="linear")
    np.testing.assert_array_equal(grow(model, outer, "outer", zero=True).model(X[:16] / 16.0).numpy(),
                                  model(X[:16] / 16.0).numpy())
