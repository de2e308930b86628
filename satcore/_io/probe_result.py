"""What a framework probe returns: the statistics per candidate and how they were made.

Framework-free, so that every adapter (PyTorch, TensorFlow, ONNX) hands back
the same object: ``report()`` scores it with the core, ``save()`` writes the
``satcore-dump/1`` file that ``satcore score`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._statistics.depth import DepthStatistics
from .._decisions.report import DepthReport
from .._scores.scores import StreamDiagnostics


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
