"""What a finished probe holds: the core's statistics plus the torch side."""

from __future__ import annotations

from dataclasses import dataclass, field

from satcore.depth import DepthStatistics
from satcore.results import DepthReport

from .diagnostics import StreamDiagnostics
from .locate import Candidate


@dataclass(frozen=True)
class ProbeResult:
    """Result of :func:`probe`.

    ``statistics`` is a :class:`satcore.DepthStatistics` (candidate name ->
    :class:`satcore.CandidateStatistics`, upstream first); ``families`` maps
    each candidate to its torch feature map; ``diagnostics`` maps it to
    :class:`StreamDiagnostics` (stream norm and relative block update);
    ``split`` names the probe data (reports warn when it is the training set).
    """

    statistics: DepthStatistics
    families: dict
    streams: dict = field(repr=False)
    candidates: tuple[Candidate, ...] = ()
    split: str | None = None
    meta: dict = field(default_factory=dict)

    @property
    def diagnostics(self) -> dict[str, StreamDiagnostics]:
        return {name: acc.summary(name) for name, acc in self.streams.items()}

    def report(self, **kwargs) -> DepthReport:
        """The core's :class:`satcore.DepthReport` (keywords of :meth:`DepthStatistics.report`)."""
        kwargs.setdefault("split", self.split)
        return self.statistics.report(**kwargs)

    def dump_meta(self) -> dict:
        return {
            **self.meta,
            "candidates": list(self.statistics),
            "framework": "torch",
            "split": self.split,
            "family": {name: fm.spec for name, fm in self.families.items()},
            "diagnostics": {name: d.to_dict() for name, d in self.diagnostics.items()},
        }

    def save(self, path) -> None:
        """Write a ``satcore-dump/1`` file with the statistics (``satcore.dump.write_dump``)."""
        from satcore.dump import write_dump

        write_dump(path, self.statistics, meta=self.dump_meta())
