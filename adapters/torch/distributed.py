"""All-reduce of the statistics when a ``torch.distributed`` process group is up.

Every field of :class:`satcore.CandidateStatistics` except ``n_positions`` is
a sum over samples (or batches), so the statistics of the union of the
ranks' data are the element-wise SUM over ranks (docs/core.md, Streaming statistics).
The statistics go through their public ``to_arrays`` / ``from_arrays``: all
sums of all candidates are packed into one float64 tensor and reduced at
once; float64 keeps the counts exact (below 2**53) and the sums at full
precision.  Every rank must have probed at least one batch (so its
statistics exist with the same shapes).
"""

from __future__ import annotations

import numpy as np
import torch

from satcore import DepthStatistics

NOT_SUMMED = ("n_positions", "n_folds")  # settings, the same on every rank


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def all_reduce_arrays(parts: list[dict], device) -> list[dict]:
    """Each dict of arrays with every entry but :data:`NOT_SUMMED` summed over ranks."""
    keys = [(i, k) for i, part in enumerate(parts) for k in part if k not in NOT_SUMMED]
    flat = np.concatenate([np.ravel(np.asarray(parts[i][k], dtype=np.float64)) for i, k in keys])
    sizes = torch.tensor([float(flat.size)], dtype=torch.float64, device=device)
    reference = sizes.clone()
    torch.distributed.all_reduce(sizes, op=torch.distributed.ReduceOp.MAX)
    if sizes.item() != reference.item():
        raise RuntimeError("ranks hold statistics of different shapes; every rank must probe the same candidates")
    buffer = torch.from_numpy(flat).to(device)
    torch.distributed.all_reduce(buffer)
    reduced = buffer.cpu().numpy()
    out = [dict(part) for part in parts]
    offset = 0
    for i, k in keys:
        shape = np.shape(parts[i][k])
        size = int(np.prod(shape))
        out[i][k] = reduced[offset : offset + size].reshape(shape).copy()
        offset += size
    return out


def reduce_probe(statistics: DepthStatistics, device) -> DepthStatistics:
    """``statistics`` (stream sums included) summed over the ranks' data; the same object without a
    process group."""
    if not is_distributed():
        return statistics
    backend_device = device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    names = list(statistics)
    stats = all_reduce_arrays([statistics[n].to_arrays() for n in names], backend_device)
    return DepthStatistics.from_arrays({f"{n}/{f}": v for n, s in zip(names, stats) for f, v in s.items()}, names)
