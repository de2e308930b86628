"""Reading ``.npy`` members of a zip archive without trusting them.

``numpy.load`` reads a whole member into memory.  A dump can be larger than
memory, so raw members are parsed here by hand: the ``.npy`` header is read
with :mod:`numpy.lib.format` (``read_magic`` and ``read_array_header_*``) from
the zip member stream, its dtype is checked *before* any data is touched
(object dtypes, which would hold pickles, are refused and never unpickled),
and the data is then read in chunks of rows straight from the (stored or
deflated) member stream.  Every problem raises :class:`NpyMemberError` with a
message; :mod:`satcore.dump` adds the key.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

# Errors the zip layer raises on damaged or truncated data.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError)


class NpyMemberError(ValueError):
    """A zip member is not a well-formed, numeric ``.npy`` array."""


@dataclass(frozen=True)
class NpyHeader:
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (one sample) of a C-ordered array."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize  # Python ints: a declared shape cannot wrap

    @property
    def n_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _read_header(stream) -> NpyHeader:
    try:
        version = npy_format.read_magic(stream)
    except ValueError as exc:
        raise NpyMemberError(f"not a .npy array ({exc})") from None
    try:
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise NpyMemberError(f"unsupported .npy format version {version}")
    except NpyMemberError:
        raise
    except (ValueError, SyntaxError, TypeError) as exc:
        raise NpyMemberError(f"malformed .npy header ({exc})") from None
    if dtype.hasobject:
        raise NpyMemberError("holds Python objects (a pickle); refused, nothing was unpickled")
    if any(int(s) < 0 for s in shape):
        raise NpyMemberError(f"malformed .npy header (negative dimension in shape {tuple(shape)})")
    return NpyHeader(tuple(int(s) for s in shape), dtype, bool(fortran))


def _read_exact(stream, n_bytes: int) -> bytes:
    try:
        data = stream.read(n_bytes)
    except MemoryError:
        raise NpyMemberError(f"{n_bytes} bytes of data do not fit in memory") from None
    if len(data) != n_bytes:
        raise NpyMemberError(f"truncated: expected {n_bytes} bytes of data, found {len(data)}")
    return data


def _finish(stream):
    """Read to the member's end so the zip layer checks its CRC; refuse trailing data."""
    if stream.read(1):
        raise NpyMemberError("has data beyond the array its header describes")


def member_header(archive: zipfile.ZipFile, member: str) -> NpyHeader:
    """The checked header of ``member`` (reads only the first bytes)."""
    try:
        with archive.open(member) as stream:
            return _read_header(stream)
    except ZIP_ERRORS as exc:
        raise NpyMemberError(f"unreadable zip member ({exc})") from None


def read_member(archive: zipfile.ZipFile, member: str) -> np.ndarray:
    """A whole (small) member: ``meta``, ``satcore_schema`` and ``stats/`` fields."""
    try:
        with archive.open(member) as stream:
            header = _read_header(stream)
            data = _read_exact(stream, header.n_bytes)
            _finish(stream)
    except ZIP_ERRORS as exc:
        raise NpyMemberError(f"unreadable zip member ({exc})") from None
    order = "F" if header.fortran_order else "C"
    return np.frombuffer(data, dtype=header.dtype).reshape(header.shape, order=order)


class RowReader:
    """Sequential chunks of rows (first axis = samples) of one member.

    Holds one open member stream; memory is one chunk.  Fortran-ordered
    members have no contiguous rows, so they are read whole on the first call
    (documented in ``docs/dump-format.md``).
    """

    def __init__(self, archive: zipfile.ZipFile, member: str):
        try:
            self._stream = archive.open(member)
            self.header = _read_header(self._stream)
        except ZIP_ERRORS as exc:
            raise NpyMemberError(f"unreadable zip member ({exc})") from None
        self._rows_left = self.header.shape[0] if self.header.shape else 0
        self._whole = None

    def read(self, n_rows: int) -> np.ndarray:
        """The next ``min(n_rows, rows left)`` rows; at the end, verifies the member."""
        h = self.header
        n = min(n_rows, self._rows_left)
        try:
            if h.fortran_order:
                if self._whole is None:
                    raw = _read_exact(self._stream, h.n_bytes)
                    self._whole = np.frombuffer(raw, dtype=h.dtype).reshape(h.shape, order="F")
                start = h.shape[0] - self._rows_left
                rows = self._whole[start : start + n]
            else:
                raw = _read_exact(self._stream, n * h.row_bytes)
                rows = np.frombuffer(raw, dtype=h.dtype).reshape((n,) + h.shape[1:])
            self._rows_left -= n
            if self._rows_left == 0:
                _finish(self._stream)
        except ZIP_ERRORS as exc:
            raise NpyMemberError(f"unreadable zip member ({exc})") from None
        return rows

    def close(self):
        self._stream.close()
