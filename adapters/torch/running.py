"""A probe's running totals, added up on the model's device.

Per batch each candidate's sums (float64 tensors on the model's device, see
:mod:`.moments`) are added in place to float64 totals on that device, with no
host transfer and no synchronisation: on a GPU a per-batch copy of an
``r x r`` Gram to the host, or a Python ``float()`` of a device scalar,
stalls the queue for longer than the sums take.  On the CPU the totals ARE
the arrays of the core's :class:`satcore.CandidateStatistics` (shared
memory, nothing copied); elsewhere :meth:`RunningSums.sync` copies them
into those arrays, which the probe does before each checkpoint and at the
end.  The stream sums (``sum_i ||z_i||^2``, its position vectors, the block
update's ``sum_i ||block(z_i) - z_i||^2``) are fields of the same statistics.
The totals are the whole probe's (seeded from a resumed checkpoint),
added batch after batch in the same order whether or not the probe was
interrupted, so a resumed probe is bitwise the uninterrupted one.
"""

from __future__ import annotations

import torch

from satcore import BatchMoments
from satcore import CandidateStatistics

from .moments import complete_lower

MATRICES = ("sum_cross", "sum_gram", "sum_xtx", "sum_qq")
SYMMETRIC = ("sum_gram", "sum_xtx")
SCALARS = {"sum_q_sq": "sum_q_sq", "sum_xi_sq": "sum_xi_sq", "batch_grad_norm": "sum_batch_grad_norm"}
STREAM_SCALARS = ("sum_z_sq", "sum_update_sq")


def fold_layout() -> tuple[int, int]:
    """``(world size, rank)`` of the ``torch.distributed`` process group, ``(1, 0)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class RunningSums:
    """Device totals of one candidate's ``statistics``, its stream sums included."""

    def __init__(self, statistics: CandidateStatistics, device: torch.device):
        self.statistics = statistics

        def scalar(value):
            return torch.tensor(float(value), dtype=torch.float64, device=device)

        def matrix(array):
            if device.type != "cpu" and statistics.n_samples == 0:
                return torch.zeros(array.shape, dtype=torch.float64, device=device)  # nothing to copy over
            return torch.as_tensor(array, device=device)  # on the CPU: a view of the array, no copy

        self.matrices = {f: matrix(getattr(statistics, f)) for f in MATRICES if getattr(statistics, f) is not None}
        self.fold_cross = None if not statistics.n_folds else matrix(statistics.fold_cross)
        # Local batch i of rank k goes to fold (i * world + k) mod m: with batches dealt to ranks
        # round-robin (rank k takes batches k, k + world, ...), the all-reduced folds are one pass's.
        self.world, self.rank = fold_layout()
        self.scalars = {field: scalar(getattr(statistics, name)) for field, name in SCALARS.items()}
        self.stream = {f: scalar(getattr(statistics, f)) for f in STREAM_SCALARS if getattr(statistics, f) is not None}
        # position vectors counted since the last sync, of the stream and of the statistics (fewer
        # under position_subsample): Python ints, or device tensors once a padding mask counted them
        # there (read at sync, so no per-batch host copy)
        self.new_stream_vectors = 0
        self.new_statistics_vectors = 0

    def add(self, moments: BatchMoments) -> None:
        """Add one batch's ``moments`` from :mod:`.moments` (exactly symmetric Grams, if any; ``None``
        for those already added, ``batch_moments(grams_into=...)``), with the stream's
        ``sum ||z_i||^2`` over its ``n_stream_vectors`` and the block update's
        ``sum ||block(z_i) - z_i||^2`` (``None`` when the block changes the shape or is the ``head``
        endpoint: then the statistics keep no update sum, ``block_update=False``).  The counts
        (``n_stream_vectors``, ``n_vectors``) are ints, or 0-d tensors counted from a padding mask."""
        for field, total in self.matrices.items():
            value = getattr(moments, field)
            if value is not None:
                total += value
        for field, total in self.scalars.items():
            total += getattr(moments, field)
        fold = None
        if self.fold_cross is not None:
            fold = (self.statistics.n_batches * self.world + self.rank) % self.statistics.n_folds
            self.fold_cross[fold] += moments.sum_cross
        self.stream["sum_z_sq"] += moments.sum_z_sq
        if "sum_update_sq" in self.stream:
            self.stream["sum_update_sq"] += moments.sum_update_sq
        self.statistics.add_counts(int(moments.n_samples), n_batches=1, n_vectors=0, fold=fold)  # vectors: at sync
        self.new_stream_vectors = self.new_stream_vectors + moments.n_stream_vectors
        self.new_statistics_vectors = self.new_statistics_vectors + moments.n_vectors

    def sync(self) -> None:
        """Bring ``statistics`` up to date (one host copy per field off the CPU).

        The Gram totals are made whole from their upper triangles first
        (:func:`.moments.add_gram` updates only those on the CPU).
        """
        for field in SYMMETRIC:
            if field in self.matrices:
                complete_lower(self.matrices[field])
        # on the CPU the totals are the statistics' own arrays already
        self.statistics.set_sums(**{f: total.cpu().numpy() for f, total in self.matrices.items()
                                    if total.device.type != "cpu"})
        self.statistics.set_sums(**{SCALARS[field]: float(total) for field, total in self.scalars.items()})
        if self.fold_cross is not None and self.fold_cross.device.type != "cpu":
            self.statistics.set_sums(fold_cross=self.fold_cross.cpu().numpy())
        self.statistics.set_sums(**{f: float(total) for f, total in self.stream.items()})
        # (n_vectors stays None when resumed from a checkpoint that did not count them)
        self.statistics.add_counts(n_vectors=int(self.new_statistics_vectors),
                                   n_stream_vectors=int(self.new_stream_vectors))
        self.new_stream_vectors = self.new_statistics_vectors = 0
