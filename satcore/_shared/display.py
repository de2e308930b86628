"""Showing names that come from files (candidate names, keys, meta fields) on a terminal.

A name read from a dump or a model is data, not text to print: a newline in it
would forge a line of the report, ``\\r`` would overwrite a row, and escape
sequences (CSI, OSC window titles, BEL) would drive the terminal.  Every text
output shows :func:`display_name` of such a name: tables, error messages,
plots and CSV (uncut there: ``limit=None``).  JSON output keeps the exact name
(``json.dumps`` escapes control characters itself, and every non-ASCII
character with its default ``ensure_ascii``).
"""

from __future__ import annotations

MAX_DISPLAY_CHARS = 200  # a name is a label: past this it is cut (the JSON keeps it whole)
NOT_VERIFIED = "not verified"  # how every rendering names a candidate no trial verified (screen only)


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def display_name(text, limit: int | None = MAX_DISPLAY_CHARS) -> str:
    """``text`` as one printable line: every non-printable character escaped, text longer than ``limit``
    characters cut (``None``: never cut).

    Non-printable is Python's ``str.isprintable`` (Unicode categories Other and
    Separator except the space): control characters, line and paragraph
    separators, and format characters such as the bidirectional overrides
    that reorder a line.  A printable name is returned unchanged.
    """
    text = str(text)
    if text.isprintable() and (limit is None or len(text) <= limit):
        return text
    shown = "".join(c if c.isprintable() else _escape(c) for c in text)
    return shown if limit is None or len(shown) <= limit else shown[: limit - 3] + "..."
