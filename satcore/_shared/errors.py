"""The one exception root of satcore (the pattern of ``httpx.HTTPError``).

Every refusal a user can cause — an invalid file, option, model, candidate name or
growth log — raises a subclass of :class:`SatcoreError`; the command line prints its
message as one line and exits 2.  Anything else that escapes is a bug in satcore and
shows as one, with its traceback.

The subclasses that refuse values also derive from :class:`ValueError` (and
:class:`OutputError` from :class:`OSError`, :class:`ArrayTypeError` from
:class:`TypeError`) so that ``except ValueError`` (``except TypeError``) written
against earlier releases keeps catching them.

::

    SatcoreError
    ├── InputError (ValueError)       an argument, option or array the core refuses
    │   ├── DumpError                 an invalid dump file (satcore._io.dump)
    │   ├── NpzError                  an .npz container that cannot be read safely (satcore._io.zipnpy)
    │   ├── ProbeError                a model, candidate or batch an adapter cannot probe
    │   │   ├── ModelOnDataError      a batch the model cannot take or scores NaN on (either may be at fault)
    │   │   └── OnnxProbeError        (satcore.adapters.onnx; its batch refusals are both)
    │   ├── GrowthLogError            a growth log or its weights that cannot be resumed
    │   └── ArrayTypeError (TypeError)  an array argument that is no real floating-point array (satcore._shared.arrays)
    ├── OutputError (OSError)         an output that cannot or must not be written (satcore._io.atomic)
    └── MissingDependencyError (ImportError)  an optional package is not installed (satcore._shared.optional)
"""

from __future__ import annotations


class SatcoreError(Exception):
    """Root of every error satcore raises on purpose; its message is one line."""


class InputError(SatcoreError, ValueError):
    """An argument, option, array or file content that satcore refuses (one line, naming it)."""


class ProbeError(InputError):
    """A model, candidate name, loss or data batch that an adapter cannot probe."""


class ModelOnDataError(ProbeError):
    """The model refused on the data: a batch the model (or the loss given for it) cannot take, or a loss that
    is NaN or infinite before any training.  Either the model or the data may be at fault, so the command line
    leads the message with both files, where any other refusal names the one at fault.  ``split``: the evaluated
    split it was refused on where the data has several (``"general"``: ``satcore expand``'s ``--general-data``,
    whose file the line then names), else None."""

    def __init__(self, message: str, *, split: str | None = None):
        super().__init__(message)
        self.split = split


class GrowthLogError(InputError):
    """A growth log (or a weights file it names) that is damaged, foreign or in use."""


class ArrayTypeError(InputError, TypeError):
    """An argument where an array of real numbers goes that is none: integers, booleans, complex values, a str, a
    ragged list.  A :class:`TypeError` too, as these refusals were before they named the argument."""


class MissingDependencyError(SatcoreError, ImportError):
    """An optional package a front-end needs is not installed; the message names the extra to install
    (``pip install 'satcore[EXTRA]'``).  An :class:`ImportError`, so ``except ImportError`` still catches it."""


__all__ = ["SatcoreError", "InputError", "ProbeError", "ModelOnDataError", "GrowthLogError", "MissingDependencyError"]
