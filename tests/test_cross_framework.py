"""Cross-framework agreement (docs/core.md, Adapters): the same trained weights in PyTorch, Keras 3 and
ONNX (exported with ``torch.onnx.export(..., dynamo=False)``) give the same ``ag``,
``growth_value``, ``C`` and ``K`` per candidate, to 1e-5 relative (float32 round-off), for the
same family seed.

The reference is written here directly: per-sample ``q_i`` from ``torch.autograd.grad`` of
``sum_i loss_i`` at a zero ``delta`` added at each tapped tensor, features from the core's NumPy
:meth:`satcore.Family.features`, statistics from :class:`satcore.CandidateStatistics`.  The
torch adapter's ``probe`` is compared to the same reference.  Models: the shared ResNet
(``conv`` family, projection shortcut included) and ``nn.TransformerEncoder`` classifier
(``mlp`` family) of ``models_torch``; the ONNX export uses batch 4, the probes batches of 12.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
keras = pytest.importorskip("keras")
pytest.importorskip("onnxruntime")

import models_torch  # noqa: E402

from satcore import CandidateStatistics, make_family  # noqa: E402
from satcore.families import conv_gradients  # noqa: E402

RTOL = 1e-5
SEED = 3
BATCH, N_BATCHES, EXPORT_BATCH = 12, 2, 4



def _np(t):
    return t.detach().cpu().numpy()


def _conv(torch_conv, name, stride=1):
    k = torch_conv.kernel_size[0]
    layers = []
    if k == 3 and stride == 2:
        layers.append(keras.layers.ZeroPadding2D(1, name=f"{name}_pad"))
    padding = "same" if stride == 1 or k == 1 else "valid"
    conv = keras.layers.Conv2D(torch_conv.out_channels, k, strides=stride, padding=padding, use_bias=False, name=name)
    return layers, conv, [np.transpose(_np(torch_conv.weight), (2, 3, 1, 0))]


def _bn(torch_bn, name):
    bn = keras.layers.BatchNormalization(epsilon=torch_bn.eps, name=name)
    return bn, [_np(torch_bn.weight), _np(torch_bn.bias), _np(torch_bn.running_mean), _np(torch_bn.running_var)]


def keras_resnet(torch_model) -> keras.Model:
    """``models_torch.DigitsResNet`` in Keras (inference BatchNorm, same weights)."""
    weights = []

    def apply(x, torch_conv, name, stride=1):
        pads, conv, w = _conv(torch_conv, name, stride)
        for p in pads:
            x = p(x)
        weights.append((conv, w))
        return conv(x)

    def batchnorm(x, torch_bn, name):
        bn, w = _bn(torch_bn, name)
        weights.append((bn, w))
        return bn(x)

    x_in = keras.Input((8, 8, 1))
    x = batchnorm(apply(x_in, torch_model.conv1, "stem_conv"), torch_model.bn1, "stem_bn")
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, layer in (("layer1", torch_model.layer1), ("layer2", torch_model.layer2)):
        for i, block in enumerate(layer):
            name = f"{stage}_{i}"
            stride = block.conv1.stride[0]
            out = apply(x, block.conv1, f"{name}_conv1", stride)
            out = keras.layers.ReLU(name=f"{name}_relu1")(batchnorm(out, block.bn1, f"{name}_bn1"))
            out = batchnorm(apply(out, block.conv2, f"{name}_conv2"), block.bn2, f"{name}_bn2")
            identity = x
            if block.downsample is not None:
                identity = apply(x, block.downsample[0], f"{name}_down", stride)
                identity = batchnorm(identity, block.downsample[1], f"{name}_down_bn")
            x = keras.layers.ReLU(name=f"{name}_out")(keras.layers.Add(name=f"{name}_add")([out, identity]))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    fc = keras.layers.Dense(torch_model.fc.out_features, name="fc")
    logits = fc(x)
    weights.append((fc, [_np(torch_model.fc.weight).T, _np(torch_model.fc.bias)]))
    model = keras.Model(x_in, logits, name="digits_resnet")
    for layer, w in weights:
        layer.set_weights(w)
    return model


class AddPosition(keras.layers.Layer):
    """``tokens + position`` with a learned ``(T, d)`` table (DigitsTransformer.position)."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = np.asarray(table, dtype=np.float32)

    def build(self, input_shape):
        self.position = self.add_weight(shape=self.table.shape, initializer="zeros", name="position")
        self.position.assign(self.table)

    def call(self, x):
        return x + self.position


def keras_transformer(torch_model) -> keras.Model:
    """``models_torch.DigitsTransformer`` (post-norm ``nn.TransformerEncoderLayer``) in Keras."""
    weights = []

    def dense(x, lin, name, activation=None):
        layer = keras.layers.Dense(lin.out_features, activation=activation, name=name)
        weights.append((layer, [_np(lin.weight).T, _np(lin.bias)]))
        return layer(x)

    def norm(x, ln, name):
        layer = keras.layers.LayerNormalization(epsilon=ln.eps, name=name)
        weights.append((layer, [_np(ln.weight), _np(ln.bias)]))
        return layer(x)

    x_in = keras.Input((8, 8))
    x = AddPosition(_np(torch_model.position), name="position")(dense(x_in, torch_model.embed, "embed"))
    for i, enc in enumerate(torch_model.encoder.layers):
        attn = enc.self_attn
        d, h = attn.embed_dim, attn.num_heads
        mha = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d // h, name=f"l{i}_attn")
        a = mha(x, x)
        w_in, b_in = _np(attn.in_proj_weight), _np(attn.in_proj_bias)
        w = []
        for k in range(3):  # query, key, value
            w += [w_in[k * d : (k + 1) * d].T.reshape(d, h, d // h), b_in[k * d : (k + 1) * d].reshape(h, d // h)]
        w += [_np(attn.out_proj.weight).T.reshape(h, d // h, d), _np(attn.out_proj.bias)]
        weights.append((mha, w))
        x = norm(keras.layers.Add(name=f"l{i}_add1")([x, a]), enc.norm1, f"l{i}_norm1")
        f = dense(dense(x, enc.linear1, f"l{i}_ff1", activation="relu"), enc.linear2, f"l{i}_ff2")
        x = norm(keras.layers.Add(name=f"l{i}_add2")([x, f]), enc.norm2, f"l{i}_norm2")
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    logits = dense(x, torch_model.fc, "fc")
    model = keras.Model(x_in, logits, name="digits_transformer")
    for layer, w in weights:
        layer.set_weights(w)
    return model


# -- the independent reference -------------------------------------------------------------
def torch_reference(model, batches, taps, kind):
    """``CandidateStatistics`` per tap from ``torch.autograd.grad`` and NumPy family features.

    ``taps``: ``(module, "input" | "output")``; the tapped tensor gets a zero ``delta``
    so every consumer sees it and its gradient is the total ``q``.
    """
    stats = [None] * len(taps)
    for x, y in batches:
        z, delta, handles = {}, {}, []
        for k, (module, where) in enumerate(taps):
            def shift(t, k=k):
                d = torch.zeros_like(t, requires_grad=True)
                z[k], delta[k] = t.detach().clone(), d
                return t + d

            if where == "input":
                handles.append(module.register_forward_pre_hook(lambda m, args, s=shift: (s(args[0]), *args[1:])))
            else:
                handles.append(module.register_forward_hook(lambda m, args, out, s=shift: s(out)))
        try:
            loss = torch.nn.functional.cross_entropy(model(x), y, reduction="none").sum()
            grads = torch.autograd.grad(loss, [delta[k] for k in range(len(taps))])
        finally:
            for h in handles:
                h.remove()
        for k, g in enumerate(grads):
            zk, gk = z[k].double().numpy(), g.double().numpy()
            if zk.ndim == 4:
                family = make_family(kind, zk.shape[1], seed=SEED)
                q, psi = conv_gradients(gk), family.features(zk)
            else:
                family = make_family(kind, zk.shape[-1], seed=SEED)
                q, psi = gk, family.features(zk)
            if stats[k] is None:
                stats[k] = CandidateStatistics(q.shape[2], psi.shape[2], q.shape[1])
            stats[k].update(q, psi)
    return stats


def assert_agree(stats, reference, label):
    """``ag``, ``growth_value``, ``C``, ``K`` agree to ``RTOL`` relative, candidate by candidate."""
    assert len(stats) == len(reference), label
    for k, (mine, ref) in enumerate(zip(stats, reference)):
        a, b = mine.score(), ref.score()
        assert a.n_samples == b.n_samples == BATCH * N_BATCHES
        assert (mine.n_hidden, mine.n_features, mine.n_positions) == (ref.n_hidden, ref.n_features, ref.n_positions)
        assert a.ag == pytest.approx(b.ag, rel=RTOL), f"{label}[{k}] ag"
        assert a.growth_value == pytest.approx(b.growth_value, rel=RTOL), f"{label}[{k}] growth_value"
        for name, m, r in (("C", mine.cross_gradient(), ref.cross_gradient()),
                           ("K", mine.feature_gram(), ref.feature_gram())):
            err = np.linalg.norm(m - r) / np.linalg.norm(r)
            assert err <= RTOL, f"{label}[{k}] {name}: relative error {err:.2e}"
        # the values are not trivial: a real gradient, a proper projection
        assert b.ag > 1e-4 and 0.05 < b.realizability < 0.9999


# -- the three frameworks -------------------------------------------------------------------
SETTINGS = {
    # name: (torch builder, keras port, family kind, taps of the reference, torch-adapter candidates)
    "resnet": (
        models_torch.digits_resnet,
        keras_resnet,
        "conv",
        lambda m: [(m.relu, "output"), (m.layer1[0], "output"), (m.layer1[1], "output"), (m.layer2[0], "output")],
        (["layer1.0", "layer1.1", "layer2.0", "layer2.1"], [0, 1, 2, 3]),
    ),
    "transformer": (
        models_torch.digits_transformer,
        keras_transformer,
        "mlp",
        lambda m: [(m.encoder.layers[0], "input"), (m.encoder.layers[0].norm1, "output"),
                   (m.encoder.layers[1], "input"), (m.encoder.layers[1].norm1, "output")],
        (["encoder.layers.0", "encoder.layers.1"], [0, 2]),
    ),
}


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def setting(request, tmp_path_factory):
    name = request.param
    build, port, kind, taps, torch_candidates = SETTINGS[name]
    torch.manual_seed(0)
    model = build()
    batches = [(x, y) for x, y in models_torch.digits_batches(BATCH, N_BATCHES, start=1200)]
    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    example = batches[0][0][:EXPORT_BATCH]
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    reference = torch_reference(model, batches, taps(model), kind)
    return {"name": name, "model": model, "port": port, "kind": kind, "batches": batches, "onnx": path,
            "reference": reference, "torch_candidates": torch_candidates}


def test_onnx_matches_torch_reference(setting):
    from satcore.adapters.onnx import probe

    data = [(x.numpy(), y.numpy()) for x, y in setting["batches"]]
    result = probe(setting["onnx"], data, loss="cross_entropy", family=setting["kind"], seed=SEED)
    assert result.meta["framework"] == "onnx"
    assert_agree(list(result.statistics.values()), setting["reference"], f"onnx/{setting['name']}")


def test_keras_matches_torch_reference(setting):
    from satcore.adapters.tensorflow import probe

    model = setting["port"](setting["model"])
    if setting["name"] == "resnet":
        data = [(np.transpose(x.numpy(), (0, 2, 3, 1)), y.numpy()) for x, y in setting["batches"]]
    else:
        data = [(x.numpy().reshape(len(x), 8, 8), y.numpy()) for x, y in setting["batches"]]
    # the port itself is faithful: same logits to float32 round-off
    logits = model(data[0][0], training=False).numpy()
    np.testing.assert_allclose(logits, setting["model"](setting["batches"][0][0]).detach().numpy(), atol=2e-5)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    result = probe(model, data, loss, family=setting["kind"], seed=SEED)
    assert result.meta["framework"] == "tensorflow"
    assert_agree(list(result.statistics.values()), setting["reference"], f"keras/{setting['name']}")


def test_torch_adapter_matches_torch_reference(setting):
    adapter = pytest.importorskip("satcore.adapters.torch")
    names, picks = setting["torch_candidates"]
    result = adapter.probe(setting["model"], setting["batches"], models_torch.per_sample_ce, candidates=names,
                           family=setting["kind"], seed=SEED, head=False)
    assert_agree(list(result.statistics.values()), [setting["reference"][k] for k in picks],
                 f"torch-adapter/{setting['name']}")
