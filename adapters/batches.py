"""The one batch convention of the adapters (pure Python: no framework is imported).

A batch is either

* a pair ``(inputs, targets)``: ``inputs`` what the model is called on (an array or
  tensor, or a structure the framework accepts), ``targets`` what the loss compares
  the outputs with; or
* a mapping of model inputs (a dict, a Hugging Face ``DataCollator``'s output or
  ``BatchEncoding``, a ``tf.data`` element) whose targets are under ``"labels"``
  (:data:`LABELS`); a mapping without it has no targets.

:func:`split_batch` reads both forms.  What the model receives of a mapping differs
only where the framework's models expect it: the torch adapter calls the model on
the whole mapping (Hugging Face models take ``labels`` and compute their own loss
from it), the TensorFlow and ONNX adapters on the mapping without the targets (a
Keras model or an ONNX graph has no ``labels`` input).  Older spellings each adapter
still reads (TensorFlow ``{"x", "y"}``; ONNX ``targets``/``target``/``y`` keys and a
batch of inputs alone) are documented with that adapter's ``probe``.
"""

from __future__ import annotations

from collections.abc import Mapping

from satcore import ProbeError

LABELS = "labels"


def split_batch(batch, *, target_keys=(LABELS,), input_names=(), targets_to_model: bool = False):
    """``(inputs, targets)`` of one batch in the convention above.

    Parameters
    ----------
    batch : tuple, list or Mapping
        ``(inputs, targets)``, or a mapping of model inputs holding the targets under
        one of ``target_keys``.
    target_keys : tuple of str
        The keys a mapping's targets may have; ``("labels",)`` unless an adapter reads
        older spellings too.  At most one may be present.
    input_names : collection of str
        Names of model inputs: such a key is an input, never the targets (a model
        whose input is called ``"y"``).
    targets_to_model : bool
        Whether a mapping's inputs keep the targets' entry (torch, for Hugging Face
        models) or lose it (TensorFlow, ONNX).

    Returns
    -------
    tuple
        ``(inputs, targets)``; ``targets`` is ``None`` for a mapping without them.

    Raises
    ------
    ProbeError
        A sequence that is not a pair, something that is neither, or a mapping with
        several target keys; one line saying what a batch is (a ``ValueError`` too).

    Examples
    --------
    >>> from satcore.adapters.batches import split_batch
    >>> split_batch(([1, 2], [0, 1]))
    ([1, 2], [0, 1])
    >>> split_batch({"input_ids": [3, 4], "labels": [4, 5]})
    ({'input_ids': [3, 4]}, [4, 5])
    >>> split_batch({"input_ids": [3, 4], "labels": [4, 5]}, targets_to_model=True)
    ({'input_ids': [3, 4], 'labels': [4, 5]}, [4, 5])
    """
    if isinstance(batch, Mapping):
        keys = [k for k in target_keys if k in batch and k not in input_names]
        if len(keys) > 1:
            raise ProbeError(f"batch has several target keys {keys}; give one ({LABELS!r})")
        targets = batch[keys[0]] if keys else None
        if targets_to_model:
            return batch, targets
        return {k: v for k, v in batch.items() if k not in keys}, targets
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ProbeError(
        f"a batch is a pair (inputs, targets) or a mapping of model inputs (with {LABELS!r} for the targets), "
        f"got {type(batch).__name__}" + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    )
