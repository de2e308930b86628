"""What a finished torch probe holds: the core's result plus the torch side."""

from __future__ import annotations

from dataclasses import dataclass, field

from satcore import ProbeResult as CoreProbeResult

from .locate import Candidate


@dataclass(frozen=True)
class ProbeResult(CoreProbeResult):
    """Result of :func:`probe`: :class:`satcore._io.probe_result.ProbeResult` plus

    ``families`` (each candidate's torch feature map) and ``candidates`` (where each
    one was tapped).  The stream diagnostics (``||z||_S``, the RMS norm per position and
    the block's relative update, NAG: docs/references.md) come from the statistics'
    stream sums (:attr:`diagnostics`); under a padding mask (:mod:`.masks`) those cover
    the positions that are data only.
    """

    families: dict = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()

    def dump_meta(self) -> dict:
        return {
            **super().dump_meta(),
            "framework": "torch",
            "family": {name: fm.spec for name, fm in self.families.items()},
        }
