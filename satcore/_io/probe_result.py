"""What a framework probe is and returns: the :class:`Probe` contract and the :class:`ProbeResult`.

Framework-free, so that every adapter (PyTorch, TensorFlow, ONNX) is fed and read the same
way by the core's loops (the growth loop's decide step, the trial decision), and hands back
the same object: ``report()`` scores it with the core, ``save()`` writes the
``satcore-dump/1`` file that ``satcore score`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._statistics.depth import DepthStatistics
from .._decisions.report import DepthReport
from .._scores.scores import StreamDiagnostics


@runtime_checkable
class Probe(Protocol):
    """An incremental probe of one model: the whole contract between a framework adapter and the core.

    An adapter's ``Probe(model, ...)`` locates the candidates and resolves its options (refusing
    bad ones with a :class:`~satcore.SatcoreError`) and runs nothing; then it is fed batches.

    ``update(batch) -> int``
        Runs the model on one batch and adds, per candidate, the batch's sums (one
        :class:`~satcore.BatchMoments`, through :meth:`~satcore.CandidateStatistics.add_moments`)
        to the running statistics.  A batch is ``(inputs, targets)`` or a mapping of the
        model's inputs holding the targets under ``"labels"`` (``satcore.adapters.batches``).
        Returns the batch's number of samples (0: an empty batch, which adds nothing).
        A batch the probe cannot use (not a batch; inputs or targets of a shape or dtype the
        model or the loss cannot take; targets missing where the loss needs them) raises a
        :class:`~satcore.ProbeError` naming the batch, never the framework's own exception,
        and adds nothing: the probe can go on with the next batch.
    ``batches_done: int``
        The batches ``update`` has taken so far, empty ones included (with those of a resumed
        checkpoint); a refused batch is not counted.  The growth loop reads it to enlarge a
        probe to a planned number of batches of its stream.
    ``result() -> ProbeResult``
        The statistics of every batch added so far, upstream candidate first, with the
        provenance ``meta`` (``framework``, ``model``, ``loss``, ``split``, ``seed``, per
        candidate ``family``).  It does not end the probe: later batches add to the same sums,
        and a later ``result()`` holds them all.  Before any sample it raises a
        :class:`~satcore.ProbeError`.

    The statistics after batches ``b_1 .. b_k`` equal, to the round-off of the framework's
    dtype, those :func:`satcore.batch_moments` gives from the same per-sample gradients and
    features (``tests/test_conformance.py`` holds every installed adapter to it).
    """

    batches_done: int

    def update(self, batch) -> int: ...

    def result(self) -> ProbeResult: ...


@dataclass(frozen=True)
class ProbeResult:
    """``statistics``: :class:`~satcore.DepthStatistics` (upstream first); ``meta``: JSON-able provenance.

    ``meta`` holds at least ``candidates``, ``framework``, ``loss``,
    ``family`` (per candidate: kind, width, n_features, seed) and ``split``
    (the name of the probe data; reports warn when it is the training set);
    it becomes the dump's ``meta`` member, with ``diagnostics`` (:attr:`diagnostics`)
    added from the statistics' stream sums.
    """

    statistics: DepthStatistics
    meta: dict = field(default_factory=dict)

    @property
    def split(self) -> str | None:
        return self.meta.get("split")

    @property
    def diagnostics(self) -> dict[str, StreamDiagnostics]:
        """Stream norms per candidate (:meth:`CandidateStatistics.stream_diagnostics`): ``||z||_S``,
        the RMS norm per position and the block's relative update; candidates whose statistics hold
        no stream sums are left out."""
        out = {name: stats.stream_diagnostics(name) for name, stats in self.statistics.items()}
        return {name: d for name, d in out.items() if d is not None}

    def report(self, criteria=None, **options) -> DepthReport:
        """:meth:`DepthStatistics.report` with the probe's split and the stream RMS ``||z||_S`` per
        candidate (:meth:`DepthStatistics.stream_rms`: for a ``tolerance`` in loss units with ``rho``)."""
        options.setdefault("split", self.split)
        if "stream_rms" not in options:
            options["stream_rms"] = self.statistics.stream_rms(self.meta)
        return self.statistics.report(criteria, **options)

    def dump_meta(self) -> dict:
        """The dump's ``meta``: :attr:`meta` with the candidates in order and the :attr:`diagnostics`
        (which readers of dumps without the stream sums fall back on)."""
        meta = {**self.meta, "candidates": list(self.statistics)}
        diagnostics = self.diagnostics
        if diagnostics:
            meta["diagnostics"] = {name: d.to_dict() for name, d in diagnostics.items()}
        return meta

    def save(self, path, inputs=(), *, stats_dtype=None) -> None:
        """Write a ``satcore-dump/1`` file that ``satcore score`` reads (:func:`satcore._io.dump.write_dump`;
        ``inputs``, the files the probe read, may not be overwritten; ``stats_dtype=numpy.float32``
        stores the float64-summed matrices as float32 on the host)."""
        from .dump import write_dump

        write_dump(path, self.statistics, meta=self.dump_meta(), inputs=inputs, stats_dtype=stats_dtype)
