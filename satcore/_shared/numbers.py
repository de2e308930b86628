"""Numbers a user gives: the one reader of the integers and reals of options, token files and recipes.

Every count, seed, size and rate that reaches satcore from a command line, a file or a Python
argument goes through here, so that one rule holds everywhere: a whole number is an ``int`` or a
NumPy integer (never a bool, never a float), written in ASCII digits when it is text (``int('²')``
raises, ``int('٣')`` is 3: neither is accepted), at most :data:`MAX_DIGITS` digits long (longer text
is refused before Python converts it: past 4300 digits ``int()`` raises); a real is finite and
within float64's range (``float(10**400)`` raises ``OverflowError``).  Each refusal is one
:class:`~satcore.InputError` that names the field (``what``) and shows a long value by its length.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .errors import InputError

# Counts (steps, samples, features, batch sizes) meet float64 arithmetic: up to 2^53 they stay exact in it.
MAX_COUNT = 2**53
# the largest seed every generator satcore seeds accepts (torch's takes a signed 64-bit value, NumPy's any)
MAX_SEED = 2**63 - 1
MAX_DIGITS = len(str(MAX_SEED)) + 1  # longer text cannot be in any range here: refused before it is converted
_WHOLE = re.compile(r"[+-]?[0-9]+")
_SHOWN_DIGITS = 24


def shown_value(value) -> str:
    """``repr(value)`` shortened: a long integer by its size in bits (``repr`` of one past 4300 digits raises)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        number = int(value)
        return str(number) if abs(number) < 10**_SHOWN_DIGITS else f"an integer of {number.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def whole_number(value, what: str, low: int = 1, high: int = MAX_COUNT) -> int:
    """``value`` (an ``int`` or NumPy integer, not a bool) as an ``int`` in ``[low, high]``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{what} must be a whole number, got {shown_value(value)} ({type(value).__name__})")
    number = int(value)
    if not low <= number <= high:
        raise InputError(f"{what}: {shown_value(number)} is not in the range {low}..{high}")
    return number


def positive_count(value, what: str) -> int:
    """``value`` (an ``int`` or NumPy integer, not a bool) as an ``int`` of at least 1: :func:`whole_number` in
    ``1 .. MAX_COUNT``, refused as ``"<what> must be a positive integer, got <value>"``."""
    try:
        return whole_number(value, what, 1, MAX_COUNT)
    except InputError:
        raise InputError(f"{what} must be a positive integer, got {shown_value(value)}") from None


def parse_whole_number(text: str, what: str, low: int = 1, high: int = MAX_COUNT) -> int:
    """A whole number written in ASCII digits (an optional sign), in ``[low, high]``; the length is checked
    before the text is converted."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        shown = repr(stripped) if len(stripped) <= 40 else f"a {len(stripped)}-character text"
        raise InputError(f"{what}: {shown} is not a whole number (ASCII digits 0-9)")
    if len(stripped.lstrip("+-").lstrip("0")) > MAX_DIGITS:
        raise InputError(f"{what}: a {len(stripped)}-character number is not in the range {low}..{high}")
    return whole_number(int(stripped), what, low, high)


def finite_real(value, what: str, *, low: float | None = None, low_open: bool = False) -> float:
    """``value`` (an ``int``, ``float`` or NumPy number, not a bool) as a finite ``float``, at least ``low``
    (more than ``low`` with ``low_open``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{what} must be a finite number, got {shown_value(value)} ({type(value).__name__})")
    try:
        number = float(value)
    except OverflowError:
        raise InputError(f"{what} must be a finite number, got {shown_value(value)} (past float64's range)") from None
    if not math.isfinite(number):
        raise InputError(f"{what} must be a finite number, got {shown_value(value)}")
    if low is not None and (number <= low if low_open else number < low):
        raise InputError(f"{what} must be {'>' if low_open else '>='} {low:g}, got {shown_value(value)}")
    return number


def derived_seed(value: int) -> int:
    """A seed computed from a user's seed (``seed * 1_000_003 + batch``, ``seed + rank``) brought back into
    ``0 .. MAX_SEED``: unchanged where it already lies there, so results for every seed in range stay."""
    return int(value) % (MAX_SEED + 1)
