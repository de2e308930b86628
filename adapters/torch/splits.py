"""A training split and a held-out split in one call: the probe behind predicted gains.

:func:`probe_splits` probes the same candidates, with the same feature maps
(one seed), on two streams of batches.  Its :meth:`SplitResults.report` is the
held-out probe's report (the tests read the split the model did not train on)
carrying :func:`satcore._decisions.predictors.predict_gains`: per candidate the training
gain of a stated optimizer step, fitted on the training split, and that step's
held-out gain with the fold test's interval; no trial verifies it, so its rows
are "not verified" with no ``P(decrease)`` (:class:`satcore.HeldoutGain`).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from satcore import DepthReport
from satcore.adapter_api import TRAINING_SPLIT_WARNING

from .probe import pass_options, plan, probe
from .result import ProbeResult


@dataclass(frozen=True)
class SplitResults:
    """The two probes of :func:`probe_splits`."""

    train: ProbeResult
    heldout: ProbeResult

    def report(self, *, optimizer: str = "sgd", lr: float | None = None, steps: int = 1, **options) -> DepthReport:
        """The held-out report with the predicted gains of ``steps`` ``optimizer`` steps at ``lr``
        (or, for ``optimizer="matched"``, the gradient-matched block of relative size ``rho=``);
        ``options`` as for :meth:`satcore.DepthStatistics.report`."""
        return self.heldout.report(train=self.train.statistics, optimizer=optimizer, lr=lr, steps=steps, **options)


def probe_training_split(model, train, loss_fn=None, **options) -> ProbeResult:
    """The probe of the ``train`` batches that fits the step (``options`` as for :func:`~.probe.probe`)."""
    with warnings.catch_warnings():
        # meant to be the training split here: its statistics fit the step, the held-out split tests it
        warnings.filterwarnings("ignore", message=re.escape(TRAINING_SPLIT_WARNING))
        return probe(model, train, loss_fn, split="train", **options)


def probe_splits(model, train, heldout, loss_fn=None, **options) -> SplitResults:
    """Probe ``model`` on the ``train`` batches and on the ``heldout`` batches (``options`` as for
    :func:`~.probe.probe`, the same for both, so the feature maps are the same)."""
    return SplitResults(probe_training_split(model, train, loss_fn, **options),
                        probe(model, heldout, loss_fn, split="heldout", **options))


def statistics_passes(model, train: list, loss_fn, max_statistics_bytes=None, **options) -> list[dict]:
    """The probe options of each pass of :func:`probe_splits_in_passes`: ``[{}]``, one pass, without
    ``max_statistics_bytes``; with it, consecutive groups of candidates whose statistics (both splits) fit
    (:meth:`~.probe.MemoryPlan.passes`, planned on one forward pass of ``train``'s first batch; ``options`` as for
    :func:`~.probe.probe`), each as :func:`~.probe.pass_options` gives it."""
    if max_statistics_bytes is None:
        return [{}]
    memory = plan(model, train[0], loss_fn, **options)
    return [pass_options(g) for g in memory.passes(max_statistics_bytes, splits=2)]


def probe_splits_in_passes(model, train: list, heldout: list, loss_fn, read, *, passes=({},), progress=False,
                           **options) -> ProbeResult:
    """:func:`probe_splits` once per entry of ``passes`` (:func:`statistics_passes`; one pass by default), each
    pass's options added to ``options``; ``progress`` as :func:`~.probe.probe` takes it, for every batch of every
    pass.

    ``read(selection, splits)`` is called on each pass's :class:`SplitResults` (``selection``: the
    probe options that pick its candidates, ``{}`` for one pass), whose statistics are dropped before the next
    pass sums its own.  Returns the last pass's training-split result."""
    for selection in passes:
        splits = None  # the previous group's statistics go before this group's are summed
        splits = probe_splits(model, train, heldout, loss_fn, progress=progress, **options | selection)
        read(selection, splits)
    return splits.train
