"""A probe's running totals, added up on the model's device.

Per batch each candidate's sums (float64 tensors on the model's device, see
:mod:`.moments`) are added in place to float64 totals on that device, with no
host transfer and no synchronisation: on a GPU a per-batch copy of an
``r x r`` Gram to the host, or a Python ``float()`` of a device scalar,
stalls the queue for longer than the sums take.  On the CPU the totals ARE
the arrays of the core's :class:`satcore.CandidateStatistics` (shared
memory, nothing copied per batch), except that up to the first sync the
Gram totals of a probe on one thread are held packed (half the bytes,
:meth:`RunningSums._share_arrays`).  ``sum_cross`` is the exception where
the statistics keep folds: a batch's ``C`` goes to its fold only, and the
total is the folds' sum, formed at each sync; a float32 model's batch on the
CPU waits for its fold unformed, as a :class:`.moments.CentredCross` (half
the bytes), until another batch reaches that fold or the next sync.  Before
any of this, a CPU probe's first batches may wait as their tapped streams and
gradients (``Probe.tapped``), added in their order when the totals' bytes
would outweigh them or at the next sync; the last sync of a probe hands its
packed Gram totals on packed (:class:`satcore.adapter_api.PackedGram`).
:meth:`RunningSums.sync`, which the
probe calls before each checkpoint and for each result, hands the totals
of every batch so far to fresh statistics as one
:class:`satcore.BatchMoments` through
:meth:`~satcore.CandidateStatistics.add_moments`, the one way sums reach
statistics (``adopt=True``: the fresh statistics take the host arrays as
they are, the totals' very bits, and on the CPU the totals themselves,
without a copy).  The stream sums
(``sum_i ||z_i||^2``, its position vectors, the block update's
``sum_i ||block(z_i) - z_i||^2``) are fields of the same statistics.
The totals are the whole probe's (seeded from a resumed checkpoint),
added batch after batch in the same order whether or not the probe was
interrupted, so a resumed probe is bitwise the uninterrupted one.
"""

from __future__ import annotations

import torch

from satcore import BatchMoments
from satcore import CandidateStatistics
from satcore.adapter_api import PackedGram

from .moments import CentredCross, add_packed, complete_lower, formed_cross, packed_zeros, packs_grams, unpacked

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
    """Device totals of one candidate's ``statistics``, its stream sums included, with the host counts."""

    def __init__(self, statistics: CandidateStatistics, device: torch.device):
        self.statistics, self.device = statistics, device

        def scalar(value):
            return torch.tensor(float(value), dtype=torch.float64, device=device)

        self._share_arrays(statistics, seeded=statistics.n_samples > 0)
        # Local batch i of rank k goes to fold (i * world + k) mod m: with batches dealt to ranks
        # round-robin (rank k takes batches k, k + world, ...), the all-reduced folds are one pass's.
        self.world, self.rank = fold_layout()
        self.scalars = {field: scalar(getattr(statistics, name)) for field, name in SCALARS.items()}
        self.stream = {f: scalar(getattr(statistics, f)) for f in STREAM_SCALARS if getattr(statistics, f) is not None}
        self.n_samples, self.n_batches = statistics.n_samples, statistics.n_batches
        self.n_vectors, self.n_stream_vectors = statistics.n_vectors, statistics.n_stream_vectors
        self.fold_samples = None if not statistics.n_folds else statistics.fold_samples.copy()
        self.unformed_folds: dict[int, CentredCross] = {}  # fold -> its one batch since the last sync
        self.blank_folds: set[int] = set()  # folds of unformed_folds whose batch is their first (zeros until formed)
        # position vectors counted since the last sync, of the stream and of the statistics (fewer
        # under position_subsample): Python ints, or device tensors once a padding mask counted them
        # there (read at sync, so no per-batch host copy)
        self.new_stream_vectors = 0
        self.new_statistics_vectors = 0

    def _share_arrays(self, statistics: CandidateStatistics, seeded: bool) -> None:
        """The matrix totals: on the CPU views of ``statistics``' arrays (no copy), elsewhere device
        copies of them (zeros when not ``seeded``: nothing to copy over).

        Up to the first sync, the Gram totals (``sum_gram``, ``sum_xtx``) of a probe on one CPU
        thread are held packed instead (:func:`.moments.packs_grams`; their upper triangles, half
        the bytes: 33 MB less while a GPT-2 probe's graph is held, 8 candidates at ``r = 1024``);
        the sync hands the statistics the whole matrices, whose views the totals are from then
        on, as without packing.
        """
        def matrix(field, array):
            if field in SYMMETRIC and not seeded and packs_grams(self.device):
                return packed_zeros(array.shape[0])
            if self.device.type != "cpu" and not seeded:
                return torch.zeros(array.shape, dtype=torch.float64, device=self.device)
            return torch.as_tensor(array, device=self.device)  # on the CPU: a view of the array, no copy

        self.matrices = {f: matrix(f, getattr(statistics, f)) for f in MATRICES if getattr(statistics, f) is not None}
        self.fold_cross = None if not statistics.n_folds else matrix("fold_cross", statistics.fold_cross)

    def add(self, moments: BatchMoments) -> None:
        """Add one batch's ``moments`` from :mod:`.moments` (exactly symmetric Grams, if any; ``None``
        for those already added, ``batch_moments(grams_into=...)``), with the stream's
        ``sum ||z_i||^2`` over its ``n_stream_vectors`` and the block update's
        ``sum ||block(z_i) - z_i||^2`` (``None`` when the block changes the shape or is the ``head``
        endpoint: then the statistics keep no update sum, ``block_update=False``).  The counts
        (``n_stream_vectors``, ``n_vectors``) are ints, or 0-d tensors counted from a padding mask."""
        for field, total in self.matrices.items():
            value = getattr(moments, field)
            # with folds, sum_cross is their sum, formed at sync (_cross_from_folds)
            if value is None or (field == "sum_cross" and self.fold_cross is not None):
                continue
            if total.dim() == 1:  # a packed Gram total: the batch's whole Gram, by its upper triangle
                add_packed(total, value)
            else:
                total += formed_cross(value)
        for field, total in self.scalars.items():
            total += getattr(moments, field)
        if self.fold_cross is not None:
            fold = (self.n_batches * self.world + self.rank) % self.statistics.n_folds
            self._write_fold(fold)
            if isinstance(moments.sum_cross, CentredCross):
                self.unformed_folds[fold] = moments.sum_cross
                if not self.fold_samples[fold]:
                    self.blank_folds.add(fold)
            else:
                self.fold_cross[fold] += moments.sum_cross
            self.fold_samples[fold] += int(moments.n_samples)
        self.stream["sum_z_sq"] += moments.sum_z_sq
        if "sum_update_sq" in self.stream:
            self.stream["sum_update_sq"] += moments.sum_update_sq
        self.n_samples += int(moments.n_samples)
        self.n_batches += 1
        self.new_stream_vectors = self.new_stream_vectors + moments.n_stream_vectors
        self.new_statistics_vectors = self.new_statistics_vectors + moments.n_vectors

    def _write_fold(self, fold: int) -> None:
        """Add the batch that waits for ``fold`` unformed, if one does, to it: the batches reach each
        fold in their order, as when each is added as it comes (the same bits)."""
        unformed = self.unformed_folds.pop(fold, None)
        if unformed is None:
            return
        if fold in self.blank_folds:  # its first batch: formed where it lies (CentredCross.add_to_zeros)
            self.blank_folds.discard(fold)
            unformed.add_to_zeros(self.fold_cross[fold])
        else:
            self.fold_cross[fold] += unformed.formed()

    def _cross_from_folds(self) -> None:
        """``sum_cross`` made the sum of the folds that hold samples, in fold order.

        Between syncs only the folds are added to: one ``N x r`` addition per
        batch less, and no ``N x r`` total written (resident) while the
        model's graph is, which is when a probe's memory peaks (2 MB a GPT-2
        candidate at ``r = 1024``).  Up to ``n_folds`` batches (world size 1)
        each fold holds one batch and the sum is the batches' in their order,
        the very bits of adding them up as they come; a resumed probe sums the
        same folds as an uninterrupted one.
        """
        for fold in list(self.unformed_folds):
            self._write_fold(fold)
        total = self.matrices["sum_cross"]
        written = [fold for fold, samples in enumerate(self.fold_samples) if samples]
        if not written:
            total.zero_()
            return
        total.copy_(self.fold_cross[written[0]])
        for fold in written[1:]:
            total += self.fold_cross[fold]

    def sync(self, *, last: bool = False) -> CandidateStatistics:
        """Statistics of every batch so far (one host copy per field off the CPU): fresh ones, fed the
        totals as one :class:`satcore.BatchMoments` of ``n_batches`` batches.

        ``last``: no batch is added after this sync (a probe's end): Gram totals held packed go to the
        statistics packed, as a :class:`~satcore.adapter_api.PackedGram` they make whole when their
        ``sum_gram`` is first read (half the bytes until then: 33 MB of a GPT-2 probe's result, 8
        candidates at ``r = 1024``), the same bits as unpacked here.

        The Gram totals are made whole from their upper triangles first
        (:func:`.moments.add_gram` updates only those on the CPU; packed ones are unpacked into new
        arrays, which the totals are from then on).  The new statistics adopt the
        host arrays (``add_moments(adopt=True)``): on the CPU the totals themselves, which the old
        statistics held too and which stay the totals from now on, so nothing is copied and folds no
        batch reached stay unwritten (untouched zero pages).
        """
        for field in SYMMETRIC:
            if field in self.matrices and self.matrices[field].dim() == 2:
                complete_lower(self.matrices[field])
        if self.fold_cross is not None:
            self._cross_from_folds()
        # (n_vectors stays None when resumed from a checkpoint that did not count them)
        if self.n_vectors is not None:
            self.n_vectors += int(self.new_statistics_vectors)
        self.n_stream_vectors += int(self.new_stream_vectors)
        self.new_stream_vectors = self.new_statistics_vectors = 0
        def host(field, total):
            if total.dim() == 2:
                return total.cpu().numpy()
            r = self.statistics.n_features
            return PackedGram(total.numpy(), r) if last and field == "sum_gram" else unpacked(total, r)

        matrices = {f: host(f, total) for f, total in self.matrices.items()}
        scalars = {field: float(total) for field, total in self.scalars.items()}
        stream = {f: float(total) for f, total in self.stream.items()}
        totals = BatchMoments(n_samples=self.n_samples, n_vectors=self.n_vectors, n_batches=self.n_batches,
                              n_stream_vectors=self.n_stream_vectors, **matrices, **scalars, **stream)
        old = self.statistics
        folds = None if self.fold_cross is None else (self.fold_cross.cpu().numpy(), self.fold_samples)
        self.statistics = CandidateStatistics(old.n_hidden, old.n_features, old.n_positions, old.variance, old.n_folds,
                                              old.curvature, old.stream, old.block_update).add_moments(totals, folds=folds,
                                                                                                       adopt=True)
        if self.device.type == "cpu" and not last:  # the new statistics' arrays are the totals from now on
            self._share_arrays(self.statistics, seeded=True)
        return self.statistics
