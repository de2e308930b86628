"""The one reader of every ``.npz`` satcore opens (dumps, ``probe --data``, checkpoints).

Files are never trusted.  Before a byte of data is allocated:

* **the file** must be a regular file: directories, FIFOs, sockets and devices
  (``/dev/zero``) are refused from ``stat`` alone, and the file is opened with
  ``O_NONBLOCK`` and checked again with ``fstat`` (a FIFO swapped in between
  would otherwise block in ``open``);
* **the zip directory** must be at most ``MAX_CENTRAL_DIRECTORY_BYTES``, each
  member stored or deflated (what ``numpy.savez``/``savez_compressed`` write;
  bzip2, lzma and the rest are refused, as are encrypted members), not empty,
  and its compressed size inside the file (compressed sizes adding up to more
  than the file mean overlapping members, a zip bomb's trick);
* **decompression** is capped: a member larger than ``SMALL_MEMBER_BYTES`` may
  inflate to at most ``max_ratio`` times its compressed size, the whole archive
  to ``max_ratio`` times the file size plus ``SMALL_ARCHIVE_BYTES``, and to
  ``max_inflated_bytes`` in all (:class:`Limits`; environment variables
  ``SATCORE_MAX_INFLATE_RATIO``, ``SATCORE_MAX_INFLATED_BYTES``);
* **each ``.npy`` header** (parsed with :mod:`numpy.lib.format`, object dtypes
  refused and never unpickled) must declare exactly as many data bytes as the
  zip says the member holds, so a declared shape can never ask for more memory
  than the member really inflates to;
* **memory**: a member read whole, one row of a streamed member and a batch
  of rows are each held to ``memory_budget`` bytes (``SATCORE_MEMORY_BUDGET``).

Data is read from the member stream in chunks of rows.  Every problem, including
whatever the zip and zlib layers raise on corrupt data (bad CRC, broken deflate
streams), is one :class:`NpzError` whose message names the file and the key.
"""

from __future__ import annotations

import math
import os
import re
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from .atomic import file_kind, note_input
from .._shared.display import display_name
from .._shared.errors import InputError

ENV_MAX_RATIO = "SATCORE_MAX_INFLATE_RATIO"
ENV_MAX_INFLATED = "SATCORE_MAX_INFLATED_BYTES"
ENV_MEMORY_BUDGET = "SATCORE_MEMORY_BUDGET"
DEFAULT_MAX_RATIO = 100.0  # random floats deflate ~1.1x; 1000x is a run of zeros (deflate's maximum is ~1032x)
DEFAULT_MAX_INFLATED_BYTES = 2**40
DEFAULT_MEMORY_BUDGET = 2**31
SMALL_MEMBER_BYTES = 2**20  # members up to this size may compress as well as they like (JSON meta, labels)
SMALL_ARCHIVE_BYTES = 16 * 2**20
MAX_CENTRAL_DIRECTORY_BYTES = 8 * 2**20  # ~100k members; zipfile holds ~0.5 kB of objects per entry
COMPRESSION = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}

# What the zip, zlib and struct layers raise on damaged, truncated or hostile data.
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError,
              struct.error, OverflowError)


class NpzError(InputError):
    """An ``.npz`` file or member that cannot be read safely; the message names file and key (one line)."""


@dataclass(frozen=True)
class Limits:
    """Caps of the reader (module docstring); :meth:`from_env` reads the overrides."""

    max_ratio: float = DEFAULT_MAX_RATIO
    max_inflated_bytes: int = DEFAULT_MAX_INFLATED_BYTES
    memory_budget: int = DEFAULT_MEMORY_BUDGET

    @classmethod
    def from_env(cls) -> "Limits":
        return cls(
            _env_number(ENV_MAX_RATIO, DEFAULT_MAX_RATIO, float),
            _env_number(ENV_MAX_INFLATED, DEFAULT_MAX_INFLATED_BYTES, int),
            _env_number(ENV_MEMORY_BUDGET, DEFAULT_MEMORY_BUDGET, int),
        )


def _env_number(name: str, default, kind):
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise NpzError(f"environment variable {name}={display_name(text)!s}: not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise NpzError(f"environment variable {name}={display_name(text)!s}: must be a positive number")
    return value


@dataclass(frozen=True)
class NpyHeader:
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int = 0  # bytes of the .npy header before the data

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (one sample) of a C-ordered array."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize  # Python ints: a declared shape cannot wrap

    @property
    def n_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def open_regular(path):
    """``(binary file, size)`` of a regular file; anything else is refused without blocking or reading."""
    shown = display_name(os.fspath(path))
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise NpzError(f"{shown}: is {file_kind(before.st_mode)}, not a regular file; refused")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NpzError(f"{shown}: no such file") from None
    except OSError as exc:
        raise NpzError(f"{shown}: cannot open ({exc.strerror or exc})") from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):  # replaced between stat and open
            raise NpzError(f"{shown}: is {file_kind(now.st_mode)}, not a regular file; refused")
        os.set_blocking(fd, True)
        note_input(path, now)  # an input of the running command: no output of it may replace this file
        return os.fdopen(fd, "rb"), now.st_size
    except BaseException:
        os.close(fd)
        raise


def _central_directory_bytes(stream) -> int | None:
    """Size of the zip's central directory from its end record (``None`` if there is none)."""
    parse = getattr(zipfile, "_EndRecData", None)  # the end-record parser zipfile itself uses (private)
    if parse is None:
        return None
    end = parse(stream)
    stream.seek(0)
    return None if end is None else int(end[zipfile._ECD_SIZE])


class NpzArchive:
    """An opened ``.npz``: file, directory and sizes checked (module docstring); members read on demand."""

    def __init__(self, path, limits: Limits | None = None):
        self.path = os.fspath(path)
        self.shown = display_name(self.path)
        self.limits = limits or Limits.from_env()
        self._file, self.file_bytes = open_regular(self.path)
        try:
            self._open_zip()
        except BaseException:
            self._file.close()
            raise
        self._headers: dict[str, NpyHeader] = {}

    def _open_zip(self):
        try:
            directory = _central_directory_bytes(self._file)
        except ZIP_ERRORS as exc:
            raise NpzError(f"{self.shown}: not a zip/.npz file, or truncated ({_reason(exc)})") from None
        if directory is not None and directory > MAX_CENTRAL_DIRECTORY_BYTES:
            raise NpzError(f"{self.shown}: zip directory of {directory} bytes, over the "
                           f"{MAX_CENTRAL_DIRECTORY_BYTES}-byte limit (too many members)")
        try:
            self._zip = zipfile.ZipFile(self._file)
            infos = self._zip.infolist()
        except ZIP_ERRORS as exc:
            raise NpzError(f"{self.shown}: not a zip/.npz file, or truncated ({_reason(exc)})") from None
        self.members: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if key in self.members:
                raise self.error(key, "duplicate member")
            self._check_member(key, info)
            self.members[key] = info
        inflated = sum(i.file_size for i in infos)
        compressed = sum(i.compress_size for i in infos)
        if compressed > self.file_bytes:
            raise NpzError(f"{self.shown}: members declare {compressed} compressed bytes in a file of "
                           f"{self.file_bytes} (overlapping members); refused")
        cap = min(self.limits.max_inflated_bytes, self.limits.max_ratio * self.file_bytes + SMALL_ARCHIVE_BYTES)
        if inflated > cap:
            raise NpzError(f"{self.shown}: members inflate to {inflated} bytes from a file of {self.file_bytes}, "
                           f"over the limit of {cap:.0f} ({ENV_MAX_RATIO}={self.limits.max_ratio:g}, "
                           f"{ENV_MAX_INFLATED}={self.limits.max_inflated_bytes} raise it)")

    def _check_member(self, key: str, info: zipfile.ZipInfo):
        if info.flag_bits & 0x1:
            raise self.error(key, "encrypted member; refused")
        if info.compress_type not in COMPRESSION:
            method = zipfile.compressor_names.get(info.compress_type, f"method {info.compress_type}")
            raise self.error(key, f"compression {method} is not supported (stored or deflated members, as "
                                  "numpy.savez and numpy.savez_compressed write them)")
        if info.file_size == 0:
            raise self.error(key, "empty member (0 bytes: not a .npy array)")
        if info.compress_size > self.file_bytes:
            raise self.error(key, f"declares {info.compress_size} compressed bytes in a file of {self.file_bytes}")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise self.error(key, f"stored member of {info.compress_size} bytes declares {info.file_size}")
        ratio = self.limits.max_ratio
        if info.file_size > SMALL_MEMBER_BYTES and info.file_size > ratio * info.compress_size:
            raise self.error(key, f"inflates to {info.file_size} bytes from {info.compress_size} (over {ratio:g}x; "
                                  f"set {ENV_MAX_RATIO} to allow more)")

    # -- errors -----------------------------------------------------------------------------
    def error(self, key: str, problem: str) -> NpzError:
        return NpzError(f"{self.shown}: {display_name(key)}: {problem}")

    def _stream(self, key: str):
        try:
            return self._zip.open(self.members[key])
        except ZIP_ERRORS as exc:
            raise self.error(key, f"unreadable zip member ({_reason(exc)})") from None

    # -- members -------------------------------------------------------------------------------
    def header(self, key: str) -> NpyHeader:
        """The checked ``.npy`` header of ``key`` (reads only its first bytes)."""
        if key not in self._headers:
            stream = self._stream(key)
            try:
                with stream:
                    header = _read_header(stream)
                    header = NpyHeader(header.shape, header.dtype, header.fortran_order, stream.tell())
            except NpyMemberError as exc:
                raise self.error(key, str(exc)) from None
            except ZIP_ERRORS as exc:
                raise self.error(key, f"unreadable zip member ({_reason(exc)})") from None
            held = self.members[key].file_size - header.data_offset
            if header.n_bytes > held:
                raise self.error(key, f"truncated: shape {header.shape} {header.dtype} declares {header.n_bytes} "
                                      f"bytes of data, the member holds {held}")
            if header.n_bytes < held:
                raise self.error(key, f"has data beyond the array its header describes ({header.n_bytes} bytes "
                                      f"declared, {held} held)")
            self._headers[key] = header
        return self._headers[key]

    def check_budget(self, key: str, n_bytes: int, what: str):
        if n_bytes > self.limits.memory_budget:
            raise self.error(key, f"{what} of {n_bytes} bytes is over the memory budget of "
                                  f"{self.limits.memory_budget} ({ENV_MEMORY_BUDGET} raises it)")

    def read(self, key: str) -> np.ndarray:
        """A whole member (``meta``, ``satcore_schema``, ``stats/`` fields), within the memory budget."""
        header = self.header(key)
        self.check_budget(key, header.n_bytes, "the member")
        reader = self.rows(key, whole=True)
        try:
            return reader.read(header.shape[0] if header.shape else 1)
        finally:
            reader.close()

    def rows(self, key: str, *, whole: bool = False) -> "RowReader":
        """Sequential chunks of rows of ``key`` (one open member stream)."""
        header = self.header(key)
        if not whole:
            if header.fortran_order:
                self.check_budget(key, header.n_bytes, "a Fortran-ordered member (read whole: no contiguous rows)")
            self.check_budget(key, header.row_bytes, "one row")
        return RowReader(self, key, header)

    def close(self):
        self._zip.close()
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _reason(exc: BaseException) -> str:
    """``exc``'s message as one line, without the memory addresses of object reprs (numpy's header parser names
    a node ``<ast.Name object at 0x7f...>``: a different number on every run, meaningless to a user)."""
    text = re.sub(r" object at 0x[0-9a-fA-F]+>", ">", str(exc) or type(exc).__name__)
    return display_name(" ".join(text.split()), limit=120)


class NpyMemberError(ValueError):
    """A zip member is not a well-formed, numeric ``.npy`` array (message without file or key)."""


def _read_header(stream) -> NpyHeader:
    try:
        version = npy_format.read_magic(stream)
    except ValueError as exc:
        raise NpyMemberError(f"not a .npy array ({_reason(exc)})") from None
    try:
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise NpyMemberError(f"unsupported .npy format version {version}")
    except NpyMemberError:
        raise
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise NpyMemberError(f"malformed .npy header ({_reason(exc)})") from None
    if dtype.hasobject:
        raise NpyMemberError("holds Python objects (a pickle); refused, nothing was unpickled")
    if dtype.itemsize == 0:
        raise NpyMemberError(f"dtype {display_name(dtype)} has zero-size items")
    if any(int(s) < 0 for s in shape):
        raise NpyMemberError(f"malformed .npy header (negative dimension in shape {tuple(shape)})")
    return NpyHeader(tuple(int(s) for s in shape), dtype, bool(fortran))


class RowReader:
    """Sequential chunks of rows (first axis = samples) of one member.

    Holds one open member stream; memory is one chunk.  Fortran-ordered
    members have no contiguous rows, so they are read whole on the first call
    (within the memory budget; documented in ``docs/dump-format.md``).
    """

    def __init__(self, archive: NpzArchive, key: str, header: NpyHeader):
        self._archive, self.key, self.header = archive, key, header
        self._stream = archive._stream(key)
        try:
            self._stream.read(header.data_offset)  # the header, checked already
        except ZIP_ERRORS as exc:
            self._stream.close()
            raise archive.error(key, f"unreadable zip member ({_reason(exc)})") from None
        self._rows_left = header.shape[0] if header.shape else 1
        self._whole = None

    def read(self, n_rows: int) -> np.ndarray:
        """The next ``min(n_rows, rows left)`` rows; at the end, verifies the member (CRC, no trailing data)."""
        h = self.header
        n = min(n_rows, self._rows_left)
        try:
            if h.fortran_order or not h.shape:
                if self._whole is None:
                    raw = self._read_exact(h.n_bytes)
                    self._whole = np.frombuffer(raw, dtype=h.dtype).reshape(h.shape, order="F")
                start = (h.shape[0] if h.shape else 1) - self._rows_left
                rows = self._whole if not h.shape else self._whole[start : start + n]
            else:
                self._archive.check_budget(self.key, n * h.row_bytes, f"a chunk of {n} rows")
                raw = self._read_exact(n * h.row_bytes)
                rows = np.frombuffer(raw, dtype=h.dtype).reshape((n,) + h.shape[1:])
            self._rows_left -= n
            if self._rows_left == 0 and self._stream.read(1):
                raise NpyMemberError("has data beyond the array its header describes")
        except NpzError:
            raise  # already names file and key (the memory budget): an InputError is a ValueError, one of ZIP_ERRORS
        except NpyMemberError as exc:
            raise self._archive.error(self.key, str(exc)) from None
        except ZIP_ERRORS as exc:
            raise self._archive.error(self.key, f"unreadable zip member ({_reason(exc)})") from None
        return rows

    def _read_exact(self, n_bytes: int) -> bytes:
        data = self._stream.read(n_bytes)
        if len(data) != n_bytes:
            raise NpyMemberError(f"truncated: expected {n_bytes} bytes of data, found {len(data)}")
        return data

    def close(self):
        self._stream.close()
