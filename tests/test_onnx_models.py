"""Per-sample activation gradients from the ONNX backward graph equal torch autograd's on exported models.

Problem settings: the shared ResNet (Conv, BatchNorm, pooling), the ``nn.TransformerEncoder``
classifier, Hugging Face GPT-2 and BERT built from small configs (``models_torch``), each
exported by the TorchScript exporter (``dynamo=False``, opset 17) and by the dynamo exporter
(onnxscript, its default opset), at batch 2 and run at batch 3, in float32 and (where ONNX
Runtime's CPU kernels have float64: not Conv, not Erf) in float64.

Float64 models use a LayerNorm epsilon exact in float32 (ONNX stores it as a float32 attribute).

Reference: ``torch.autograd.grad`` of ``sum_i loss_i`` at a zero ``delta`` added to the output
of tapped modules (residual-stream tensors); the ONNX tensor holding the same values is found by
running every float tensor of the graph as an output.  The residual Adds found automatically
(``residual_blocks``) must be the four of each model, those taps among them.  Float64 graphs agree with torch float64 to
1e-12 (relative Frobenius error per tensor); float32 graphs are held to float32 round-off of the
computation: ``roundoff.FLOAT32_MARGIN`` times how far perturbations of the weights and the input by
float32's backward error for the model's longest inner product (``n eps32``, any summation order)
move the float64 gradient (``roundoff.float32_sensitivity``), not to torch float32's own error on
this host, which depends on the host's kernels as much as ONNX Runtime's does.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from zoo import models_torch  # noqa: E402
from roundoff import FLOAT32_MARGIN, float32_sensitivity, relative_error  # noqa: E402

from satcore.adapters.onnx import load_model, per_sample_gradients  # noqa: E402
from satcore.adapters.onnx.locate import residual_blocks  # noqa: E402

F64_TOL = 1e-12
EXPORT_BATCH, BATCH, SEQ = 2, 3, 8


class Logits(torch.nn.Module):
    """The model's logits tensor (Hugging Face models return an output object)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(x)
        return getattr(out, "logits", out)


def bert(hidden_act="gelu"):
    """``models_torch.bert``'s config with ``hidden_act``."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(**{**models_torch.bert().config.to_dict(), "hidden_act": hidden_act})
    torch.manual_seed(0)
    return BertForMaskedLM(config).eval()


def gpt2(activation_function="gelu_new"):
    """``models_torch.gpt2``'s trained weights with ``use_cache=True``: without a cache, transformers 5
    builds the causal mask with ``aten::diff``, which the TorchScript exporter lacks."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(models_torch.gpt2_config(use_cache=True, activation_function=activation_function))
    model.load_state_dict(models_torch.gpt2().state_dict())
    return model.eval()


def per_sample_ce(out, y):
    return torch.nn.functional.cross_entropy(out, y, reduction="none")


def per_token_ce(out, y):
    return torch.nn.functional.cross_entropy(out.transpose(1, 2), y, reduction="none").mean(1)


def digits(batch, start):
    return models_torch.digits_batches(batch, 1, start=start)[0]


def text(batch, start):
    return models_torch.text_batches(SEQ, batch, 1, offset=start)[0]


# name -> (model builder, batch maker, per-sample loss, taps(model) -> modules, float64 ok in ORT)
SETTINGS = {
    "resnet": (models_torch.digits_resnet, digits, per_sample_ce,
               lambda m: [m.relu, m.layer1[0], m.layer1[1], m.layer2[0], m.layer2[1]], False),
    "transformer-encoder": (models_torch.digits_transformer, digits, per_sample_ce,
                            lambda m: [m.encoder.layers[0].norm1, m.encoder.layers[0], m.encoder.layers[1].norm1],
                            True),
    "gpt2": (gpt2, text, per_token_ce,
             lambda m: [m.transformer.drop, m.transformer.h[0], m.transformer.h[1]], True),
    "bert": (bert, text, per_token_ce,
             lambda m: [m.bert.embeddings, m.bert.encoder.layer[0].attention.output, m.bert.encoder.layer[0].output,
                        m.bert.encoder.layer[1].attention.output], True),
}


# which taps are skip inputs of residual Adds (each model has four such Adds, and
# ``residual_blocks`` must find exactly those, whichever the exporter)
SKIP_TAPS = {"resnet": [0, 1, 2, 3], "transformer-encoder": [0, 1, 2], "gpt2": [0, 1], "bert": [0, 1, 2, 3]}


def torch_gradients(model, x, loss_of, taps):
    """``(activations, per-sample q)`` at each tapped module's output, by autograd of ``sum_i loss_i``."""
    delta, acts, handles = [], [], []
    for module in taps:
        def shift(m, args, out):
            z = out[0] if isinstance(out, tuple) else out
            d = torch.zeros_like(z, requires_grad=True)
            delta.append(d)
            acts.append(z.detach().numpy())
            return (z + d, *out[1:]) if isinstance(out, tuple) else z + d

        handles.append(module.register_forward_hook(shift))
    try:
        total = loss_of(Logits(model)(x)).sum()
        return acts, [g.numpy() for g in torch.autograd.grad(total, delta)]
    finally:
        for h in handles:
            h.remove()


def tensors_holding(model_path, feeds, values, rtol):
    """The first (producer-most) float tensor of the graph equal to each array in ``values``."""
    import onnxruntime as ort

    from satcore.adapters.onnx.locate import FLOAT_TYPES, tensor_infos

    model = onnx.load(str(model_path))
    infos = tensor_infos(model)
    names = [o for n in model.graph.node for o in n.output
             if n.op_type != "Constant" and o in infos and infos[o].elem_type in FLOAT_TYPES]
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(n, infos[n].elem_type, None)
                              for n in names if n not in known)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    arrays = dict(zip(names, session.run(names, feeds)))
    found = []
    for value in values:
        match = [n for n in names if arrays[n].shape == value.shape
                 and np.allclose(arrays[n], value, rtol=rtol, atol=rtol * np.abs(value).max())]
        assert match, f"no ONNX tensor holds the torch activation of shape {value.shape}"
        found.append(match[0])
    return found


def export(model, example, path, dynamo, opset=None):
    """TorchScript at opset 17 by default, dynamo (onnxscript) at its default opset."""
    if dynamo:
        pytest.importorskip("onnxscript")
        torch.onnx.export(Logits(model), (example,), str(path), dynamo=True, input_names=["x"], opset_version=opset,
                          output_names=["out"], dynamic_shapes=({0: torch.export.Dim("batch")},))
    else:
        torch.onnx.export(Logits(model), (example,), str(path), dynamo=False, opset_version=opset or 17,
                          input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "batch"}, "out": {0: "batch"}})
    return path


CASES = [(name, exporter, dtype) for name in SETTINGS for exporter in ("torchscript", "dynamo")
         for dtype in ("float32", "float64")]


@pytest.mark.parametrize("name,exporter,dtype", CASES, ids=["-".join(c) for c in CASES])
def test_per_sample_gradients_equal_torch_autograd(name, exporter, dtype, tmp_path):
    check(name, exporter, dtype, tmp_path)


@pytest.mark.parametrize("exporter,opset", [("torchscript", 20), ("dynamo", 18), ("dynamo", 21)])
def test_other_opsets(exporter, opset, tmp_path):
    """The TransformerEncoder in float64 at the exporters' other opsets (ReduceMean, Split take
    their axes and sizes as inputs from 18 on)."""
    check("transformer-encoder", exporter, "float64", tmp_path, opset)
    assert next(o.version for o in onnx.load(str(tmp_path / "transformer-encoder.onnx")).opset_import
                if o.domain == "") == opset


def check(name, exporter, dtype, tmp_path, opset=None):
    build, batch_of, loss_of, taps, f64_ok = SETTINGS[name]
    if dtype == "float64" and not f64_ok:
        pytest.skip(f"{name}: ONNX Runtime's CPU Conv has no float64 kernel (float32 case covers it)")
    # float64 GPT-2 and BERT use ReLU: every float64 GELU graph differs from torch's float64 function
    # by ~5e-9 before any gradient is taken. The exact GELU needs Erf, which ONNX Runtime's CPU provider
    # has in float32 only; the dynamo exporter writes gelu_new's Python constants in float32, and ONNX's
    # Gelu(approximate="tanh") function body holds its constants as float32 attributes.
    model = build("relu") if dtype == "float64" and name in ("gpt2", "bert") else build()
    exact = copy.deepcopy(model).double()
    if dtype == "float64":
        # ONNX stores LayerNormalization's epsilon as a float32 attribute: 1e-5 would become
        # 9.99999975e-06 in the graph and move its activations by ~1e-12 against torch's float64
        for module in exact.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = 2.0**-17  # exact in float32
    subject = exact if dtype == "float64" else model

    def cast(x):
        return x.to(getattr(torch, dtype)) if x.is_floating_point() else x

    example, _ = batch_of(EXPORT_BATCH, 0)
    path = export(subject, cast(example), tmp_path / f"{name}.onnx", exporter == "dynamo", opset)
    x, y = batch_of(BATCH, 200)  # another batch size than the export's
    def loss(out):
        return loss_of(out, y)

    truth_acts, truth = torch_gradients(exact, x.double() if x.is_floating_point() else x, loss, taps(exact))
    feeds = {"x": cast(x).numpy()}
    names = tensors_holding(path, feeds, truth_acts, rtol=1e-5 if dtype == "float32" else 1e-9)
    assert len(set(names)) == len(names)
    found = [block.skip for block in residual_blocks(load_model(path))]
    assert len(found) == 4 and {names[k] for k in SKIP_TAPS[name]} <= set(found)
    session = per_sample_gradients(path, loss="cross_entropy", candidates=names)
    acts, grads = session((feeds["x"], y.numpy()))
    if dtype == "float32":
        sensitivity = float32_sensitivity(exact, x.double() if x.is_floating_point() else x,
                                          lambda m, xx: torch_gradients(m, xx, loss, taps(m))[1])
    for k, name_k in enumerate(names):
        got = grads[name_k]
        assert got.dtype == np.dtype(dtype) and got.shape == truth[k].shape
        assert np.abs(truth[k]).max() > 1e-6  # a real gradient
        if dtype == "float64":
            assert relative_error(got, truth[k]) <= F64_TOL, name_k
        else:
            assert relative_error(got, truth[k]) <= FLOAT32_MARGIN * sensitivity[k], (name_k, sensitivity[k])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_residual_blocks_take_the_torch_adapters_names_under_either_exporter(exporter, tmp_path):
    """A ResNet exported as it is: the blocks' names are the torch adapter's (``find_blocks``), whether the scope is
    in the node's name (TorchScript: ``/layer1/layer1.0/Add``) or in its metadata (dynamo: ``node_add_40``, module
    path under ``pkg.torch.onnx.name_scopes``), which a newcomer's dynamo export showed as ``relu``, ``relu_2``;
    metadata that is not a list of strings, or too long to be a module path, is not read: the skip tensor names."""
    from satcore.adapters.torch import find_blocks
    from satcore.adapters.onnx.locate import MAX_NAME_SCOPES_CHARS, NAME_SCOPES_KEY

    model = models_torch.digits_resnet().eval()
    example, _ = digits(EXPORT_BATCH, 0)
    path = tmp_path / "resnet.onnx"
    if exporter == "dynamo":
        torch.onnx.export(model, (example,), str(path), dynamo=True, input_names=["x"], output_names=["out"])
    else:
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["out"])
    proto = onnx.load(str(path))
    blocks = residual_blocks(load_model(proto))
    assert [b.name for b in blocks] == list(find_blocks(model)) == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]
    if exporter == "torchscript":
        return
    adds = [n for n in proto.graph.node if any(p.key == NAME_SCOPES_KEY for p in n.metadata_props)
            and n.op_type == "Add"]
    hostile = ["__import__('os').getcwd()", "['', 'layer1', 3]", "['layer1.0', '" + "x" * MAX_NAME_SCOPES_CHARS + "']",
               "[[[[" * 100]
    for node, value in zip(adds, hostile):
        next(p for p in node.metadata_props if p.key == NAME_SCOPES_KEY).value = value
    unread = residual_blocks(load_model(proto))
    assert [b.name for b in unread] == [b.skip for b in unread] and [b.skip for b in unread] == [b.skip for b in blocks]
