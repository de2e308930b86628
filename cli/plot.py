"""Figures for ``satcore score --plot`` and ``satcore sweep --plot`` (matplotlib, the ``plot`` extra).

Imported only when a plot is asked for, so the command line runs without matplotlib.  Names from
files are drawn as :func:`label` shows them (one printable line, no mathtext), and the figure is
written by :func:`satcore._io.atomic.atomic_write` (whole or not at all, never over an input).

A command checks its ``--plot`` path with :func:`check_plot_path` before it reads or prints
anything: the format must be one the Agg canvas writes by itself (:data:`PLOT_FORMATS`; ``pgf``
needs a TeX installation and is refused) and the target must be writable by the atomic writer.
It draws through :func:`draw_or_skip`: without matplotlib the figure alone is skipped, with one
line on stderr naming the extra that installs it, and the command's other output stands.  Drawing and saving a figure writes nothing to stderr: matplotlib's
warnings (a glyph missing from the font, a layout that does not fit) and log messages describe the
figure, not the command's outcome.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

import click

from satcore.adapter_api import atomic_write, check_target
from satcore.adapter_api import require
from satcore import Verdict
from satcore.adapter_api import NOT_VERIFIED, MissingDependencyError

from .common import display_name


def label(text) -> str:
    """A name from a file as plot text: printable, one line, and ``$`` kept literal (matplotlib reads
    ``$...$`` as mathtext, which would mis-draw the name or fail on it)."""
    return display_name(text).replace("$", r"\$")


# What the Agg canvas writes without an external program (the raster formats through Pillow, a
# matplotlib dependency); a name matplotlib also knows but that is not here (pgf: LaTeX) is refused.
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp", "raw", "rgba")


def plot_format(path: str) -> str:
    """The image format ``path``'s extension names (``png`` without one); refused unless in :data:`PLOT_FORMATS`."""
    fmt = os.path.splitext(path)[1][1:].lower() or "png"
    if fmt not in PLOT_FORMATS:
        raise click.BadParameter(f"{display_name(path)}: image format {display_name(fmt)!r} is not one satcore "
                                 f"writes ({', '.join(PLOT_FORMATS)})", param_hint="--plot")
    return fmt


def check_plot_path(path: str, inputs=()) -> None:
    """Refuse a ``--plot`` path before any work (module docstring): its format and its target."""
    check_target(path, inputs)  # first: "this is your input" says more than "not an image format"
    plot_format(path)


def draw_or_skip(path: str, draw) -> bool:
    """``draw()`` the figure for ``--plot path``, or, where matplotlib is not installed, skip it with one line on
    stderr naming the extra (the rest of the command's output does not need it); whether it was drawn."""
    try:
        require("matplotlib", extra="plot", by="--plot")
    except MissingDependencyError as exc:
        click.echo(f"satcore: note: {exc}; the figure {display_name(path)} was skipped", err=True)
        return False
    draw()
    return True


@contextlib.contextmanager
def _silent_matplotlib():
    """matplotlib's warnings and log messages held back while a figure is drawn and saved."""
    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _pyplot():
    with _silent_matplotlib():
        import matplotlib

        matplotlib.use("Agg")
        # a user's matplotlibrc may route text through TeX or PostScript through Ghostscript: external programs
        matplotlib.rcParams["text.usetex"] = False
        matplotlib.rcParams["ps.usedistiller"] = None
        import matplotlib.pyplot as plt

    return plt


def plot_report(report, path: str, title: str = "", inputs=()):
    """AG and growth value per candidate in depth order, noise floors dashed, the argmax marked; when the
    report carries predictions (a training split was given), the predicted gains lead, in a panel above."""
    check_plot_path(path, inputs)  # before the figure is drawn
    with _silent_matplotlib():
        _draw_report(report, path, title, inputs)


def _draw_report(report, path: str, title: str, inputs):
    plt = _pyplot()
    names = [c.name for c in report.candidates]
    x = range(len(names))
    width = max(6, 0.4 * len(names) + 3)
    if report.predictions is None:
        fig, ax = plt.subplots(figsize=(width, 4))
    else:
        fig, (top, ax) = plt.subplots(2, 1, figsize=(width, 7.5), sharex=True)
        draw_predictions(top, report.predictions, names)
    ax.plot(x, [c.ag for c in report.candidates], "o-", label="AG")
    ax.plot(x, [c.growth_value for c in report.candidates], "s-", label="growth value")
    # the growth value's own floor (needs sum X^T X), not ||C||_F's: it is drawn against the growth value
    floors = [c.growth_noise_floor for c in report.candidates]
    if any(f is not None for f in floors):
        ax.plot(x, [f if f is not None else float("nan") for f in floors], "k--", lw=1,
                label="noise floor (growth value)")
    # the verdicts: improvable candidates marked, the interval for the population V as bars
    tests = {t.name: t for t in report.tests}
    marks = [(i, c.growth_value) for i, c in enumerate(report.candidates)
             if c.name in tests and tests[c.name].verdict == Verdict.IMPROVABLE]
    if marks:
        ax.plot(*zip(*marks), "^", color="green", ms=9, mfc="none", label="improvable (Holm p < alpha)")
    spans = [(i, tests[c.name].growth_value_interval) for i, c in enumerate(report.candidates)
             if c.name in tests and tests[c.name].growth_value_interval is not None]
    shown = [v for c in report.candidates for v in (c.ag, c.growth_value) if v > 0]
    bottom = 0.3 * min(shown) if shown else 0.0  # an interval reaching 0 is drawn down to here (log scale)
    for i, (lo, hi) in spans:
        ax.plot([i, i], [max(lo, bottom), max(hi, bottom)], color="0.5", lw=3, alpha=0.5,
                label="interval for V" if i == spans[0][0] else None)
    best = names.index(report.argmax)
    ax.plot([best], [report.growth_value_max], "r*", ms=14, label=f"max at {label(report.argmax)}")
    ax.set_xticks(list(x), [label(n) for n in names], rotation=60, ha="right", fontsize=8)
    _log_scale(ax, [c.ag for c in report.candidates])
    ax.set_ylabel("score")
    verdict = f" — {report.verdict.verdict}" if report.verdict is not None else ""
    ax.set_title(label(title) + verdict)
    ax.legend(fontsize=8)
    _save(fig, plt, path, inputs)


def draw_predictions(ax, predictions, names):
    """Predicted training gain (second order where the report has it) and held-out gain per candidate, in loss
    units (positive = the loss falls), on ``ax``; candidates in ``names``' order.  No trial verified them: no
    interval or probability is drawn (the fold test's omit the predictor's own error, ``satcore.HeldoutGain``), and
    the title says "not verified"."""
    by_name = {c.name: c for c in predictions.candidates}
    gains = [by_name[n] for n in names]
    train = [c.training_gain if c.training_gain_second_order is None else c.training_gain_second_order
             for c in gains]
    held = [c.heldout.value for c in gains]
    x = range(len(names))
    ax.plot(x, train, "o-", label="predicted training gain (training split)")
    ax.plot(x, held, "s-", label="predicted held-out gain (probe split; first-order screen)")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_yscale("symlog", linthresh=_linear_range(train + held))
    ax.set_ylabel("loss decrease")
    step = ", ".join(f"{k} {v:g}" for k, v in predictions.step.items())
    ax.set_title(f"one inserted block trained by {predictions.optimizer} ({step}): {NOT_VERIFIED}, no trial ran",
                 fontsize=9)
    ax.legend(fontsize=8)


def _linear_range(values) -> float:
    """The symlog scale's linear range: a tenth of the smallest nonzero magnitude drawn (1 if none)."""
    nonzero = [abs(v) for v in values if v != 0]
    return 0.1 * min(nonzero) if nonzero else 1.0


def plot_sweep(sweep, path: str, inputs=()):
    """AG_max and growth_value_max over depth, the growth noise floor, the plateau shaded."""
    check_plot_path(path, inputs)
    with _silent_matplotlib():
        _draw_sweep(sweep, path, inputs)


def _draw_sweep(sweep, path: str, inputs):
    plt = _pyplot()
    depths = [p.depth for p in sweep.points]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(depths, [p.ag_max for p in sweep.points], "o-", label="AG_max")
    ax.plot(depths, [p.growth_value_max for p in sweep.points], "s-", label="growth_value_max")
    floors = [p.growth_noise_floor for p in sweep.points]
    if any(f is not None for f in floors):
        ax.plot(depths, [f if f is not None else float("nan") for f in floors], "k--", lw=1,
                label="noise floor (growth value)")
    if sweep.plateau is not None:
        ax.axvspan(sweep.plateau.start_depth, depths[-1], color="0.85", label="plateau")
    ax.set_xlabel("model depth")
    _log_scale(ax, [p.ag_max for p in sweep.points])
    ax.set_ylabel("score")
    ax.legend(fontsize=8)
    _save(fig, plt, path, inputs)


def _log_scale(ax, values):
    """Log scale unless nothing is positive (an exactly saturated probe), where matplotlib cannot use one."""
    ax.set_yscale("log" if any(v > 0 for v in values) else "linear")


def _save(fig, plt, path: str, inputs):
    """Write the figure in the format its extension names (PNG without one)."""
    fmt = plot_format(path)
    fig.tight_layout()
    try:
        atomic_write(path, lambda stream: fig.savefig(stream, format=fmt, dpi=120), inputs=inputs)
    finally:
        plt.close(fig)
