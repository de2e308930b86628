"""The core growth loop on a functional Keras model (float64 residual MLP, sklearn digits).

Against independent references: each insertion is a zero block (the grown model's outputs equal
the old one's bit for bit, the logged training loss right after insertion equals the one before);
the block is the probed family's (the gradient of the mean probe loss w.r.t. its ``V`` at zero,
by ``tf.GradientTape``, equals the probe's ``C`` at the round's seed); a harm beyond noise is
rolled back to the model before the round; a killed run resumes to the uninterrupted log and
weights; a weights file of another model is refused naming the file.
"""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from sklearn.datasets import load_digits  # noqa: E402

from satcore import GrowthBudget, GrowthCriteria, GrowthLogError, GrowthOptions, read_growth_log  # noqa: E402
from satcore.adapters.tensorflow import InsertedResidual, ProbeConfig, grow_until_saturated, probe  # noqa: E402
from satcore.adapters.tensorflow.growth import load_weights, save_weights  # noqa: E402

F64 = "float64"
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None, dtype=F64)


def residual_mlp():
    x = keras.Input((64,), dtype=F64)
    h = keras.layers.Dense(16, dtype=F64, name="stem")(x)
    for k in range(2):
        f = keras.layers.Dense(16, dtype=F64, name=f"fc2_{k}")(
            keras.layers.Dense(32, activation="tanh", dtype=F64, name=f"fc1_{k}")(h))
        h = keras.layers.Add(dtype=F64, name=f"add{k}")([h, f])
    return keras.Model(x, keras.layers.Dense(10, dtype=F64, name="head")(h), name="residual_mlp")


def digits():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y


def train(model, round_index):
    """A few Adam steps on the training digits, seeded by the round (deterministic)."""
    keras.utils.set_random_seed(100 + round_index)
    X, y = digits()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    model.fit(X[:512], y[:512], batch_size=64, epochs=1, verbose=0, shuffle=False)
    return model


@pytest.fixture(scope="module")
def setup():
    keras.utils.set_random_seed(0)
    X, y = digits()
    model = train(residual_mlp(), 0)
    probe_data = [(X[1000 + 32 * b: 1032 + 32 * b], y[1000 + 32 * b: 1032 + 32 * b]) for b in range(16)]
    heldout = [(X[1550 + 60 * b: 1610 + 60 * b], y[1550 + 60 * b: 1610 + 60 * b]) for b in range(4)]
    return model, probe_data, heldout


def _blocks(model):
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, InsertedResidual)]


@pytest.mark.slow
def test_keras_grows_with_zero_blocks_of_the_probed_family(setup):
    model, probe_data, heldout = setup
    result = grow_until_saturated(model, lambda m, k: m, probe_data, LOSS, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=1), probe=ProbeConfig(family="mlp")))
    (r,) = result.rounds
    assert r.inserted_at in ("add0", "add1") and r.inserted_block["family"]["kind"] == "mlp"
    assert result.depth == 3 and len(_blocks(result.model)) == 1
    X = np.concatenate([b[0] for b in probe_data])
    y = np.concatenate([b[1] for b in probe_data])
    np.testing.assert_array_equal(result.model(X).numpy(), model(X).numpy())
    (block,) = _blocks(result.model)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(LOSS(y, result.model(X, training=False)))
    gradient = tape.gradient(loss, block.projection).numpy()
    reference = probe(model, probe_data, LOSS, family="mlp", seed=r.seed)
    C = reference.statistics[r.inserted_at].cross_gradient()
    assert gradient == pytest.approx(C, rel=1e-9, abs=1e-12 * abs(C).max())


@pytest.mark.slow
def test_keras_loop_trains_guards_and_resumes(setup, tmp_path):
    model, probe_data, heldout = setup
    def kw(log_path):
        return dict(heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=2),
                                                                guard=None, probe=ProbeConfig(family="mlp"),
                                                                log_path=log_path))

    whole = grow_until_saturated(model, train, probe_data, LOSS, **kw(tmp_path / "w.jsonl"))
    assert [r.inserted_at is not None for r in whole.rounds] == [True, True]
    for r in whole.rounds:
        assert r.loss_after_insert == pytest.approx(r.train_loss_before, rel=1e-13)
    assert (tmp_path / "w.jsonl.round1.npz").is_file()

    def die(m, k):
        if k == 1:
            raise KeyboardInterrupt
        return train(m, k)

    with pytest.raises(KeyboardInterrupt):
        grow_until_saturated(model, die, probe_data, LOSS, **kw(tmp_path / "p.jsonl"))
    resumed = grow_until_saturated(model, train, probe_data, LOSS, **kw(tmp_path / "p.jsonl"))
    drop = ("probe_seconds", "train_seconds")
    logs = [[{k: v for k, v in r.to_dict().items() if k not in drop} for r in read_growth_log(p).rounds]
            for p in (tmp_path / "w.jsonl", tmp_path / "p.jsonl")]
    assert logs[0] == logs[1]
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(GrowthLogError, match=r"w\.jsonl\.round1\.npz: array"):
        load_weights(other, str(tmp_path / "w.jsonl.round1.npz"))


def _harm(model, round_index):
    for block in _blocks(model):
        rng = np.random.default_rng(round_index)
        block.projection.assign(rng.normal(size=block.projection.shape))
    return model


def test_keras_harm_beyond_noise_is_rolled_back(setup, tmp_path):
    model, probe_data, heldout = setup
    result = grow_until_saturated(model, _harm, probe_data, LOSS, heldout_data=heldout, options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=3), probe=ProbeConfig(family="mlp")))
    (r,) = result.rounds
    assert r.rolled_back and result.stop_reason == "heldout_knee" and result.depth == 2
    assert r.heldout_change > 1.6448536269514722 * r.heldout_change_se > 0
    assert result.model is model and not _blocks(result.model)


def test_keras_weights_round_trip(tmp_path):
    model = residual_mlp()
    path = str(tmp_path / "w.npz")
    save_weights(model, path)
    fresh = residual_mlp()
    load_weights(fresh, path)
    for a, b in zip(model.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_keras_heldout_split_of_the_probes_own_batches_warns_once(setup):
    """As torch's (tests/test_torch_growth_generic.py): ``heldout_data`` holding ``probe_data``'s batches makes the
    guard read the data each round's place was chosen on; one ``UserWarning`` per run at the caller's line, none
    for other batches."""
    import warnings

    model, probe_data, heldout = setup
    says = "heldout_data holds the same batches as probe_data"
    options = GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=2), probe=ProbeConfig(family="mlp"))
    with pytest.warns(UserWarning, match=says) as caught:
        grow_until_saturated(model, lambda m, k: m, probe_data, LOSS, heldout_data=list(probe_data), options=options)
    assert [w.filename for w in caught if says in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=says)
        grow_until_saturated(model, lambda m, k: m, probe_data, LOSS, heldout_data=heldout,
                             options=GrowthOptions(GrowthCriteria(tolerance=0.0), GrowthBudget(max_rounds=0)))


@pytest.mark.parametrize("split, spent", [("probe_data", True), ("heldout_data", False)])
def test_keras_loop_refuses_data_it_cannot_read_every_round(setup, split, spent):
    """As torch's: a spent generator (probe_data) or an empty heldout_data is refused before round 1, naming the
    argument; before, the generator gave 'no batches' of no named split and the empty held-out split was taken."""
    from satcore import InputError

    model, probe_data, _ = setup
    value = (batch for batch in probe_data) if spent else []
    if spent:
        list(value)
    trained = []
    expect = "probe_data is a one-shot iterator" if spent else "heldout_data holds no batches"
    with pytest.raises(InputError, match=f"^grow_until_saturated's {expect}"):
        grow_until_saturated(model, lambda m, k: trained.append(k) or m, loss_fn=LOSS,
                             options=GrowthOptions(GrowthCriteria(tolerance=0.0), probe=ProbeConfig(family="mlp")),
                             **{"probe_data": probe_data, split: value})
    assert trained == []
