"""The growth loop's log: one JSON line per round, locked while a run appends, checked when read.

Format (``satcore-growth-log/1``).  The first line is a header,
``{"satcore_growth_log":1,"settings":{...}}``: the arguments that decide what the
run does (criteria, budgets, seed, family, guard), so that a log is never resumed
or returned under other ones.  Each further line is one round
(:class:`GrowthRound`), written compactly: no spaces, and the per-candidate rows
as columns (``"candidates":{"name":[...],"growth_value":[...],...}``), so a key
is written once per round and not once per candidate, and floats with 9
significant digits (the in-memory :class:`GrowthRound` keeps every digit).

Safety.  While a run appends, it holds an exclusive ``flock`` on the log: a second
run on the same log is refused at once (:class:`~satcore._shared.errors.GrowthLogError`,
"in use by another run") instead of appending rounds of its own between the
first run's.  Each round is appended with one ``write`` and ``fsync``; a run
killed during that write can leave a partial last line, which the reader reports.
Reading checks every line before anything is replayed: valid JSON (deep
nesting included), the header first, every field present with its type, rounds
numbered 0, 1, 2, ... with nothing after a stop round.  Any damage is one line
naming the file and the line.

:func:`read_growth_log` reads a log for analysis (no lock, nothing replayed).
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import asdict, dataclass

from .._shared.display import display_name
from .._shared.json_keys import DuplicateKeyError, loads_unique
from .._shared.errors import GrowthLogError

FORMAT_KEY = "satcore_growth_log"
FORMAT_VERSION = 1
LOG_DIGITS = 9  # significant digits of a logged float: past float32's, the statistics' own noise is far larger
MAX_LOG_BYTES = 64 * 2**20  # a round is ~0.2 kB + ~0.1 kB per candidate: far above any real run


@dataclass(frozen=True)
class GrowthRound:
    """One round of the growth loop (one line of its log).

    ``candidates`` holds one row per candidate of the round's decision (its name,
    first-order test and predicted gain, or what a pluggable decide step reported);
    ``inserted_at`` is where the block went (``None``: the round stopped);
    ``heldout_change`` is the held-out loss after training minus before insertion
    (a harm is positive) and ``heldout_change_se`` its paired standard error;
    ``rolled_back`` says the block was removed again (a harm beyond noise);
    ``inserted_block`` is what an adapter needs to rebuild the block on resume
    (the feature family of a generic block; ``None`` for a native one);
    ``decision`` is what a pluggable decide step reported beyond its candidates
    (its cost, recipe, ...; ``None`` for the first-order decision).
    """

    round: int
    depth: int
    seed: int
    verdict: str | None
    candidates: list
    inserted_at: str | None
    train_loss_before: float
    heldout_loss_before: float | None
    loss_after_insert: float | None
    train_loss_after: float | None
    heldout_loss_after: float | None
    probe_seconds: float
    train_seconds: float | None
    stop_reason: str | None = None
    probe_samples: int | None = None
    probe_looks: int = 1
    look_alpha: float | None = None
    heldout_change: float | None = None
    heldout_change_se: float | None = None
    rolled_back: bool = False
    inserted_block: dict | None = None
    decision: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready fields, the candidates as one dict per row."""
        return asdict(self)

    @property
    def kept(self) -> bool:
        """Whether this round left a trained block in the model."""
        return self.inserted_at is not None and not self.rolled_back


_NUMBER, _INT, _STR, _NONE = (int, float), (int,), (str,), (type(None),)
# key -> (allowed types, required); the required ones are every field the first log format had
FIELDS = {
    "round": (_INT, True), "depth": (_INT, True), "seed": (_INT, True), "verdict": (_STR + _NONE, True),
    "candidates": ((list, dict), True), "inserted_at": (_STR + _NONE, True),
    "train_loss_before": (_NUMBER, True), "heldout_loss_before": (_NUMBER + _NONE, True),
    "loss_after_insert": (_NUMBER + _NONE, True), "train_loss_after": (_NUMBER + _NONE, True),
    "heldout_loss_after": (_NUMBER + _NONE, True), "probe_seconds": (_NUMBER, True),
    "train_seconds": (_NUMBER + _NONE, True), "stop_reason": (_STR + _NONE, False),
    "probe_samples": (_INT + _NONE, False), "probe_looks": (_INT, False), "look_alpha": (_NUMBER + _NONE, False),
    "heldout_change": (_NUMBER + _NONE, False), "heldout_change_se": (_NUMBER + _NONE, False),
    "rolled_back": ((bool,), False), "inserted_block": ((dict,) + _NONE, False), "decision": ((dict,) + _NONE, False),
}


def _type_ok(value, types) -> bool:
    if isinstance(value, bool) and bool not in types:  # JSON true is not a round number
        return False
    return isinstance(value, types)


def _significant(value):
    """Floats to ``LOG_DIGITS`` significant digits (lists and dicts walked); everything else as it is."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{LOG_DIGITS}g}")
    if isinstance(value, list):
        return [_significant(v) for v in value]
    if isinstance(value, dict):
        return {k: _significant(v) for k, v in value.items()}
    return value


def encode_round(entry: GrowthRound) -> bytes:
    """One compact log line (module docstring), newline included."""
    data = entry.to_dict()
    rows = data.pop("candidates")
    keys = list(dict.fromkeys(k for row in rows for k in row))
    data["candidates"] = {k: [row.get(k) for row in rows] for k in keys}
    return (json.dumps(_significant(data), separators=(",", ":")) + "\n").encode()


def _decode_candidates(columns, where: str) -> list:
    if isinstance(columns, list):  # the first log format: one object per candidate
        if not all(isinstance(row, dict) for row in columns):
            raise GrowthLogError(f"{where}: 'candidates' must hold one object per candidate")
        return columns
    lengths = {len(v) if isinstance(v, list) else -1 for v in columns.values()}
    if -1 in lengths or len(lengths) > 1 or "name" not in columns:
        raise GrowthLogError(f"{where}: 'candidates' must map 'name' and each field to lists of one length")
    names = columns["name"]
    return [{k: columns[k][i] for k in columns} for i in range(len(names))]


def _decode_round(data, where: str) -> GrowthRound:
    if not isinstance(data, dict):
        raise GrowthLogError(f"{where}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise GrowthLogError(f"{where}: unknown key {display_name(unknown[0])!r}")
    for key, (types, required) in FIELDS.items():
        if key not in data:
            if required:
                raise GrowthLogError(f"{where}: missing key {key!r}")
            continue
        if not _type_ok(data[key], types):
            raise GrowthLogError(f"{where}: key {key!r} has a value of type {type(data[key]).__name__}")
    for key in ("round", "depth", "seed", "probe_looks"):
        if key in data and data[key] < 0:
            raise GrowthLogError(f"{where}: key {key!r} is negative ({data[key]})")
    rows = _decode_candidates(data["candidates"], where)
    return GrowthRound(**{**data, "candidates": rows})


def _parse_line(raw: bytes, where: str):
    try:
        return loads_unique(raw.decode("utf-8"))
    except DuplicateKeyError as exc:
        raise GrowthLogError(f"{where}: {exc}") from None
    except RecursionError:
        raise GrowthLogError(f"{where}: nested too deeply to be a growth log line") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise GrowthLogError(f"{where}: not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None


@dataclass(frozen=True)
class GrowthLogContents:
    """What a growth log holds: the header's settings (``None`` in a log without a header) and its rounds."""

    settings: dict | None
    rounds: tuple[GrowthRound, ...]

    @property
    def stop_reason(self) -> str | None:
        """The stop reason of a finished log; ``None`` while rounds may still follow."""
        return self.rounds[-1].stop_reason if self.rounds else None


def parse_log(data: bytes, shown: str) -> GrowthLogContents:
    """Check and decode a whole log (module docstring, Safety); ``shown`` names it in messages."""
    lines = data.split(b"\n")
    cut = lines.pop()  # b"" after the last newline; else a last line cut by a kill during the append
    settings, rounds = None, []
    for number, raw in enumerate(lines, start=1):
        where = f"{shown} line {number}"
        if not raw.strip():
            continue
        data = _parse_line(raw, where)
        if isinstance(data, dict) and FORMAT_KEY in data:
            if number != 1:
                raise GrowthLogError(f"{where}: a header after the first line (two runs' logs joined?)")
            if data[FORMAT_KEY] != FORMAT_VERSION or not isinstance(data.get("settings"), dict):
                raise GrowthLogError(f"{where}: unsupported header {display_name(str(data)[:80])}")
            settings = data["settings"]
            continue
        entry = _decode_round(data, where)
        expected = rounds[-1].round + 1 if rounds else 0
        if rounds and rounds[-1].stop_reason is not None:
            raise GrowthLogError(f"{where}: round {entry.round} follows round {rounds[-1].round}, which stopped "
                                 f"the run ({rounds[-1].stop_reason!r})")
        if entry.round != expected:
            raise GrowthLogError(f"{where}: round {entry.round} where round {expected} was expected (two runs "
                                 "appending to one log?)")
        rounds.append(entry)
    if cut:  # after the whole lines: a file that is no log at all is refused at its first line, not its last
        raise GrowthLogError(f"{shown} line {len(lines) + 1}: incomplete last line (a run killed while writing leaves "
                             f"one); delete that line to resume from the round before it")
    return GrowthLogContents(settings, tuple(rounds))


def _read_all(fd: int, shown: str) -> bytes:
    size = os.fstat(fd).st_size
    if size > MAX_LOG_BYTES:
        raise GrowthLogError(f"{shown}: {size} bytes, more than a growth log holds ({MAX_LOG_BYTES})")
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, min(2**20, size - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _open_regular(path: str, flags: int) -> int:
    shown = display_name(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise GrowthLogError(f"{shown}: its folder {display_name(folder)} does not exist; create it first")
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise GrowthLogError(f"{shown}: cannot open the growth log ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GrowthLogError(f"{shown}: not a regular file; a growth log must be one")
    return fd


def read_growth_log(path) -> GrowthLogContents:
    """The settings and rounds of the growth log at ``path``, checked (module docstring).

    Raises :class:`~satcore._shared.errors.GrowthLogError` naming the file and line of any damage.

    Examples
    --------
    >>> log = read_growth_log("growth.jsonl")                       # doctest: +SKIP
    >>> [(r.round, r.inserted_at, r.heldout_change) for r in log.rounds], log.stop_reason   # doctest: +SKIP
    """
    path = os.fspath(path)
    fd = _open_regular(path, os.O_RDONLY)
    try:
        return parse_log(_read_all(fd, display_name(path)), display_name(path))
    finally:
        os.close(fd)


def _finite_settings(settings: dict) -> dict:
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in settings.items()}


class GrowthLog:
    """A log opened for a run: locked for its lifetime (a context manager), read, then appended to.

    ``settings``: the run's arguments (module docstring); compared with the header of an
    existing log by :meth:`check_settings`.
    """

    def __init__(self, path, settings: dict):
        self.path = os.fspath(path)
        self.shown = display_name(self.path)
        self.settings = json.loads(json.dumps(_finite_settings(settings)))  # as it reads back
        self.fd = _open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            self._lock()
            self.contents = parse_log(_read_all(self.fd, self.shown), self.shown)
        except BaseException:
            self.close()
            raise
        self.next_round = self.contents.rounds[-1].round + 1 if self.contents.rounds else 0

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # no flock on this platform: nothing to hold
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GrowthLogError(f"{self.shown}: in use by another run (locked); wait for it to finish or give "
                                 "this run another log_path") from None

    def check_settings(self) -> None:
        """Refuse to resume or return a log written under other settings (one line says what to do)."""
        logged = self.contents.settings
        if logged is None or logged == self.settings:
            return
        changed = sorted(k for k in set(logged) | set(self.settings) if logged.get(k) != self.settings.get(k))
        diff = ", ".join(f"{k} {logged.get(k)!r} -> {self.settings.get(k)!r}" for k in changed[:4])
        state = (f"finished ({self.contents.stop_reason!r})" if self.contents.stop_reason is not None
                 else f"stopped after round {self.next_round - 1}")
        raise GrowthLogError(f"{self.shown}: this log {state} under other settings ({diff}); give a new log_path "
                             "to run with these (or the same settings to resume or return it)")

    def append(self, entry: GrowthRound) -> None:
        """Append one round (it must be the next) with one write, then ``fsync``."""
        if entry.round != self.next_round:
            raise GrowthLogError(f"{self.shown}: round {entry.round} appended where {self.next_round} is next")
        if os.fstat(self.fd).st_size == 0:
            header = {FORMAT_KEY: FORMAT_VERSION, "settings": self.settings}
            self._write((json.dumps(header, separators=(",", ":")) + "\n").encode())
        self._write(encode_round(entry))
        self.next_round += 1

    def _write(self, data: bytes) -> None:
        try:
            written = 0
            while written < len(data):
                written += os.write(self.fd, data[written:])
            os.fsync(self.fd)
        except OSError as exc:
            raise GrowthLogError(f"{self.shown}: cannot append ({exc.strerror or exc})") from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["GrowthRound", "GrowthLog", "GrowthLogContents", "read_growth_log", "encode_round", "parse_log"]
