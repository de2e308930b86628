"""Residual-stream diagnostics from the same hooks (related work: NAG, docs/references.md).

NAG argues that the residual stream's norm grows with depth, so the relative
size of each block's update ``||block(z) - z|| / ||z||`` shrinks and late
blocks are suppressed.  Per candidate we add up, in float64,
``sum_i ||z_i||_F^2`` and ``sum_i ||block(z_i) - z_i||_F^2`` and report

* ``stream_rms = sqrt(sum_i ||z_i||^2 / M) = ||z||_S``, the empirical norm that
  turns a relative insertion size ``rho`` into ``alpha``
  (:func:`satcore.alpha_for_relative_update`);
* ``stream_rms_per_position = sqrt(sum_i ||z_i||^2 / n_vectors)``, the RMS
  norm of one token's (pixel's) stream vector, with ``n_vectors`` the stream
  vectors counted (``M T`` when every batch has ``T`` positions);
* ``relative_update = sqrt(sum_i ||block(z_i) - z_i||^2 / sum_i ||z_i||^2)``
  (``None`` for the ``head`` endpoint and for blocks that change the shape).

Under a padding mask (:mod:`.masks`) the sums and ``n_vectors`` cover the
positions that are data only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIELDS = ("n_samples", "n_vectors", "sum_z_sq", "sum_update_sq", "has_update")


@dataclass(frozen=True)
class StreamDiagnostics:
    """Finished diagnostics of one candidate (see module docstring)."""

    name: str
    stream_rms: float
    stream_rms_per_position: float
    relative_update: float | None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "stream_rms": self.stream_rms,
            "stream_rms_per_position": self.stream_rms_per_position,
            "relative_update": self.relative_update,
        }


class StreamAccumulator:
    """Float64 sums behind :class:`StreamDiagnostics` (added up by :class:`.running.RunningSums`)."""

    def __init__(self, has_update: bool):
        self.n_samples = 0
        self.n_vectors = 0
        self.sum_z_sq = 0.0
        self.sum_update_sq = 0.0
        self.has_update = bool(has_update)

    def summary(self, name: str) -> StreamDiagnostics:
        rms = math.sqrt(self.sum_z_sq / max(self.n_samples, 1))
        per_position = math.sqrt(self.sum_z_sq / max(self.n_vectors, 1))
        relative = math.sqrt(self.sum_update_sq / self.sum_z_sq) if self.has_update and self.sum_z_sq > 0 else None
        return StreamDiagnostics(name, rms, per_position, relative)

    def to_arrays(self) -> dict:
        return {f: np.asarray(float(getattr(self, f))) for f in FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict) -> "StreamAccumulator":
        out = cls(bool(arrays["has_update"]))
        out.n_samples = int(arrays["n_samples"])
        out.n_vectors = int(arrays["n_vectors"])
        out.sum_z_sq = float(arrays["sum_z_sq"])
        out.sum_update_sq = float(arrays["sum_update_sq"])
        return out
