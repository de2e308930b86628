"""The ``satcore-dump/1`` file: gradients or statistics saved by any framework (docs/dump-format.md).

A dump is a ``.npz`` (zip of ``.npy`` members) with keys

* ``satcore_schema``: 0-d string ``"satcore-dump/1"``;
* ``meta``: 0-d string of JSON with at least ``candidates`` (ordered names,
  upstream first);
* ``q/<name>`` with ``psi/<name>`` (standard block ``h = V psi``) or with
  ``jac/<name>`` (general family, Lemma 4): raw arrays, sample-first;
* ``stats/<name>/<field>``: accumulated :class:`~satcore.CandidateStatistics`.

A file of only ``q/`` and ``psi/`` keys (no schema, no meta) is accepted,
candidates in key order.  Files are never trusted: nothing is unpickled, each
problem raises one :class:`DumpError` naming the key, and raw members are
streamed in chunks of samples (:mod:`satcore._io.zipnpy`), so memory is one chunk
plus the statistics.  Full description: ``docs/dump-format.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .atomic import atomic_write
from .._shared.display import display_name
from .._shared.json_keys import DuplicateKeyError, loads_unique
from .._shared.errors import InputError
from .._formulas.folds import DEFAULT_FOLDS
from .zipnpy import NpyHeader, NpzArchive, NpzError
from .._statistics.depth import DepthStatistics
from .._statistics.moments import BatchMoments, batch_moments
from .._statistics.candidate import FIELDS, MATRIX_FIELDS, CandidateStatistics

SCHEMA = "satcore-dump/1"
RAW_PREFIXES = ("q", "psi", "jac")
CHUNK_BYTES = 64 * 2**20  # working memory per chunk when chunk_samples is not given
MAX_META_BYTES = 16 * 2**20


class DumpError(InputError):
    """An invalid dump: the message names the key and the problem (one line)."""


# -- writing --------------------------------------------------------------------------------


def write_dump(path, stats: DepthStatistics | None = None, *, raw=None, jac=None, meta=None, compress=False,
               inputs=(), stats_dtype=None):
    """Write a ``satcore-dump/1`` file.

    ``stats``: a :class:`~satcore.DepthStatistics` (``stats/<name>/<field>``);
    ``raw``: ``{name: (Q, Psi)}`` (``q/<name>``, ``psi/<name>``);
    ``jac``: ``{name: (Q, J)}`` (``q/<name>``, ``jac/<name>``);
    ``meta``: extra JSON fields.  ``meta["candidates"]`` sets the depth order
    (it must list exactly the candidates given); otherwise the order is stats,
    then raw, then jac.  Arrays are written as given (float32 stays float32); an array holding NaN or Inf, or a
    candidate without samples, which every reader refuses, is refused here.

    The file is written whole or not at all (:func:`satcore._io.atomic.atomic_write`:
    a failed or killed write leaves any earlier file at ``path`` intact, and
    never a partial file); ``path`` is used exactly as given (no ``.npz``
    appended).  A ``path`` that is not a regular file (a device, a FIFO), or
    that is one of ``inputs`` (the files the caller read), is refused.

    ``stats_dtype``: store the statistics' matrices (``sum_cross``,
    ``sum_gram``, ``sum_xtx``, ``sum_qq``, ``fold_cross``) in this dtype, e.g.
    ``numpy.float32`` to halve a large model's dump.  The sums were added up in
    float64; only their storage is rounded (relative ``6e-8`` per entry), and
    they are read back as float64.  Scalars and counts stay exact.
    """
    members: dict[str, np.ndarray] = {}
    order: list[str] = []

    def claim(name):
        if name in order:
            raise InputError(f"candidate {name!r} given twice (one form per candidate)")
        order.append(name)

    for name, s in (stats or {}).items():
        claim(name)
        for field, value in s.to_arrays().items():
            value = np.asarray(value)
            if stats_dtype is not None and field in MATRIX_FIELDS + ("fold_cross",):
                value = value.astype(stats_dtype)
            members[f"stats/{name}/{field}"] = value
    for prefix, group in (("psi", raw), ("jac", jac)):
        for name, (q, second) in (group or {}).items():
            claim(name)
            members[f"q/{name}"] = np.asarray(q)
            members[f"{prefix}/{name}"] = np.asarray(second)
    for key, value in members.items():
        if value.dtype.kind not in "iuf":  # np.savez would pickle an object array
            raise InputError(f"{key}: dtype {value.dtype} is not a real number type")
        if (value.size == 0) if not key.startswith("stats/") else (key.endswith("/n_samples") and value == 0):
            # every reader refuses an empty candidate: a dump written with it could never be read back
            raise InputError(f"{display_name(os.fspath(path))}: not written: {display_name(key)} is empty (no "
                             "samples, or an axis of extent 0): probe some data first")
        bad = int(value.size - np.count_nonzero(np.isfinite(value)))
        if bad:  # every reader refuses such a member: a dump written with it could never be read back
            raise InputError(f"{display_name(os.fspath(path))}: not written: {key} holds {bad} non-finite value(s) "
                             "(NaN/Inf: sums that overflowed, or inputs that held them)")
    info = dict(meta or {})
    if "candidates" in info and sorted(info["candidates"]) != sorted(order):
        raise InputError(f"meta candidates {info['candidates']} do not match the data {order}")
    info.setdefault("candidates", order)
    members["satcore_schema"] = np.array(SCHEMA)
    members["meta"] = np.array(json.dumps(info))
    atomic_write(path, lambda stream: (np.savez_compressed if compress else np.savez)(stream, **members),
                 inputs=inputs)


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawMembers:
    """The raw members of one candidate: ``q/<name>`` with ``psi/`` or ``jac/``."""

    q: str  # keys
    features: str
    kind: str  # "psi" (standard block) or "jac" (general family)
    q_header: NpyHeader
    features_header: NpyHeader

    @property
    def n_samples(self) -> int:
        return self.q_header.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.q_header.row_bytes + self.features_header.row_bytes


def _check_meta_fields(meta: dict):
    """The meta fields satcore reads besides ``candidates``: ``split`` (text), ``batch_size`` and
    ``model_depth`` (positive integers); refused here so that ``inspect`` catches what ``score`` would."""
    split = meta.get("split")
    if split is not None and not isinstance(split, str):
        raise DumpError(f"meta: split must be a string, found {_shown_value(split)}")
    for field in ("batch_size", "model_depth"):
        value = meta.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise DumpError(f"meta: {field} must be a positive integer, found {_shown_value(value)}")


def _shown_value(value) -> str:
    return display_name(json.dumps(value), limit=60)


def _decode(value, key: str) -> str:
    """The text of a 0-d ``U`` or ``S`` member; invalid code points or UTF-8 are refused."""
    raw = value.tobytes()
    try:
        return raw.decode("utf-32-le" if value.dtype.kind == "U" else "utf-8").rstrip("\0")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{key}: not valid {exc.encoding.upper()} text (byte {exc.start})") from None


class Dump:
    """A validated dump, opened by :func:`read_dump`; raw data is read by :meth:`statistics`."""

    def __init__(self, path, archive: NpzArchive):
        self.path = os.fspath(path)
        self.schema, self.meta = read_header_members(archive)
        groups = self._group(archive.members)
        self.candidates = self._order(list(groups))
        # raw candidates (read on demand) and stats candidates (small, read now)
        self.raw: dict[str, RawMembers] = {}
        self.stored: dict[str, CandidateStatistics] = {}
        stored_bytes = 0
        for name in self.candidates:
            parts = groups[name]
            if "stats" in parts and len(parts) > 1:
                raise DumpError(f"candidate {name!r}: has both raw and stats/ members; keep one form")
            if "stats" in parts:
                stored_bytes += self._stats_bytes(archive, parts["stats"])
                # every candidate's sums are held at once: the budget is for all of them
                archive.check_budget(parts["stats"][0], stored_bytes, "statistics held in memory")
                self.stored[name] = self._read_stats(archive, name, parts["stats"])
            else:
                self.raw[name] = self._raw(archive, name, parts)

    # -- structure ---------------------------------------------------------------------
    @staticmethod
    def _read_header_members(archive: NpzArchive):
        has_schema, has_meta = "satcore_schema" in archive.members, "meta" in archive.members
        if not has_schema:
            if has_meta:
                raise DumpError("satcore_schema: missing (a dump with meta must state its schema)")
            return None, {}
        schema_text = Dump._text(archive, "satcore_schema")
        if schema_text != SCHEMA:
            raise DumpError(f"satcore_schema: unknown schema {display_name(schema_text, 60)!r} "
                            f"(this satcore reads {SCHEMA!r})")
        if not has_meta:
            raise DumpError("meta: missing (required with satcore_schema)")
        text = Dump._text(archive, "meta")
        try:
            meta = loads_unique(text)
        except DuplicateKeyError as exc:
            raise DumpError(f"meta: {exc}") from None
        except json.JSONDecodeError as exc:
            raise DumpError(f"meta: not valid JSON ({exc.msg} at position {exc.pos})") from None
        except RecursionError:
            raise DumpError("meta: JSON nested too deeply") from None
        except ValueError as exc:  # e.g. an integer of more digits than int() converts
            raise DumpError(f"meta: not readable JSON ({display_name(exc, 100)})") from None
        names = meta.get("candidates") if isinstance(meta, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise DumpError("meta: 'candidates' must be a list of non-empty candidate names")
        if len(set(names)) != len(names):
            raise DumpError("meta: 'candidates' lists a name twice")
        _check_meta_fields(meta)
        return SCHEMA, meta

    @staticmethod
    def _text(archive: NpzArchive, key: str) -> str:
        header = archive.header(key)
        if header.shape != () or header.dtype.kind not in "US":
            raise DumpError(f"{key}: expected a 0-d string, found shape {header.shape} dtype {header.dtype}")
        if header.n_bytes > MAX_META_BYTES:
            raise DumpError(f"{key}: {header.n_bytes} bytes, over the {MAX_META_BYTES}-byte limit")
        return _decode(archive.read(key), key)

    @staticmethod
    def _group(members):
        """``{name: {"q"|"psi"|"jac": key, "stats": [keys]}}`` in key order."""
        groups: dict[str, dict] = {}
        for key in members:
            if key in ("satcore_schema", "meta"):
                continue
            prefix, _, rest = key.partition("/")
            if prefix == "stats":
                name, _, field = rest.rpartition("/")
                if not name or field not in FIELDS:
                    raise DumpError(f"{display_name(key)}: not a statistics field (fields: {', '.join(FIELDS)})")
                groups.setdefault(name, {}).setdefault("stats", []).append(key)
            elif prefix in RAW_PREFIXES and rest:
                groups.setdefault(rest, {})[prefix] = key
            else:
                raise DumpError(f"{display_name(key)}: unknown key (expected q/, psi/, jac/, stats/, meta, "
                                "satcore_schema)")
        if not groups:
            raise DumpError("dump holds no candidates (no q/, psi/, jac/ or stats/ keys)")
        return groups

    def _order(self, seen):
        if self.schema is None:
            return tuple(seen)
        listed = self.meta["candidates"]
        missing = [n for n in listed if n not in seen]
        if missing:
            raise DumpError(f"candidate {missing[0]!r}: listed in meta but no q/, psi/, jac/ or stats/ keys")
        extra = [n for n in seen if n not in listed]
        if extra:
            raise DumpError(f"candidate {extra[0]!r}: has keys but is not listed in meta candidates")
        return tuple(listed)

    # -- statistics form -------------------------------------------------------------
    @staticmethod
    def _stats_bytes(archive: NpzArchive, keys) -> int:
        """Bytes of a candidate's fields from their headers: dtypes and shapes checked before any data."""
        headers = {key.rpartition("/")[2]: (key, archive.header(key)) for key in keys}
        for key, header in headers.values():
            if header.dtype.kind not in "iuf":
                raise DumpError(f"{display_name(key)}: dtype {header.dtype} is not numeric")
        cross = headers.get("sum_cross")
        if cross is not None and len(cross[1].shape) == 2:
            r = cross[1].shape[1]
            for field in ("sum_gram", "sum_xtx"):
                if field in headers and headers[field][1].shape != (r, r):
                    key, header = headers[field]
                    raise DumpError(f"{display_name(key)}: shape {header.shape} does not fit sum_cross "
                                    f"{cross[1].shape} (expected ({r}, {r}))")
        return sum(header.n_bytes for _, header in headers.values())

    @staticmethod
    def _read_stats(archive: NpzArchive, name, keys):
        arrays = {}
        for key in keys:
            value = archive.read(key)
            bad = int(value.size - np.count_nonzero(np.isfinite(value)))
            if bad:
                raise DumpError(f"{display_name(key)}: {bad} non-finite value(s) (NaN/Inf)")
            arrays[key.rpartition("/")[2]] = value
        try:
            stats = DepthStatistics.from_arrays({f"{name}/{field}": v for field, v in arrays.items()}, [name])[name]
        except InputError as exc:
            raise DumpError(display_name(exc, 300)) from None
        if stats.n_samples == 0:
            raise DumpError(f"stats/{display_name(name)}: empty candidate (n_samples is 0)")
        return stats

    # -- raw form ------------------------------------------------------------------------
    @staticmethod
    def _raw(archive: NpzArchive, name, parts) -> RawMembers:
        shown = display_name(name)
        if "q" not in parts:
            raise DumpError(f"{display_name(next(iter(parts.values())))}: no matching q/{shown}")
        kinds = [k for k in ("psi", "jac") if k in parts]
        if not kinds:
            raise DumpError(f"q/{shown}: no matching psi/{shown} or jac/{shown}")
        if len(kinds) == 2:
            raise DumpError(f"candidate {name!r}: has both psi/ and jac/ members; keep one")
        kind = kinds[0]
        q_key, f_key = parts["q"], parts[kind]
        qh, fh = archive.header(q_key), archive.header(f_key)
        q_key, f_key = display_name(q_key), display_name(f_key)  # the keys as messages show them
        for key, header in ((q_key, qh), (f_key, fh)):
            if header.dtype.kind != "f":
                raise DumpError(f"{key}: dtype {header.dtype} is not a real floating-point type")
        if qh.shape[:1] != fh.shape[:1] and qh.shape and fh.shape:
            raise DumpError(f"{f_key}: has {fh.shape[0]} samples but {q_key} has {qh.shape[0]}")
        if qh.shape and qh.shape[0] == 0:
            raise DumpError(f"{q_key}: empty candidate (0 samples)")
        if len(qh.shape) not in (2, 3):
            raise DumpError(f"{q_key}: expected shape (M, N) or (M, T, N), found {qh.shape}")
        if kind == "psi":
            if len(fh.shape) != len(qh.shape) or fh.shape[:-1] != qh.shape[:-1]:
                raise DumpError(
                    f"{f_key}: shape {fh.shape} does not match {q_key} {qh.shape} in samples/positions"
                )
        else:
            positions_times_width = int(np.prod(qh.shape[1:]))
            if len(fh.shape) != 3 or fh.shape[1] != positions_times_width:
                raise DumpError(
                    f"{f_key}: expected shape ({qh.shape[0]}, {positions_times_width}, p) for {q_key} "
                    f"{qh.shape}, found {fh.shape}"
                )
        empty = [k for k, h in ((q_key, qh), (f_key, fh)) if 0 in h.shape]
        if empty:
            raise DumpError(f"{empty[0]}: empty candidate (a zero-sized axis)")
        return RawMembers(parts["q"], parts[kind], kind, qh, fh)

    # -- public ----------------------------------------------------------------------------
    def form(self, name: str) -> str:
        """``"psi"``, ``"jac"`` or ``"stats"``."""
        return self.raw[name].kind if name in self.raw else "stats"

    @property
    def raw_bytes(self) -> int:
        return sum(r.q_header.n_bytes + r.features_header.n_bytes for r in self.raw.values())

    def statistics(
        self,
        chunk_samples: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        *,
        variance: bool = True,
    ) -> DepthStatistics:
        """Statistics of every candidate, in depth order.

        Raw candidates are streamed in chunks of ``chunk_samples`` samples
        (default: about 64 MiB of working memory) through
        :func:`~satcore._statistics.candidate.batch_moments`.  A ``jac/`` candidate is the general
        family of Lemma 4 written as a standard block: ``Q_i`` becomes the
        column ``vec(Q_i)`` (``T*N x 1``) and ``J_i`` the features, so
        ``C = g^T``, ``K = G`` and ``growth_value = sqrt(g^T G^+ g)``
        (``n_hidden`` is then 1 and ``n_positions`` is ``T*N``).
        ``progress(done_bytes, total_bytes)`` is called after each chunk.
        ``ag_batch`` (eq. 2) needs training batches: it is reported when
        ``meta["batch_size"]`` is given; a batch larger than a chunk is summed
        over its chunks, so memory stays one chunk whatever the batch size.
        Stats candidates without ``sum_xtx`` keep ``variance=False``.
        """
        with _named(self.path), NpzArchive(self.path) as archive:
            return self._statistics(archive, chunk_samples, progress, variance)

    def _statistics(self, archive, chunk_samples, progress, variance) -> DepthStatistics:
        total = self.raw_bytes
        done = 0
        out = DepthStatistics()
        batch = self.meta.get("batch_size")
        for name in self.candidates:
            if name not in self.raw:
                out[name] = self.stored[name]
                continue
            members = self.raw[name]
            rows = chunk_samples or self._auto_chunk(members, variance)
            # without training batches, blocks of about M / n_folds samples are the units dealt to the folds
            block = batch or -(-members.n_samples // DEFAULT_FOLDS)
            stats = None
            units = 0  # batches (or blocks) added: unit u goes to fold u mod n_folds
            read = 0  # samples of this candidate so far: batches start at multiples of ``batch``
            pending = None  # the sums of a batch not yet complete
            for q, features in self._chunks(archive, name, members, rows):
                if stats is None:
                    stats = CandidateStatistics(q.shape[2], features.shape[2], q.shape[1], variance)
                start = 0
                while start < q.shape[0]:
                    stop = min(q.shape[0], start + block - read % block)
                    part = batch_moments(q[start:stop], features[start:stop], variance=variance)
                    pending = part if pending is None else pending + part
                    read += stop - start
                    start = stop
                    if read % block == 0:
                        stats.add_moments(_as_batch(pending, batch), fold=units % max(stats.n_folds, 1))
                        pending, units = None, units + 1
                done += q.shape[0] * members.row_bytes
                if progress is not None:
                    progress(done, total)
            if pending is not None:  # a last, shorter batch
                stats.add_moments(_as_batch(pending, batch), fold=units % max(stats.n_folds, 1))
            out[name] = stats
        return out

    @staticmethod
    def _auto_chunk(members: RawMembers, variance: bool) -> int:
        q_shape, f_shape = members.q_header.shape, members.features_header.shape
        width_q = q_shape[-1] if members.kind == "psi" else 1
        width_f = f_shape[-1]
        # float64 copies of both rows, plus X_i = Q_i^T Psi_i (N x r) that batch_moments forms.
        per_sample = 8 * (int(np.prod(q_shape[1:])) + int(np.prod(f_shape[1:])))
        per_sample += 8 * width_q * width_f * (2 if variance else 1)
        return max(1, CHUNK_BYTES // per_sample)

    @staticmethod
    def _chunks(archive: NpzArchive, name, members: RawMembers, rows: int):
        """Matching chunks ``(Q, features)`` as ``(m, T, N)`` and ``(m, T, r)``, checked finite."""
        for key, header in ((members.q, members.q_header), (members.features, members.features_header)):
            if key not in archive.members or archive.header(key) != header:
                raise DumpError(f"{display_name(key)}: changed since the dump was opened")
        q_reader = archive.rows(members.q)
        f_reader = archive.rows(members.features)
        bad = {members.q: 0, members.features: 0}
        try:
            left = members.n_samples
            while left:
                n = min(rows, left)
                q = q_reader.read(n)
                f = f_reader.read(n)
                left -= n
                for key, arr in ((members.q, q), (members.features, f)):
                    bad[key] += int(arr.size - np.count_nonzero(np.isfinite(arr)))
                if any(bad.values()):
                    continue  # keep counting so the message gives the total
                if members.kind == "jac":
                    q = q.reshape(n, -1, 1)
                elif q.ndim == 2:
                    q, f = q[:, None, :], f[:, None, :]
                yield q, f
        finally:
            q_reader.close()
            f_reader.close()
        for key, count in bad.items():
            if count:
                raise DumpError(f"{display_name(key)}: candidate {name!r} has {count} non-finite value(s) (NaN/Inf)")


def _as_batch(sums: BatchMoments, batch: int | None) -> BatchMoments:
    """The sums of one batch's parts (added up: eq. (2)'s ``||Q_b||_F / |b|`` of the whole batch, what
    ``batch_moments`` gives a batch read in one piece), counted as a training batch only with training
    batches (without, a block of samples is no batch of eq. (2))."""
    return sums if batch else replace(sums, batch_grad_norm=None)


@contextlib.contextmanager
def _named(path):
    """Reader errors as one :class:`DumpError` line that starts with the file's name."""
    shown = display_name(os.fspath(path))
    try:
        yield
    except (DumpError, NpzError) as exc:
        message = str(exc)
        raise DumpError(message if message.startswith(f"{shown}: ") else f"{shown}: {message}") from None


def read_header_members(archive: NpzArchive):
    """``(schema, meta)`` of an opened dump: ``(None, {})`` for the bare form."""
    return Dump._read_header_members(archive)


def read_dump_meta(path) -> tuple[str | None, dict]:
    """``(schema, meta)`` of the dump at ``path``, validated, without reading its candidates."""
    with _named(path), NpzArchive(path) as archive:
        return read_header_members(archive)


def read_dump(path) -> Dump:
    """Open and validate a dump (structure, dtypes, shapes, statistics); raw data is read later.

    Raises :class:`DumpError` with one line naming the file, the key and the problem
    (the reader's limits: :mod:`satcore._io.zipnpy`).
    """
    with _named(path), NpzArchive(path) as archive:
        return Dump(path, archive)
