"""``satcore score DUMP``: the per-candidate table or the JSON report of SPEC section 8."""

from __future__ import annotations

import json

import click

from .common import CHUNK_OPTION, QUIET_OPTION, load, num, table


@click.command()
@click.argument("dump")
@click.option("--json", "as_json", is_flag=True, help="Print the satcore-report/1 JSON object instead of a table.")
@click.option("--probe-split", metavar="NAME", help="Split the probe came from (overrides meta 'split').")
@click.option("--delta", type=click.FloatRange(min=0), default=None, help="Tolerance delta of the separated test.")
@click.option("--t", "t", type=click.FloatRange(min=0, min_open=True), default=None, help="Separation t of the test.")
@click.option(
    "--error",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Error level a: derive t = sqrt(sum sigma^2 / (n a)) (Prop. 1).",
)
@click.option(
    "--detector-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Also run Theorem 3's detector: saturated iff Gamma_hat <= S * n^-1/4 (S in ||C||_F units).",
)
@click.option("--plot", "plot_path", metavar="PNG", help="Also draw AG and growth value per candidate (matplotlib).")
@QUIET_OPTION
@CHUNK_OPTION
def score(dump, as_json, probe_split, delta, t, error, detector_scale, plot_path, quiet, chunk_samples):
    """Score every candidate of DUMP: AG, growth value, realizability, depth-wide maximum.

    With --t (and --delta) or --error, also run the separated saturation test
    of Proposition 1 and print its verdict.
    """
    if t is not None and error is not None:
        raise click.UsageError("give either --t or --error, not both")
    for option, value in (("--delta", delta), ("--detector-scale", detector_scale)):
        if value is not None and t is None and error is None:
            raise click.UsageError(f"{option} needs --t or --error")
    source, stats = load(dump, quiet=quiet, chunk_samples=chunk_samples)
    split = probe_split if probe_split is not None else source.meta.get("split")
    report = stats.report(split=split, delta=delta or 0.0, t=t, error=error, detector_scale=detector_scale)
    if plot_path:
        from .plot import plot_report

        plot_report(report, plot_path, title=dump)
    if as_json:
        out = {"dump": dump, **report.to_dict()}
        click.echo(json.dumps(out, indent=2, allow_nan=False))
    else:
        click.echo(render_report(report, dump))


def render_report(report, label: str) -> str:
    header = ["candidate", "n", "N", "r", "T", "AG", "AG/sqrt(N)", "growth_value", "realizability",
              "||C||_F", "rank", "noise_floor"]
    rows = [
        [c.name, num(c.n_samples), num(c.n_hidden), num(c.n_features), num(c.n_positions), num(c.ag),
         num(c.ag_normalized), num(c.growth_value), num(c.realizability), num(c.cross_gradient_norm),
         num(c.feature_rank), num(c.noise_floor)]
        for c in report.candidates
    ]
    lines = [f"{label}: {len(report.candidates)} candidate(s), probe split: {report.split or 'not stated'}",
             table(header, rows),
             f"depth-wide maximum: growth_value {num(report.growth_value_max)} at {report.argmax}; "
             f"AG_max {num(report.ag_max)} at {report.ag_argmax}"]
    if report.test is not None:
        lines.append(render_test(report.test))
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


def render_test(test) -> str:
    verdict = "SATURATED" if test.saturated else "NOT SATURATED"
    relation = "<=" if test.saturated else ">"
    text = (
        f"verdict: {verdict} (separated test, Prop. 1): Gamma_hat = max ||C||_F = {num(test.gamma_hat)} "
        f"at {test.argmax} {relation} delta + t = {num(test.delta)} + {num(test.t)}; "
        f"P(wrong decision) <= {num(test.error_bound)}"
    )
    if test.interval is not None:
        text += f"; Gamma in [{num(test.interval[0])}, {num(test.interval[1])}] at level {num(test.error_level)}"
    if test.detector_threshold is not None:
        verdict = "SATURATED" if test.detector_saturated else "NOT SATURATED"
        text += f"\ndetector (Theorem 3): {verdict}: Gamma_hat vs tau_n = S n^-1/4 = {num(test.detector_threshold)}"
    return text
