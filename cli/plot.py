"""Figures for ``satcore score --plot`` and ``satcore sweep --plot`` (matplotlib, the ``plot`` extra).

Imported only when a plot is asked for, so the command line runs without matplotlib.
"""

from __future__ import annotations

import click

from satcore.report_text import display_name, growth_noise_floor


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise click.ClickException("--plot needs matplotlib: pip install 'satcore[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_report(report, path: str, title: str = ""):
    """AG and growth value per candidate in depth order, noise floors dashed, the argmax marked."""
    plt = _pyplot()
    names = [c.name for c in report.candidates]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(names) + 3), 4))
    ax.plot(x, [c.ag for c in report.candidates], "o-", label="AG")
    ax.plot(x, [c.growth_value for c in report.candidates], "s-", label="growth value")
    # the growth value's own floor (needs sum X^T X), not ||C||_F's: it is drawn against the growth value
    floors = [growth_noise_floor(c) for c in report.candidates]
    if any(f is not None for f in floors):
        ax.plot(x, [f if f is not None else float("nan") for f in floors], "k--", lw=1,
                label="noise floor (growth value)")
    # the verdicts: improvable candidates marked, the interval for the population V as bars
    tests = {t.name: t for t in report.tests}
    marks = [(i, c.growth_value) for i, c in enumerate(report.candidates)
             if c.name in tests and tests[c.name].verdict == "improvable"]
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
    ax.plot([best], [report.growth_value_max], "r*", ms=14, label=f"max at {display_name(report.argmax)}")
    ax.set_xticks(list(x), [display_name(n) for n in names], rotation=60, ha="right", fontsize=8)
    _log_scale(ax, [c.ag for c in report.candidates])
    ax.set_ylabel("score")
    verdict = f" — {report.verdict.verdict}" if report.verdict is not None else ""
    ax.set_title(display_name(title) + verdict)
    ax.legend(fontsize=8)
    _save(fig, plt, path)


def plot_sweep(sweep, path: str):
    """AG_max and growth_value_max over depth, the growth noise floor, the plateau shaded."""
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
    _save(fig, plt, path)


def _log_scale(ax, values):
    """Log scale unless nothing is positive (an exactly saturated probe), where matplotlib cannot use one."""
    ax.set_yscale("log" if any(v > 0 for v in values) else "linear")


def _save(fig, plt, path: str):
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
