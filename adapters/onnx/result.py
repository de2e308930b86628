"""What a framework probe returns: the statistics per candidate and how they were made."""

from __future__ import annotations

from dataclasses import dataclass, field

from satcore.depth import DepthStatistics


@dataclass(frozen=True)
class ProbeResult:
    """``statistics``: :class:`~satcore.DepthStatistics` (upstream first); ``meta``: JSON-able provenance.

    ``meta`` holds at least ``candidates``, ``framework``, ``loss`` and
    ``family`` (per candidate: kind, width, n_features, seed); it becomes the
    dump's ``meta`` member.  Field names follow the torch adapter's result.
    """

    statistics: DepthStatistics
    meta: dict = field(default_factory=dict)

    def report(self, **options):
        """:meth:`DepthStatistics.report` with the probe's split (SPEC section 4)."""
        options.setdefault("split", self.meta.get("split"))
        return self.statistics.report(**options)

    def save(self, path) -> None:
        """Write a ``satcore-dump/1`` file that ``satcore score`` reads."""
        from satcore.dump import write_dump

        write_dump(path, self.statistics, meta=self.meta)
