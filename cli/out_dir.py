"""Output directories (``satcore expand -o OUT_DIR``, ``satcore fetch-example NAME DIR``): whole or not at all.

The directory must be new or empty, its path UTF-8 and within the file system's name and path lengths,
and its parent must exist and be writable (all checked before any work); it is written under a temporary
name in the same parent and renamed into place once complete, so a failure or an interruption leaves no
half-written directory under the name the user gave.  The temporary directory says what it is twice: its
name (``PREFIX-incomplete-XXXX``) and a file in it (:data:`MARKER`), which goes only when everything is
written, just before the rename; so a process killed mid-write (``kill -9``, a power cut) leaves at most
a hidden folder marked incomplete beside the output, never the output.  A write that fails (a full disk,
also inside the safetensors writer) is one line naming the file under the output's name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from satcore import InputError
from satcore.adapter_api import OutputError, check_folder_writable, file_kind

from .common import display_name

MARKER = "INCOMPLETE.txt"
MARKER_TEXT = ("satcore was writing this folder and did not finish (it was interrupted): what it holds is incomplete. "
               "Delete the folder and run the command again.\n")
# the longest name written inside an output directory (sharded weights' index), for the path-length check
LONGEST_NAME = len("model.safetensors.index.json")


def check_out_dir(out_dir: str, *, source_dir: str | None = None, option: str = "-o") -> None:
    """Refuse ``out_dir`` unless it is new or an empty directory whose parent exists, and (``source_dir``) not
    the directory the command reads nor inside it; ``option``: how the messages name it (``""``: by itself)."""
    shown = display_name(out_dir)
    encoded = os.fsencode(os.path.abspath(out_dir))
    try:
        encoded.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{_named(shown, option)}: the path is not UTF-8, which the safetensors writer needs") from None
    parent = os.path.dirname(os.path.abspath(out_dir))
    if not os.path.isdir(parent):
        given = os.path.dirname(os.path.normpath(out_dir))  # as the user wrote it, not made absolute
        if os.path.exists(parent):  # a file named as a folder: "does not exist" would be false
            raise InputError(f"{_named(shown, option)}: its parent {display_name(given)} is a file, not a directory")
        raise InputError(f"{_named(shown, option)}: its parent directory {display_name(given)} does not exist "
                         "(create it first)")
    check_folder_writable(_named(shown, option), parent)  # created in, not os.access: root passes that anywhere
    name_max, path_max = _limit(parent, "PC_NAME_MAX", 255), _limit(parent, "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.basename(os.path.abspath(out_dir)))) > name_max:
        raise InputError(f"{_named(shown, option)}: its name is longer than the {name_max} bytes the file system "
                         "allows")
    if len(encoded) + 1 + LONGEST_NAME >= path_max:
        raise InputError(f"{_named(shown, option)}: the paths of the files in it would be longer than the "
                         f"{path_max} bytes the system allows")
    if source_dir is not None:
        refuse_inside_model_dir(out_dir, source_dir)
    if os.path.isfile(out_dir) and not os.path.islink(out_dir):
        raise InputError(f"{shown}: is a file, not a directory; refusing to replace it (give a new or empty "
                         "directory)")
    if os.path.lexists(out_dir) and (not os.path.isdir(out_dir) or os.path.islink(out_dir) or os.listdir(out_dir)):
        what = ("a symbolic link" if os.path.islink(out_dir) else "a directory with files in it"
                if os.path.isdir(out_dir) else file_kind(os.stat(out_dir).st_mode))
        raise InputError(f"{shown}: exists and is not an empty directory ({what}); refusing to replace it")


def refuse_inside_model_dir(path: str, model_dir: str) -> None:
    """Refuse an output ``path`` that is ``model_dir`` or inside it (compared resolved): a command that reads a
    checkpoint directory never writes to it, where an output could replace its weights or its config."""
    real_out, real_source = os.path.realpath(path), os.path.realpath(model_dir)
    if real_out == real_source or real_out.startswith(real_source + os.sep):
        raise InputError(f"{display_name(path)}: is MODEL_DIR or inside it; MODEL_DIR is never written to")


@contextlib.contextmanager
def staged_out_dir(out_dir: str, *, prefix: str, option: str = "-o"):
    """A temporary directory beside ``out_dir`` (checked by :func:`check_out_dir`), named ``prefix`` +
    ``incomplete-`` and holding :data:`MARKER` while it is written, to write into; renamed to ``out_dir`` when
    the block ends normally (the marker removed just before), removed when it raises."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    try:
        staging = tempfile.mkdtemp(prefix=prefix + "incomplete-", dir=parent)
    except OSError as exc:  # name OUT_DIR, not the temporary name it is written under
        raise OutputError(f"{_named(display_name(out_dir), option)}: cannot write in {display_name(parent)} "
                          f"({exc.strerror or exc})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the output gets the usual permissions
        with _write_errors_named(staging, out_dir):
            with open(os.path.join(staging, MARKER), "w") as stream:
                stream.write(MARKER_TEXT)
            yield staging
            os.remove(os.path.join(staging, MARKER))
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked before
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def _write_errors_named(staging: str, out_dir: str):
    """A failed write into ``staging`` as one :class:`OutputError` naming the file under ``out_dir``'s name that
    was being written (the newest; a safetensors writer's failure is of a weights file)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # no safetensors, no writer of it to fail
        SafetensorError = OSError
    try:
        yield
    except (OSError, SafetensorError) as exc:
        suffix = ".safetensors" if isinstance(exc, SafetensorError) and not isinstance(exc, OSError) else ""
        names = [n for n in os.listdir(staging) if n != MARKER and n.endswith(suffix)]
        newest = max(names, key=lambda n: os.stat(os.path.join(staging, n)).st_mtime_ns,
                     default="model" + suffix if suffix else "")
        reason = getattr(exc, "strerror", None) or " ".join(str(exc).split())
        raise OutputError(f"{display_name(os.path.join(out_dir, newest))}: cannot be written "
                          f"({display_name(reason, 200)})") from None


def _limit(path: str, name: str, default: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError):
        return default


def _named(shown: str, option: str) -> str:
    return f"{option} {shown}" if option else shown
