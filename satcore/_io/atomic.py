"""The one way satcore writes an output file (dumps, checkpoints, plots): whole or not at all.

:func:`atomic_write` refuses a target that exists and is not a regular file
(``-o /dev/null`` would otherwise replace the device node, a FIFO would be
replaced by a file) or that is one of the command's own inputs (compared as
files, ``os.path.samefile``: a hard link or another spelling of the path is
the same input).

On Linux the data goes to an unnamed file in the target's folder
(``O_TMPFILE``), which is linked into place only once it is complete
(``linkat`` of ``/proc/self/fd/N``): a process killed while writing, even by
SIGKILL, leaves no file behind, and a failed write (full disk, ``RLIMIT_FSIZE``)
leaves the earlier file intact.  When the target already exists the finished
file is linked under a hidden name and renamed over it (one ``rename``, so a
reader sees the old file or the new one, never a torn one).  Where the
platform lacks ``O_TMPFILE`` the data is written under that hidden name
(``.NAME.PID.RANDOM.part``) from the start; SIGTERM then removes it.  SIGKILL
cannot be caught: killed between the hidden link and the rename (or, without
``O_TMPFILE``, at any point of the write) a process leaves its hidden name
behind, next to the old file or the complete new one.  The next write of the
same target removes every such name whose process (``PID``) is no longer
running on this machine, so a stale temporary never outlives the next save.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import secrets
import signal
import stat
import threading
from typing import BinaryIO, Callable

from .._shared.display import display_name
from .._shared.errors import InputError, SatcoreError

TMPFILE_UNSUPPORTED = {"EOPNOTSUPP", "EISDIR", "EINVAL", "ENOTSUP", "EACCES"}


class OutputError(SatcoreError, OSError):
    """An output that cannot or must not be written; the message names the file (one line)."""


class _Terminated(BaseException):
    """SIGTERM arrived while an output was being written."""


def file_kind(mode: int) -> str:
    """What a file of ``os.stat`` mode ``mode`` is, for a refusal (``"a FIFO"``, ``"a file"`` for a regular one)."""
    for test, kind in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def regular_file(path, shown: str, error: type[Exception] | None = None) -> bool:
    """Whether a regular file (or a symlink to one) is at ``path``: ``False`` where nothing is, one line naming
    ``shown`` and what is there otherwise (:func:`file_kind`; raised as ``error``, by default
    :class:`~satcore.InputError`): a FIFO or a device could block or never end when read, and calling a directory
    missing would send the user looking for a file they can see.  So too a symbolic link that leads to no file
    (a loop, or its target gone), which ``ls`` shows where the file should be."""
    if os.path.isfile(path):
        return True
    if os.path.exists(path):
        raise (error or InputError)(f"{shown}: is {file_kind(os.stat(path).st_mode)}, not a regular file; refused")
    _refuse_unreachable(path, shown, "file", error)
    return False


def directory(path, shown: str, error: type[Exception] | None = None, *, expected: str | None = None) -> bool:
    """Whether a directory (or a symlink to one) is at ``path``: ``False`` where nothing is or something else
    is (the caller says what it expects); a symbolic link that leads to no directory (a loop, or its target gone)
    is refused in the words :func:`regular_file` has for a link to no file, since ``ls`` shows its name.

    With ``expected`` (what the folder is to the user, ``"a Hugging Face model folder"``) there is no ``False``:
    ``shown`` is refused as not existing, or as what is there instead (``is a file, not a Hugging Face model
    folder``), since "not a directory" would send the user looking for a folder they never gave."""
    if os.path.isdir(path):
        return True
    if not os.path.exists(path):
        _refuse_unreachable(path, shown, "directory", error)
        if expected is not None:
            raise (error or InputError)(f"{shown}: does not exist ({expected} is expected)")
    elif expected is not None:
        raise (error or InputError)(f"{shown}: is {file_kind(os.stat(path).st_mode)}, not {expected}")
    return False


def _refuse_unreachable(path, shown: str, what: str, error: type[Exception] | None) -> None:
    """For a ``path`` at which nothing is reached: refuse a symbolic link (to no ``what``) or a path that cannot be
    looked up for another reason than being missing; return where it is simply missing."""
    if os.path.islink(path):
        try:
            os.stat(path)
            reason = "it resolves to nothing"
        except OSError as exc:
            reason = exc.strerror or str(exc)
        raise (error or InputError)(f"{shown}: is a symbolic link to no {what} ({reason}: a link loop, or its target "
                                    f"{display_name(os.readlink(path), 120)!r} is missing); refused")
    try:
        os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:  # not "missing": a name too long, a folder of the path not searchable or not a folder
        raise (error or InputError)(f"{shown}: cannot be read ({exc.strerror or exc})") from None


# The files read so far by the running command: {(resolved path, (device, inode)): shown name}; None outside
# command_inputs(), where reading a file and then writing it (a checkpoint resumed and saved) is legitimate.
_READ: contextvars.ContextVar[dict | None] = contextvars.ContextVar("satcore_command_inputs", default=None)


@contextlib.contextmanager
def command_inputs():
    """Within the block, every file noted by :func:`note_input` is an input no output may replace."""
    token = _READ.set({})
    try:
        yield
    finally:
        _READ.reset(token)


def note_input(path, st: os.stat_result | None = None) -> None:
    """Record ``path`` (whose ``os.stat`` is ``st`` when known) as read by the running command, if any."""
    read = _READ.get()
    if read is None:
        return
    try:
        st = st or os.stat(path)
    except OSError:
        return
    read.setdefault((os.path.realpath(path), (st.st_dev, st.st_ino)), os.fspath(path))  # a file read twice: once


def _identity(path) -> tuple[str, tuple[int, int] | None]:
    """``(resolved path, (device, inode) or None when it cannot be stat'ed)``."""
    resolved = os.path.realpath(path)
    try:
        st = os.stat(path)
    except OSError:  # an input that is not there (yet) is matched by its path only
        return resolved, None
    return resolved, (st.st_dev, st.st_ino)


def _cannot_write_into(shown: str, folder: str, exc: OSError) -> OutputError:
    """The one line for an output whose folder cannot take it (missing, not a folder, not writable)."""
    return OutputError(f"{shown}: cannot write into {display_name(folder)} ({exc.strerror or exc})")


def check_folder_writable(shown: str, folder: str) -> None:
    """Refuse ``folder`` (for the output ``shown``) unless a file can be created in it, by creating one as
    :func:`atomic_write` does: unnamed where the platform allows, else under a hidden name removed at once.

    ``os.access`` answers from the permission bits alone, which root passes everywhere and which ACLs,
    security modules, FUSE mounts and ``/proc`` or ``/sys`` overrule; a command that trusted it found its
    output folder unwritable only after all its work.
    """
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_write_into(shown, folder, exc) from None
    try:
        fd = _unnamed_file(dir_fd)
        if fd is None:
            trial = _hidden_name("satcore-write-check")
            fd = os.open(trial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
            os.unlink(trial, dir_fd=dir_fd)
        os.close(fd)
    except OSError as exc:
        raise _cannot_write_into(shown, folder, exc) from None
    finally:
        os.close(dir_fd)


def check_target(path, inputs=(), *, folder_exists: bool = True) -> None:
    """Refuse ``path`` if it exists and is not a regular file, or is one of ``inputs`` or of the files the
    running command has read (module docstring), by resolved path or as the same file; and, with
    ``folder_exists``, a new ``path`` whose folder is not there; and a ``path`` whose folder, there, takes no new
    file (:func:`check_folder_writable`).  A command checks its outputs before its work; ``folder_exists`` is
    ``False`` where the command makes the folder itself, as ``satcore expand`` its ``-o`` directory."""
    target = os.fspath(path)
    shown = display_name(target)
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise OutputError(f"{shown}: cannot write ({exc.strerror or exc})") from None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise OutputError(f"{shown}: is {file_kind(existing.st_mode)}, not a regular file; refusing to replace it")
    folder = os.path.dirname(os.path.abspath(target))
    if existing is None and folder_exists:  # a new file: its folder must be there now, not after the work
        try:
            os.stat(folder)  # a folder that is a file made the target's stat fail above, with ENOTDIR
        except OSError as exc:
            raise _cannot_write_into(shown, folder, exc) from None
    if existing is not None or folder_exists:  # and take a new file now, not after the work
        check_folder_writable(shown, folder)
    resolved = os.path.realpath(target)
    file_id = None if existing is None else (existing.st_dev, existing.st_ino)
    sources = [(os.fspath(s), *_identity(s)) for s in inputs]
    sources += [(name, *identity) for identity, name in (_READ.get() or {}).items()]
    for name, source_path, source_id in sources:
        if source_path == resolved or (file_id is not None and source_id == file_id):
            raise OutputError(f"{shown}: is also an input of this command ({display_name(name)}); "
                              "write the output to another file")


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises :class:`_Terminated` inside the block (so the cleanup runs), where it would kill."""
    if not (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        yield
        return

    def handler(signum, frame):
        raise _Terminated()

    # The handler runs between any two bytecodes, so its exception can come from the install or from the restore
    # as well as from the block: the outer ``except`` sees it wherever it comes from (a SIGTERM landing while the
    # default was being put back once escaped as an uncaught exception, exit status 1).
    try:
        try:
            signal.signal(signal.SIGTERM, handler)
            yield
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except _Terminated:
        # cleaned up by now: die of SIGTERM as the process would have, with the usual exit status
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise


def _hidden_name(base: str) -> str:
    return f".{base}.{os.getpid()}.{secrets.token_hex(4)}.part"


def _process_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only whether the process exists is checked
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_stale_temporaries(dir_fd: int, base: str) -> None:
    """Unlink the hidden names (:func:`_hidden_name`) of ``base`` left in the folder by writers that were
    killed (SIGKILL) and are no longer running; a running writer's name is left alone."""
    pattern = re.compile(rf"\.{re.escape(base)}\.(\d+)\.[0-9a-f]{{8}}\.part")
    for name in os.listdir(dir_fd):
        match = pattern.fullmatch(name)
        if match and not _process_running(int(match.group(1))):
            with contextlib.suppress(OSError):  # another writer may have removed it first
                os.unlink(name, dir_fd=dir_fd)


def _unnamed_file(dir_fd: int) -> int | None:
    """An ``O_TMPFILE`` descriptor in the folder, or ``None`` where the platform or file system has none."""
    if not hasattr(os, "O_TMPFILE") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        if errno.errorcode.get(exc.errno) in TMPFILE_UNSUPPORTED:
            return None
        raise


def atomic_write(path, write: Callable[[BinaryIO], None], *, inputs=()) -> None:
    """Write ``path`` through ``write(stream)`` whole or not at all (module docstring).

    ``inputs``: the files the command read; ``path`` may not be one of them.
    Raises :class:`OutputError` (an ``OSError``) naming ``path`` when it is
    refused or the write fails.
    """
    target = os.fspath(path)
    shown = display_name(target)
    check_target(target, inputs)
    mode = _kept_mode(target)
    folder, base = os.path.split(os.path.abspath(target))
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_write_into(shown, folder, exc) from None
    temp = None
    try:
        _remove_stale_temporaries(dir_fd, base)
        with _sigterm_raises():
            try:
                fd = _unnamed_file(dir_fd)
                if fd is None:
                    temp = _hidden_name(base)
                    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
                try:
                    with os.fdopen(fd, "wb", closefd=False) as stream:
                        write(stream)
                    if mode is not None:
                        os.fchmod(fd, mode)
                    check_target(target, inputs)  # again: the target may have been swapped while we wrote
                    if temp is None:
                        _link_into_place(fd, base, dir_fd)
                    else:
                        os.replace(temp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                        temp = None
                finally:
                    os.close(fd)
            except BaseException:
                if temp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(temp, dir_fd=dir_fd)
                raise
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        raise OutputError(f"{shown}: cannot write ({exc.strerror or exc})") from None
    finally:
        os.close(dir_fd)


def _kept_mode(target: str) -> int | None:
    """The permission bits of the regular file ``target`` replaces (``None``: a new file, umask applies)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"{display_name(target)}: cannot write ({exc.strerror or exc})") from None


def _link_into_place(fd: int, base: str, dir_fd: int) -> None:
    """Give the finished unnamed file its name: directly when the name is free, else by a rename over it."""
    source = f"/proc/self/fd/{fd}"
    try:
        os.link(source, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=True)
        return
    except FileExistsError:
        pass
    hidden = _hidden_name(base)
    os.link(source, hidden, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=True)
    try:
        os.replace(hidden, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(hidden, dir_fd=dir_fd)
        raise
