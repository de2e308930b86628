"""How a refusal names an option the user gave: by the Python keyword (``n_features=10``) or, while a command of
the command line runs, by the flag the user typed (``--n-features 10``).

The command line passes its flags' values on to the same functions Python callers use (``satcore probe
--n-features`` is the probe's ``n_features``), so a refusal raised deep in the core would name the keyword to a user
who typed a flag.  The running command installs, with :func:`options_named_by`, the function that finds a keyword's
flag (its own option table); :func:`option_given` then spells the option as the user gave it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .numbers import shown_value

_FLAG_OF: ContextVar[Callable[[str], str | None] | None] = ContextVar("satcore_flag_of", default=None)


@contextmanager
def options_named_by(flag_of: Callable[[str], str | None]) -> Iterator[None]:
    """Within the block, :func:`option_given` names an option by ``flag_of(keyword)`` (``None``: by its keyword)."""
    token = _FLAG_OF.set(flag_of)
    try:
        yield
    finally:
        _FLAG_OF.reset(token)


def option_given(keyword: str, value) -> str:
    """``keyword=value`` as a Python call gives it, or ``--flag value`` where the running command took it as ``--flag``.

    Examples
    --------
    >>> from satcore.adapter_api import option_given, options_named_by
    >>> option_given("n_features", 10)
    'n_features=10'
    >>> with options_named_by({"n_features": "--n-features"}.get):
    ...     option_given("n_features", 10)
    '--n-features 10'
    """
    flag_of = _FLAG_OF.get()
    flag = None if flag_of is None else flag_of(keyword)
    return f"{keyword}={shown_value(value)}" if flag is None else f"{flag} {shown_value(value)}"
