"""The probe on a CUDA device against the same probe on the CPU.

CI has no GPU, so this module is skipped there; it runs wherever torch sees
one (docs/benchmarks.md records such a run).  float64 models: every field of
every candidate to 1e-10 relative (only the order of reductions differs), on
each route of the adapter (``mlp`` with the ``T x T`` kernel, the per-sample
``X_i`` route, the GPU's ``K_i Psi_i`` route for ``variance``, the ``conv``
hidden-map route (its Gram by FFT and by shifted products), subsampled
positions), plus 100 times the gap between the model's own CPU and GPU
outputs (Hugging Face Llama computes its rotary angles in float32 even in a
float64 model); float32 models (TF32 off) to
1e-4; ``grow`` on the GPU matches its first-order prediction.  With
``torch.use_deterministic_algorithms`` a resumed probe is bitwise the
uninterrupted one and an NCCL all-reduce over one rank changes nothing
(without it two identical GPU probes differ in the last bit).
"""

import copy
import os

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore.adapters.torch import grow, probe, sequence_loss

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, read when CUDA starts

CUDA = torch.device("cuda")
PROBLEMS = {
    "resnet": (mt.digits_resnet, lambda dt: mt.digits_batches(8, 3, dtype=dt), mt.per_sample_ce),
    "transformer_encoder": (mt.digits_transformer, lambda dt: mt.digits_batches(8, 3, dtype=dt), mt.per_sample_ce),
    "gpt2": (mt.gpt2, lambda dt: mt.text_batches(16, 4, 3), sequence_loss),
    "llama": (mt.llama, lambda dt: mt.text_batches(16, 4, 3), sequence_loss),
}
OPTIONS = [{}, {"variance": True}, {"position_subsample": 5, "seed": 2}]


def on(device, batches):
    def move(x):
        if torch.is_tensor(x):
            return x.to(device)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x

    return [(move(x), move(y)) for x, y in batches]


def max_rel_diff(a, b) -> float:
    worst = 0.0
    for name in b.statistics:
        x, y = a.statistics[name].to_arrays(), b.statistics[name].to_arrays()
        assert x.keys() == y.keys()
        for field in x:
            scale = np.linalg.norm(y[field])
            if scale:
                worst = max(worst, float(np.linalg.norm(x[field] - y[field]) / scale))
    return worst


@pytest.fixture(autouse=True)
def no_tf32():
    """cuDNN convolutions default to TF32 (10-bit mantissa); the float32 checks compare float32 to float32."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(False)


def output_gap(model, gpu_model, batches) -> float:
    """Relative difference of the model's own outputs on the CPU and on the GPU."""
    with torch.no_grad():
        a = torch.cat([getattr(o, "logits", o).flatten() for o in (model(x) for x, _ in batches)])
        b = torch.cat([getattr(o, "logits", o).flatten().cpu() for o in (gpu_model(x) for x, _ in on(CUDA, batches))])
    return float((a - b).norm() / a.norm())


@pytest.mark.parametrize("options", OPTIONS, ids=["default", "variance", "subsample"])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_float64_probe_on_cuda_equals_cpu(problem, options):
    build, batches_for, loss_fn = PROBLEMS[problem]
    model = build().double()
    gpu_model = copy.deepcopy(model).to(CUDA)
    batches = batches_for(torch.float64)
    gap = output_gap(model, gpu_model, batches)
    cpu = probe(model, batches, loss_fn, **options)
    gpu = probe(gpu_model, on(CUDA, batches), loss_fn, **options)
    assert list(gpu.statistics) == list(cpu.statistics)
    assert max_rel_diff(gpu, cpu) < 1e-10 + 100 * gap
    for name in cpu.statistics:
        assert gpu.statistics[name].n_samples == cpu.statistics[name].n_samples
        assert gpu.statistics[name].n_batches == cpu.statistics[name].n_batches
        assert np.array_equal(gpu.statistics[name].sum_gram, gpu.statistics[name].sum_gram.T)
        assert gpu.diagnostics[name].stream_rms == pytest.approx(cpu.diagnostics[name].stream_rms,
                                                                 rel=1e-12 + 100 * gap)
    for got, ref in zip(gpu.report().candidates, cpu.report().candidates):
        assert got.growth_value == pytest.approx(ref.growth_value, rel=1e-8 + 100 * gap)


@pytest.mark.parametrize("problem", ["resnet", "gpt2"])
def test_float32_probe_on_cuda_close_to_cpu(problem):
    build, batches_for, loss_fn = PROBLEMS[problem]
    model = build()
    batches = batches_for(torch.float32)
    cpu = probe(model, batches, loss_fn, variance=True)
    gpu = probe(model.to(CUDA), on(CUDA, batches), loss_fn, variance=True)
    assert max_rel_diff(gpu, cpu) < 1e-4
    float32_sums = probe(model, on(CUDA, batches), loss_fn, variance=True, batch_dtype=torch.float32)
    assert max_rel_diff(float32_sums, cpu) < 1e-4


def test_grow_on_cuda_matches_prediction():
    model = mt.gpt2().double().to(CUDA)
    batches = on(CUDA, mt.text_batches(32, 4, 2, path=mt.TRAIN_TEXT))
    result = probe(model, batches, sequence_loss)

    def mean_loss(m):
        with torch.no_grad():
            return float(torch.cat([sequence_loss(m(x), y) for x, y in batches]).mean())

    base = mean_loss(model)
    grown = grow(model, result, "transformer.h.0", rho=1e-4)
    assert next(grown.model.parameters()).device.type == "cuda"
    measured = mean_loss(grown.model) - base
    assert abs(measured / grown.predicted_change - 1) < 0.05


def test_resumed_probe_on_cuda_is_bitwise_uninterrupted(tmp_path, deterministic):
    model = mt.digits_resnet().double().to(CUDA)
    batches = on(CUDA, mt.digits_batches(8, 4, dtype=torch.float64))
    whole = probe(model, batches, mt.per_sample_ce, variance=True)
    path = tmp_path / "c.npz"
    probe(model, batches[:2], mt.per_sample_ce, variance=True, checkpoint=path)
    resumed = probe(model, batches, mt.per_sample_ce, variance=True, checkpoint=path)
    assert max_rel_diff(resumed, whole) == 0.0


def test_nccl_single_rank_all_reduce_is_identity(tmp_path, deterministic):
    model = mt.digits_resnet().double().to(CUDA)
    batches = on(CUDA, mt.digits_batches(8, 2, dtype=torch.float64))
    alone = probe(model, batches, mt.per_sample_ce, variance=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.distributed.init_process_group("nccl", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        reduced = probe(model, batches, mt.per_sample_ce, variance=True)
    finally:
        torch.distributed.destroy_process_group()
    assert max_rel_diff(reduced, alone) == 0.0


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_conv_moments_on_cuda_equal_cpu(gram_route, dtype, tol):
    """The conv family's sums on the GPU, with the Gram by FFT and by shifted products, against the CPU's float64."""
    from satcore.adapters.torch import moments

    g = torch.Generator().manual_seed(4)
    grad = torch.randn(6, 5, 9, 7, generator=g, dtype=torch.float64)
    hidden = torch.randn(6, 4, 9, 7, generator=g, dtype=torch.float64).relu()
    cpu = moments.conv_batch_moments(grad, hidden, variance=True).as_dict()
    gpu = moments.conv_batch_moments(grad.to(CUDA), hidden.to(CUDA), variance=True, dtype=dtype).as_dict()
    assert set(gpu) == set(cpu)
    assert (gpu["n_samples"], gpu["n_vectors"]) == (cpu["n_samples"], cpu["n_vectors"]) == (6, 6 * 9 * 7)
    for field in set(cpu) - {"n_samples", "n_vectors"}:
        assert gpu[field].device.type == CUDA.type and gpu[field].dtype == torch.float64
        assert float((gpu[field].cpu() - cpu[field]).norm() / cpu[field].norm()) < tol, field
    assert torch.equal(gpu["sum_gram"], gpu["sum_gram"].T)
