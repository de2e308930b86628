"""``LightningCallback``: probe at the end of a Lightning validation, metrics through ``log_dict``.

At the end of every validation in every ``every_n_epochs``-th training epoch (not during the sanity check)
the callback probes the module on ``probe_data``: as ``ModelCheckpoint(every_n_epochs=...)`` counts, epochs, so
that with ``val_check_interval`` (several validations an epoch) each validation of such an epoch is probed and a
``ModelCheckpoint`` monitoring a ``satcore/`` key finds it at each.  It logs the report's
:meth:`~satcore.DepthReport.scalars` (keys starting
``satcore/``) with ``pl_module.log_dict``: every logger of the Trainer gets
them, and ``trainer.callback_metrics`` holds them (so a ``ModelCheckpoint``
can monitor ``satcore/growth_value_max``).  Lightning validates under
``torch.inference_mode``; the probe takes its gradients outside it.  Like ``HFCallback`` and ``KerasCallback``
it logs the depth-wide keys unless its ``log_candidates`` is ``True`` (one key set for one report,
:func:`satcore.adapters.base.callback_scalars`): every logger of the Trainer files each key it is given, up to
twelve a candidate with a decision.  Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning``.

The configuration is checked at ``on_fit_start``, before the first training
step: ``module`` must give an ``nn.Module`` and the candidates must be found
in it, else the fit stops with one line instead of after a full epoch.
"""

from __future__ import annotations

import importlib.util

from satcore.adapter_api import moved_keywords, require

if importlib.util.find_spec("pytorch_lightning") is None:  # else the standalone package serves
    require("lightning", extra="lightning", by="LightningCallback")

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

from torch import nn

from satcore import DecisionPolicy, InputError

from satcore.adapters.base import (callback_log_candidates, callback_scalars, callback_schedule,
                                   warn_if_too_few_batches)

from satcore.adapters.callback_dumps import callback_dumps

from .callback_common import callback_places, callback_report, callback_settings, dump_writer
from .probe import ProbeConfig


def shows_progress_bar(trainer) -> bool:
    """Whether ``trainer`` shows its progress bar on this process: it has one, enabled (a ``TQDMProgressBar`` with
    ``refresh_rate=0`` is one that shows nothing), and this is the global rank 0 that prints it."""
    bar = trainer.progress_bar_callback
    return bar is not None and bar.is_enabled and trainer.is_global_zero


class LightningCallback(Callback):
    """A Lightning ``Callback`` that probes at validation end (module docstring).

    Parameters
    ----------
    probe_data : re-iterable of batches (:class:`~.probe.Probe`'s convention).
    loss_fn : :class:`~.probe.Probe`'s.
    module : which ``nn.Module`` to probe: ``None`` for the LightningModule
        itself (its ``forward``), an ``nn.Module`` (e.g. ``pl_module.model``,
        a wrapped Hugging Face model), or a callable ``module(pl_module)``
        returning one, e.g. ``lambda m: m.model``.
    every_n_epochs, report : how often (every validation of every ``every_n_epochs``-th epoch), and keyword
        arguments of ``report()``.
    config : the probe's :class:`~.probe.ProbeConfig` (default ``ProbeConfig()``).
    policy, train_data : optional
        Also decide, at each probed validation end, where to insert a block under the
        :class:`satcore.DecisionPolicy`, the trials drawing from the ``train_data`` batches (``HFCallback``'s
        ``policy`` and ``train_data``); the held-out split is ``probe_data``, and the decision's scalars
        (``satcore/decision/...``) are logged with the first-order ones.
    dump_dir : str or os.PathLike, optional
        Also write each probed validation's statistics to
        ``dump_dir/satcore-epoch-<current_epoch>-step-<global_step>.npz`` (four and six digits at least, the epoch
        counted from 0 as in Lightning's checkpoint names), a dump ``satcore score`` reads
        (:mod:`satcore.adapters.callback_dumps`), from the global rank 0; a path that is a file, or a folder
        holding a file at such a name, is refused here.

    ``prefix`` (``"satcore/"``, the start of every metric key) and ``log_candidates`` (``False``: the depth-wide
    keys only, ``HFCallback``'s set; ``True``: the per-candidate keys too, ``satcore/<name>/...`` and
    ``satcore/decision/<name>/...``, which a ``ModelCheckpoint`` monitoring one needs) are class attributes: set
    them on a subclass or the instance for others (``HFCallback`` and ``KerasCallback`` take ``log_candidates``
    as a keyword).  A ``log_candidates`` other than ``True`` or ``False`` is refused at ``on_fit_start``, before
    the first step.  ``reports`` holds ``(global_step, DepthReport)`` of every probe made, as
    ``HFCallback.reports`` does (the step identifies a validation; an epoch may hold several), with ``policy``
    the report's ``decision`` that validation's :class:`satcore.InsertionDecision`.
    """

    prefix = "satcore/"
    # an attribute, not HFCallback's keyword: beside module it would be a tenth parameter (tests/test_core_layers.py)
    log_candidates = False

    @moved_keywords("callback", class_attributes=("prefix", "log_candidates"))
    def __init__(self, probe_data, loss_fn=None, *, module=None, every_n_epochs: int = 1, report: dict | None = None,
                 config: ProbeConfig | None = None, policy: DecisionPolicy | None = None, train_data=None,
                 dump_dir=None):
        self.every_n_epochs, self.report_options = callback_schedule("LightningCallback", "every_n_epochs",
                                                                     every_n_epochs, report)
        self.probe_data, self.loss_fn, self.module = probe_data, loss_fn, module
        self.config, self.decision = callback_settings("LightningCallback", probe_data, config, policy, train_data)
        self.dumps = callback_dumps("LightningCallback", dump_dir)
        self.reports: list = []

    def _model(self, pl_module) -> nn.Module:
        if self.module is None:
            return pl_module
        if isinstance(self.module, nn.Module):  # callable too: calling it would run its forward on pl_module
            model = self.module
        else:
            model = self.module(pl_module) if callable(self.module) else self.module
        if not isinstance(model, nn.Module):
            raise InputError(f"LightningCallback(module=...) must be an nn.Module or a callable returning one; "
                             f"it gave {type(model).__name__}")
        return model

    def on_fit_start(self, trainer, pl_module):
        callback_log_candidates("LightningCallback", self.log_candidates)
        names, _ = callback_places(self._model(pl_module), self.config, self.decision)
        warn_if_too_few_batches("LightningCallback", self.probe_data, len(names), self.report_options)

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        model = self._model(pl_module)
        # the dump from the global rank 0 only, as Lightning's ModelCheckpoint saves
        dump = (dump_writer(self.dumps, model, self.config, epoch=trainer.current_epoch, step=trainer.global_step)
                if self.dumps is not None and trainer.is_global_zero else None)
        report = callback_report(model, self.probe_data, self.loss_fn, self.config, self.report_options,
                                 self.decision, progress=shows_progress_bar(trainer), dump=dump)
        self.reports.append((trainer.global_step, report))
        # the sums are all-reduced already: every rank holds the same numbers
        pl_module.log_dict(callback_scalars(report, self.prefix, self.log_candidates), sync_dist=False)
