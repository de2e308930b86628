"""Per-sample gradients from the ONNX backward graph equal torch autograd's at the same tensor.

Models exported with ``torch.onnx.export(..., dynamo=False)`` at batch 4 are run at batches 3
and 7 (dynamic batch axis).  The reference is ``torch.autograd.grad`` of ``sum_i loss_i`` at a
zero ``delta`` added to the same tensor; ``loss_i`` is per-sample cross-entropy, for token
outputs the mean over tokens, or the per-sample mean squared error, evaluated on a float64 copy
of the model (the truth the float32 graph is held against).  Float32 models here;
float64 graphs and the exporters' other models are in ``test_onnx_models.py``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from zoo import models_torch  # noqa: E402
from roundoff import FLOAT32_MARGIN, float32_sensitivity, relative_error  # noqa: E402

from satcore.adapters.onnx import per_sample_gradients, residual_candidates, load_model  # noqa: E402

# Float32 graphs against torch's float64 gradients, per tensor: the relative Frobenius error within
# FLOAT32_MARGIN times the computation's float32 sensitivity (tests/roundoff.py), and no element off by
# more than that times the largest gradient element (a few wrong entries cannot hide in the norm).
EXPORT_BATCH = 4


class Block(torch.nn.Module):
    """Pre-LN transformer MLP block ``x + W2 gelu(W1 LN(x))``."""

    def __init__(self, d):
        super().__init__()
        self.ln, self.fc1, self.fc2 = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


class TokenModel(torch.nn.Module):
    """``(B, T, 5) -> (B, T, 3)`` logits through two residual MLP blocks."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(5, 8)
        self.blocks = torch.nn.ModuleList([Block(8), Block(8)])
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def export(model, example, path):
    torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["out"], dynamic_axes={"x": {0: "batch"}, "out": {0: "batch"}})
    return path


def torch_gradients(model, x, loss_of, taps):
    """Per-sample ``q`` at each tapped module output, by autograd of ``sum_i loss_i``."""
    delta, handles = [], []
    for module in taps:
        def shift(m, args, out):
            d = torch.zeros_like(out, requires_grad=True)
            delta.append(d)
            return out + d

        handles.append(module.register_forward_hook(shift))
    try:
        total = loss_of(model(x)).sum()
        return [g.numpy() for g in torch.autograd.grad(total, delta)]
    finally:
        for h in handles:
            h.remove()


def ce_tokens(targets):
    return lambda logits: torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(1)


def mse(targets):
    return lambda out: ((out - targets) ** 2).flatten(1).mean(1)


@pytest.fixture(scope="module")
def token_model(tmp_path_factory):
    torch.manual_seed(0)
    model = TokenModel().eval()
    path = export(model, torch.randn(EXPORT_BATCH, 6, 5), tmp_path_factory.mktemp("tok") / "tok.onnx")
    return model, path


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    model = models_torch.digits_resnet()
    x = models_torch.digits_batches(EXPORT_BATCH, 1)[0][0]
    return model, export(model, x, tmp_path_factory.mktemp("resnet") / "resnet.onnx")


def assert_close(onnx_grads, truth, sensitivity):
    for mine, ref, s in zip(onnx_grads, truth, sensitivity):
        assert mine.shape == ref.shape
        scale = np.abs(ref).max()
        assert scale > 1e-6  # a real gradient
        assert relative_error(mine, ref) <= FLOAT32_MARGIN * s
        assert np.abs(mine - ref).max() <= FLOAT32_MARGIN * s * scale


@pytest.mark.parametrize("batch", [3, 7])
@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_token_model_gradients(token_model, batch, loss):
    model, path = token_model
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 6, 5)).astype(np.float32)
    if loss == "cross_entropy":
        y = rng.integers(0, 3, (batch, 6))
        loss64 = ce_tokens(torch.tensor(y))
    else:
        y = rng.standard_normal((batch, 6, 3)).astype(np.float32)
        loss64 = mse(torch.tensor(y, dtype=torch.float64))
    session = per_sample_gradients(path, loss=loss)
    acts, grads = session((x, y))
    names = list(session.candidates)
    # the two residual Adds' skip inputs (embed output, block 0 output), named after their blocks, and
    # the head (block 1's output)
    assert names == ["blocks.0", "blocks.1", "head"]
    exact = copy.deepcopy(model).double()

    def gradients(m, xx):
        return torch_gradients(m, xx, loss64, [m.embed, m.blocks[0], m.blocks[1]])

    x64 = torch.tensor(x, dtype=torch.float64)
    assert_close([grads[n] for n in names], gradients(exact, x64), float32_sensitivity(exact, x64, gradients))
    with torch.no_grad():
        np.testing.assert_allclose(acts[names[0]], model.embed(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_resnet_gradients_at_other_batch_sizes(resnet):
    model, path = resnet
    exact = copy.deepcopy(model).double()
    session = per_sample_gradients(path)

    def taps(m):  # stem output, block outputs; layer2.0 has a projection shortcut
        return [m.relu, m.layer1[0], m.layer1[1], m.layer2[0]]

    for batch, start in ((3, 1100), (7, 1200)):
        x, y = models_torch.digits_batches(batch, 1, start=start)[0]
        _, grads = session((x.numpy(), y.numpy()))

        def ce(out):
            return torch.nn.functional.cross_entropy(out, y, reduction="none")

        def gradients(m, xx):
            return torch_gradients(m, xx, ce, taps(m))

        truth = gradients(exact, x.double())
        sensitivity = float32_sensitivity(exact, x.double(), gradients)
        assert_close([grads[name] for name in session.candidates], truth, sensitivity)


def test_residual_candidates_of_the_resnet(resnet):
    _, path = resnet
    names = residual_candidates(load_model(path))
    # four blocks, each found once; the projection block (layer2.0) through its common input
    assert len(names) == 4 and len(set(names)) == 4


class TokenLoss(torch.nn.Module):
    """Two inputs ``(x, tokens)``; outputs the per-token cross-entropy ``(B, T)`` itself."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, tokens):
        logits = self.model(x)
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")


def test_loss_given_as_a_model_output(token_model, tmp_path):
    """``loss="<output name>"``: a (B, T) per-token loss output is averaged over tokens per sample."""
    model, _ = token_model
    wrapped = TokenLoss(model).eval()
    x0, t0 = torch.randn(EXPORT_BATCH, 6, 5), torch.randint(0, 3, (EXPORT_BATCH, 6))
    path = tmp_path / "loss.onnx"
    torch.onnx.export(wrapped, (x0, t0), str(path), dynamo=False, opset_version=17, input_names=["x", "tokens"],
                      output_names=["token_loss"],
                      dynamic_axes={"x": {0: "batch"}, "tokens": {0: "batch"}, "token_loss": {0: "batch"}})
    rng = np.random.default_rng(11)
    x, t = rng.standard_normal((5, 6, 5)).astype(np.float32), rng.integers(0, 3, (5, 6))
    session = per_sample_gradients(path, loss="token_loss")
    _, grads = session({"x": x, "tokens": t})
    exact = copy.deepcopy(model).double()

    def gradients(m, xx):
        return torch_gradients(m, xx, ce_tokens(torch.tensor(t)), [m.embed, m.blocks[0]])

    x64 = torch.tensor(x, dtype=torch.float64)
    assert_close([grads[n] for n in session.candidates], gradients(exact, x64), float32_sensitivity(exact, x64, gradients))
