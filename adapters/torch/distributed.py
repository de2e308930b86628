"""All-reduce of the statistics when a ``torch.distributed`` process group is up.

Every field of :class:`satcore.CandidateStatistics` except ``n_positions`` is
a sum over samples (or batches), so the statistics of the union of the
ranks' data are the element-wise SUM over ranks (docs/core.md, Streaming statistics).  All sums
of all candidates are packed into one float64 tensor and reduced at once;
float64 keeps the counts exact (below 2**53) and the sums at full precision.
Every rank must have probed at least one batch (so its statistics exist with
the same shapes).
"""

from __future__ import annotations

import numpy as np
import torch

SUMMED = ("n_samples", "n_vectors", "n_batches", "sum_q_sq", "sum_xi_sq", "sum_batch_grad_norm", "sum_cross", "sum_gram",
          "sum_xtx", "fold_cross", "fold_samples")
STREAM_SUMMED = ("n_samples", "n_vectors", "sum_z_sq", "sum_update_sq")


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _fields(objects, names):
    return [(obj, f) for obj in objects for f in names if getattr(obj, f, None) is not None]


def all_reduce_sums(objects, names, device) -> None:
    """In place: each listed field of each object becomes its sum over ranks."""
    fields = _fields(objects, names)
    flat = np.concatenate([np.ravel(np.asarray(getattr(o, f), dtype=np.float64)) for o, f in fields])
    sizes = torch.tensor([float(flat.size)], dtype=torch.float64, device=device)
    reference = sizes.clone()
    torch.distributed.all_reduce(sizes, op=torch.distributed.ReduceOp.MAX)
    if sizes.item() != reference.item():
        raise RuntimeError("ranks hold statistics of different shapes; every rank must probe the same candidates")
    buffer = torch.from_numpy(flat).to(device)
    torch.distributed.all_reduce(buffer)
    reduced = buffer.cpu().numpy()
    offset = 0
    for obj, f in fields:
        old = getattr(obj, f)
        size = np.size(old)
        value = reduced[offset : offset + size]
        offset += size
        if np.ndim(old):
            setattr(obj, f, value.reshape(np.shape(old)).astype(np.asarray(old).dtype))
        elif isinstance(old, (int, np.integer)):
            setattr(obj, f, int(round(value[0])))
        else:
            setattr(obj, f, float(value[0]))


def reduce_probe(statistics, streams, device) -> None:
    """All-reduce a probe's statistics and stream diagnostics (no-op without a process group)."""
    if not is_distributed():
        return
    backend_device = device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
    all_reduce_sums(list(statistics.values()), SUMMED, backend_device)
    all_reduce_sums(list(streams.values()), STREAM_SUMMED, backend_device)
