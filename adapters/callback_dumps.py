"""A training-loop callback's dumps: each probed evaluation's statistics as a ``satcore-dump/1`` file.

``HFCallback``, ``LightningCallback`` and ``KerasCallback`` take ``dump_dir=PATH``.  At each evaluation they
probe, the process that logs for the run (the main process under ``torch.distributed``, the chief under
``tf.distribute``) writes the probe's statistics to ``PATH/<name>.npz``, named by the training step or the epoch
(:data:`DUMP_NAMES`), with :func:`satcore.write_dump`: whole or not at all.  ``satcore score`` reads it as it reads
``probe(...).save(PATH)``'s, and gives the growth values of the callback's own report (the same sums).

The folder is checked when the callback is built, so that a mistake surfaces before training: a path that is a
file, a folder that takes no new file, and a folder holding a file at a name the callback writes (another run's
dump or a file of the user's, which it would replace) are each refused in one line naming the path.  A file that
appears at such a name during training is not replaced either: that evaluation's dump is skipped with a warning.
Only a dump this callback wrote is replaced (a second probe at the same step: ``trainer.evaluate()`` after
training).
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import stat
import warnings
from dataclasses import fields

from satcore import InputError, write_dump
from satcore.adapter_api import check_folder_writable, display_name, file_kind

#: the file name pattern of each callback's dumps (``str.format`` fields: ``step``, ``epoch``), and its regular
#: expression, which the folder's files are checked against when the callback is built
DUMP_NAMES = {
    "HFCallback": ("satcore-step-{step:06d}.npz", r"satcore-step-\d+\.npz"),
    "LightningCallback": ("satcore-epoch-{epoch:04d}-step-{step:06d}.npz", r"satcore-epoch-\d+-step-\d+\.npz"),
    "KerasCallback": ("satcore-epoch-{epoch:04d}.npz", r"satcore-epoch-\d+\.npz"),
}


class CallbackDumps:
    """Where the callback ``by`` writes its dumps: the folder ``dump_dir``, checked when built (module docstring).

    Parameters
    ----------
    by : str
        The callback's class name (a key of :data:`DUMP_NAMES`), which the refusals name.
    dump_dir : str or os.PathLike
        The folder; made (with its parents) at the first dump where it does not exist yet.

    Attributes
    ----------
    written : list of str
        The paths of the dumps this callback wrote, in order (one a name: a dump replaced keeps its place).
    """

    def __init__(self, by: str, dump_dir):
        if not isinstance(dump_dir, (str, os.PathLike)):
            raise InputError(f"{by}: dump_dir must be a folder's path, got {type(dump_dir).__name__}")
        self.by, self.folder = by, os.fspath(dump_dir)
        self.pattern, matches = DUMP_NAMES[by]
        self.written: list[str] = []
        shown = display_name(self.folder)
        existing = self.folder
        while not os.path.lexists(existing):  # a new folder: its nearest existing parent must take it
            existing = os.path.dirname(os.path.abspath(existing))
        try:
            mode = os.stat(existing).st_mode
        except OSError as exc:  # a link to nowhere (or in a loop), a folder this process may not look into
            raise InputError(f"{by}: dump_dir={shown}: cannot use {display_name(existing)} as a folder "
                             f"({exc.strerror or exc})") from None
        if not stat.S_ISDIR(mode):
            kind = "a file" if stat.S_ISREG(mode) else file_kind(mode)
            what = kind if existing == self.folder else f"inside {display_name(existing)}, which is {kind}"
            raise InputError(f"{by}: dump_dir={shown} is {what}, not a folder; give the folder its dumps go to")
        check_folder_writable(f"{by}: dump_dir={shown}", existing)
        if existing == self.folder:
            taken = sorted(name for name in os.listdir(self.folder) if re.fullmatch(matches, name))
            if taken:
                more = f" and {len(taken) - 1} more" if len(taken) > 1 else ""
                raise InputError(f"{by}: dump_dir={shown} holds {display_name(taken[0])}{more}, at the names its "
                                 f"dumps take ({self.pattern}); they would be replaced: give a new or empty folder")

    def write(self, result, config, fingerprint: str, **name) -> str | None:
        """Write ``result`` (a :class:`satcore.ProbeResult`) as the dump named by ``name`` (``step=``, ``epoch=``),
        its ``meta`` the result's own (:meth:`~satcore.ProbeResult.dump_meta`) with ``callback``: this callback,
        ``name``, what reproduces the dump (the probe's ``config``, :func:`config_record`, and the model's weights'
        ``fingerprint``); return its path, or ``None`` where a file this callback did not write holds the name
        (warned, kept)."""
        path = os.path.join(self.folder, self.pattern.format(**name))
        if path not in self.written and os.path.lexists(path):
            warnings.warn(f"{self.by}: {display_name(path)} appeared during training and is not a dump this callback "
                          f"wrote; it is kept, and this evaluation's dump is not written (callback.reports holds "
                          f"its report)", UserWarning, stacklevel=3)
            return None
        os.makedirs(self.folder, exist_ok=True)
        meta = {"by": self.by, **name, "config": config_record(config), "model_fingerprint": fingerprint}
        write_dump(path, result.statistics, meta={**result.dump_meta(), "callback": meta})
        if path not in self.written:
            self.written.append(path)
        return path


def callback_dumps(by: str, dump_dir) -> CallbackDumps | None:
    """The callback ``by``'s :class:`CallbackDumps` of ``dump_dir``, checked now; ``None`` without one."""
    return None if dump_dir is None else CallbackDumps(by, dump_dir)


def config_record(config) -> dict:
    """A probe config (a frozen dataclass: a ``ProbeConfig``) as JSON values, for a dump's ``meta``: numbers,
    strings, ``None`` and their lists and mappings as given; a callable (a ``mask``) as ``"callable"``; any other
    object by its text where that is one short line (a dtype: ``"torch.float32"``), else its class name (a feature
    map, a ``tf.distribute`` strategy: code and live objects cannot be saved)."""
    return {f.name: _json_value(getattr(config, f.name)) for f in fields(config)}


def _json_value(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if inspect.isroutine(value) or isinstance(value, functools.partial):
        return "callable"
    text = str(value)
    return text if "\n" not in text and not text.startswith("<") and len(text) <= 80 else type(value).__name__
