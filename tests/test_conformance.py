"""Conformance of the adapters (docs/core.md, Adapters): problem settings -> every adapter -> one reference.

Each problem setting is one trained PyTorch model, ported with the same weights to Keras 3 and
exported to ONNX (``torch.onnx.export(..., dynamo=False)``): a residual MLP (``mlp`` family), a
stagewise conv ResNet with a projection shortcut (``conv``) and an ``nn.TransformerEncoder``
classifier (``mlp``).  Every installed adapter (torch, tensorflow, onnx) probes its form of the model and
its ``ag``, growth value, ``C``, ``K`` and variance sums ``sum_i X_i^T X_i`` must equal the SAME
independent reference to 1e-5 relative (float32 round-off); adapters are never compared with
each other.

The reference is written here directly: ``q_i`` from ``torch.autograd.grad`` of ``sum_i loss_i``
at a zero ``delta`` added at each tapped tensor (row ``i`` is sample ``i``'s gradient: the
models do not mix samples), features from the core's NumPy :meth:`satcore.Family.features`,
statistics from :class:`satcore.CandidateStatistics`.  The probe contract
(:class:`satcore.adapters.base.Probe`) is one test run for every installed adapter: ``update``,
``batches_done``, ``result()`` at any point, and bad batches (not a pair, inputs the model cannot
take, targets the loss cannot take) refused with a ``ProbeError``, never a framework's own
exception, adding nothing.  Also conformance: the one batch
convention (a mapping with ``labels`` gives the statistics of the pair ``(inputs, targets)``),
the options every adapter resolves alike (``n_features``, a training ``split`` warns), the dump
metadata every adapter records (valid against the dump-meta schema) and the stream sums behind
``||z||_S`` (against the reference's stream), the one layout of positions (each framework's
``positions`` is the core's), the registered feature maps (each framework's equals
``Family.features``), and a family added by one spec plus one builder per framework passing all
of it like a built-in one.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the settings' models and the reference are torch's

from zoo import models_torch  # noqa: E402
from zoo.models_keras import copied_dense, keras_mlp  # noqa: E402
from zoo.models_keras import to_numpy as _np  # noqa: E402
from zoo.models_torch import ResidualMLP  # noqa: E402

import satcore  # noqa: E402
from satcore import CandidateStatistics, ProbeError, SatcoreError, make_family  # noqa: E402
from satcore._formulas.families import positions  # noqa: E402
from satcore.adapters.base import Probe  # noqa: E402

# the adapters whose framework is installed; each case runs for every one of them
INSTALLED = {"torch"} | {adapter for adapter, packages in (("tensorflow", ("tensorflow", "keras")),
                                                           ("onnx", ("onnx", "onnxruntime")))
                         if all(importlib.util.find_spec(p) is not None for p in packages)}
keras = pytest.importorskip("keras") if "tensorflow" in INSTALLED else None

RTOL = 1e-5
SEED = 3
BATCH, EXPORT_BATCH = 12, 4


def residual_mlp():
    torch.manual_seed(0)
    return models_torch._train_classifier(ResidualMLP(), steps=100, seed=0)



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

    x_in = keras.Input((8, 8, 1), name="x")
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
        return copied_dense(x, lin, name, weights, activation)

    def norm(x, ln, name):
        layer = keras.layers.LayerNormalization(epsilon=ln.eps, name=name)
        weights.append((layer, [_np(ln.weight), _np(ln.bias)]))
        return layer(x)

    x_in = keras.Input((8, 8), name="x")
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
def torch_reference(model, batches, taps, kind, n_features=None):
    """``CandidateStatistics`` (with ``sum_i X_i^T X_i``) per tap, from autograd and NumPy features.

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
            family = make_family(kind, zk.shape[1] if zk.ndim == 4 else zk.shape[-1], seed=SEED, n_features=n_features)
            q, psi = positions(gk), family.features(zk)
            if stats[k] is None:
                stats[k] = CandidateStatistics(q.shape[2], psi.shape[2], q.shape[1], variance=True, stream=True)
            stats[k].update(q, psi, z=positions(zk))
    return stats


def relative_error(mine, ref):
    return float(np.linalg.norm(mine - ref) / np.linalg.norm(ref))


def assert_agree(stats, reference, label, n_samples):
    """``ag``, growth value, ``C``, ``K``, ``sum_i X_i^T X_i`` agree to ``RTOL`` relative, candidate by candidate."""
    assert len(stats) == len(reference), label
    for k, (mine, ref) in enumerate(zip(stats, reference)):
        a, b = mine.score(), ref.score()
        assert a.n_samples == b.n_samples == n_samples
        assert (mine.n_hidden, mine.n_features, mine.n_positions) == (ref.n_hidden, ref.n_features, ref.n_positions)
        assert a.ag == pytest.approx(b.ag, rel=RTOL), f"{label}[{k}] ag"
        assert a.growth_value == pytest.approx(b.growth_value, rel=RTOL), f"{label}[{k}] growth_value"
        # the debiased value is growth_value^2 minus a variance term: each part is good to RTOL
        # relative, their difference to RTOL times their sum
        square, correction = b.growth_value ** 2, b.growth_value ** 2 - b.growth_value_sq_debiased
        assert abs(a.growth_value_sq_debiased - b.growth_value_sq_debiased) <= RTOL * (square + abs(correction)), \
            f"{label}[{k}] growth_value_sq_debiased"
        # the stream sums: ||z||_S and the stream's position vectors, whatever the framework's layout
        assert mine.n_stream_vectors == ref.n_stream_vectors, f"{label}[{k}] n_stream_vectors"
        assert mine.stream_rms() == pytest.approx(ref.stream_rms(), rel=RTOL), f"{label}[{k}] stream_rms"
        for name, m, r in (("C", mine.cross_gradient(), ref.cross_gradient()),
                           ("K", mine.feature_gram(), ref.feature_gram()),
                           ("sum_xtx", mine.sum_xtx, ref.sum_xtx)):
            err = relative_error(m, r)
            assert err <= RTOL, f"{label}[{k}] {name}: relative error {err:.2e}"
        # the values are not trivial: a real gradient, a proper projection
        assert b.ag > 1e-4 and 0.05 < b.realizability < 0.9999, f"{label}[{k}]"


# -- the problem settings -------------------------------------------------------------------
SETTINGS = {
    # name: (torch builder, keras port, Keras input layout, family kind, batches,
    #        taps of the reference, the blocks the torch adapter finds and the reference taps they are)
    "mlp": (
        residual_mlp,
        keras_mlp,
        lambda x: x.reshape(len(x), 64),
        "mlp",
        8,
        lambda m: [(m.blocks[0], "input"), (m.blocks[1], "input")],
        (["blocks.0", "blocks.1"], [0, 1]),
    ),
    "resnet": (
        models_torch.digits_resnet,
        keras_resnet,
        lambda x: np.transpose(x, (0, 2, 3, 1)),
        "conv",
        2,
        lambda m: [(m.relu, "output"), (m.layer1[0], "output"), (m.layer1[1], "output"), (m.layer2[0], "output")],
        (["layer1.0", "layer1.1", "layer2.0", "layer2.1"], [0, 1, 2, 3]),
    ),
    "transformer": (
        models_torch.digits_transformer,
        keras_transformer,
        lambda x: x.reshape(len(x), 8, 8),
        "mlp",
        2,
        lambda m: [(m.encoder.layers[0], "input"), (m.encoder.layers[0].norm1, "output"),
                   (m.encoder.layers[1], "input"), (m.encoder.layers[1].norm1, "output")],
        (["encoder.layers.0", "encoder.layers.1"], [0, 2]),
    ),
}


def build_setting(name, tmp_path_factory):
    build, port, keras_layout, kind, n_batches, taps, torch_candidates = SETTINGS[name]
    torch.manual_seed(0)
    model = build()
    batches = [(x, y) for x, y in models_torch.digits_batches(BATCH, n_batches, start=1200)]
    path = keras_model = None
    if "onnx" in INSTALLED:
        path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
        example = batches[0][0][:EXPORT_BATCH]
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    if "tensorflow" in INSTALLED:
        keras_model = port(model)
        # the port itself is faithful: same logits to float32 round-off
        logits = keras_model(keras_layout(batches[0][0].numpy()), training=False).numpy()
        np.testing.assert_allclose(logits, model(batches[0][0]).detach().numpy(), atol=2e-5)
    return {"name": name, "model": model, "keras": keras_model, "keras_layout": keras_layout, "kind": kind,
            "batches": batches, "onnx": path, "reference": torch_reference(model, batches, taps(model), kind),
            "torch_candidates": torch_candidates, "taps": taps}


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def setting(request, tmp_path_factory):
    return build_setting(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def mlp_setting(tmp_path_factory):
    return build_setting("mlp", tmp_path_factory)


# -- the adapters: each probes its own form of the setting's model ---------------------------
class TakesLabels(torch.nn.Module):
    """``model(x)`` callable as ``forward(x=..., labels=...)``: how the torch adapter calls a model on a
    mapping batch (Hugging Face models take ``labels``)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, labels=None):
        return self.model(x)


def probe_torch(setting, mapping=False, with_meta=False, **options):
    """``(statistics in candidate order, the reference taps they are)``; ``options`` of every adapter's probe."""
    from satcore.adapters.torch import probe

    names, picks = setting["torch_candidates"]
    model, data = setting["model"], setting["batches"]
    if mapping:
        model, names = TakesLabels(model), ["model." + n for n in names]
        data = [{"x": x, "labels": y} for x, y in data]
    # default candidates (the located blocks), as the other adapters' residual Adds
    result = probe(model, data, models_torch.per_sample_ce, seed=SEED, head=False, variance=True,
                   **{"family": setting["kind"], **options})
    assert list(result.statistics) == names
    return _returned(result, picks, with_meta)


def probe_tensorflow(setting, mapping=False, with_meta=False, **options):
    from satcore.adapters.tensorflow import probe

    layout = setting["keras_layout"]
    data = [(layout(x.numpy()), y.numpy()) for x, y in setting["batches"]]
    if mapping:
        data = [{"x": x, "labels": y} for x, y in data]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    result = probe(setting["keras"], data, loss, seed=SEED, variance=True, **{"family": setting["kind"], **options})
    return _returned(result, range(len(setting["reference"])), with_meta)


def probe_onnx(setting, mapping=False, with_meta=False, **options):
    from satcore.adapters.onnx import probe

    data = [(x.numpy(), y.numpy()) for x, y in setting["batches"]]
    if mapping:
        data = [{"x": x, "labels": y} for x, y in data]
    # the residual blocks, as the torch adapter's head=False
    result = probe(setting["onnx"], data, loss="cross_entropy", seed=SEED, variance=True, head=False,
                   **{"family": setting["kind"], **options})
    return _returned(result, range(len(setting["reference"])), with_meta)


def _returned(result, picks, with_meta):
    stats = list(result.statistics.values())
    return (stats, picks, result.dump_meta()) if with_meta else (stats, picks)


ADAPTERS = {name: probe for name, probe in (("torch", probe_torch), ("tensorflow", probe_tensorflow),
                                            ("onnx", probe_onnx)) if name in INSTALLED}


def assert_meta_conforms(meta, adapter, kind, n_candidates):
    """Every adapter's dump meta: the same provenance, valid against the shipped dump-meta schema, the
    family recorded per candidate and the stream diagnostics of every candidate."""
    jsonschema = pytest.importorskip("jsonschema")
    from satcore._io.schemas import json_schema

    jsonschema.Draft202012Validator(json_schema("dump-meta")).validate(meta)
    assert {"candidates", "framework", "model", "loss", "split", "seed", "family", "diagnostics"} <= set(meta), \
        sorted(meta)
    assert meta["framework"] == adapter and meta["seed"] == SEED and len(meta["candidates"]) == n_candidates
    assert all(meta["family"][name]["kind"] == kind for name in meta["candidates"])
    assert set(meta["diagnostics"]) == set(meta["candidates"])


def assert_adapter_conforms(setting, adapter, kind, reference):
    """One adapter's probe of ``setting`` with the family ``kind``: its meta and its statistics (against
    ``reference``, the independent one of the same family)."""
    stats, picks, meta = ADAPTERS[adapter](setting, mapping=False, with_meta=True, family=kind)
    assert_meta_conforms(meta, adapter, kind, len(stats))
    n_samples = BATCH * len(setting["batches"])
    assert_agree(stats, [reference[k] for k in picks], f"{adapter}/{setting['name']}/{kind}", n_samples)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_adapter_matches_the_reference(setting, adapter):
    assert_adapter_conforms(setting, adapter, setting["kind"], setting["reference"])


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_mapping_with_labels_is_the_pair(setting, adapter):
    """The one batch convention: ``{inputs..., "labels": y}`` gives the statistics of ``(x, y)``."""
    pair, _ = ADAPTERS[adapter](setting, mapping=False)
    mapping, _ = ADAPTERS[adapter](setting, mapping=True)
    for a, b in zip(pair, mapping):
        arrays_a, arrays_b = a.to_arrays(), b.to_arrays()
        assert sorted(arrays_a) == sorted(arrays_b)
        for key in arrays_a:
            np.testing.assert_allclose(arrays_b[key], arrays_a[key], rtol=1e-12, atol=0, err_msg=key)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_n_features_and_a_training_split_mean_the_same_everywhere(mlp_setting, adapter):
    """``n_features=r`` draws ``make_family(..., n_features=r)`` in every adapter, and every adapter
    warns (``warnings.warn``) when the probe data is called a training split."""
    r = 24  # below the 96 samples: the projection is a proper one
    with pytest.warns(UserWarning, match="the probe split is the training set"):
        stats, picks = ADAPTERS[adapter](mlp_setting, n_features=r, split="train")
    model = mlp_setting["model"]
    reference = torch_reference(model, mlp_setting["batches"], mlp_setting["taps"](model), "mlp", n_features=r)
    assert all(s.n_features == r for s in stats)
    assert_agree(stats, [reference[k] for k in picks], f"{adapter}/mlp/n_features={r}",
                 BATCH * len(mlp_setting["batches"]))


def start_probe(adapter, setting, batches):
    """``(a fresh Probe of the adapter's form of the setting's model, batches in that adapter's form)``."""
    if adapter == "torch":
        from satcore.adapters.torch import Probe as TorchProbe

        state = TorchProbe(setting["model"], models_torch.per_sample_ce, family=setting["kind"], seed=SEED,
                           head=False, variance=True)
        return state, list(batches)
    if adapter == "tensorflow":
        from satcore.adapters.tensorflow import Probe as KerasProbe

        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        state = KerasProbe(setting["keras"], loss, family=setting["kind"], seed=SEED, variance=True)
        return state, [(setting["keras_layout"](x.numpy()), y.numpy()) for x, y in batches]
    from satcore.adapters.onnx import Probe as OnnxProbe

    state = OnnxProbe(setting["onnx"], loss="cross_entropy", family=setting["kind"], seed=SEED, variance=True,
                      head=False)
    return state, [(x.numpy(), y.numpy()) for x, y in batches]


def incremental(adapter, setting, batches):
    """Each adapter's ``Probe`` fed ``batches`` one by one, and its ``result()`` after every batch."""
    state, data = start_probe(adapter, setting, batches)
    results = []
    for batch in data:
        state.update(batch)
        results.append(list(state.result().statistics.values()))
    return results


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_every_adapter_probes_incrementally(mlp_setting, adapter):
    """``Probe.update`` batch by batch: ``result()`` after batch ``k`` is the probe of the first ``k``
    batches (the reference over them), and the probe goes on after a ``result()``."""
    batches = mlp_setting["batches"]
    model = mlp_setting["model"]
    steps = incremental(adapter, mlp_setting, batches)
    for k in (6, len(batches)):  # 72 and 96 samples, above r = 64: proper projections
        reference = torch_reference(model, batches[:k], mlp_setting["taps"](model), "mlp")
        assert_agree(steps[k - 1], reference, f"{adapter}/incremental/{k}", BATCH * k)


def _wider(x):
    """The inputs with their last axis doubled: a shape the model's first layer cannot take."""
    return torch.cat([x, x], -1) if torch.is_tensor(x) else np.concatenate([x, x], -1)


BAD_BATCHES = {
    # what every adapter must refuse with a ProbeError (never its framework's exception), adding nothing
    "not a pair": lambda x, y: (x, y, y),
    "inputs of another width": lambda x, y: (_wider(x), y),
    "fewer targets than inputs": lambda x, y: (x, y[:-1]),
}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_every_adapter_keeps_the_probe_contract(mlp_setting, adapter):
    """The contract of :class:`satcore.adapters.base.Probe`, case by case, for every installed adapter:
    a fresh probe holds no batch and refuses ``result()`` with a satcore error; ``update`` returns the
    batch's samples and counts it in ``batches_done``; a bad batch (not a pair, inputs the model cannot
    take, targets the loss cannot take) raises a one-line ``ProbeError`` naming it, not the framework's
    exception, and adds nothing; ``result()`` does not end the probe; and the statistics after every
    batch equal the independent reference (autograd gradients, the core's NumPy features and sums)."""
    batches = mlp_setting["batches"]
    state, data = start_probe(adapter, mlp_setting, batches)
    assert isinstance(state, Probe) and state.batches_done == 0
    with pytest.raises(ProbeError):
        state.result()
    assert state.update(data[0]) == BATCH and state.batches_done == 1
    for case, make_bad in BAD_BATCHES.items():
        with pytest.raises(SatcoreError) as refused:
            state.update(make_bad(*data[1]))
        assert isinstance(refused.value, ProbeError), (case, type(refused.value).__mro__)
        assert "\n" not in str(refused.value) and state.batches_done == 1, case
    middle = list(state.result().statistics.values())
    assert [state.update(batch) for batch in data[1:]] == [BATCH] * (len(data) - 1)
    assert state.batches_done == len(data)
    assert all(stats.n_samples == BATCH for stats in middle)  # the first batch's, and the probe went on
    assert_agree(list(state.result().statistics.values()), mlp_setting["reference"], f"{adapter}/contract",
                 BATCH * len(data))


@pytest.mark.skipif("tensorflow" not in INSTALLED, reason="compares torch's and TensorFlow's layouts")
@pytest.mark.parametrize("shape", [(3, 5), (3, 4, 5), (3, 2, 4, 5)])
def test_every_framework_lays_out_positions_as_the_core(shape):
    """``positions`` of torch (channels-first) and TensorFlow (channels-last) equal the core's NumPy one."""
    from satcore.adapters.tensorflow.features import positions as tf_positions
    from satcore.adapters.torch import positions as torch_positions

    a = np.random.default_rng(0).standard_normal(shape)
    core = positions(a)
    assert core.shape == (shape[0], int(np.prod(shape[2:])) if len(shape) == 4 else (shape[1] if len(shape) == 3 else 1),
                          shape[1] if len(shape) == 4 else shape[-1])
    # explicit: pixel (h, w) of a channels-first map is position h * W + w, channel c its column c
    if len(shape) == 4:
        M, C, H, W = shape
        assert core[1, 2 * W + 3, 1] == a[1, 1, 2, 3]
    np.testing.assert_array_equal(torch_positions(torch.from_numpy(a)).numpy(), core)
    channels_last = np.moveaxis(a, 1, -1) if len(shape) == 4 else a
    np.testing.assert_array_equal(np.asarray(tf_positions(keras.ops.convert_to_tensor(channels_last))), core)


FEATURE_CASES = [("mlp", (4, 5, 8)), ("mlp", (4, 8)), ("linear", (4, 5, 8)), ("bias", (4, 5, 8)),
                 ("bias", (3, 4, 5, 6)), ("conv", (3, 4, 5, 6)), ("linear", (3, 4, 5, 6)), ("mlp", (3, 4, 5, 6))]


def features_of(framework, kind, z):
    """``psi`` of the built-in family ``kind`` (seed 7) for the channels-first ``z``, by ``framework``."""
    if framework == "torch":
        from satcore.adapters.torch import build_feature_map

        t = torch.from_numpy(z)
        with torch.no_grad():
            return build_feature_map(kind, t, seed=7)(t).numpy()
    if framework == "tensorflow":
        from satcore.adapters.tensorflow import feature_map

        nhwc = keras.ops.convert_to_tensor(np.moveaxis(z, 1, -1) if z.ndim == 4 else z)
        return np.asarray(feature_map(kind, nhwc, seed=7)(nhwc))
    from satcore.adapters.onnx.features import feature_map

    return feature_map(kind, z, seed=7)(z)


def assert_features_conform(framework, kind, shape):
    """The framework's feature map of ``kind`` is ``Family.features`` of ``make_family(kind, width, seed)``
    (float64, to round-off): same weights, same positions, same column order."""
    z = np.random.default_rng(0).standard_normal(shape)
    width = shape[1] if len(shape) == 4 else shape[-1]
    ref = make_family(kind, width, seed=7).features(z)
    got = features_of(framework, kind, z)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_feature_cases_cover_every_drawn_family():
    from satcore._formulas.families import family_spec, registered_families

    drawn = {k for k in registered_families() if family_spec(k).drawn}
    assert drawn == {kind for kind, _ in FEATURE_CASES}


@pytest.mark.parametrize("framework", sorted(ADAPTERS))
@pytest.mark.parametrize("kind, shape", FEATURE_CASES)
def test_feature_maps_equal_the_numpy_family(framework, kind, shape):
    """Every framework's built-in feature map is ``Family.features`` (float64, to round-off)."""
    assert_features_conform(framework, kind, shape)


# -- a family added from outside: one spec in the core, one builder per framework --------------
def _draw_tanh(width, rng, *, n_features, init_std, seed, **_):
    r = 2 * width if n_features is None else n_features
    w = rng.standard_normal((r, width)) * (init_std if init_std is not None else width**-0.5)
    return satcore.Family("tanh", width, r, {"w": w}, seed=seed)


TANH = satcore._formulas.families.FamilySpec(
    "tanh", _draw_tanh, lambda family, z: np.tanh(positions(z).astype(np.float64) @ family.params["w"].T),
    takes_init_std=True)


def torch_tanh(family, like):
    """The torch builder: ``builder(family, like) -> FeatureMap``."""
    from satcore.adapters.options import family_record
    from satcore.adapters.torch import FeatureMap, positions as torch_positions

    class TanhFeatures(FeatureMap):
        kind, positionwise = "tanh", True

        def __init__(self):
            super().__init__(family.width, family.n_features, family_record(family))
            self.register_buffer("w", torch.as_tensor(family.params["w"], dtype=like.dtype, device=like.device))

        def forward(self, z):
            return torch.tanh(torch_positions(z).to(self.w.dtype) @ self.w.T)

    return TanhFeatures()


def tensorflow_tanh(family, z):
    """The TensorFlow builder: ``builder(family, z) -> (M, T, r)``, ``z`` float64 channels-last."""
    import tensorflow as tf

    from satcore.adapters.tensorflow.features import positions as tf_positions

    return tf.tanh(tf.matmul(tf_positions(z), tf.constant(family.params["w"].T)))


@pytest.fixture
def tanh_family():
    import importlib

    from satcore._formulas.families import register_builder, register_family, unregister_family

    register_family(TANH)
    for framework, builder in (("torch", torch_tanh), ("tensorflow", tensorflow_tanh)):
        if framework in INSTALLED:
            importlib.import_module(f"satcore.adapters.{framework}")  # it registers its built-in builders
            register_builder(framework, "tanh", builder)
    yield "tanh"
    unregister_family("tanh")


def test_a_family_added_by_one_spec_and_one_builder_per_framework_conforms(tanh_family, mlp_setting):
    """No adapter's source names ``tanh``: the spec and the two builders above make every adapter take
    ``family="tanh"`` (ONNX from the spec's NumPy features), and it passes the suite's checks: features
    equal to ``Family.features``, statistics equal to the independent reference, meta valid."""
    for framework in sorted(ADAPTERS):
        for shape in ((4, 5, 8), (4, 8), (3, 4, 5, 6)):
            assert_features_conform(framework, tanh_family, shape)
    model = mlp_setting["model"]
    reference = torch_reference(model, mlp_setting["batches"], mlp_setting["taps"](model), tanh_family)
    for adapter in sorted(ADAPTERS):
        assert_adapter_conforms(mlp_setting, adapter, tanh_family, reference)


def test_a_kind_without_a_builder_is_refused_by_name(tanh_family):
    from satcore._formulas.families import unregister_family

    z = np.zeros((2, 8))
    unregister_family(tanh_family)
    with pytest.raises(ValueError, match="unknown family 'tanh'"):
        features_of("onnx", tanh_family, z)
    satcore._formulas.families.register_family(TANH)  # a spec without the torch builder
    with pytest.raises(ValueError, match="family 'tanh' has no torch feature map"):
        features_of("torch", tanh_family, z)


# (M, T, N, r): both routes of the core, X_i formed (T large against N, r) and the T x T kernel (T small)
MOMENT_SHAPES = [(5, 1, 3, 4), (4, 6, 3, 7), (3, 9, 2, 2), (2, 3, 8, 9), (7, 1, 5, 3), (7, 6, 4, 9), (7, 2, 8, 8)]


def moments_of(framework, q, psi, variance):
    """The framework's per-batch sums as NumPy; ONNX has none of its own (it calls the core's)."""
    if framework == "torch":
        from satcore.adapters.torch import batch_moments

        got = batch_moments(torch.from_numpy(q), torch.from_numpy(psi), variance=variance)
        return got.to_numpy().as_dict()
    from satcore.adapters.tensorflow.moments import replica_moments

    got = replica_moments(keras.ops.convert_to_tensor(q), keras.ops.convert_to_tensor(psi), variance=variance)
    # a replica's sums carry no batch norm (it needs the global batch): Probe.update adds it
    return got.to_numpy().as_one_batch().as_dict()


@pytest.mark.parametrize("framework", sorted(INSTALLED - {"onnx"}))
@pytest.mark.parametrize("shape", MOMENT_SHAPES)
@pytest.mark.parametrize("variance", [False, True])
def test_moments_equal_the_core_batch_moments(framework, shape, variance):
    """Each framework's own per-batch sums are :func:`satcore.batch_moments`, field by field (float64)."""
    from satcore._statistics.candidate import batch_moments

    M, T, N, r = shape
    rng = np.random.default_rng(sum(shape))
    q, psi = rng.standard_normal((M, T, N)), rng.standard_normal((M, T, r))
    got, ref = moments_of(framework, q, psi, variance), batch_moments(q, psi, variance=variance).as_dict()
    assert set(got) == set(ref)
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-12, atol=1e-12, err_msg=key)
