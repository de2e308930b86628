"""``satcore score DUMP``: the per-candidate table or the JSON report of SPEC section 8."""

from __future__ import annotations

import json

import click

from .common import CHUNK_OPTION, QUIET_OPTION, FiniteFloatRange, load, num, table


@click.command()
@click.argument("dump")
@click.option("--json", "as_json", is_flag=True, help="Print the satcore-report/1 JSON object instead of a table.")
@click.option("--format", "output_format", type=click.Choice(["table", "json", "jsonl", "csv"]), default=None,
              help="table (default), json (= --json), jsonl (one JSON object per candidate) or csv "
              "(a header, then one row per candidate, name first).")
@click.option("--probe-split", metavar="NAME", help="Split the probe came from (overrides meta 'split').")
@click.option("--delta", type=FiniteFloatRange(min=0), default=None, help="Tolerance delta of the separated test.")
@click.option("--t", "t", type=FiniteFloatRange(min=0, min_open=True), default=None, help="Separation t of the test.")
@click.option(
    "--error",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Error level a: derive t = sqrt(sum sigma^2 / (n a)) (Prop. 1); with --t, the interval at level a "
    "and the probe size that would bring the bound to a at that t.",
)
@click.option(
    "--detector-scale",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Also run Theorem 3's detector: saturated iff Gamma_hat <= S * n^-1/4 (S in ||C||_F units).",
)
@click.option("--plot", "plot_path", metavar="PNG", help="Also draw AG and growth value per candidate (matplotlib).")
@QUIET_OPTION
@CHUNK_OPTION
def score(dump, as_json, output_format, probe_split, delta, t, error, detector_scale, plot_path, quiet, chunk_samples):
    """Score every candidate of DUMP: AG, growth value, realizability, depth-wide maximum.

    With --t (and --delta) or --error, also run the separated saturation test
    of Proposition 1 and print its verdict; with both, also the probe size
    needed for error level a at separation t.
    """
    for option, value in (("--delta", delta), ("--detector-scale", detector_scale)):
        if value is not None and t is None and error is None:
            raise click.UsageError(f"{option} needs --t or --error")
    source, stats = load(dump, quiet=quiet, chunk_samples=chunk_samples)
    split = probe_split if probe_split is not None else source.meta.get("split")
    report = stats.report(split=split, delta=delta or 0.0, t=t, error=error, detector_scale=detector_scale)
    if as_json and output_format not in (None, "json"):
        raise click.UsageError(f"--json and --format {output_format} disagree")
    output_format = "json" if as_json else output_format or "table"
    if output_format == "json":
        out = {"dump": dump, **report.to_dict()}
        click.echo(json.dumps(out, indent=2, allow_nan=False))
    elif output_format in ("jsonl", "csv"):
        click.echo(report.to_jsonl() if output_format == "jsonl" else report.to_csv(), nl=False)
    else:
        click.echo(render_report(report, dump))
    if plot_path:  # after the scores, so that a bad plot path does not cost them
        from .plot import plot_report

        plot_report(report, plot_path, title=dump)


def render_report(report, label: str) -> str:
    # noise_floor = sqrt(sigma^2 / n) is ||C||_F's floor (SPEC section 4), so it sits next to ||C||_F
    header = ["candidate", "n", "N", "r", "T", "AG", "AG/sqrt(N)", "growth_value", "realizability", "rank",
              "||C||_F", "noise_floor(||C||)"]
    rows = [
        [c.name, num(c.n_samples), num(c.n_hidden), num(c.n_features), num(c.n_positions), num(c.ag),
         num(c.ag_normalized), num(c.growth_value), num(c.realizability), num(c.feature_rank),
         num(c.cross_gradient_norm), num(c.noise_floor)]
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
    vacuous = " (vacuous: a bound above 1 says nothing)" if test.error_bound > 1 else ""
    text = (
        f"verdict: {verdict} (separated test, Prop. 1): Gamma_hat = max ||C||_F = {num(test.gamma_hat)} "
        f"at {test.argmax} {relation} delta + t = {num(test.delta)} + {num(test.t)}; "
        f"P(wrong decision) <= {num(test.error_bound)}{vacuous}"
    )
    if test.interval is not None:
        text += f"; Gamma in [{num(test.interval[0])}, {num(test.interval[1])}] at level {num(test.error_level)}"
    if test.required_probe_size is not None:
        text += (f"\nprobe size for P(wrong decision) <= {num(test.error_level)} at t = {num(test.t)}: "
                 f"n >= {test.required_probe_size} (this probe: {test.n_samples})")
    if test.detector_threshold is not None:
        verdict = "SATURATED" if test.detector_saturated else "NOT SATURATED"
        text += f"\ndetector (Theorem 3): {verdict}: Gamma_hat vs tau_n = S n^-1/4 = {num(test.detector_threshold)}"
    return text
