"""Output directories (``satcore expand -o OUT_DIR``, ``satcore fetch-example NAME DIR``): whole or not at all.

The directory must be new or empty and its parent must exist (checked before any work); it is written
under a temporary name in the same parent and renamed into place once complete, so a failure or an
interruption leaves no half-written directory under the name the user gave.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from satcore import InputError
from satcore.adapter_api import OutputError

from .common import display_name


def check_out_dir(out_dir: str, *, source_dir: str | None = None, option: str = "-o") -> None:
    """Refuse ``out_dir`` unless it is new or an empty directory whose parent exists, and (``source_dir``) not
    the directory the command reads nor inside it; ``option``: how the messages name it (``""``: by itself)."""
    shown = display_name(out_dir)
    parent = os.path.dirname(os.path.abspath(out_dir))
    if not os.path.isdir(parent):
        given = os.path.dirname(os.path.normpath(out_dir))  # as the user wrote it, not made absolute
        raise InputError(f"{_named(shown, option)}: its parent directory {display_name(given)} does not exist "
                         "(create it first)")
    if source_dir is not None:
        real_out, real_source = os.path.realpath(out_dir), os.path.realpath(source_dir)
        if real_out == real_source or real_out.startswith(real_source + os.sep):
            raise InputError(f"{shown}: is MODEL_DIR or inside it; MODEL_DIR is never written to")
    if os.path.lexists(out_dir) and (not os.path.isdir(out_dir) or os.path.islink(out_dir) or os.listdir(out_dir)):
        raise InputError(f"{shown}: exists and is not an empty directory; refusing to replace it")


@contextlib.contextmanager
def staged_out_dir(out_dir: str, *, prefix: str, option: str = "-o"):
    """A temporary directory beside ``out_dir`` (checked by :func:`check_out_dir`) to write into; renamed to
    ``out_dir`` when the block ends normally, removed when it raises."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    try:
        staging = tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError as exc:  # name OUT_DIR, not the temporary name it is written under
        raise OutputError(f"{_named(display_name(out_dir), option)}: cannot write in {display_name(parent)} "
                          f"({exc.strerror or exc})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the output gets the usual permissions
        yield staging
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked before
        os.rename(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _named(shown: str, option: str) -> str:
    return f"{option} {shown}" if option else shown
