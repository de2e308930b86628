"""Shared pieces of the ``satcore`` commands: reading dumps with progress, names and numbers for tables."""

from __future__ import annotations

import math
import sys
import time

import click

from satcore.adapter_api import display_name
from satcore import DumpError, read_dump
from satcore.adapter_api import Dump
from satcore import InputError
from satcore.adapter_api import num, table

from .numbers import Count

__all__ = ["announced", "display_name", "load", "scored", "statistics", "num", "table", "human_bytes", "model_on_data"]


class FiniteFloatRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN and infinities (``FloatRange`` lets NaN through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


QUIET_OPTION = click.option("--quiet", "-q", is_flag=True, help="No progress output on stderr.")
CHUNK_OPTION = click.option(
    "--chunk-samples",
    type=Count(),
    default=None,
    help="Samples per chunk when streaming raw members (default: about 64 MiB of working memory).",
)


class StderrProgress:
    """``progress(done_bytes, total_bytes)`` for :meth:`Dump.statistics`.

    Writes one self-overwriting line to stderr, only when stderr is a terminal
    and the read has lasted over a second (short reads stay silent).
    """

    def __init__(self, label: str, delay_s: float = 1.0):
        self.label = label
        self.start = time.monotonic()
        self.delay_s = delay_s
        self.shown = False

    def __call__(self, done: int, total: int):
        if time.monotonic() - self.start < self.delay_s:
            return
        self.shown = True
        pct = 100.0 * done / total if total else 100.0
        sys.stderr.write(f"\r{display_name(self.label)}: {pct:5.1f}% of {human_bytes(total)}")
        sys.stderr.flush()

    def close(self):
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def load(path: str, *, quiet: bool, chunk_samples: int | None = None):
    """``(dump, statistics)`` of a validated dump; errors name the file (:class:`DumpError` does)."""
    dump: Dump = read_dump(path)
    return dump, statistics(dump, quiet=quiet, chunk_samples=chunk_samples)


def scored(path: str, stats, criteria, **options):
    """``stats.report(criteria, **options)``; a refusal from scoring (an indefinite Gram, sums too large)
    names the file."""
    try:
        return stats.report(criteria, **options)
    except InputError as exc:
        raise DumpError(f"{display_name(path)}: {display_name(exc, 300)}") from None


def statistics(dump: Dump, *, quiet: bool, chunk_samples: int | None = None):
    """Stream the dump's statistics; progress on stderr unless ``quiet`` or stderr is not a terminal."""
    progress = None if quiet or not sys.stderr.isatty() else StderrProgress(f"reading {dump.path}")
    try:
        return dump.statistics(chunk_samples=chunk_samples, progress=progress)
    finally:
        if progress is not None:
            progress.close()


def announced(note: str | None, work):
    """``work()``, with ``note`` (what it will cost: a long load) on stderr first where there is one."""
    if note:
        click.echo(note, err=True)
    return work()


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def model_on_data(model, data_path, text: str, option: str | None = None) -> str:
    """A refusal ``text`` of the model on the data (a batch it cannot take or scores NaN on), led by both files:
    either may be at fault, so the line names neither option alone (``satcore probe``, ``satcore expand``).
    ``option``: the flag that gave ``data_path``, named before it where the command reads a second data file
    (``satcore expand --general-data``)."""
    return f"{display_name(model)} on {option + ' ' if option else ''}{display_name(data_path)}: {text}"
