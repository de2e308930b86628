"""Optional packages: the one check every front-end makes before importing its framework.

``import satcore`` needs NumPy and SciPy only; each front-end needs its own
packages, installed with an extra (``pip install 'satcore[torch]'``,
``[tensorflow]``, ``[onnx]``, ``[hf]``, ``[lightning]``, ``[plot]``).  When one is
missing, :func:`require` raises :class:`~satcore._shared.errors.MissingDependencyError`
(an ``ImportError``) with one line that names what needs it, what is missing
and the extra that installs it, instead of a bare ``ModuleNotFoundError`` from
deep inside the front-end.  It asks the import system whether the package is
installed (``importlib.util.find_spec``) without importing it, so a front-end
that imports its framework lazily stays lazy.
"""

from __future__ import annotations

import importlib.util

from .errors import MissingDependencyError


def require(*modules: str, extra: str, by: str) -> None:
    """Raise :class:`MissingDependencyError` unless every top-level package in ``modules`` is installed.

    ``by`` names what needs them (a module, a class, a command-line option); the message is
    ``"<by> needs <missing>: pip install 'satcore[<extra>]'"``.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependencyError(f"{by} needs {' and '.join(missing)}: pip install 'satcore[{extra}]'")
