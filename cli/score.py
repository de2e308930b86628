"""``satcore score DUMP``: the per-candidate table with tests and verdicts, or the ``satcore-report/2`` JSON."""

from __future__ import annotations

import json
import os

import click

from satcore.adapter_api import display_name
from satcore import Criteria, Prop1Options
from satcore.adapter_api import DEFAULT_ALPHA
from satcore import InputError
from satcore.adapter_api import check_paired
from satcore import Recipe
from satcore.adapter_api import render_report

from .common import CHUNK_OPTION, QUIET_OPTION, FiniteFloatRange, load, scored
from .numbers import Count


@click.command()
@click.argument("dump")
@click.option("--json", "as_json", is_flag=True, help="Print the satcore-report/2 JSON object instead of a table.")
@click.option("--format", "output_format", type=click.Choice(["table", "json", "jsonl", "csv"]), default=None,
              help="table (default), json (= --json), jsonl (one JSON object per candidate) or csv "
              "(a header, then one row per candidate, name first).")
@click.option("--probe-split", metavar="NAME",
              help="Split the probe came from (default: the dump's meta 'split', which this overrides).")
@click.option("--alpha", type=FiniteFloatRange(0, 1, min_open=True, max_open=True), default=DEFAULT_ALPHA,
              show_default=True, help="Level of the per-candidate tests (Holm across candidates) and intervals.")
@click.option("--tolerance", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
              help="Gain that does not matter: in loss units with --rho (needs the probe's stream RMS), else in "
              "growth-value units. 'saturated' needs a tolerance > 0.")
@click.option("--rho", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Relative size ||h|| / ||z|| of the inserted block: the tolerance is then in loss units and "
              "each candidate's predicted first-order gain rho ||z||_S sqrt(max(U, 0)) is shown (U: the "
              "fold-unbiased V^2; default: none, the tolerance in growth-value units).")
@click.option("--delta", type=FiniteFloatRange(min=0), default=None, help="Prop. 1: tolerance delta (||C||_F units; default 0).")
@click.option("--t", "t", type=FiniteFloatRange(min=0, min_open=True), default=None, help="Prop. 1: separation t (||C||_F units; default: the t whose error bound is --error).")
@click.option(
    "--error",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Prop. 1: error level a (default: alpha): t = sqrt(sum sigma^2 / (n a)); with --t, the interval at "
    "level a and the probe size that would bring the bound to a at that t.",
)
@click.option(
    "--detector-scale",
    type=FiniteFloatRange(min=0, min_open=True),
    default=None,
    help="Also run Theorem 3's detector Gamma_hat <= S * n^-1/4 (S in ||C||_F units; default: not run).",
)
@click.option("--train", "train_dump", metavar="TRAIN_DUMP", default=None,
              help="The same candidates probed on the training split: lead with the predicted training and held-out "
              "gains of --optimizer steps, not verified by any trial (no P(decrease)); DUMP is the held-out probe (default: "
              "none, no prediction).")
@click.option("--optimizer", type=click.Choice(["sgd", "adam", "matched"]), default="sgd", show_default=True,
              help="With --train: the step predicted (matched: the gradient-matched block of relative size --rho).")
@click.option("--lr", type=FiniteFloatRange(min=0, min_open=True), default=None, help="With --train: learning rate (no default: sgd and adam need it).")
@click.option("--steps", type=Count(), default=1, show_default=True, help="With --train: optimizer steps.")
@click.option("--plot", "plot_path", metavar="PNG",
              help="Also draw AG and growth value per candidate (matplotlib), the format from the file's extension "
              "(default: no figure).")
@QUIET_OPTION
@CHUNK_OPTION
def score(dump, **options):
    """Score and test every candidate of DUMP; print the verdict.

    Per candidate: AG, growth value V, its noise floor and unbiased square, a
    sign-flip test of "no first-order gain here" (Holm-adjusted p-value) and
    the verdict improvable / saturated (within --tolerance) / inconclusive.
    Proposition 1's distribution-free test is printed under its own name.
    """
    as_json, output_format, quiet, chunk_samples = (options.pop(k) for k in ("as_json", "output_format", "quiet",
                                                                             "chunk_samples"))
    if as_json and output_format not in (None, "json"):  # a usage error costs no reading
        raise click.UsageError(f"--json and --format {output_format} disagree")
    plot_path, train_dump = options.pop("plot_path"), options.pop("train_dump")
    _check_step_options(train_dump, options["optimizer"], options["lr"], options["rho"])
    if plot_path:  # before any work: a format or target that cannot be written costs nothing, prints nothing
        from .plot import check_plot_path

        check_plot_path(plot_path, inputs=(dump,) if train_dump is None else (dump, train_dump))
    source, stats = load(dump, quiet=quiet, chunk_samples=chunk_samples)
    probe_split = options.pop("probe_split")
    split = probe_split if probe_split is not None else source.meta.get("split")
    criteria = Criteria(*(options.pop(k) for k in ("alpha", "tolerance", "rho")))
    prop1 = Prop1Options(options.pop("delta") or 0.0, *(options.pop(k) for k in ("t", "error", "detector_scale")))
    optimizer, lr, steps = (options.pop(k) for k in ("optimizer", "lr", "steps"))
    train = recipe = None
    if train_dump is not None:
        train = load(train_dump, quiet=quiet, chunk_samples=chunk_samples)[1]
        if os.path.samefile(train_dump, dump):  # both read: they exist
            raise click.UsageError(f"--train {display_name(train_dump)} is DUMP itself: the held-out gain would be "
                                   "measured on the samples the step is fitted on; give the training split's probe")
        try:  # here, where both files are known: a training dump of other candidates or shapes is named
            check_paired(train, stats)
        except InputError as exc:
            raise InputError(f"{display_name(train_dump)}: {exc} (held-out dump {display_name(dump)})") from None
        if optimizer != "matched":  # full-batch steps on the training split: its size is the batch
            recipe = Recipe(optimizer, lr, steps, max(s.n_samples for s in train.values()) or 1)
    report = scored(dump, stats, criteria, split=split, prop1=prop1, stream_rms=stats.stream_rms(source.meta),
                    train=train, recipe=recipe)
    output_format = "json" if as_json else output_format or "table"
    if output_format == "json":
        out = {"dump": dump, **report.to_dict()}
        click.echo(json.dumps(out, indent=2, allow_nan=False))
    elif output_format in ("jsonl", "csv"):
        click.echo(report.to_jsonl() if output_format == "jsonl" else report.to_csv(), nl=False)
    else:
        click.echo(render_report(report, dump))
    if plot_path:  # after the scores, so that a bad plot path does not cost them
        from .plot import draw_or_skip, plot_report

        draw_or_skip(plot_path, lambda: plot_report(report, plot_path, title=dump, inputs=(dump,)))


def _check_step_options(train_dump, optimizer: str, lr, rho) -> None:
    """Refuse, before any work, a step the command would not price as asked: ``--optimizer``, ``--lr`` or
    ``--steps`` without ``--train`` (no prediction would be printed), sgd/adam without ``--lr``, and the
    matched block without ``--rho`` (its relative size) or with ``--lr``/``--steps`` (which it ignores)."""
    given = [f"--{name}" for name in ("optimizer", "lr", "steps")
             if click.get_current_context().get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if train_dump is None:
        if given:
            raise click.UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --train "
                                   "TRAIN_DUMP (the training split's probe the predicted gains are fitted on); without "
                                   "it nothing would be predicted")
    elif optimizer == "matched" and rho is None:
        raise click.UsageError("--optimizer matched needs --rho, the relative size ||h|| / ||z|| of the matched block")
    elif optimizer == "matched" and {"--lr", "--steps"} & set(given):
        raise click.UsageError("--lr and --steps price sgd or adam steps; --optimizer matched is sized by --rho alone")
    elif optimizer != "matched" and lr is None:
        raise click.UsageError("--train needs --lr (or --optimizer matched with --rho)")
