"""``HFCallback``: probe at a Hugging Face ``Trainer``'s evaluations, metrics into its logs.

At every ``every``-th evaluation the callback probes the model on
``probe_data`` (a re-iterable: a list of batches or a ``DataLoader``; the
batch convention is :class:`~.probe.Probe`'s, so ``DataCollator`` batches with
``labels`` need no ``loss_fn``) and adds the report's
:meth:`~satcore.results.DepthReport.scalars` (keys starting ``satcore/``) to

* the evaluation's log entry, which the ``Trainer`` hands to every logger it
  has (``report_to``: TensorBoard, W&B, ...) and keeps in
  ``state.log_history``; the evaluation is recognised in ``on_log`` by its
  ``eval_``-prefixed keys (``eval_prefix``);
* the metrics ``trainer.evaluate()`` returns (``on_evaluate``), so that
  ``metric_for_best_model="satcore/growth_value_max"`` works.

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
from dataclasses import replace

from transformers import TrainerCallback
from transformers.trainer_callback import CallbackHandler

from .probe import ProbeConfig, probe


class HFCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that probes at evaluations (module docstring).

    Parameters
    ----------
    probe_data : re-iterable of batches, held out from training.
    loss_fn : :class:`~.probe.Probe`'s (``None``: the model's own per-sample loss).
    every : probe at every ``every``-th evaluation.
    prefix : start of every metric key.
    eval_prefix : the ``metric_key_prefix`` of the evaluations to follow.
    report : keyword arguments of :meth:`~satcore.probe_result.ProbeResult.report`
        (e.g. ``{"t": 0.01}`` for the separated test, which adds ``satcore/saturated``).
    config, options : the probe's :class:`~.probe.ProbeConfig` (or its fields).

    ``reports`` holds ``(global_step, DepthReport)`` of every probe made.
    """

    def __init__(self, probe_data, loss_fn=None, *, every: int = 1, prefix: str = "satcore/",
                 eval_prefix: str = "eval", report: dict | None = None, config: ProbeConfig | None = None,
                 **options):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.probe_data, self.loss_fn, self.every, self.prefix = probe_data, loss_fn, every, prefix
        self.eval_prefix, self.report_options = eval_prefix, dict(report or {})
        self.config = ProbeConfig(**options) if config is None else replace(config, **options)
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

    def on_train_begin(self, args, state, control, **kwargs):
        self._go_first()

    def _measure(self, state, model) -> dict | None:
        """This evaluation's scalars (probing once per evaluation), ``None`` when it is skipped."""
        if self._step == state.global_step:
            return self._scalars
        self._step = state.global_step
        self._evaluations += 1
        self._scalars = None
        if (self._evaluations - 1) % self.every == 0:
            result = probe(model, self.probe_data, self.loss_fn, config=self.config)
            report = result.report(**self.report_options)
            self.reports.append((state.global_step, report))
            self._scalars = report.scalars(self.prefix)
        return self._scalars

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs or not any(str(k).startswith(self.eval_prefix + "_") for k in logs):
            return
        scalars = self._measure(state, model)
        if scalars:
            logs.update(scalars)
            entry = state.log_history[-1] if state.log_history else None
            if entry is not None and entry.get("step") == state.global_step and not set(scalars) <= set(entry):
                entry.update(scalars)  # the Trainer copied logs into its history before calling on_log

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        scalars = self._measure(state, model)
        if scalars and metrics is not None:
            metrics.update(scalars)
