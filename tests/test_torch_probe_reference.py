"""probe() statistics == an independent per-sample autograd reference.

The reference runs ONE sample at a time, replaces the stream at ONE candidate
by a fresh leaf (its own plain hook, not the adapter's taps), takes
``torch.autograd.grad(loss_i, z_i)``, computes ``psi`` with the NumPy
``satcore._formulas.families`` (same seed) and accumulates with the core's
``CandidateStatistics.from_samples``.  Real models: a ResNet trained on
load_digits, Hugging Face GPT-2, GPT-NeoX and Llama trained on English text, a BERT masked LM, and an
``nn.TransformerEncoder``.
"""

import importlib

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore import CandidateStatistics, ag_batch, make_family
from satcore.adapters.torch import probe, sequence_loss
from satcore._formulas.families import conv_gradients
from roundoff import relative_error

torch.set_num_threads(1)

PROBLEMS = {
    "resnet": (mt.digits_resnet, lambda dt: mt.digits_batches(6, 2, dtype=dt), mt.per_sample_ce),
    "transformer_encoder": (mt.digits_transformer, lambda dt: mt.digits_batches(6, 2, dtype=dt), mt.per_sample_ce),
    "gpt2": (mt.gpt2, lambda dt: mt.text_batches(16, 3, 2), sequence_loss),
    "gpt_neox": (mt.gpt_neox, lambda dt: mt.text_batches(16, 3, 2), sequence_loss),
    "llama": (mt.llama, lambda dt: mt.text_batches(16, 3, 2), sequence_loss),
    "bert": (mt.bert, lambda dt: mt.text_batches(16, 3, 2), mt.token_loss),
}
FIELDS = ("sum_q_sq", "sum_cross", "sum_gram", "sum_xi_sq", "sum_xtx")


def _leaf_hook(store):
    def pre(module, args, kwargs):
        z = args[0].detach().clone().requires_grad_()
        store.append(z)
        return (z,) + tuple(args[1:]), kwargs

    def post(module, args, output):
        z = output.detach().clone().requires_grad_()
        store.append(z)
        return z

    return pre, post


def reference_statistics(model, batches, loss_fn, candidate, init_std):
    """Per-sample loop at one candidate (module name, position) -> CandidateStatistics."""
    name, position = candidate
    module = model.get_submodule(name)
    Q, Psi = [], []
    for inputs, targets in batches:
        for i in range(len(targets)):
            store = []
            pre, post = _leaf_hook(store)
            handle = (
                module.register_forward_pre_hook(pre, with_kwargs=True)
                if position == "input"
                else module.register_forward_hook(post)
            )
            try:
                loss = loss_fn(model(inputs[i : i + 1]), targets[i : i + 1])
                (grad,) = torch.autograd.grad(loss.sum(), store)
            finally:
                handle.remove()
            z = store[0].detach().double().numpy()
            g = grad.double().numpy()
            if z.ndim == 4:
                Q.append(conv_gradients(g))
                Psi.append(make_family("conv", z.shape[1], seed=0).features(z))
            else:
                Q.append(g)
                Psi.append(make_family("mlp", z.shape[-1], seed=0, init_std=init_std).features(z))
    return CandidateStatistics.from_samples(
        np.concatenate(Q), np.concatenate(Psi), variance=True, batch_size=len(batches[0][1])
    )


# float64: exact to round-off.  float32: a float32 model's batched and single-sample
# passes differ by themselves (measured up to 3e-6 for the conv ResNet, 2e-7 for the
# GPTs), so the float32 bound is that round-off, not the adapter's.
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_probe_matches_per_sample_autograd(problem, dtype, tol):
    build, batches_for, loss_fn = PROBLEMS[problem]
    model = build().to(dtype)
    batches = batches_for(dtype)
    result = probe(model, batches, loss_fn, variance=True)
    init_std = getattr(getattr(model, "config", None), "initializer_range", None)
    assert len(result.candidates) >= 3
    for c in result.candidates:
        ref = reference_statistics(model, batches, loss_fn, (c.module, c.position), init_std)
        got = result.statistics[c.name]
        assert got.n_samples == ref.n_samples == sum(len(t) for _, t in batches)
        assert (got.n_hidden, got.n_features, got.n_positions) == (ref.n_hidden, ref.n_features, ref.n_positions)
        for f in FIELDS:
            assert relative_error(getattr(got, f), getattr(ref, f)) < tol, (c.name, f, relative_error(getattr(got, f), getattr(ref, f)))
        # eq. (2): the batch-mean gradient norm averaged over batches
        assert got.sum_batch_grad_norm / got.n_batches == pytest.approx(ref.sum_batch_grad_norm / ref.n_batches, rel=tol)
        assert got.sum_q_sq > 0 and np.abs(got.sum_cross).max() > 0


def test_sum_cross_is_the_folds_sum_past_the_fold_count_and_between_results():
    """Each batch's ``C`` goes to its fold only and ``sum_cross`` is the folds' sum, formed at each result:
    with more batches than folds (18 of one image, 16 folds: two folds hold two batches), a result
    midway and the last one equal the per-sample reference, and so do their folds added up."""
    from satcore.adapters.torch import Probe

    model = mt.digits_resnet().double()
    batches = mt.digits_batches(1, 18, dtype=torch.float64)
    state = Probe(model, mt.per_sample_ce, candidates=["layer2.0"], head=False)
    results = []
    for k, batch in enumerate(batches):
        state.update(batch)
        if k in (8, 17):
            results.append((state.result(), batches[: k + 1]))
    for result, seen in results:
        ref = reference_statistics(model, seen, mt.per_sample_ce, ("layer2.0", "input"), None)
        got = result.statistics["layer2.0"]
        assert relative_error(got.sum_cross, ref.sum_cross) < 1e-12
        assert relative_error(got.fold_cross.sum(0), ref.sum_cross) < 1e-12
    assert list(results[-1][0].statistics["layer2.0"].fold_samples) == [2, 2] + [1] * 14


def test_ag_batch_is_papers_eq2_on_real_gradients():
    """ag_batch from the probe equals the core's ag_batch on the reference Q (eq. 2)."""
    model = mt.digits_resnet().double()
    batches = mt.digits_batches(5, 3, dtype=torch.float64)
    result = probe(model, batches, mt.per_sample_ce, head=False)
    module = model.get_submodule("layer2.1")
    Q = []
    for x, y in batches:
        for i in range(len(y)):
            store = []
            pre, _ = _leaf_hook(store)
            h = module.register_forward_pre_hook(pre, with_kwargs=True)
            try:
                (g,) = torch.autograd.grad(mt.per_sample_ce(model(x[i : i + 1]), y[i : i + 1]).sum(), store)
            finally:
                h.remove()
            Q.append(conv_gradients(g.numpy()))
    assert result.report()["layer2.1"].ag_batch == pytest.approx(ag_batch(np.concatenate(Q), 5), rel=1e-12)


@pytest.mark.parametrize("immediate", [True, False], ids=["cpu", "accelerator"])
def test_a_non_finite_loss_is_refused_naming_its_batch(immediate, monkeypatch, tmp_path):
    """Batch 1 of 3 has a NaN and an infinite per-sample loss (2 of 4).  Where reading the loss costs nothing
    (the CPU) its update is refused; where it would stall a device queue (patched in: an accelerator) the
    counts stay on the device and the next sync refuses, the probe's result or its checkpoint, before the
    checkpoint file is written; the batches before it pass either way.  Either refusal is the model's, on that
    data (:class:`satcore.ModelOnDataError`: the command line leads it with both files)."""
    from satcore import ModelOnDataError
    from satcore.adapters.torch import Probe

    # the module, which the package's probe function shadows as an attribute
    monkeypatch.setattr(importlib.import_module("satcore.adapters.torch.probe"), "reads_without_sync",
                        lambda device: immediate)
    calls = []

    def loss_fn(outputs, targets):
        losses = mt.per_sample_ce(outputs, targets)
        calls.append(None)
        if len(calls) == 2:
            losses = losses + torch.tensor([0.0, float("nan"), 0.0, float("inf")])
        return losses

    message = r"batch 1: the loss is NaN or infinite for 2 of 4 sample\(s\)"
    batches = mt.digits_batches(4, 3)
    model = mt.digits_resnet()
    for checkpoint in (None, tmp_path / "sums.npz"):
        calls.clear()
        state = Probe(model, loss_fn, candidates=["layer2.0"], head=False, checkpoint=checkpoint,
                      checkpoint_every=3)
        state.update(batches[0])
        if immediate:
            with pytest.raises(ModelOnDataError, match=message):
                state.update(batches[1])
            continue
        state.update(batches[1])
        with pytest.raises(ModelOnDataError, match=message):
            state.update(batches[2]) if checkpoint else state.result()
        assert checkpoint is None or not checkpoint.exists()
