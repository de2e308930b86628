"""Stream taps leave the model alone, handle in-place ops and keyword streams,
are always removed; candidate discovery on real model families; bad input."""

import numpy as np
import pytest
import torch
from torch import nn

from zoo import models_torch as mt
from satcore import ModelOnDataError
from satcore.adapters.torch import StreamTaps, find_candidates, probe, sequence_loss

torch.set_num_threads(1)


def _hook_counts(model):
    return [
        (len(m._forward_pre_hooks), len(m._forward_hooks), len(m._backward_hooks)) for m in model.modules()
    ]


class KeywordBlock(nn.Module):
    """Called with the stream as a keyword, modifies it in place before use."""

    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, *, hidden_states, gate):
        hidden_states.mul_(gate)  # in-place on the block input
        return hidden_states + self.fc(torch.tanh(hidden_states))


class KeywordStack(nn.Module):
    def __init__(self, d=6, depth=3):
        super().__init__()
        self.embed = nn.Linear(8, d)
        self.layers = nn.ModuleList(KeywordBlock(d) for _ in range(depth))
        self.out = nn.Linear(d, 10)

    def forward(self, x):
        h = self.embed(x.reshape(x.shape[0], 8, 8))
        for i, layer in enumerate(self.layers):
            h = layer(hidden_states=h, gate=1.0 + 0.1 * i)
        return self.out(h.mean(1))


def _kw_reference(model, batches, index):
    """Per-sample q at block ``index``'s input, via a leaf swapped into the keyword argument."""
    Q, Z = [], []
    layer = model.layers[index]
    for x, y in batches:
        for i in range(len(y)):
            store = []

            def pre(module, args, kwargs):
                z = kwargs["hidden_states"].detach().clone().requires_grad_()
                store.append(z)
                return args, {**kwargs, "hidden_states": z.clone()}

            h = layer.register_forward_pre_hook(pre, with_kwargs=True)
            try:
                (g,) = torch.autograd.grad(mt.per_sample_ce(model(x[i : i + 1]), y[i : i + 1]).sum(), store)
            finally:
                h.remove()
            Q.append(g.numpy())
            Z.append(store[0].detach().numpy())
    return np.concatenate(Q), np.concatenate(Z)


def test_keyword_streams_and_inplace_inputs_match_reference():
    torch.manual_seed(0)
    model = KeywordStack().double().eval()
    batches = mt.digits_batches(4, 2, dtype=torch.float64)
    result = probe(model, batches, mt.per_sample_ce, family="linear", head=False)
    assert list(result.statistics) == ["layers.0", "layers.1", "layers.2"]
    for i in range(3):
        Q, Z = _kw_reference(model, batches, i)
        s = result.statistics[f"layers.{i}"]
        np.testing.assert_allclose(s.sum_cross, np.einsum("mtn,mtr->nr", Q, Z), rtol=1e-12, atol=1e-15)
        assert s.sum_q_sq == pytest.approx(float((Q * Q).sum()), rel=1e-12)


@pytest.mark.parametrize("build", [mt.digits_resnet, mt.gpt2, KeywordStack])
def test_taps_change_neither_outputs_nor_parameter_gradients(build):
    torch.manual_seed(0)
    model = build().eval()
    if hasattr(model, "config"):
        x, y = mt.text_batches(16, 2, 1)[0]
        loss_fn = sequence_loss
    else:
        x, y = mt.digits_batches(4, 1)[0]
        loss_fn = mt.per_sample_ce

    def run():
        model.zero_grad(set_to_none=True)
        out = model(x)
        out = getattr(out, "logits", out)
        loss_fn(out, y).sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    plain_out, plain_grads = run()
    with StreamTaps(model, find_candidates(model)) as taps:
        tapped_out, tapped_grads = run()
        assert len(taps.taps) == len(find_candidates(model))
    assert torch.equal(plain_out, tapped_out)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, tapped_grads))


def test_probe_leaves_grads_mode_and_hooks_untouched():
    model = mt.digits_resnet()
    model.train()
    before = _hook_counts(model)
    probe(model, mt.digits_batches(4, 2), mt.per_sample_ce)
    assert _hook_counts(model) == before
    assert all(p.grad is None for p in model.parameters())
    assert all(m.training for m in model.modules())  # mode restored


def test_hooks_removed_after_exception_in_loop():
    model = mt.digits_resnet()
    before = _hook_counts(model)

    def failing_loss(outputs, targets):
        raise RuntimeError("boom in loss")

    with pytest.raises(ModelOnDataError, match=r"batch 0: the model or loss_fn cannot take it \(RuntimeError: boom in loss\)"):
        probe(model, mt.digits_batches(4, 2), failing_loss)
    assert _hook_counts(model) == before

    def failing_data():
        yield from mt.digits_batches(4, 1)
        raise KeyError("data source broke")

    with pytest.raises(KeyError):
        probe(model, failing_data(), mt.per_sample_ce)
    assert _hook_counts(model) == before
    with pytest.raises(ZeroDivisionError):
        with StreamTaps(model, find_candidates(model)):
            assert _hook_counts(model) != before
            1 / 0
    assert _hook_counts(model) == before


def test_scalar_mean_loss_is_rescaled_to_per_sample():
    model = mt.digits_resnet().double()
    batches = mt.digits_batches(5, 2, dtype=torch.float64)
    per_sample = probe(model, batches, mt.per_sample_ce).statistics
    mean = probe(model, batches, lambda o, t: nn.functional.cross_entropy(o, t)).statistics
    for name in per_sample:
        np.testing.assert_allclose(mean[name].sum_cross, per_sample[name].sum_cross, rtol=1e-12, atol=1e-15)
        assert mean[name].sum_q_sq == pytest.approx(per_sample[name].sum_q_sq, rel=1e-12)


def test_discovery_on_real_families():
    transformers = pytest.importorskip("transformers")
    BertConfig, BertModel = transformers.BertConfig, transformers.BertModel

    assert [c.name for c in find_candidates(mt.digits_resnet())] == [
        "layer1.0", "layer1.1", "layer2.0", "layer2.1", "head",
    ]
    assert [c.name for c in find_candidates(mt.gpt2(), head=False)] == ["transformer.h.0", "transformer.h.1"]
    assert [c.name for c in find_candidates(mt.gpt_neox(), head=False)] == ["gpt_neox.layers.0", "gpt_neox.layers.1"]
    assert [c.name for c in find_candidates(mt.llama(), head=False)] == ["model.layers.0", "model.layers.1"]
    assert [c.name for c in find_candidates(mt.digits_transformer(), head=False)] == [
        "encoder.layers.0", "encoder.layers.1",
    ]
    bert = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                intermediate_size=32))
    names = [c.name for c in find_candidates(bert)]
    assert names == ["encoder.layer.0", "encoder.layer.1", "encoder.layer.2", "head"]
    head = find_candidates(bert)[-1]
    assert (head.module, head.position) == ("encoder.layer.2", "output")


def test_explicit_candidates_capture_that_modules_input():
    model = mt.digits_resnet().double()
    batches = mt.digits_batches(4, 1, dtype=torch.float64)
    explicit = probe(model, batches, mt.per_sample_ce, candidates=["layer2.1", "fc"], family="linear", head=False)
    auto = probe(model, batches, mt.per_sample_ce, family="linear")
    np.testing.assert_array_equal(explicit.statistics["layer2.1"].sum_cross, auto.statistics["layer2.1"].sum_cross)
    # fc's input is the pooled (M, C) vector: one position, and q = d loss / d pooled
    assert explicit.statistics["fc"].n_positions == 1 and explicit.statistics["fc"].n_hidden == 16


def test_integer_candidate_input_is_refused_naming_it():
    model = mt.gpt2()
    before = _hook_counts(model)
    with pytest.raises(ValueError) as err:
        probe(model, mt.text_batches(16, 2, 1), sequence_loss, candidates=["transformer.wte"])
    assert str(err.value) == (
        "candidate 'transformer.wte': its input is a torch.int64 tensor, not a floating-point activation; "
        "name a module that reads the residual stream"
    )
    assert _hook_counts(model) == before


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"candidates": ["layer9"]}, "candidate 'layer9' is not a submodule"),
        ({"family": "fourier"}, "unknown family 'fourier'"),
        ({"family": {"layer1.0": "conv", "head": "spline"}}, "unknown family 'spline'"),
        ({"candidates": ["fc"], "family": "conv"}, "family='conv' needs a (M, C, H, W) stream"),
    ],
)
def test_bad_arguments_are_refused_with_one_clear_line(kwargs, message):
    model = mt.digits_resnet()
    with pytest.raises(ValueError) as err:
        probe(model, mt.digits_batches(4, 1), mt.per_sample_ce, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_losses_and_models_are_refused():
    model = mt.digits_resnet()
    with pytest.raises(ValueError, match=r"loss_fn returned shape \(4, 10\)"):
        probe(model, mt.digits_batches(4, 1), lambda o, t: o)
    with pytest.raises(ValueError, match="no residual blocks recognised in Linear"):
        probe(nn.Linear(3, 3), [(torch.zeros(2, 3), torch.zeros(2))], lambda o, t: o.sum(1))
    with pytest.raises(ValueError, match="data yielded no batches"):
        probe(model, [], mt.per_sample_ce)
    with pytest.raises(ValueError, match=r"family given for unknown candidate\(s\) \['layer7'\]"):
        probe(model, mt.digits_batches(4, 1), mt.per_sample_ce, family={"layer7": "conv"})
    # a named module that the forward never calls
    model.unused = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"candidate\(s\) \['unused'\] did not run in the forward pass"):
        probe(model, mt.digits_batches(4, 1), mt.per_sample_ce, candidates=["layer1.0", "unused"], head=False)
