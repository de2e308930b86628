"""``KerasCallback``: probe at the end of ``fit``'s epochs, metrics into the epoch's logs.

At the end of every ``every_n_epochs``-th epoch the callback probes
``self.model`` on ``probe_data`` and adds the report's
:meth:`~satcore.DepthReport.scalars` (keys starting ``satcore/``) to
the epoch's ``logs``, which Keras hands to the callbacks after this one in
the list and to the ``History`` that ``fit`` returns: place it before a
``keras.callbacks.TensorBoard`` or ``CSVLogger`` that should record them.
"""

from __future__ import annotations

from dataclasses import replace

import keras

from satcore import InputError, ProbeError

from .probe import ProbeConfig, probe


def per_sample_loss(loss):
    """The model's compiled loss with no reduction over the batch: ``(B,)`` or ``(B, T)`` values.

    A ``keras.losses.Loss`` is rebuilt from its config with ``reduction=None``; a name
    (``"sparse_categorical_crossentropy"``) is Keras's loss function, which does not reduce.
    """
    if isinstance(loss, keras.losses.Loss):
        return type(loss).from_config({**loss.get_config(), "reduction": None})
    if isinstance(loss, str):
        return keras.losses.get(loss)
    if callable(loss):
        return loss
    raise ProbeError(f"loss_fn: the model's compiled loss {loss!r} is not one loss; pass loss_fn(y_true, y_pred) -> (B,)")


class KerasCallback(keras.callbacks.Callback):
    """A Keras callback that probes at epoch end (module docstring).

    Parameters
    ----------
    probe_data : re-iterable of ``(x, y)`` batches or a ``tf.data.Dataset``, held out from training.
    loss_fn : ``loss_fn(y_true, y_pred)`` as :class:`~.probe.Probe` takes it; ``None``: the
        model's compiled loss without batch reduction (:func:`per_sample_loss`).
    every_n_epochs, prefix, report : how often, the key prefix, and keyword arguments of ``report()``.
    config, options : the probe's :class:`~.probe.ProbeConfig` (or its fields).

    ``reports`` holds ``(epoch, DepthReport)`` of every probe made.
    """

    def __init__(self, probe_data, loss_fn=None, *, every_n_epochs: int = 1, prefix: str = "satcore/",
                 report: dict | None = None, config: ProbeConfig | None = None, **options):
        super().__init__()
        if every_n_epochs < 1:
            raise InputError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.probe_data, self.loss_fn = probe_data, loss_fn
        self.every_n_epochs, self.prefix, self.report_options = every_n_epochs, prefix, dict(report or {})
        self.config = ProbeConfig(**options) if config is None else replace(config, **options)
        self.reports: list = []

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs:
            return
        loss_fn = self.loss_fn if self.loss_fn is not None else per_sample_loss(self.model.loss)
        report = probe(self.model, self.probe_data, loss_fn, config=self.config).report(**self.report_options)
        self.reports.append((epoch, report))
        if logs is not None:
            logs.update(report.scalars(self.prefix))
