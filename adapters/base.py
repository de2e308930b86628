"""What every adapter is, framework-free: the probe protocol, its shared options, split check and meta.

An adapter turns a model of its framework into the core's statistics
(docs/adapters.md).  Whatever the framework, it offers

* a :class:`Probe` (the protocol below): ``update(batch)`` adds one batch's sums,
  ``result()`` returns a :class:`satcore._io.probe_result.ProbeResult` at any point, and
  the probe goes on after it;
* ``probe(model, data, ...)``: a ``Probe`` fed every batch of ``data``, then its result;
* its options as a frozen dataclass derived from :class:`ProbeOptions`, the options
  every adapter takes and resolves alike (:mod:`.options`), built from keywords or
  given whole as ``config=`` (:func:`resolve_options`);
* :func:`warn_if_training_split` when the probe data is named a training split, and
  :func:`probe_meta` for the provenance its result records.

Per batch the adapter computes, on its device, per candidate: the per-sample gradients
``q_i = d loss_i / d z_i`` (of a per-sample loss; a batch mean is multiplied back),
the features ``psi(z_i)`` of the registered family (:mod:`satcore._formulas.families`), and hands
the batch's sums as a :class:`satcore.BatchMoments` (``batch_moments``' fields and the
stream sums ``sum_z_sq``, ``n_stream_vectors``, in the framework's own arrays until
converted) to :meth:`satcore.CandidateStatistics.add_moments` of statistics made with
``stream=True``.  ``tests/test_conformance.py`` holds every
adapter to one independent reference.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from satcore.adapter_api import is_training_split
from satcore import ProbeResult
from satcore.adapter_api import TRAINING_SPLIT_WARNING


@runtime_checkable
class Probe(Protocol):
    """The incremental probe every adapter implements (torch, TensorFlow, ONNX; a JAX one would too).

    ``update(batch)`` runs one batch (the batch convention of :mod:`.batches`) and adds its
    sums to the running statistics; it returns the batch's number of samples (the torch and
    ONNX probes) or ``None``.  ``result()`` returns the statistics of every batch so far as a
    :class:`~satcore._io.probe_result.ProbeResult` (upstream candidate first, ``meta`` from
    :func:`probe_meta`), without ending the probe.
    """

    def update(self, batch) -> int | None: ...

    def result(self) -> ProbeResult: ...


@dataclass(frozen=True)
class ProbeOptions:
    """The options every adapter's probe takes, with the same meaning everywhere.

    Attributes
    ----------
    candidates : ``None`` (the residual blocks the adapter locates) or names of candidate
        locations (module names, layer names or tensor names, as the framework names them).
    family : ``"auto"`` (``conv`` for a 4-d image stream, else ``mlp``), a registered kind
        (:func:`satcore._formulas.families.registered_families`), a :class:`satcore.Family`, a
        framework feature map, or a mapping candidate -> one of those (a candidate it leaves
        out gets ``"auto"``).
    seed : seed of the drawn families' weights (``make_family(kind, width, seed=seed)``).
    init_std : weight scale of the kinds that take one (``mlp``); ``None``: the default.
    variance : also keep ``sum_i X_i^T X_i`` (the debiased growth value).
    split : name of the probe data; a training split warns (:func:`warn_if_training_split`).
    n_features : the drawn families' ``r``: an int, or a mapping candidate -> int.
    """

    candidates: tuple[str, ...] | None = None
    family: object = "auto"
    seed: int = 0
    init_std: float | None = None
    variance: bool = False
    split: str | None = None
    n_features: int | dict | None = None

    def __post_init__(self):
        if self.candidates is not None and not isinstance(self.candidates, tuple):
            object.__setattr__(self, "candidates", tuple(self.candidates))


def resolve_options(cls, config=None, **options):
    """``cls(**options)``, or ``config`` (an instance of ``cls``) with ``options`` replacing its fields:
    how every adapter's ``Probe(model, ..., config=None, **options)`` reads its options."""
    return cls(**options) if config is None else replace(config, **options)


def warn_if_training_split(split: str | None, stacklevel: int = 3) -> None:
    """Warn (``UserWarning``) when ``split`` names a training split: the finite-sample tests assume a
    probe independent of training.  ``stacklevel`` 3 points at the caller of the adapter's ``Probe``."""
    if is_training_split(split):
        warnings.warn(TRAINING_SPLIT_WARNING, UserWarning, stacklevel=stacklevel)


def loss_name(loss) -> str:
    """What a result records of the loss: a string as given, ``"model_loss"`` for ``None`` (the model's
    own loss), else the object's ``name`` (Keras), ``__name__`` (a function) or type name."""
    if loss is None:
        return "model_loss"
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def probe_meta(framework: str, model: str, loss, options: ProbeOptions, **extra) -> dict:
    """The provenance every adapter's result records in ``meta`` (the dump's ``meta`` member,
    ``satcore/schemas/dump-meta.schema.json``): ``framework``, ``model`` (a name), ``loss``
    (:func:`loss_name`), the probe data's ``split`` and the families' ``seed``, plus the
    adapter's own fields ``extra``.  ``candidates``, ``family`` and the stream ``diagnostics`` are
    added when the result is written (:meth:`satcore._io.probe_result.ProbeResult.dump_meta`)."""
    return {"framework": framework, "model": model, "loss": loss_name(loss), "split": options.split,
            "seed": options.seed, **extra}
