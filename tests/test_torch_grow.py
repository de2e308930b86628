"""grow(): the measured change of the probe-set mean loss matches the first-order
prediction -alpha * growth_value^2 (docs/core.md, Gradient-matched insertion; paper Appendix H), for an
absolute alpha and for a relative update size rho; alpha=0 and zero=True are
function-preserving; the zero block's gradient is the cross-gradient C."""

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore.adapters.torch import InsertedResidual, grow, probe, sequence_loss

torch.set_num_threads(1)

# float64: a predicted change of 1e-6 is far below float32 resolution of a loss ~ 1
PROBLEMS = {
    "resnet": (mt.digits_resnet, lambda: mt.digits_batches(32, 2, start=0, dtype=torch.float64), mt.per_sample_ce),
    "gpt2": (mt.gpt2, lambda: mt.text_batches(32, 4, 2, path=mt.TRAIN_TEXT), sequence_loss),
    "gpt_neox": (mt.gpt_neox, lambda: mt.text_batches(32, 4, 2, path=mt.TRAIN_TEXT), sequence_loss),
}
CASES = [
    ("resnet", "layer1.1"), ("resnet", "layer2.0"), ("resnet", "head"),
    ("gpt2", "transformer.h.0"), ("gpt2", "head"), ("gpt_neox", "gpt_neox.layers.1"),
]


@pytest.fixture(scope="module")
def probed():
    out = {}
    for key, (build, batches_for, loss_fn) in PROBLEMS.items():
        model = build().double()
        batches = batches_for()
        out[key] = (model, batches, loss_fn, probe(model, batches, loss_fn, split="train"))
    return out


def mean_loss(model, batches, loss_fn):
    with torch.no_grad():
        return float(torch.cat([loss_fn(model(x), y) for x, y in batches]).mean())


def outputs(model, batches):
    with torch.no_grad():
        return [getattr(o, "logits", o) for o in (model(x) for x, _ in batches)]


@pytest.mark.parametrize("problem,at", CASES)
def test_measured_loss_change_matches_prediction(probed, problem, at):
    model, batches, loss_fn, result = probed[problem]
    base = mean_loss(model, batches, loss_fn)
    growth = result.report()[at].growth_value
    errors = {}
    for kw in ({"alpha": 1e-3}, {"rho": 1e-3}, {"rho": 1e-4}):
        grown = grow(model, result, at, **kw)
        measured = mean_loss(grown.model, batches, loss_fn) - base
        assert grown.predicted_change == pytest.approx(-grown.alpha * growth**2, rel=1e-10)
        assert grown.predicted_change < 0
        errors[tuple(kw.items())] = abs(measured / grown.predicted_change - 1)
        assert errors[tuple(kw.items())] < 0.05, (kw, measured, grown.predicted_change)
        if "rho" in kw:  # the inserted update has the asked relative size ||h||_S / ||z||_S
            assert grown.alpha * growth / result.diagnostics[at].stream_rms == pytest.approx(kw["rho"], rel=1e-12)
    # the remainder is second order: ten times smaller step, about ten times smaller relative error
    ratio = errors[(("rho", 1e-3),)] / errors[(("rho", 1e-4),)]
    assert 5 < ratio < 20


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("problem,at", [("resnet", "layer2.1"), ("gpt2", "transformer.h.1"), ("gpt_neox", "head")])
def test_alpha_zero_and_zero_block_are_bit_identical(probed, problem, at, dtype):
    model, batches, loss_fn, result = probed[problem]
    model = model.to(dtype)
    batches = [(x.to(dtype) if x.is_floating_point() else x, y) for x, y in batches]
    reference = outputs(model, batches)
    for kw in ({"alpha": 0.0}, {"zero": True}):
        grown = grow(model, result, at, **kw)
        assert any(isinstance(m, InsertedResidual) for m in grown.model.modules())
        assert all(torch.equal(a, b) for a, b in zip(reference, outputs(grown.model, batches)))
        assert grown.predicted_change == 0.0
    model.double()
    # and a non-zero step does change the function (the comparison above can fail)
    moved = grow(model.to(dtype), result, at, rho=1e-2).model
    assert not all(torch.equal(a, b) for a, b in zip(reference, outputs(moved, batches)))
    model.double()


@pytest.mark.parametrize("problem,at", [("resnet", "layer1.0"), ("gpt2", "transformer.h.1")])
def test_zero_block_gradient_is_the_cross_gradient(probed, problem, at):
    """Growth arm: d(mean loss)/dV at V = 0 equals C = (1/M) sum_i Q_i^T Psi_i (Appendix F)."""
    model, batches, loss_fn, result = probed[problem]
    grown = grow(model, result, at, zero=True).model.eval()
    wrapper = next(m for m in grown.modules() if isinstance(m, InsertedResidual))
    weight = wrapper.branch.projection.weight
    total = sum(loss_fn(grown(x), y).sum() for x, y in batches) / sum(len(y) for _, y in batches)
    (grad,) = torch.autograd.grad(total, weight)
    C = result.statistics[at].cross_gradient()
    np.testing.assert_allclose(grad.reshape(C.shape).numpy(), C, rtol=1e-9, atol=1e-12 * np.abs(C).max())


def test_grown_model_probes_again_and_grow_refuses_bad_steps(probed):
    model, batches, loss_fn, result = probed["gpt2"]
    grown = grow(model, result, "transformer.h.1", rho=1e-3).model
    again = probe(grown, batches, loss_fn)
    assert list(again.statistics) == list(result.statistics)
    with pytest.raises(ValueError, match="exactly one of alpha, rho or zero"):
        grow(model, result, "transformer.h.1", alpha=1e-3, rho=1e-3)
    with pytest.raises(ValueError, match="unknown candidate 'nowhere'"):
        grow(model, result, "nowhere", alpha=1e-3)
