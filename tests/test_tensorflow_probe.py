"""TensorFlow / Keras 3 adapter against independent references.

* feature maps in TF equal the core's NumPy ``Family.features`` (channels-last streams laid
  out like the channels-first core: ``Q`` ``(M, H*W, C)``, patches in ``unfold`` order);
* per-replica moments equal :func:`satcore._statistics.candidate.batch_moments`;
* a subclassed token model probed at named layers (a causal-LM-style loss averaged over
  tokens) equals a per-sample loop of ``tf.GradientTape`` (batch of one), and the functional
  copy of the same model, probed at its automatically found residual ``Add`` layers, agrees;
* NumPy batches into a model whose first candidate is the model input equal ``tf.constant``
  batches and the same per-sample loop;
* a Keras loss with its default (batch-mean) reduction gives the same sums as ``reduction=None``;
* a user Keras layer ``psi = z A`` (invertible ``A``) gives the ``linear`` growth value
  (reparameterisation invariance, docs/core.md identity 3) with a different ``||C||``;
* ``MirroredStrategy`` on 2 logical CPUs (fresh process) equals one device, with per-sample
  losses and with a Keras mean loss over unevenly split batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from satcore import CandidateStatistics, InputError, ProbeError, make_family  # noqa: E402
from satcore.adapters.tensorflow import Candidate, Probe, probe  # noqa: E402

D, T, VOCAB, IN = 8, 5, 7, 3


# -- features and moments -------------------------------------------------------------------
# TF feature maps and replica moments against the NumPy core: tests/test_conformance.py
# (test_feature_maps_equal_the_numpy_family, test_moments_equal_the_core_batch_moments)


# -- a subclassed token model and its functional copy ------------------------------------------
class Block(keras.layers.Layer):
    """Pre-LN residual MLP block ``x + W2 gelu(W1 LN(x))``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ln = keras.layers.LayerNormalization(epsilon=1e-5)
        self.fc1 = keras.layers.Dense(4 * D, activation="gelu")
        self.fc2 = keras.layers.Dense(D)

    def call(self, x):
        return x + self.fc2(self.fc1(self.ln(x)))


class TokenModel(keras.Model):
    def __init__(self):
        super().__init__(name="token_model")
        self.stem = keras.layers.Dense(D, name="stem")
        self.blocks = [Block(name=f"block{i}") for i in range(2)]
        self.head = keras.layers.Dense(VOCAB, name="head")

    def call(self, x):
        h = self.stem(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def functional_copy(sub: TokenModel) -> keras.Model:
    x_in = keras.Input((T, IN))
    h = keras.layers.Dense(D, name="stem")(x_in)
    layers = [("stem", sub.stem)]
    for i, blk in enumerate(sub.blocks):
        ln = keras.layers.LayerNormalization(epsilon=1e-5, name=f"ln{i}")
        fc1 = keras.layers.Dense(4 * D, activation="gelu", name=f"fc1_{i}")
        fc2 = keras.layers.Dense(D, name=f"fc2_{i}")
        h = keras.layers.Add(name=f"add{i}")([h, fc2(fc1(ln(h)))])
        layers += [(f"ln{i}", blk.ln), (f"fc1_{i}", blk.fc1), (f"fc2_{i}", blk.fc2)]
    model = keras.Model(x_in, keras.layers.Dense(VOCAB, name="head")(h))
    layers.append(("head", sub.head))
    for name, source in layers:
        model.get_layer(name).set_weights(source.get_weights())
    return model


def token_loss(y_true, logits):
    return keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)  # (B, T)


@pytest.fixture(scope="module")
def token_setup():
    keras.utils.set_random_seed(0)
    model = TokenModel()
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((b, T, IN)).astype(np.float32), rng.integers(0, VOCAB, (b, T)))
               for b in (6, 4)]
    model(batches[0][0])
    return model, batches


def loop_reference(stem, blocks, head, batches, seed):
    """One sample at a time: ``q_i = d loss_i / d z_i`` at each block input, ``loss_i`` the token mean."""
    stats = [None] * len(blocks)
    for x, y in batches:
        for i in range(len(x)):
            z = stem(x[i : i + 1])
            for k in range(len(blocks)):
                with tf.GradientTape() as tape:
                    tape.watch(z)
                    h = z
                    for b in blocks[k:]:
                        h = b(h)
                    loss_i = tf.reduce_mean(token_loss(y[i : i + 1], head(h)))
                q = tape.gradient(loss_i, z).numpy().astype(np.float64)
                psi = make_family("mlp", z.shape[-1], seed=seed).features(z.numpy())
                if stats[k] is None:
                    stats[k] = CandidateStatistics(q.shape[-1], psi.shape[-1], q.shape[1] if q.ndim == 3 else 1)
                stats[k].update(q, psi)
                z = blocks[k](z)
    return stats


def assert_same(stats, reference, rtol):
    for mine, ref in zip(stats, reference):
        a, b = mine.score(), ref.score()
        assert a.n_samples == b.n_samples
        for field in ("ag", "growth_value", "cross_gradient_norm"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=rtol), field
        np.testing.assert_allclose(mine.cross_gradient(), ref.cross_gradient(), rtol=0,
                                   atol=rtol * np.abs(ref.cross_gradient()).max())
        assert 0.05 < b.realizability < 0.9999


def test_subclassed_named_layers_match_per_sample_loop(token_setup):
    model, batches = token_setup
    result = probe(model, batches, token_loss, candidates=["block0", "block1"], family="mlp", seed=4)
    assert list(result.statistics) == ["block0", "block1"]
    assert result.meta["taps"]["block0"] == {"layer": "block0", "position": "input"}
    reference = loop_reference(model.stem, model.blocks, model.head, batches, seed=4)
    assert_same(list(result.statistics.values()), reference, rtol=1e-5)


def test_functional_copy_found_automatically_agrees(token_setup):
    model, batches = token_setup
    functional = functional_copy(model)
    np.testing.assert_allclose(functional(batches[0][0]).numpy(), model(batches[0][0]).numpy(), atol=1e-6)
    result = probe(functional, batches, token_loss, seed=4)
    assert list(result.statistics) == ["add0", "add1"]
    assert result.meta["taps"]["add0"] == {"layer": "stem", "position": "output"}
    sub = probe(model, batches, token_loss, candidates=["block0", "block1"], family="mlp", seed=4)
    assert_same(list(result.statistics.values()), list(sub.statistics.values()), rtol=1e-6)


def test_batches_of_two_lengths_count_every_row_for_tangent_completeness(token_setup):
    """2 samples of T = 5 and 3 of T = 3: 19 position vectors against r = 4 D = 32 features.  The
    reference for completeness is Thm 2 item 4 (growth value == ag) and the rank of the Gram of the
    per-sample loop's features (of its stacked rows), which sees every sample at its own length."""
    model, _ = token_setup
    rng = np.random.default_rng(8)
    batches = [(rng.standard_normal((b, t, IN)).astype(np.float32), rng.integers(0, VOCAB, (b, t)))
               for b, t in ((2, 5), (3, 3))]
    rows = sum(x.shape[0] * x.shape[1] for x, _ in batches)
    result = probe(model, batches, token_loss, candidates=["block0", "block1"], family="mlp", seed=4)
    reference = loop_reference(model.stem, model.blocks, model.head, batches, seed=4)
    for stats, ref in zip(result.statistics.values(), reference):
        assert stats.n_vectors == ref.n_vectors == rows
        assert stats.n_samples * stats.n_positions != rows  # the first batch's T does not count them
        score = stats.score()
        assert score.feature_rank == np.linalg.matrix_rank(ref.sum_gram) == rows
        assert score.tangent_complete
        assert score.growth_value == pytest.approx(score.ag, rel=1e-6)


def test_output_tap_candidate_equals_next_layer_input(token_setup):
    model, batches = token_setup
    functional = functional_copy(model)
    by_output = probe(functional, batches, token_loss, candidates=[Candidate("s", "stem", "output")], seed=1)
    auto = probe(functional, batches, token_loss, seed=1)
    assert by_output.statistics["s"].score().growth_value == pytest.approx(
        auto.statistics["add0"].score().growth_value, rel=1e-12)


def assert_same_sums(stats, reference, rtol):
    assert stats.n_samples == reference.n_samples
    for field in ("sum_q_sq", "sum_xi_sq", "sum_batch_grad_norm", "sum_cross", "sum_gram", "sum_xtx"):
        np.testing.assert_allclose(getattr(stats, field), getattr(reference, field), rtol=rtol, atol=0, err_msg=field)


@pytest.fixture(scope="module")
def input_skip_setup():
    """``h = x + f0(x)``, ``h + f1(h)``: the first candidate is the model input itself."""
    keras.utils.set_random_seed(1)
    f0 = keras.layers.Dense(D, activation="tanh")
    f1 = keras.layers.Dense(D, activation="tanh")
    head = keras.layers.Dense(VOCAB)
    x_in = keras.Input((D,))
    h = keras.layers.Add(name="add0")([x_in, f0(x_in)])
    model = keras.Model(x_in, head(keras.layers.Add(name="add1")([h, f1(h)])))
    rng = np.random.default_rng(5)
    # more samples than the 4*D mlp features, so the growth value is not ag by tangent completeness
    batches = [(rng.standard_normal((b, D)).astype(np.float32), rng.integers(0, VOCAB, b)) for b in (24, 16)]
    return model, batches, [lambda h: h + f0(h), lambda h: h + f1(h)], head


def test_numpy_batches_tap_the_model_input(input_skip_setup):
    model, batches, blocks, head = input_skip_setup
    from_numpy = probe(model, batches, token_loss, seed=2, variance=True)
    assert from_numpy.meta["taps"]["add0"] == {"layer": None, "position": "model_input", "input_index": 0}
    from_tensors = probe(model, [(tf.constant(x), y) for x, y in batches], token_loss, seed=2, variance=True)
    for name in ("add0", "add1"):
        assert_same_sums(from_numpy.statistics[name], from_tensors.statistics[name], rtol=1e-12)
    reference = loop_reference(tf.convert_to_tensor, blocks, head, batches, seed=2)
    assert_same(list(from_numpy.statistics.values()), reference, rtol=1e-5)


def test_batch_mean_loss_is_rescaled_to_per_sample(token_setup):
    """A Keras loss's default reduction is the batch mean (gradients ``q_i / B``); ``B`` is undone."""
    model, batches = token_setup  # batches of 6 and 4: a wrong or fixed B would show
    kwargs = {"candidates": ["block0", "block1"], "variance": True}
    per_sample = probe(model, batches, keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None),
                       **kwargs)
    mean = probe(model, batches, keras.losses.SparseCategoricalCrossentropy(from_logits=True), **kwargs)
    for name in ("block0", "block1"):
        assert_same_sums(mean.statistics[name], per_sample.statistics[name], rtol=1e-6)


def test_user_keras_layer_is_a_reparameterised_linear_family(token_setup):
    model, batches = token_setup
    rng = np.random.default_rng(9)
    A = rng.standard_normal((D, D)) + 3 * np.eye(D)  # invertible
    user = keras.layers.Dense(D, use_bias=False, dtype="float64")
    user.build((None, T, D))
    user.set_weights([A])
    mapped = probe(model, batches, token_loss, candidates=["block1"], family=user)
    linear = probe(model, batches, token_loss, candidates=["block1"], family="linear")
    a, b = mapped.statistics["block1"].score(), linear.statistics["block1"].score()
    assert mapped.meta["family"]["block1"]["kind"] == "user"
    assert a.growth_value == pytest.approx(b.growth_value, rel=1e-8)
    assert abs(a.cross_gradient_norm / b.cross_gradient_norm - 1) > 1e-2


def test_save_writes_a_dump_that_reads_back(token_setup, tmp_path):
    from satcore._io.dump import read_dump

    model, batches = token_setup
    result = probe(model, batches, token_loss, candidates=["block0", "block1"], variance=True, split="heldout")
    result.save(tmp_path / "tf.npz")
    dump = read_dump(tmp_path / "tf.npz")
    assert dump.meta["framework"] == "tensorflow" and dump.meta["candidates"] == ["block0", "block1"]
    back = dump.statistics()
    for name in ("block0", "block1"):
        a, b = back[name].score(), result.statistics[name].score()
        assert a.growth_value == b.growth_value and a.growth_value_sq_debiased == b.growth_value_sq_debiased


def test_bad_candidates_and_losses(token_setup):
    model, batches = token_setup
    with pytest.raises(ProbeError, match="^model: TokenModel is not a functional Keras model"):
        probe(model, batches, token_loss)
    with pytest.raises(ProbeError, match="^candidates: 'nope': 'nope' is not a layer name"):
        probe(model, batches, token_loss, candidates=["nope"])
    with pytest.raises(ProbeError, match="^candidates is empty"):
        probe(model, batches, token_loss, candidates=[])
    over_batch = lambda y, p: tf.reduce_mean(token_loss(y, p), axis=0)  # noqa: E731  (T,): one per token
    with pytest.raises(ProbeError, match=r"^loss_fn returned shape \(5,\); expected per-sample losses \(6, ...\)"):
        probe(model, batches, over_batch, candidates=["block0"])
    with pytest.raises(ProbeError, match="^loss_fn must return a tensor, got float"):
        probe(model, batches, lambda y, p: 1.0, candidates=["block0"])
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    with pytest.raises(ProbeError, match="^loss_fn sums over the batch"):
        probe(model, batches, summed, candidates=["block0"])


BAD_BATCHES = {
    # name: (the bad batch made from a good (x, y), what the one-line refusal says)
    "a triple": (lambda x, y: (x, y, y), r"^a batch is a pair \(inputs, targets\) or a mapping .* tuple of length 3$"),
    "no labels": (lambda x, y: {"x": x}, r"^batch: a mapping needs the targets under 'labels'"),
    "inputs too wide": (lambda x, y: (np.concatenate([x, x], axis=-1), y),
                        r"^batch 1: the model or loss_fn cannot take it \(ValueError: .*"),
    "text inputs": (lambda x, y: (np.full(x.shape, "word"), y), r"^batch 1: the model or loss_fn cannot take it \("),
    "too few targets": (lambda x, y: (x, y[:-1]), r"^batch 1: the model or loss_fn cannot take it \("),
    "targets past the classes": (lambda x, y: (x, y + VOCAB), r"^batch 1: the model or loss_fn cannot take it \("),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_bad_batch_is_refused_by_name_and_adds_nothing(token_setup, case):
    """Bad shapes, dtypes and missing labels on a real functional Keras model: a one-line ProbeError
    (a satcore error, not Keras's or TensorFlow's), and the probe goes on as if the batch had not come."""
    sub, batches = token_setup
    model = functional_copy(sub)
    make_bad, message = BAD_BATCHES[case]
    clean = Probe(model, token_loss)
    assert [clean.update(batch) for batch in batches] == [6, 4] and clean.batches_done == 2
    state = Probe(model, token_loss)
    assert state.update(batches[0]) == 6
    with pytest.raises(ProbeError, match=message) as refused:
        state.update(make_bad(*batches[1]))
    assert "\n" not in str(refused.value) and state.batches_done == 1
    assert state.update(batches[1]) == 4 and state.batches_done == 2
    for name, stats in state.result().statistics.items():
        expected = clean.result().statistics[name]
        assert stats == expected, name  # the same sums to the bit: the refused batch added nothing


def test_the_other_refusals_name_their_argument(token_setup):
    sub, batches = token_setup
    model = functional_copy(sub)
    with pytest.raises(ProbeError, match="^data: the probe has held no samples yet"):
        Probe(model, token_loss).result()
    with pytest.raises(InputError, match="^family: the Family's width 5 does not match the stream's 8"):
        probe(model, batches, token_loss, family=make_family("mlp", 5))
    from satcore.adapters.tensorflow import KerasCallback
    from satcore.adapters.tensorflow.callbacks import per_sample_loss
    from satcore.adapters.tensorflow.growth import per_sample_losses

    with pytest.raises(InputError, match="^KerasCallback: every_n_epochs must be a positive integer, got 0"):
        KerasCallback(batches, token_loss, every_n_epochs=0)
    with pytest.raises(ProbeError, match="^loss_fn: the model's compiled loss 3 is not one loss"):
        per_sample_loss(3)
    with pytest.raises(ProbeError, match=r"^loss_fn returned a 0-d loss; the growth loop needs per-sample losses"):
        per_sample_losses(model, batches, lambda y, p: tf.reduce_mean(token_loss(y, p)))


# -- tf.distribute ----------------------------------------------------------------------------
MIRRORED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, tensorflow as tf, keras
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from satcore.adapters.tensorflow import probe

    def build():
        keras.utils.set_random_seed(0)
        x = keras.Input((6, 6, 3))
        h = keras.layers.Conv2D(4, 3, padding="same", name="stem")(x)
        b = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(h)
        h = keras.layers.Add(name="add0")([h, keras.layers.Conv2D(4, 3, padding="same")(b)])
        return keras.Model(x, keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(h)))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 6, 6, 3)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    single = probe(build(), tf.data.Dataset.from_tensor_slices((x, y)).batch(8), loss, variance=True)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = build()
    mirrored = probe(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(8), loss, strategy=strategy,
                     variance=True)
    # a Keras mean loss is each replica's mean divided by the replicas; batches of 7 split unevenly
    mean_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    mirrored_mean = probe(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(7), mean_loss,
                          strategy=strategy, variance=True)
    out = {"replicas": mirrored.meta["replicas"]}
    for name, res in (("single", single), ("mirrored", mirrored), ("mirrored_mean", mirrored_mean)):
        s = res.statistics["add0"]
        out[name] = {"n": s.n_samples, "n_vectors": s.n_vectors, "sum_q_sq": s.sum_q_sq,
                     "sum_cross": s.sum_cross.tolist(), "sum_gram": s.sum_gram.tolist(), "sum_xtx": s.sum_xtx.tolist(),
                     "growth_value": s.score().growth_value}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.slow  # a fresh TF process with 2 logical devices: ~7 s
def test_mirrored_strategy_equals_one_device(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    out = json.loads(lines[0][len("RESULT "):])
    assert out["replicas"] == 2
    single = out["single"]
    for mirrored in (out["mirrored"], out["mirrored_mean"]):
        assert single["n"] == mirrored["n"] == 16
        assert single["n_vectors"] == mirrored["n_vectors"] == 16 * 6 * 6
        assert mirrored["sum_q_sq"] == pytest.approx(single["sum_q_sq"], rel=1e-6)
        for key in ("sum_cross", "sum_gram", "sum_xtx"):
            a, b = np.array(mirrored[key]), np.array(single[key])
            assert np.linalg.norm(a - b) <= 1e-6 * np.linalg.norm(b), key
        assert mirrored["growth_value"] == pytest.approx(single["growth_value"], rel=1e-6)
    assert single["growth_value"] > 0
