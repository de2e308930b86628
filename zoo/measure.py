"""One probe per model: the numbers a depth-sweep table row shows.

Everything is computed by satcore: :func:`satcore.adapters.torch.probe`
accumulates the statistics, :meth:`DepthStatistics.report` scores them and runs
the separated test of Prop. 1 at a stated error level, and
:func:`satcore._scores.scores.growth_noise_floor` gives the growth value a saturated
candidate would show on the same number of probe samples.
"""

from __future__ import annotations

import math
from pathlib import Path

from satcore.adapters.torch import probe
from satcore._scores.scores import growth_noise_floor

ERROR_LEVEL = 0.1  # error level of the certified test: t = sqrt(sum sigma^2 / (n a))


def probe_model(model, data, loss_fn, *, split: str, depth: int, dump_path: Path | None = None, seed: int = 0,
                variance: bool = True, **kwargs):
    """Probe ``model`` on ``data``; write a ``satcore-dump/1`` (with ``model_depth``) when asked."""
    result = probe(model, data, loss_fn, seed=seed, variance=variance, split=split, **kwargs)
    result.meta["model_depth"] = int(depth)
    if dump_path is not None:
        Path(dump_path).parent.mkdir(parents=True, exist_ok=True)
        result.save(dump_path)
    return result


def report_row(result, prefix: str = "") -> dict:
    """Depth-wide numbers of one probe, keys prefixed by ``prefix``.

    ``ag_batch_max`` is the paper's logged statistic, eq. (2) (batch-mean
    loss, mean over analysis batches), maximised over candidates.  With
    ``variance`` statistics also: ``growth_floor`` (noise floor of the growth
    value at its argmax), Prop. 1's test at :data:`ERROR_LEVEL`; always the
    fold tests' depth-wide verdict, the candidates called improvable and the
    smallest Holm-adjusted p-value.
    """
    report = result.report(error=ERROR_LEVEL) if _has_variance(result) else result.report()
    best = report[report.argmax]
    row = {
        "ag_max": report.ag_max,
        "ag_argmax": report.ag_argmax,
        "ag_batch_max": max(c.ag_batch for c in report.candidates if c.ag_batch is not None),
        "growth_value_max": report.growth_value_max,
        "argmax": report.argmax,
        "realizability": best.realizability,
        "n_probe": best.n_samples,
    }
    floor = growth_noise_floor(best)
    if floor is not None:
        row["growth_floor"] = floor
        row["signal_to_floor"] = report.growth_value_max / floor if floor > 0 else math.inf
    improvable = [t for t in report.tests if t.verdict == "improvable"]
    row.update(verdict=report.verdict.verdict, n_improvable=len(improvable), n_candidates=len(report.tests),
               improvable_at=" ".join(t.name for t in improvable) or "-",
               min_p_adjusted=min(t.p_value_adjusted for t in report.tests))
    if report.prop1 is not None:
        t = report.prop1
        row.update(gamma_hat=t.gamma_hat, noise_floor=report[t.argmax].noise_floor, t=t.t,
                   certified_saturated=t.saturated, prop1_verdict=t.verdict, test_error_bound=t.error_bound)
    return {prefix + k: v for k, v in row.items()}


def _has_variance(result) -> bool:
    return all(s.variance and s.n_samples > 1 for s in result.statistics.values())
