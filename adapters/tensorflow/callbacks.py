"""``KerasCallback``: probe at the end of ``fit``'s epochs, metrics into the epoch's logs.

At the end of every ``every_n_epochs``-th epoch the callback probes
``self.model`` on ``probe_data`` and adds the report's depth-wide
:meth:`~satcore.DepthReport.scalars` (keys starting ``satcore/``; with a decision its depth-wide
:meth:`~satcore.InsertionDecision.scalars` too) to
the epoch's ``logs``, which Keras hands to the callbacks after this one in
the list and to the ``History`` that ``fit`` returns: place it before a
``keras.callbacks.TensorBoard`` or ``CSVLogger`` that should record them.

``fit(verbose=1)`` prints every key of the epoch's logs, so the per-candidate keys (six a candidate, up to
twelve with a decision) are logged only with ``log_candidates=True``, as in ``HFCallback``: the keys the two log
for one report are the same (:func:`satcore.adapters.base.callback_scalars`).  ``reports`` holds every probed
epoch's whole report either way.
"""

from __future__ import annotations

from dataclasses import replace

import keras

from satcore import DecisionPolicy, InputError, ProbeError
from satcore.adapter_api import moved_keywords
from satcore.adapters.base import (ProgressCounter, callback_log_candidates, callback_scalars, callback_schedule,
                                  known_length, require_reiterable, warn_if_too_few_batches, weights_fingerprint)
from satcore.adapters.callback_dumps import callback_dumps

from .grow import require_functional
from .locate import locate_candidates
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


def is_chief(strategy) -> bool:
    """Whether this process is the chief of ``strategy``'s cluster, the one that writes files for the run (TensorFlow's
    rule, ``multi_worker_util.is_chief``): every process without a cluster (one machine, any number of devices), the
    ``chief`` (or ``evaluator``) task, else, in a cluster without a ``chief``, worker 0."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not cluster or resolver.task_type in (None, "chief", "evaluator"):
        return True
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster


def keras_fingerprint(model) -> str:
    """:func:`satcore.adapters.base.weights_fingerprint` of ``model.weights`` (by their ``path``), the torch
    checkpoints' fingerprint of a Keras model: its first and last four values of each weight, not a pass over
    them."""

    def entries():
        for weight in model.weights:
            flat = keras.ops.reshape(weight.value, (-1,))
            ends = keras.ops.concatenate([flat[:4], flat[-4:]]) if flat.shape[0] > 8 else flat
            yield weight.path, tuple(weight.shape), weight.dtype, keras.ops.convert_to_numpy(ends)

    return weights_fingerprint(entries())


class KerasCallback(keras.callbacks.Callback):
    """A Keras callback that probes at epoch end (module docstring).

    Parameters
    ----------
    probe_data : re-iterable of ``(x, y)`` batches or a ``tf.data.Dataset``, held out from training (read at every
        probed epoch: a generator or no batches are refused when the callback is built).
    loss_fn : ``loss_fn(y_true, y_pred)`` as :class:`~.probe.Probe` takes it; ``None``: the
        model's compiled loss without batch reduction (:func:`per_sample_loss`).
    every_n_epochs, report : how often, and keyword arguments of ``report()``.
    config : the probe's :class:`~.probe.ProbeConfig` (default ``ProbeConfig()``; its ``split`` default
        ``"heldout"``, as in the PyTorch callbacks).  Its places, and the policy's, are found in the model when
        training starts (``on_train_begin``), so that a layer it does not have is refused before the first step.
    policy, train_data : optional
        Also decide, at each probed epoch end, where to insert a block under the
        :class:`satcore.DecisionPolicy` (:func:`~.decide.decide`, the trials drawing from the ``train_data``
        batches; the held-out split is ``probe_data``; the places, family and features those of ``config``
        where the policy names none and gives no probe); the decision's scalars (``satcore/decision/...``) join
        the epoch's logs and the report leads with it.  The trials train copies of the model, from their own
        seeded generators.
    log_candidates : bool
        Log the per-candidate keys too (``satcore/<name>/...``, ``satcore/decision/<name>/...``); default: the
        depth-wide ones only, which ``fit(verbose=1)`` prints at each epoch's end.
    dump_dir : str or os.PathLike, optional
        Also write each probed epoch's statistics to ``dump_dir/satcore-epoch-<epoch>.npz`` (four digits at least;
        the epoch counted from 1, as ``fit`` shows it and ``ModelCheckpoint``'s ``{epoch}`` names it), a dump
        ``satcore score`` reads (:mod:`satcore.adapters.callback_dumps`), from the chief only under a multi-worker
        ``tf.distribute`` strategy (:func:`is_chief`); a path that is a file, or a folder holding a file at such a
        name, is refused here.

    ``prefix`` (``"satcore/"``, the start of every metric key) is a class attribute, as in the PyTorch
    callbacks.  ``reports`` holds ``(epoch, DepthReport)`` of every probe made (with ``policy``, the report's
    ``decision`` is that epoch's :class:`satcore.InsertionDecision`).
    """

    prefix = "satcore/"

    @moved_keywords("callback", class_attributes=("prefix",))
    def __init__(self, probe_data, loss_fn=None, *, every_n_epochs: int = 1, report: dict | None = None,
                 config: ProbeConfig | None = None, policy: DecisionPolicy | None = None, train_data=None,
                 log_candidates: bool = False, dump_dir=None):
        super().__init__()
        every_n_epochs, report_options = callback_schedule("KerasCallback", "every_n_epochs", every_n_epochs, report)
        self.log_candidates = callback_log_candidates("KerasCallback", log_candidates)
        config = ProbeConfig() if config is None else config
        if not isinstance(config, ProbeConfig):
            raise InputError(f"KerasCallback: config must be a satcore.adapters.tensorflow.ProbeConfig, got "
                             f"{type(config).__name__}")
        if config.split is None:  # the probe data is held out from training (the tests assume it)
            config = replace(config, split="heldout")
        require_reiterable(probe_data, "KerasCallback's probe_data")
        if (policy is None) != (train_data is None):
            raise InputError("KerasCallback: policy= and train_data= (the training batches the trials draw from) go "
                             "together")
        if policy is not None:
            if not isinstance(policy, DecisionPolicy):
                raise InputError(f"KerasCallback: policy must be a satcore.DecisionPolicy, got {type(policy).__name__}")
            require_reiterable(train_data, "KerasCallback's train_data")
            # the callback's places and features where the policy gives none (its own probe settings stay its own)
            shared = ProbeConfig(family=config.family, init_std=config.init_std, n_features=config.n_features,
                                 strategy=config.strategy)
            policy = replace(policy, candidates=config.candidates if policy.candidates is None else policy.candidates,
                             probe=shared if policy.probe is None else policy.probe)
        self.probe_data, self.loss_fn, self.config = probe_data, loss_fn, config
        self.every_n_epochs, self.report_options = every_n_epochs, report_options
        self.policy, self.train_data = policy, train_data
        self.dumps = callback_dumps("KerasCallback", dump_dir)
        self.reports: list = []

    def on_train_begin(self, logs=None):
        if self.policy is not None:  # the decision's trials rebuild the graph: refused before the first step
            require_functional(self.model, "KerasCallback(policy=...)")
        # the places, the probe's and the decisions', found before the first step rather than at an epoch's end
        names = locate_candidates(self.model, self.config.candidates)
        warn_if_too_few_batches("KerasCallback", self.probe_data, len(names), self.report_options)
        if self.policy is not None:
            locate_candidates(self.model, self.policy.candidates)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs:
            return
        loss_fn = self.loss_fn if self.loss_fn is not None else per_sample_loss(self.model.loss)
        # the probe can take longer than the epoch's validation, and a decision minutes: their bars show where fit
        # shows its own
        shows_bar = self.params.get("verbose") in (1, "auto")
        with ProgressCounter(shows_bar, "probe") as counter:
            if known_length(self.probe_data) is not None:
                counter.plan(known_length(self.probe_data))
            result = probe(self.model, self.probe_data, loss_fn, config=self.config, progress=counter.per_batch())
        if self.dumps is not None and is_chief(self.config.strategy or self.model.distribute_strategy):
            # the epoch as Keras shows it and ModelCheckpoint's "{epoch}" names it: from 1
            self.dumps.write(result, self.config, keras_fingerprint(self.model), epoch=epoch + 1)
        report = result.report(**self.report_options)
        if self.policy is not None:
            from .decide import decide

            decision = decide(self.model, self.train_data, self.probe_data, loss_fn, policy=self.policy,
                              progress=shows_bar)
            report = replace(report, decision=decision)
        self.reports.append((epoch, report))
        if logs is not None:
            logs.update(callback_scalars(report, self.prefix, self.log_candidates))
