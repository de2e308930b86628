"""What a finished torch probe holds: the core's result plus the torch side."""

from __future__ import annotations

from dataclasses import dataclass, field

from satcore.probe_result import ProbeResult as CoreProbeResult

from .diagnostics import StreamDiagnostics
from .locate import Candidate


@dataclass(frozen=True)
class ProbeResult(CoreProbeResult):
    """Result of :func:`probe`: :class:`satcore.probe_result.ProbeResult` plus

    ``families`` (each candidate's torch feature map), ``streams`` (the stream
    sums behind :attr:`diagnostics`: stream norm and relative block update per
    candidate) and ``candidates`` (where each one was tapped).
    """

    families: dict = field(default_factory=dict)
    streams: dict = field(default_factory=dict, repr=False)
    candidates: tuple[Candidate, ...] = ()

    @property
    def diagnostics(self) -> dict[str, StreamDiagnostics]:
        return {name: acc.summary(name) for name, acc in self.streams.items()}

    def dump_meta(self) -> dict:
        return {
            **super().dump_meta(),
            "framework": "torch",
            "family": {name: fm.spec for name, fm in self.families.items()},
            "diagnostics": {name: d.to_dict() for name, d in self.diagnostics.items()},
        }
