"""Strings in the YAML satcore writes (``mergekit.yaml``): one writer of double-quoted scalars.

A path is user text: it may hold a newline, a carriage return, NEL (U+0085), the line and paragraph
separators (U+2028/9), which a YAML reader folds into a space (another path), or an escape, a DEL or a
lone surrogate (a file name that is not UTF-8), which YAML may not hold at all (PyYAML refuses the
file).  :func:`yaml_quoted` writes every such character as its YAML escape, so that the scalar reads
back, by any YAML 1.1 or 1.2 reader, as exactly the string written (YAML 1.2, 5.7 "Escaped
Characters"; PyYAML reads the same escapes).
"""

from __future__ import annotations

# the short escapes of YAML's double-quoted style; every other character outside the printable set below is \xXX,
# \uXXXX or \UXXXXXXXX
_SHORT = {"\\": "\\\\", '"': '\\"', "\0": "\\0", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v",
          "\f": "\\f", "\r": "\\r", "\x1b": "\\e", "\x85": "\\N", "\xa0": "\\_", "\u2028": "\\L", "\u2029": "\\P"}


def _plain(ch: str) -> bool:
    """Whether ``ch`` may stand for itself inside double quotes on one line: YAML's printable characters
    (c-printable), less the line breaks and the byte-order mark."""
    code = ord(ch)
    return (0x20 <= code <= 0x7E or 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000) \
        and code not in (0x2028, 0x2029, 0xFEFF)


def _escaped(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    if _plain(ch):
        return ch
    code = ord(ch)
    return f"\\x{code:02X}" if code <= 0xFF else f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def yaml_quoted(text: str) -> str:
    """``text`` as one YAML double-quoted scalar on one line, reading back as ``text`` exactly."""
    return '"' + "".join(map(_escaped, text)) + '"'
