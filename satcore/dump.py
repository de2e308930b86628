"""The ``satcore-dump/1`` file: gradients or statistics saved by any framework (SPEC section 7).

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
streamed in chunks of samples (:mod:`satcore._zipnpy`), so memory is one chunk
plus the statistics.  Full description: ``docs/dump-format.md``.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._zipnpy import ZIP_ERRORS, NpyHeader, NpyMemberError, RowReader, member_header, read_member
from .depth import DepthStatistics
from .statistics import FIELDS, CandidateStatistics

SCHEMA = "satcore-dump/1"
RAW_PREFIXES = ("q", "psi", "jac")
CHUNK_BYTES = 64 * 2**20  # working memory per chunk when chunk_samples is not given
MAX_META_BYTES = 16 * 2**20


class DumpError(ValueError):
    """An invalid dump: the message names the key and the problem (one line)."""


# -- writing --------------------------------------------------------------------------------


def write_dump(path, stats: DepthStatistics | None = None, *, raw=None, jac=None, meta=None, compress=False):
    """Write a ``satcore-dump/1`` file.

    ``stats``: a :class:`~satcore.DepthStatistics` (``stats/<name>/<field>``);
    ``raw``: ``{name: (Q, Psi)}`` (``q/<name>``, ``psi/<name>``);
    ``jac``: ``{name: (Q, J)}`` (``q/<name>``, ``jac/<name>``);
    ``meta``: extra JSON fields.  ``meta["candidates"]`` sets the depth order
    (it must list exactly the candidates given); otherwise the order is stats,
    then raw, then jac.  Arrays are written as given (float32 stays float32).

    The file is written next to ``path`` under a temporary name and renamed
    onto it when complete, so a failed write (full disk, a size limit) leaves
    any earlier file at ``path`` intact; ``path`` is used exactly as given
    (no ``.npz`` appended).
    """
    members: dict[str, np.ndarray] = {}
    order: list[str] = []

    def claim(name):
        if name in order:
            raise ValueError(f"candidate {name!r} given twice (one form per candidate)")
        order.append(name)

    for name, s in (stats or {}).items():
        claim(name)
        for field, value in s.to_arrays().items():
            members[f"stats/{name}/{field}"] = np.asarray(value)
    for prefix, group in (("psi", raw), ("jac", jac)):
        for name, (q, second) in (group or {}).items():
            claim(name)
            members[f"q/{name}"] = np.asarray(q)
            members[f"{prefix}/{name}"] = np.asarray(second)
    for key, value in members.items():
        if value.dtype.kind not in "iuf":  # np.savez would pickle an object array
            raise ValueError(f"{key}: dtype {value.dtype} is not a real number type")
    info = dict(meta or {})
    if "candidates" in info and sorted(info["candidates"]) != sorted(order):
        raise ValueError(f"meta candidates {info['candidates']} do not match the data {order}")
    info.setdefault("candidates", order)
    members["satcore_schema"] = np.array(SCHEMA)
    members["meta"] = np.array(json.dumps(info))
    target = os.fspath(path)
    if os.path.isdir(target):
        raise OSError(f"{target}: is a directory")
    partial = os.path.join(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.{os.getpid()}.part")
    try:
        with open(partial, "xb") as stream:
            (np.savez_compressed if compress else np.savez)(stream, **members)
        os.replace(partial, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        if isinstance(exc, OSError):
            raise OSError(f"{target}: cannot write ({exc.strerror or exc})") from None
        raise


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawMembers:
    """The raw members of one candidate: ``q/<name>`` with ``psi/`` or ``jac/``."""

    q: str
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
        raise DumpError(f"meta: split must be a string, found {split!r}")
    for field in ("batch_size", "model_depth"):
        value = meta.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise DumpError(f"meta: {field} must be a positive integer, found {value!r}")


def _strip_npy(member: str) -> str:
    return member[:-4] if member.endswith(".npy") else member


def _text(archive, member: str, key: str) -> str:
    header = _checked(member_header, archive, member, key)
    if header.shape != () or header.dtype.kind not in "US":
        raise DumpError(f"{key}: expected a 0-d string, found shape {header.shape} dtype {header.dtype}")
    if header.n_bytes > MAX_META_BYTES:
        raise DumpError(f"{key}: {header.n_bytes} bytes, over the {MAX_META_BYTES}-byte limit")
    value = _checked(read_member, archive, member, key).item()
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _checked(fn, archive, member, key):
    try:
        return fn(archive, member)
    except NpyMemberError as exc:
        raise DumpError(f"{key}: {exc}") from None


def _check_real(header: NpyHeader, key: str):
    if header.dtype.kind != "f":
        raise DumpError(f"{key}: dtype {header.dtype} is not a real floating-point type")


class Dump:
    """A validated dump, opened by :func:`read_dump`; raw data is read by :meth:`statistics`."""

    def __init__(self, path, archive: zipfile.ZipFile):
        self.path = os.fspath(path)
        members = {}
        for info in archive.infolist():
            key = _strip_npy(info.filename)
            if key in members:
                raise DumpError(f"{key}: duplicate member")
            members[key] = info.filename
        self.schema, self.meta = self._read_header_members(archive, members)
        groups, seen = self._group(members)
        self.candidates = self._order(seen)
        # raw candidates (read on demand) and stats candidates (small, read now)
        self.raw: dict[str, RawMembers] = {}
        self.stored: dict[str, CandidateStatistics] = {}
        for name in self.candidates:
            parts = groups[name]
            if "stats" in parts and len(parts) > 1:
                raise DumpError(f"candidate {name!r}: has both raw and stats/ members; keep one form")
            if "stats" in parts:
                self.stored[name] = self._read_stats(archive, name, parts["stats"])
            else:
                self.raw[name] = self._raw(archive, name, parts)

    # -- structure ---------------------------------------------------------------------
    def _read_header_members(self, archive, members):
        schema = members.get("satcore_schema")
        meta_member = members.get("meta")
        if schema is None:
            if meta_member is not None:
                raise DumpError("satcore_schema: missing (a dump with meta must state its schema)")
            return None, {}
        schema_text = _text(archive, schema, "satcore_schema")
        if schema_text != SCHEMA:
            raise DumpError(f"satcore_schema: unknown schema {schema_text!r} (this satcore reads {SCHEMA!r})")
        if meta_member is None:
            raise DumpError("meta: missing (required with satcore_schema)")
        try:
            meta = json.loads(_text(archive, meta_member, "meta"))
        except json.JSONDecodeError as exc:
            raise DumpError(f"meta: not valid JSON ({exc.msg} at position {exc.pos})") from None
        except RecursionError:
            raise DumpError("meta: JSON nested too deeply") from None
        names = meta.get("candidates") if isinstance(meta, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise DumpError("meta: 'candidates' must be a list of non-empty candidate names")
        if len(set(names)) != len(names):
            raise DumpError("meta: 'candidates' lists a name twice")
        _check_meta_fields(meta)
        return SCHEMA, meta

    @staticmethod
    def _group(members):
        """``{name: {"q"|"psi"|"jac": member, "stats": {field: member}}}`` and names in key order."""
        groups: dict[str, dict] = {}
        for key, member in members.items():
            if key in ("satcore_schema", "meta"):
                continue
            prefix, _, rest = key.partition("/")
            if prefix == "stats":
                name, _, field = rest.rpartition("/")
                if not name or field not in FIELDS:
                    raise DumpError(f"{key}: not a statistics field (fields: {', '.join(FIELDS)})")
                groups.setdefault(name, {}).setdefault("stats", {})[field] = (key, member)
            elif prefix in RAW_PREFIXES and rest:
                groups.setdefault(rest, {})[prefix] = (key, member)
            else:
                raise DumpError(f"{key}: unknown key (expected q/, psi/, jac/, stats/, meta, satcore_schema)")
        if not groups:
            raise DumpError("dump holds no candidates (no q/, psi/, jac/ or stats/ keys)")
        return groups, list(groups)

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
    def _read_stats(archive, name, fields):
        arrays = {}
        for field, (key, member) in fields.items():
            value = _checked(read_member, archive, member, key)
            if value.dtype.kind not in "iuf":
                raise DumpError(f"{key}: dtype {value.dtype} is not numeric")
            bad = int(value.size - np.count_nonzero(np.isfinite(value)))
            if bad:
                raise DumpError(f"{key}: {bad} non-finite value(s) (NaN/Inf)")
            arrays[field] = value
        try:
            stats = DepthStatistics.from_arrays(
                {f"{name}/{field}": v for field, v in arrays.items()}, [name]
            )[name]
        except ValueError as exc:
            raise DumpError(str(exc)) from None
        if stats.n_samples == 0:
            raise DumpError(f"stats/{name}: empty candidate (n_samples is 0)")
        return stats

    # -- raw form ------------------------------------------------------------------------
    @staticmethod
    def _raw(archive, name, parts) -> RawMembers:
        if "q" not in parts:
            other = next(iter(parts.values()))[0]
            raise DumpError(f"{other}: no matching q/{name}")
        kinds = [k for k in ("psi", "jac") if k in parts]
        if not kinds:
            raise DumpError(f"q/{name}: no matching psi/{name} or jac/{name}")
        if len(kinds) == 2:
            raise DumpError(f"candidate {name!r}: has both psi/ and jac/ members; keep one")
        kind = kinds[0]
        q_key, q_member = parts["q"]
        f_key, f_member = parts[kind]
        qh = _checked(member_header, archive, q_member, q_key)
        fh = _checked(member_header, archive, f_member, f_key)
        _check_real(qh, q_key)
        _check_real(fh, f_key)
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
        return RawMembers(q_member, f_member, kind, qh, fh)

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
        :meth:`CandidateStatistics.update`.  A ``jac/`` candidate is the general
        family of Lemma 4 written as a standard block: ``Q_i`` becomes the
        column ``vec(Q_i)`` (``T*N x 1``) and ``J_i`` the features, so
        ``C = g^T``, ``K = G`` and ``growth_value = sqrt(g^T G^+ g)``
        (``n_hidden`` is then 1 and ``n_positions`` is ``T*N``).
        ``progress(done_bytes, total_bytes)`` is called after each chunk.
        ``ag_batch`` (eq. 2) needs training batches: it is reported when
        ``meta["batch_size"]`` is given (chunks then respect those batches).
        Stats candidates without ``sum_xtx`` keep ``variance=False``.
        """
        total = self.raw_bytes
        done = 0
        out = DepthStatistics()
        batch = self.meta.get("batch_size")
        with zipfile.ZipFile(self.path) as archive:
            for name in self.candidates:
                if name not in self.raw:
                    out[name] = self.stored[name]
                    continue
                members = self.raw[name]
                rows = chunk_samples or self._auto_chunk(members, variance)
                if batch:
                    rows = max(batch, rows // batch * batch)
                stats = None
                for q, features in self._chunks(archive, name, members, rows):
                    if stats is None:
                        stats = CandidateStatistics(q.shape[2], features.shape[2], q.shape[1], variance)
                    # without training batches, blocks of about M / n_folds samples feed the folds
                    step = batch or min(q.shape[0], -(-members.n_samples // stats.n_folds))
                    for s in range(0, q.shape[0], step):
                        stats.update(q[s : s + step], features[s : s + step])
                    done += q.shape[0] * members.row_bytes
                    if progress is not None:
                        progress(done, total)
                if not batch:
                    # A chunk is not a training batch: eq. (2) is undefined here.
                    stats.sum_batch_grad_norm, stats.n_batches = 0.0, 0
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
    def _chunks(archive, name, members: RawMembers, rows: int):
        """Matching chunks ``(Q, features)`` as ``(m, T, N)`` and ``(m, T, r)``, checked finite."""
        q_key, f_key = f"q/{name}", f"{members.kind}/{name}"
        q_reader = _checked(RowReader, archive, members.q, q_key)
        f_reader = _checked(RowReader, archive, members.features, f_key)
        bad = {q_key: 0, f_key: 0}
        try:
            left = members.n_samples
            while left:
                n = min(rows, left)
                q = _read_rows(q_reader, n, q_key)
                f = _read_rows(f_reader, n, f_key)
                left -= n
                for key, arr in ((q_key, q), (f_key, f)):
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
                raise DumpError(f"{key}: candidate {name!r} has {count} non-finite value(s) (NaN/Inf)")


def _read_rows(reader: RowReader, n: int, key: str) -> np.ndarray:
    try:
        return reader.read(n)
    except NpyMemberError as exc:
        raise DumpError(f"{key}: {exc}") from None


def read_dump(path) -> Dump:
    """Open and validate a dump (structure, dtypes, shapes, statistics); raw data is read later.

    Raises :class:`DumpError` with one line naming the key and the problem.
    """
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise DumpError(f"{os.fspath(path)}: no such file") from None
    except IsADirectoryError:
        raise DumpError(f"{os.fspath(path)}: is a directory, not a dump") from None
    except ZIP_ERRORS as exc:
        raise DumpError(f"{os.fspath(path)}: not a zip/.npz file, or truncated ({exc})") from None
    with archive:
        return Dump(path, archive)
