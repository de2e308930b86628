"""Two gloo processes, each probing half of the batches, all-reduce to the
single-process statistics (docs/core.md, Streaming statistics) to 1e-10 relative: the model bare, wrapped in
DistributedDataParallel, and sharded with FSDP2's fully_shard."""

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from zoo import models_torch as mt
from satcore.adapters.torch import probe

WORLD = 2


def _batches():
    return mt.digits_batches(6, 4, dtype=torch.float64)


def _model():
    # untrained but seeded: identical in every process without training in each of them
    torch.manual_seed(0)
    return mt.DigitsResNet().double().eval()


WRAPPERS = ("plain", "ddp", "fsdp")


def _wrapped(model, wrap):
    """The model as a data-parallel training script holds it: bare, in DDP (probed through its module,
    names without "module."), or sharded in place by FSDP2's fully_shard (each block, then the root)."""
    if wrap == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in ("layer1.0", "layer1.1", "layer2.0", "layer2.1"):
            fully_shard(model.get_submodule(block))
        fully_shard(model)
    return model


def _worker(rank, init_file, out_dir):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for wrap in WRAPPERS:  # one process group for all three: spawning dominates the test's time
            model = _wrapped(_model(), wrap)
            mine = _batches()[rank::WORLD]
            result = probe(model, mine, mt.per_sample_ce, variance=True)
            arrays = result.statistics.to_arrays()
            arrays.update({f"{k}/stream_rms": np.asarray(d.stream_rms) for k, d in result.diagnostics.items()})
            np.savez(os.path.join(out_dir, f"{wrap}-rank{rank}.npz"), **arrays)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow  # spawned gloo processes
def test_two_gloo_processes_equal_one_bare_ddp_and_fsdp(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    torch.set_num_threads(1)
    single = probe(_model(), _batches(), mt.per_sample_ce, variance=True)
    expected = single.statistics.to_arrays()
    expected.update({f"{k}/stream_rms": np.asarray(d.stream_rms) for k, d in single.diagnostics.items()})
    # the halves really differ (the all-reduce is what makes them agree)
    halves = [probe(_model(), _batches()[r::WORLD], mt.per_sample_ce) for r in range(WORLD)]
    assert not np.allclose(halves[0].statistics["layer1.0"].sum_cross, halves[1].statistics["layer1.0"].sum_cross)
    for wrap in WRAPPERS:
        for rank in range(WORLD):
            with np.load(tmp_path / f"{wrap}-rank{rank}.npz", allow_pickle=False) as got:
                assert sorted(got.files) == sorted(expected), wrap
                for key, value in expected.items():
                    err = np.linalg.norm(np.ravel(got[key] - value)) / max(np.linalg.norm(np.ravel(value)), 1e-300)
                    assert err < 1e-10, (wrap, rank, key, err)
