"""``satcore sweep DUMP...``: the AG_max / growth-value curve over model depth and its plateau."""

from __future__ import annotations

import json

import click

import re

from satcore import InputError
from satcore import depth_sweep, sweep_point

from .common import CHUNK_OPTION, QUIET_OPTION, FiniteFloatRange, display_name, load, num, table


@click.command()
@click.argument("dumps", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the satcore-sweep/2 JSON object instead of a table.")
@click.option("--metric", type=click.Choice(["growth_value", "ag"]), default="growth_value", show_default=True,
              help="Curve the plateau rule reads: growth_value_max or AG_max.")
@click.option("--rel-tol", type=FiniteFloatRange(min=0), default=0.25, show_default=True,
              help="Plateau: later depths stay within (1 + rel_tol) x the tail minimum plus noise (a fraction).")
@click.option("--noise-factor", type=FiniteFloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="Plateau is 'low signal' when every value is <= noise_factor x its noise floor (a multiple).")
@click.option("--plot", "plot_path", metavar="PNG",
              help="Draw the curve, noise floor and plateau (matplotlib), the format from the file's extension "
              "(default: no figure).")
@QUIET_OPTION
@CHUNK_OPTION
def sweep(dumps, as_json, metric, rel_tol, noise_factor, plot_path, quiet, chunk_samples):
    """Depth sweep over DUMPS, one dump per model depth.

    A dump's depth is meta 'model_depth' when given, else its number of
    candidates other than the 'head' endpoint (its residual blocks).  The plateau rule is in docs/dump-format.md.
    Dumps of unrelated models are refused: their candidate name patterns, stream widths, feature families or
    probe settings (framework, loss, split) must agree.
    """
    if plot_path:  # before any work: a format or target that cannot be written costs nothing
        from .plot import check_plot_path

        check_plot_path(plot_path, inputs=dumps)
    points, first = [], None
    for path in dumps:
        source, stats = load(path, quiet=quiet, chunk_samples=chunk_samples)
        try:  # each dump scored first: a damaged dump is named for its damage, not for differing from another
            report = stats.report(split=source.meta.get("split"))
        except InputError as exc:
            raise click.ClickException(f"{path}: {exc}") from None
        identity = model_identity(source.meta, stats)
        if first is None:
            first = (path, identity)
        for key, value in identity.items():
            if value is not None and first[1].get(key) is not None and value != first[1][key]:
                raise InputError(f"{display_name(path)} and {display_name(first[0])} are not one model at two depths: "
                                 f"their {key} differ ({_shown(value)} vs {_shown(first[1][key])}); a depth sweep "
                                 f"compares one architecture, probed the same way, at several depths")
        # the reader checked model_depth; without it, the residual blocks (candidates but the head endpoint)
        depth = source.meta.get("model_depth") or max(1, sum(name != "head" for name in source.candidates))
        points.append(sweep_point(depth, path, report))
    result = depth_sweep(points, metric=metric, rel_tol=rel_tol, noise_factor=noise_factor)
    if plot_path:
        from .plot import draw_or_skip, plot_sweep

        draw_or_skip(plot_path, lambda: plot_sweep(result, plot_path, inputs=dumps))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, allow_nan=False))
    else:
        click.echo(render_sweep(result))


# meta fields that say how a dump was probed; dumps of one sweep must agree where they state them
PROBE_META = ("framework", "loss", "split")


def model_identity(meta: dict, stats) -> dict:
    """What must agree between the dumps of one depth sweep: the candidates' naming pattern (names with
    their digits as ``#``: ``transformer.h.#``, ``layer#.#``), the stream widths, the feature families
    (kind, width, feature count, seed) and the probe's ``framework``/``loss``/``split``, each compared
    where both dumps' meta state it.
    A deeper model of the same architecture has more candidates of the same patterns and widths."""
    identity = {
        "candidate name patterns": sorted({re.sub(r"[0-9]+", "#", name) for name in stats}),
        "stream widths": sorted({s.n_hidden for s in stats.values()}),
        "feature counts": sorted({s.n_features for s in stats.values()}),
    }
    family = meta.get("family")
    identity["feature families"] = (sorted({json.dumps(spec, sort_keys=True) for spec in family.values()})
                                    if isinstance(family, dict) else None)
    for key in PROBE_META:
        identity[key] = meta.get(key)
    return identity


def _shown(value) -> str:
    return display_name(json.dumps(value)) if not isinstance(value, str) else display_name(value)


def render_sweep(result) -> str:
    rows = []
    for p in result.points:
        ratio = p.growth_value_max / p.growth_noise_floor if p.growth_noise_floor else None
        rows.append([str(p.depth), display_name(p.label), num(p.ag_max), display_name(p.ag_argmax),
                     num(p.growth_value_max), display_name(p.argmax), num(p.growth_noise_floor), num(ratio),
                     p.verdict or "-"])
    lines = [NO_STOP_DECISION, table(["depth", "dump", "AG_max", "at", "growth_value_max", "at", "growth_noise_floor", "V/floor",
                    "first-order"], rows)]
    p = result.plateau
    if len(result.points) < result.min_points:
        lines.append(f"plateau: not assessed (needs at least {result.min_points} depths, got {len(result.points)})")
    elif p is None:
        lines.append(f"plateau: none (later depths do not stay within rel_tol {num(result.rel_tol)} + noise of "
                     f"the tail's minimum {result.metric})")
    else:
        signal = ("low signal (within sampling noise, no depth improvable)" if p.low_signal
                  else "not shown to be low signal (a depth is improvable or has no noise floor)")
        lines.append(f"plateau: from depth {p.start_depth} on ({result.metric}, rel_tol {num(result.rel_tol)}); {signal}")
    return "\n".join(lines)


# The first-order verdict is "improvable" at every depth of sweeps whose test loss is lowest at the shallowest (an
# independent replication and the decision bench's over-fitting sweeps); the stop is decided by trials. Said first,
# so that "plateau: from depth d on" is not read as "d blocks suffice".
NO_STOP_DECISION = ("depth decision: none from statistics alone: the first-order verdicts and plateau below say "
                    "whether a zero-output block has a descent direction at each depth, not whether a deeper model "
                    "lowers the held-out loss; to decide when to stop, verify by short trials (satcore.adapters.torch."
                    "decide or satcore.adapters.tensorflow.decide at each depth, or grow_until_saturated with a "
                    "recipe; docs/predictive-validity.md)")
