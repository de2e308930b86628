"""Sequence-first streams: ``nn.TransformerEncoder`` with ``batch_first=False`` (PyTorch's
default) gives ``(T, B, d)`` at its layers.  The probe must read the batch from dim 1
there: the same weights in either layout give the same statistics, also when ``T == B``
(8 digit rows as tokens, 8 samples a batch), and both equal a per-sample autograd
reference that takes ``z[:, 0]`` of each single-sample ``(T, 1, d)`` stream by hand.
A sequence-first stream at a module that does not say so is refused by the batch-size
check (when ``T != B``), naming the candidate and its shape.
"""

import numpy as np
import pytest
import torch
from torch import nn

from zoo import models_torch as mt
from roundoff import assert_nested_close, relative_error
from satcore import CandidateStatistics, make_family
from satcore.adapters.torch import grow, probe

torch.set_num_threads(1)

FIELDS = ("sum_q_sq", "sum_cross", "sum_gram", "sum_xi_sq", "sum_xtx", "sum_batch_grad_norm")


def models():
    return mt.digits_transformer().double(), mt.digits_transformer(batch_first=False).double()


def reference_statistics(model, batches, module_name, position):
    """Per-sample ``q_i``, ``z_i`` at a sequence-first module (a leaf swapped in), the core's features."""
    module = model.get_submodule(module_name)
    Q, Z = [], []
    for x, y in batches:
        for i in range(len(y)):
            store = []

            def pre(module, args):
                store.append(args[0].detach().clone().requires_grad_())
                return (store[0],) + tuple(args[1:])

            def post(module, args, output):
                store.append(output.detach().clone().requires_grad_())
                return store[0]

            handle = module.register_forward_pre_hook(pre) if position == "input" else module.register_forward_hook(post)
            try:
                (grad,) = torch.autograd.grad(mt.per_sample_ce(model(x[i : i + 1]), y[i : i + 1]).sum(), store)
            finally:
                handle.remove()
            assert store[0].shape == (8, 1, 32)  # (T, B, d): the layout under test
            Q.append(grad[:, 0].numpy())
            Z.append(store[0][:, 0].detach().numpy())
    Q, Z = np.stack(Q), np.stack(Z)
    return CandidateStatistics.from_samples(Q, make_family("mlp", 32, seed=0).features(Z), variance=True,
                                            batch_size=len(batches[0][1]))


# 6 a batch: T != B; 8 a batch: T == B, where reading dim 0 as the batch raised no error
@pytest.mark.parametrize("batch_size, n_batches", [(6, 4), (8, 3)])
def test_sequence_first_equals_batch_first_and_reference(batch_size, n_batches):
    batch_first, sequence_first = models()
    batches = mt.digits_batches(batch_size, n_batches, dtype=torch.float64)
    a = probe(batch_first, batches, mt.per_sample_ce, variance=True)
    b = probe(sequence_first, batches, mt.per_sample_ce, variance=True)
    assert [c.sequence_first for c in b.candidates] == [True, True, True]
    assert [c.sequence_first for c in a.candidates] == [False, False, False]
    for c in b.candidates:
        ref = reference_statistics(sequence_first, batches, c.module, c.position)
        for got in (a.statistics[c.name], b.statistics[c.name]):
            assert (got.n_samples, got.n_positions, got.n_hidden) == (batch_size * n_batches, 8, 32)
            for f in FIELDS:
                assert relative_error(getattr(got, f), getattr(ref, f)) < 1e-12, (c.name, f)
        da, db = a.diagnostics[c.name], b.diagnostics[c.name]
        assert db.stream_rms == pytest.approx(da.stream_rms, rel=1e-12)
        if c.name == "head":
            assert da.relative_update is db.relative_update is None
        else:
            assert db.relative_update == pytest.approx(da.relative_update, rel=1e-12)
    # the report: growth value (not tangent complete: M T > r), sigma_sq, noise floor, debiased values, the
    # fold test's nested record. The two layouts sum the same float64 products in another order, a few eps64
    # apart (the statistics agree to 1e-12 above); the report's pseudo-inverses amplify a relative change of K
    # by at most its condition number on the kept spectrum (1e5-1e7 here), so each value is held to
    # 64 eps64 cond(K): a margin of 64 over that first-order bound, and still 1e-7 or less, where a wrong layout
    # is off by O(1).
    for c, ra, rb in zip(a.candidates, a.report().to_dict()["candidates"], b.report().to_dict()["candidates"]):
        assert rb["realizability"] < 0.999
        lam = np.linalg.eigvalsh(a.statistics[c.name].feature_gram())
        condition = lam.max() / lam[lam > 1e-10 * lam.max()].min()
        assert_nested_close(rb, ra, rel=64 * np.finfo(np.float64).eps * condition, abs=1e-12)


def test_sequence_first_mean_loss_is_rescaled_like_per_sample():
    _, sequence_first = models()
    batches = mt.digits_batches(6, 2, dtype=torch.float64)
    per_sample = probe(sequence_first, batches, mt.per_sample_ce).statistics
    mean = probe(sequence_first, batches, lambda o, t: mt.per_sample_ce(o, t).mean()).statistics
    for name in per_sample:
        assert relative_error(mean[name].sum_cross, per_sample[name].sum_cross) < 1e-12
        assert mean[name].sum_q_sq == pytest.approx(per_sample[name].sum_q_sq, rel=1e-12)


class Block(nn.Module):
    """A block that states no layout."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, z):
        return self.layer(z)


class HiddenLayout(nn.Module):
    """The sequence-first digits transformer with its layers wrapped in :class:`Block`:
    fed ``(T, B, d)``, and nothing says so."""

    def __init__(self, model):
        super().__init__()
        self.embed, self.position, self.fc = model.embed, model.position, model.fc
        self.layers = nn.ModuleList(Block(layer) for layer in model.encoder.layers)

    def forward(self, x):
        h = (self.embed(x.reshape(x.shape[0], 8, 8)) + self.position).transpose(0, 1)
        for layer in self.layers:
            h = layer(h)
        return self.fc(h.mean(0))


def test_unknown_sequence_first_layout_is_refused_naming_the_candidate():
    model = HiddenLayout(models()[1])
    batches = mt.digits_batches(6, 1, dtype=torch.float64)
    with pytest.raises(ValueError) as err:
        probe(model, batches, mt.per_sample_ce, head=False)
    assert str(err.value).startswith(
        "candidate 'layers.0' has a stream of batch-first shape (8, 6, 32) (8 samples) "
        "but loss_fn returned 6 per-sample losses"
    )
    # a scalar loss gives no batch size: the candidates disagree with each other
    with pytest.raises(ValueError, match=r"candidate 'fc' has a stream of batch-first shape "
                                         r"\(6, 32\) \(6 samples\) but candidate 'layers.0' has 8"):
        probe(model, batches, lambda o, t: mt.per_sample_ce(o, t).mean(), candidates=["layers.0", "fc"], head=False)


class TokenMeanFeatures(nn.Module):
    """A user feature map that mixes a sample's tokens: wrong if handed ``(T, B, d)``."""

    def forward(self, z):
        return torch.cat([z, z.mean(1, keepdim=True).expand_as(z)], -1)


@pytest.mark.parametrize("family", ["mlp", TokenMeanFeatures()])
@pytest.mark.parametrize("at", ["encoder.layers.1", "head"])
def test_grow_at_sequence_first_candidate_equals_batch_first(family, at):
    batch_first, sequence_first = models()
    batches = mt.digits_batches(32, 2, start=0, dtype=torch.float64)
    grown = []
    for model in (batch_first, sequence_first):
        result = probe(model, batches, mt.per_sample_ce, family=family)
        grown.append(grow(model, result, at, rho=1e-3))
        base = torch.cat([mt.per_sample_ce(model(x), y) for x, y in batches]).mean()
        with torch.no_grad():
            measured = torch.cat([mt.per_sample_ce(grown[-1].model(x), y) for x, y in batches]).mean() - base
        assert grown[-1].predicted_change < 0
        assert float(measured) / grown[-1].predicted_change == pytest.approx(1, abs=0.05)
    assert grown[1].alpha == pytest.approx(grown[0].alpha, rel=1e-9)
    with torch.no_grad():
        for x, _ in batches:
            torch.testing.assert_close(grown[1].model(x), grown[0].model(x), rtol=1e-10, atol=1e-12)
    # the grown sequence-first model is still read sequence-first
    again = [probe(g.model, batches, mt.per_sample_ce, family=family).statistics for g in grown]
    for name in again[0]:
        assert relative_error(again[1][name].sum_cross, again[0][name].sum_cross) < 1e-10
