"""``HFCallback``: probe at a Hugging Face ``Trainer``'s evaluations, metrics into its logs.

At every ``every``-th evaluation the callback probes the model on
``probe_data`` (a re-iterable: a list of batches or a ``DataLoader``; the
batch convention is :class:`~.probe.Probe`'s, so ``DataCollator`` batches with
``labels`` need no ``loss_fn``) and adds the report's depth-wide
:meth:`~satcore.DepthReport.scalars` (keys starting ``satcore/``; with a decision its depth-wide
:meth:`~satcore.InsertionDecision.scalars`: what it chose and its predicted change) to

* the evaluation's log entry, which the ``Trainer`` hands to every logger it
  has (``report_to``: TensorBoard, W&B, ...) and keeps in
  ``state.log_history``; the evaluation is recognised in ``on_log`` by its
  ``eval_``-prefixed keys (``eval_prefix``);
* the metrics ``trainer.evaluate()`` returns (``on_evaluate``), under the
  evaluation's prefix like every other metric there (``eval_satcore/...``),
  so that ``metric_for_best_model="satcore/growth_value_max"`` works with
  ``load_best_model_at_end`` (the ``Trainer`` looks that name up as
  ``eval_satcore/growth_value_max``).

The Trainer prints every key of an evaluation's log entry (its progress bar, or ``PrinterCallback``), so the
per-candidate keys (six a candidate, up to twelve with a decision: 46 keys and some 2,250 printed characters at
each evaluation of a two-block GPT-2, up to 312 keys for 24 layers, where the summary is 12) are logged only with
``log_candidates=True``; ``reports`` holds every evaluation's whole report either way (``report.to_dict()`` is
its JSON).

A ``metric_for_best_model`` naming a ``satcore/`` key the callback cannot log
(a typo, a candidate the probe does not have) is refused at ``on_train_begin``,
before the first training step, with the keys it logs.

The ``Trainer`` logs before it calls ``on_evaluate`` and calls callbacks in
list order, the loggers first; so that they see the keys, the callback moves
itself to the front of the ``Trainer``'s callback list when the ``Trainer``
first calls it (``on_init_end``, else ``on_train_begin``).  Under
``torch.distributed`` every rank probes its ``probe_data`` and the sums are
all-reduced (:mod:`.distributed`), so every rank logs the same numbers.
"""

from __future__ import annotations

import sys
import warnings

from satcore.adapter_api import moved_keywords, require

require("transformers", "accelerate", extra="hf", by="HFCallback")

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

import numpy as np

from satcore import CandidateStatistics, DecisionPolicy, DepthStatistics, InsertionDecision
from satcore import InputError

from satcore.adapters.base import (callback_log_candidates, callback_scalars, callback_schedule,
                                   warn_if_too_few_batches)

from satcore.adapters.callback_dumps import callback_dumps

from .callback_common import callback_places, callback_report, callback_settings, dump_writer
from .probe import ProbeConfig



class HFCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that probes at evaluations (module docstring).

    Parameters
    ----------
    probe_data : re-iterable of batches, held out from training.
    loss_fn : :class:`~.probe.Probe`'s (``None``: the model's own per-sample loss).
    every : probe at every ``every``-th evaluation.
    report : keyword arguments of :meth:`~satcore._io.probe_result.ProbeResult.report`
        (e.g. ``{"t": 0.01}`` for the separated test, which adds ``satcore/saturated``).
    config : the probe's :class:`~.probe.ProbeConfig` (default ``ProbeConfig()``; its ``split`` default
        ``"heldout"``).
    policy : satcore.DecisionPolicy, optional
        Also decide, at each probed evaluation, where to insert a block under the policy
        (:func:`~.decide.decide`; the held-out split is ``probe_data``, the places, family and features those
        of ``config`` where the policy names none).  Its
        :meth:`~satcore._decisions.trials.InsertionDecision.scalars` (``satcore/decision/...``) are logged with the
        first-order ones and the report leads with it.  Each costs the probe of both splits and trials of at
        most ``recipe.steps`` block-steps (one block trained with the recipe), on a copy of the model, under
        forked random number generators: the training run is the same with or without it.
    train_data : re-iterable of batches
        With ``policy``: the training batches the trials draw from.
    log_candidates : bool
        Log the per-candidate keys too (``satcore/<name>/...``, ``satcore/decision/<name>/...``); default: the
        depth-wide ones only, which the Trainer prints at each evaluation.
    dump_dir : str or os.PathLike, optional
        Also write each probed evaluation's statistics to ``dump_dir/satcore-step-<global_step>.npz`` (six digits
        at least), a dump ``satcore score`` reads (:mod:`satcore.adapters.callback_dumps`), from the global main
        process; a path that is a file, or a folder holding a file at such a name, is refused here.

    ``prefix`` (``"satcore/"``, the start of every metric key) and ``eval_prefix`` (``"eval"``, the
    ``metric_key_prefix`` of the evaluations to follow) are class attributes: set them on a subclass or the
    instance for others.  ``reports`` holds ``(global_step, DepthReport)`` of every probe made (with ``policy``,
    the report's ``decision`` is the evaluation's :class:`satcore.InsertionDecision`).
    """

    prefix = "satcore/"
    eval_prefix = "eval"

    @moved_keywords("callback", class_attributes=("prefix", "eval_prefix"))
    def __init__(self, probe_data, loss_fn=None, *, every: int = 1, report: dict | None = None,
                 config: ProbeConfig | None = None, policy: DecisionPolicy | None = None, train_data=None,
                 log_candidates: bool = False, dump_dir=None):
        self.every, self.report_options = callback_schedule("HFCallback", "every", every, report)
        self.log_candidates = callback_log_candidates("HFCallback", log_candidates)
        self.probe_data, self.loss_fn = probe_data, loss_fn
        self.config, self.decision = callback_settings("HFCallback", probe_data, config, policy, train_data)
        self.dumps = callback_dumps("HFCallback", dump_dir)
        self.reports: list = []
        self._evaluations = 0
        self._scalars: dict | None = None  # of the evaluation at _step
        self._step: int | None = None

    def _go_first(self) -> None:
        handler = sys._getframe(2).f_locals.get("self")  # CallbackHandler.call_event -> on_* -> here
        if not isinstance(handler, CallbackHandler):
            warnings.warn("HFCallback could not place itself before the Trainer's loggers; they may miss the "
                          "satcore/ metrics of an evaluation (trainer.evaluate() still returns them)", UserWarning)
            return
        if handler.callbacks and handler.callbacks[0] is not self:
            # a new list: the handler is iterating over the old one right now
            handler.callbacks = [self] + [c for c in handler.callbacks if c is not self]

    def on_init_end(self, args, state, control, **kwargs):
        self._go_first()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._go_first()
        # the places, the probe's and the decisions', found before the first step rather than at an evaluation
        names, decided = callback_places(model, self.config, self.decision)
        warn_if_too_few_batches("HFCallback", self.probe_data, len(names), self.report_options)
        self._check_metric(args.metric_for_best_model, names, decided)

    def _check_metric(self, metric: str | None, names: list, decided: list | None) -> None:
        """Refuse a ``metric_for_best_model`` under this callback's prefix that it will not log at every
        evaluation (the Trainer looks it up at each)."""
        if metric is None:
            return
        key = metric.removeprefix(self.eval_prefix + "_")
        if not key.startswith(self.prefix):
            return  # another metric: the Trainer's own, or a compute_metrics key
        if self.every > 1:
            raise InputError(f"metric_for_best_model={metric!r}: HFCallback(every={self.every}) logs it at one "
                             f"evaluation in {self.every}, and the Trainer looks it up at each; use every=1")
        keys = self._logged_keys(names, decided, self.log_candidates)
        if key not in keys:
            if key.startswith(f"{self.prefix}decision/") and decided is None:
                hint = " (decision keys are logged with HFCallback(policy=..., train_data=...))"
            elif key in self._logged_keys(names, decided, per_candidate=True):
                hint = " (per-candidate keys are logged with HFCallback(log_candidates=True))"
            else:
                hint = ""
            raise InputError(f"metric_for_best_model={metric!r} is not a key HFCallback logs{hint}; it logs "
                             f"{sorted(keys)}")

    def _logged_keys(self, names: list[str], decided: list | None, per_candidate: bool) -> set[str]:
        """The keys :meth:`~satcore.DepthReport.scalars` gives for these candidates, read off the report of
        placeholder statistics (16 folds, so with the verdict keys), so that the list never drifts from it, and
        those :meth:`~satcore.InsertionDecision.scalars` can give for the decisions' candidates ``decided``."""
        rng = np.random.default_rng(0)
        placeholder = DepthStatistics([(name, CandidateStatistics.from_samples(
            rng.standard_normal((32, 1)), rng.standard_normal((32, 1)), batch_size=2)) for name in names])
        try:
            report = placeholder.report(**self.report_options)
        except ValueError:  # an option the placeholder cannot take (it has no stream norms): the plain report
            report = placeholder.report()
        keys = set(report.scalars(self.prefix, per_candidate))
        if decided is not None:
            keys |= InsertionDecision.scalar_keys(decided, self.prefix, per_candidate)
        return keys

    def _measure(self, args, state, model) -> dict | None:
        """This evaluation's scalars (probing once per evaluation: ``on_log`` and then ``on_evaluate`` of one
        evaluation share them), ``None`` when it is skipped.  A decision shows its progress bar where the Trainer
        shows its own (``args.disable_tqdm`` false, on the global main process: the Trainer's ``ProgressCallback``
        draws on ``state.is_world_process_zero`` only)."""
        if self._step == state.global_step:
            return self._scalars
        self._step = state.global_step
        self._evaluations += 1
        self._scalars = None
        if (self._evaluations - 1) % self.every == 0:
            # the dump, like the Trainer's own checkpoints and logs, from the global main process only
            dump = (dump_writer(self.dumps, model, self.config, step=state.global_step, epoch=state.epoch)
                    if self.dumps is not None and state.is_world_process_zero else None)
            report = callback_report(model, self.probe_data, self.loss_fn, self.config, self.report_options,
                                     self.decision, progress=not args.disable_tqdm and state.is_world_process_zero,
                                     dump=dump)
            self.reports.append((state.global_step, report))
            self._scalars = callback_scalars(report, self.prefix, self.log_candidates)
        return self._scalars

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs or not any(str(k).startswith(self.eval_prefix + "_") for k in logs):
            return
        scalars = self._measure(args, state, model)
        if scalars:
            logs.update(scalars)
            entry = state.log_history[-1] if state.log_history else None
            if entry is not None and entry.get("step") == state.global_step and not set(scalars) <= set(entry):
                entry.update(scalars)  # the Trainer copied logs into its history before calling on_log

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        scalars = self._measure(args, state, model)
        if scalars and metrics is not None:
            for key, value in scalars.items():
                # the Trainer logged this very dict, so on_log put the unprefixed key in it too: one name per value
                metrics.pop(key, None)
                metrics[f"{self.eval_prefix}_{key}"] = value
        # this evaluation is over: the next one probes again even at the same step (after load_best_model_at_end
        # the Trainer holds another model at the last step, and trainer.evaluate() must see that one)
        self._step = None
