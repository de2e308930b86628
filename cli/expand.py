"""``satcore expand MODEL_DIR --data FILE --blocks K|auto -o OUT_DIR``: grow a pretrained decoder.

Reads the Hugging Face checkpoint directory MODEL_DIR (never writes to it),
decides where identity blocks go on the user's data
(:func:`satcore.adapters.torch.expand`), and writes OUT_DIR: the grown model
(``save_pretrained``, safetensors, the config counting the new layers), the
tokenizer files copied, ``expansion.json`` (positions, the evidence per
candidate, the decision's cost, the LLaMA-Factory / ms-swift settings) and
``mergekit.yaml`` (the same layout rebuilt from MODEL_DIR by ``mergekit-yaml``).
OUT_DIR must not exist or be empty; it is written under a temporary name and
renamed into place, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import time

import click

from satcore import InputError, ModelOnDataError, ProbeError
from satcore.adapter_api import (DEFAULT_ALPHA, NOT_VERIFIED, SCREEN_READING, decision_interval_notes,
                                 parse_whole_number)

from .common import FiniteFloatRange, announced, display_name, model_on_data, num, table
from .expand_report import SEQ_LEN_RULE, defaults_line, frontier_report, moves_report, plot_frontier, stop_line
from .hf_dir import window_length
from .numbers import MAX_SEED, Count
from .out_dir import check_out_dir, refuse_inside_model_dir, staged_out_dir

COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


def _blocks_option(ctx, param, value):
    if value is None or value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither an integer nor 'auto'") from None
    if k < 1:
        raise click.BadParameter(f"{value!r}: at least 1 block; --blocks auto decides whether to add any")
    return k


def _at_option(value, n_blocks: int, block_names: list[str]):
    """``--at`` entries (block names, indices or ``head``) as original block indices or ``"head"``; at most one
    per place of the model (the count is checked before any entry is read)."""
    from satcore.adapters.torch.input_bounds import check_new_block_count

    items = [v.strip() for v in value.split(",", n_blocks + 1)]
    check_new_block_count(len(items) if len(items) <= n_blocks + 1 else value.count(",") + 1, n_blocks, "--at")
    out = []
    for item in items:
        if item == "head":
            out.append("head")
        elif item in block_names:
            out.append(block_names.index(item))
        else:
            try:
                out.append(parse_whole_number(item, "--at", 0, n_blocks - 1))
            except InputError:
                shown = item if len(item) <= 40 else f"a {len(item)}-character entry"
                raise click.BadParameter(f"{shown!r} is not a block of the model ({block_names[0]} .. "
                                         f"{block_names[-1]}, an index 0..{n_blocks - 1}, or head)",
                                         param_hint="--at") from None
    return out


SIZED_NOTE = " (sized so the trials pass over their windows at most twice)"


@contextlib.contextmanager
def _led_by(option: str | None):
    """A data file's refusal raised inside, led by ``option`` where given: the command reads two data files, and a
    refusal of the second naming only its path read as one of ``--data``'s (``model_on_data`` leads so too)."""
    try:
        yield
    except InputError as exc:
        if option is None:
            raise
        raise InputError(f"{option} {exc}") from None


def _sized_windows(model, recipe, windows: dict, fraction: float, general_path, max_blocks, freeze_old
                   ) -> tuple[int, str]:
    """``(--max-windows, rule)`` without the option under ``--blocks auto``: the frontier's own count
    (:func:`~satcore.adapters.torch.expansion_frontier.frontier_windows`), at least the default; capped, with one
    line, at what the memory budget holds of token ids (the reader's bound)."""
    from satcore.adapter_api import memory_budget
    from satcore.adapters.torch.expansion_frontier import DecisionBudget, frontier_windows

    least = windows["max_windows"]
    sized = frontier_windows(model, recipe, seq_len=windows["seq_len"], max_blocks=max_blocks,
                             budget=DecisionBudget(fraction, general=general_path), train_new_only=freeze_old,
                             least=least)
    if sized <= least:
        return least, "default"
    cap = max(least, memory_budget() // (8 * windows["seq_len"]))
    if sized > cap:
        click.echo(f"--max-windows {sized:,} would keep the trials within 2 passes over their windows; capped at "
                   f"{cap:,}, what the memory budget holds (SATCORE_MEMORY_BUDGET): the plan warns of the passes")
        return cap, "capped"
    return sized, "sized"


def _max_windows_value(count: int, rule: str, read: int | None) -> str:
    """The line of defaults' ``--max-windows``: the ``count``, why where ``rule`` is ``"sized"``, and the windows
    ``--data`` held where it ``read`` fewer (a user read the sized 1750 as windows read, where the file held 179 and
    the trials passed over theirs 31 times; the plan's warning then names what to give)."""
    held = "" if read is None or read >= count else f" (--data holds {read:,})"
    return f"{count}{SIZED_NOTE if rule == 'sized' else ''}{held}"


def _announcer(first: str | None):
    """``click.echo`` for a budgeted decision's plan, with ``first`` (the defaults line) echoed before the plan's
    lines: after the decision has checked its budget, so that a budget it refuses is one line."""
    pending = [first] if first else []

    def announce(text: str) -> None:
        while pending:
            click.echo(pending.pop())
        click.echo(text)

    return announce


def _check_recorded_path(path: str, option: str) -> None:
    """Refuse a data ``path`` that is not UTF-8 before any work: expansion.json and the model card record it (the
    card, UTF-8 text, could not hold it: the decision ran, then the write failed)."""
    try:
        os.fsencode(os.path.abspath(path)).decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{option} {display_name(path)}: the path is not UTF-8, which expansion.json and the model "
                         "card record; rename the file (or link it under a UTF-8 name)") from None


def _same_file(first: str, second: str) -> bool:
    """Whether the paths name one file (however spelled or linked); a missing one is refused by its reader."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _check_counts(config: dict, blocks, max_blocks, model_dir: str) -> None:
    """Refuse a ``--blocks K`` or ``--max-blocks`` the model's layer count (from its ``config.json``, where it
    names one) cannot take, before the weights are read: ``L`` layers have ``L + 1`` places, and the frontier's
    arms go up to ``L`` blocks at most (:func:`~satcore.adapters.torch.expansion.max_blocks_cap`)."""
    from satcore.adapters.torch.checkpoint_dir import LAYER_KEYS

    key = next((k for k in LAYER_KEYS if k in config), None)
    if key is None:
        return  # the architecture's default: checked on the built model (expand)
    layers, shown = config[key], f"{key} {config[key]} in {display_name(model_dir)}/config.json"
    if isinstance(blocks, int) and blocks > layers + 1:
        raise InputError(f"--blocks {blocks}: the model has {layers + 1} places for a block ({shown}, and the head); "
                         f"give at most --blocks {layers + 1}")
    if max_blocks is not None and max_blocks > layers:
        raise InputError(f"--max-blocks {max_blocks}: more blocks than the model's layers ({shown}); give at most "
                         f"--max-blocks {layers}")


def _window_tokens(seq_len: int | None, config, on_gpu: bool) -> int:
    """``--seq-len``, else ``min(128, context)`` on a CPU, ``min(256, context)`` on a GPU (``config``: the model's
    config, or its ``config.json`` object before the weights are read)."""
    return seq_len or min(window_length(config), 256 if on_gpu else 128)


def _check_seq_len(seq_len: int | None, context: tuple[str, int] | None, model_dir: str) -> None:
    """Refuse a ``--seq-len`` longer than the model's ``context`` (:func:`~satcore.adapters.torch.hf.context_length`
    of its ``config.json`` or its built config; ``None``: it names none)."""
    if seq_len is not None and context is not None and seq_len > context[1]:
        raise InputError(f"--seq-len {seq_len}: longer than the model's context ({context[0]} {context[1]} in "
                         f"{display_name(model_dir)}/config.json)")


def _check_statistics_cap(model, data, policy, gib: float) -> None:
    """Refuse a ``--max-statistics-gib`` below what the decision's smallest probe pass holds (the largest place's
    statistics, or the last block's and the head's together, both splits), naming the least that works, before
    any decision runs (one forward pass of one window plans it)."""
    from satcore.adapters.torch.expansion import probe_memory_plan
    from satcore.adapters.torch.probe import gib_up

    window = data[:1]
    least = probe_memory_plan(model, ({"input_ids": window}, window), policy).least_max_bytes(splits=2)
    if policy.max_statistics_bytes < least:
        raise InputError(f"--max-statistics-gib {gib:g}: the decision's smallest probe pass holds {least:,} bytes of "
                         "statistics (the largest place's, or the last block's and the head's together, both "
                         f"splits); give at least --max-statistics-gib {gib_up(least)}")


def _report(expansion) -> str:
    from satcore.adapters.torch.expansion import TrialRanking, _original_index

    lines = [f"{len(expansion.new_blocks)} new block(s) at positions {expansion.positions} "
             f"(inserted before original blocks {expansion.inserted_before}), init={expansion.init}"]
    decision = expansion.decision
    groups = expansion.to_dict()["groups"]
    if groups is not None:
        lines.append("layout grouped, one block per group of places: "
                     + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups))
    if expansion.budgeted is not None and hasattr(expansion.budgeted, "arms"):
        return "\n".join(lines[1:] if not expansion.new_blocks else lines) + "\n" + "\n".join(frontier_report(expansion))
    if decision is not None:
        rows = []
        chosen = set(expansion.inserted_before)
        ranking = decision.ranking()
        for name in ranking:
            c = decision.candidates[name]
            rows.append([name, *_evidence_cells(c), "yes" if _original_index(name) in chosen else ""])
        lines += ["", table(["candidate", "predicted held-out change", "95% interval", "P(decrease)", "evidence",
                             "chosen"], rows),
                  *_table_notes(decision.candidates, ranking, chosen, moves=expansion.budgeted is not None,
                                moved={m.proposed for m in getattr(expansion.budgeted, "moves", ()) if m.moved}),
                  ""]
        if expansion.budgeted is not None:
            lines += moves_report(expansion)
        else:
            unbudgeted = " (the trials' steps, not held to --decision-budget)" if isinstance(decision, TrialRanking) \
                else ""
            lines.append(f"decision cost: {decision.cost_block_steps} block-steps{unbudgeted}")
        if stop := stop_line(expansion):
            lines.append(stop)
    return "\n".join(lines)


def _evidence_cells(c) -> list[str]:
    """A ranking row's change, interval, P(decrease) and evidence cells (``c``: a
    :class:`satcore.CandidateDecision`).  A candidate no trial verified (every row of ``--decision screen``
    and of the placement check's screen) has no interval or P(decrease): the words "not verified" stand there."""
    if not c.verified:
        return [f"{num(c.predicted_heldout_change)} (screen)", "-", NOT_VERIFIED, f"screen ({NOT_VERIFIED})"]
    return [num(c.predicted_heldout_change), f"[{num(c.interval[0])}, {num(c.interval[1])}]", num(c.p_decrease),
            "trial"]


# the unit, where the table shows none, with how to read the size: the screen's value is the recipe's step
# extrapolated linearly over all its steps, and on a pretrained model can run past the held-out loss itself
SCREEN_SIZE = f"the screen's held-out change is in nats, a linear extrapolation: {SCREEN_READING}"


def _table_notes(rows: dict, order: list[str], chosen: set, moves: bool = False, moved=()) -> list[str]:
    """The lines under the ranking (``rows``, the candidates' :class:`satcore.CandidateDecision`, in the table's
    ``order``) that say what its columns are where they could mislead; ``chosen``: the original indices blocks
    went before; ``moves``: the rows are the placement check's screen, which proposed the moves its trials
    tested; ``moved``: the original indices a block was moved to by those trials (chosen by a trial, so not
    "chosen although not verified" although their screen rows are)."""
    from satcore.adapters.torch.expansion import _original_index

    trialled = [n for n in order if rows[n].verified]
    if not trialled:
        notes = [f"evidence: every row is the first-order screen's ({NOT_VERIFIED}: the recipe's step priced "
                 f"linearly, no trial of a place ran); {SCREEN_SIZE}; it has no interval or P(decrease): the "
                 "screen's own fold interval omits its error and reads as near-certain; its order "
                 + ("proposes the moves below" if moves else "ranks the places")]
    elif len(trialled) < len(order):
        notes = ["evidence: 'trial' rows are short trials of the recipe, extrapolated and calibrated; 'screen' rows "
                 f"are {NOT_VERIFIED}: no trial ran, they show the first-order screen's value (not comparable with "
                 f"the trials', often far off in magnitude; {SCREEN_SIZE}) and no interval or P(decrease); their "
                 "order is the screen's, no trial chose them"]
    else:
        notes = ["evidence: every place was verified by a short trial of the recipe (extrapolated, calibrated)"]
    notes += decision_interval_notes({n: rows[n] for n in order}, DEFAULT_ALPHA)
    placed = [n for n in order if _original_index(n) in chosen]
    uncertain = [n for n in placed if rows[n].interval is not None and rows[n].interval[1] >= 0]
    unverified = [n for n in placed if rows[n].interval is None and _original_index(n) not in moved]
    if uncertain:
        notes.append(f"{', '.join(uncertain)}: chosen although the 95% interval reaches 0: --blocks K puts K blocks "
                     "whatever the intervals (uniform places unless a trial moves one; the best-ranked with --layout "
                     "ranked); whether to add any is --blocks auto's question")
    if unverified and moves:
        notes.append(f"{', '.join(unverified)}: chosen although {NOT_VERIFIED}: --blocks K puts K blocks at uniform "
                     "places unless a trial moves one; whether to add any is --blocks auto's question")
    elif unverified and not trialled:
        notes.append(f"{', '.join(unverified)}: chosen although {NOT_VERIFIED}: --blocks K puts K blocks at the "
                     "places the screen ranks first (one per group with --layout grouped); whether to add any is "
                     "--blocks auto's question, answered by trials")
    elif unverified:
        notes.append(f"{', '.join(unverified)}: chosen although {NOT_VERIFIED}: --blocks K takes the K best-ranked "
                     "places whatever their evidence, and the trials verified fewer places than that")
    if moved_there := [n for n in placed if _original_index(n) in moved]:
        notes.append(f"{', '.join(moved_there)}: chosen because a paired trial against uniform favoured the move "
                     "(placement, below); its row is the screen's that proposed it")
    return notes


@click.command()
@click.argument("model_dir", type=click.Path())
@click.option("--data", "data_path", default=None, metavar="FILE",
              help="UTF-8 text (tokenised with MODEL_DIR's tokenizer), or token ids: .npz with input_ids, .jsonl. "
              "Required unless --at forces the places.")
@click.option("--blocks", callback=_blocks_option, default=None, metavar="K|auto",
              help="How many blocks: K, or auto (K = 0, 1, 2, 4, ... --max-blocks at uniform places; a K > 0 "
              "counts only where it beats K = 0 credibly, paired on the same windows (its 95% interval, the trials' "
              "noise and the error of carrying them to your steps, below 0, its point below minus --tolerance); of those, the fewest whose predicted held-out loss after your "
              "training is within --tolerance of the best; none when expanding does not pay; trials only, not "
              "with --decision screen). Required unless --at gives the places.")
@click.option("-o", "--out", "out_dir", required=True, metavar="OUT_DIR", help="Directory to write (new or empty).")
@click.option("--at", "at", default=None, metavar="NAME,...",
              help="Force the positions: original block names or indices to insert before, or head (default: the "
              "decision places the blocks).")
@click.option("--init", type=click.Choice(("copy", "fresh")), default="copy", show_default=True,
              help="copy: LLaMA-Pro (the preceding block, output projections zeroed); fresh: the model's own "
              "initialisation, output projections zeroed.")
@click.option("--freeze-old", is_flag=True, help="Train only the new blocks (recorded for the trainer exports).")
@click.option("--optimizer", type=click.Choice(("adamw", "adam", "sgd")), default="adamw", show_default=True,
              help="Optimizer of the training the decision prices.")
@click.option("--lr", type=FiniteFloatRange(min=0, min_open=True), default=2e-4, show_default=True,
              help="Learning rate of that training.")
@click.option("--steps", type=Count(min=1), default=1000, show_default=True,
              help="The steps of the training you plan for the expanded model; the decision spends at most "
              "--decision-budget of them.")
@click.option("--batch-size", type=Count(min=1), default=8, show_default=True,
              help="Its batch size (windows); also the unit of the decision's cost.")
@click.option("--decision-budget", type=FiniteFloatRange(min=0, min_open=True, max=1), default=0.1,
              show_default=True, metavar="FRACTION",
              help="The most of the planned training's FLOPs (--steps) the decision spends, a fraction; a budget it cannot "
              "decide within, even reading only 8 held-out windows, is refused, naming one that would do.")
@click.option("--general-data", "general_path", default=None, metavar="FILE",
              help="With --blocks auto: text (or token ids) of the model's old domain: each trial also measures "
              "the change of its held-out loss (forgetting), shown beside the gain (default: none, no forgetting "
              "measured).")
@click.option("--max-forgetting", type=FiniteFloatRange(min=0), default=None, metavar="NATS",
              help="With --blocks auto and --general-data: no K whose predicted general loss change after --steps "
              "(extrapolated from the short trials) exceeds it, in nats per token (the loss's units; default: no "
              "limit). It limits that prediction, not the realized change after your training, which can exceed it.")
@click.option("--tolerance", type=FiniteFloatRange(min=0), default=None, metavar="NATS",
              help="--blocks auto takes blocks only where they beat K = 0 by more than this, credibly, then the "
              "fewest within it of the best; a move needs a gain beyond it, in nats per token (the loss's units; "
              "default 0.3% of the held-out loss).")
@click.option("--race/--no-race", default=True, show_default=True,
              help="With --blocks auto: stop the trials once no K > 0 can still beat K = 0 credibly (off with "
              "--max-forgetting); the budget not spent is your training's, and the cost printed at the end is what "
              "was spent.  --no-race: every trial to its end.")
@click.option("--plot", "plot_path", default=None, metavar="PNG",
              help="With --blocks auto: the frontier as a figure, its format from the file's extension (needs "
              "matplotlib; skipped with a note without it; default: no figure).")
@click.option("--quiet", is_flag=True, help="No plan, no defaults line, no progress bar; the report only.")
@click.option("--seq-len", type=Count(min=2), default=None,
              help=f"Tokens per window (default {SEQ_LEN_RULE}).")
@click.option("--max-windows", type=Count(min=4), default=None,
              help="Windows of data read at most (default 64 on a CPU, 256 on a GPU; with --blocks auto, more where "
              "needed so each trial passes over its training windows at most twice): with --blocks auto the trials "
              "train on every window not held out, and as many are held out as a quarter of --decision-budget "
              "reads (at least 8, at most half); otherwise half train the decision, half are held out.")
@click.option("--max-blocks", type=Count(min=1, shown="1<=x<=the model's layers"), default=None,
              help="With --blocks auto: at most this many (default a quarter of the layers).")
@click.option("--seed", type=Count(min=0, max=MAX_SEED), default=0, show_default=True,
              help="Seed of the fresh blocks' draws and of the decision's trials.")
@click.option("--decision", type=click.Choice(("trial", "screen")), default="trial", show_default=True,
              help="trial: short trials within --decision-budget (--blocks auto: the frontier over K; --blocks K: "
              "the placement check, the first-order screen proposing the moves); screen: the first-order screen "
              "alone (its cost is the probe; --blocks K only: its rows are not verified, no interval or "
              "P(decrease), and without a trial it cannot price K = 0 against K > 0). "
              "Experimental: screen, whose first-order values do not price a trained block's held-out gain "
              "(studies/decision-validity.md).")
@click.option("--layout", type=click.Choice(("grouped", "ranked")), default="grouped", show_default=True,
              help="grouped: one block per contiguous group of places (LLaMA-Pro's), at the uniform place unless a "
              "trial within --decision-budget credibly favours the screen's place in the group; ranked: the trial "
              "decision's top K places anywhere in the stack (its trials train one block for the whole --steps; no "
              "progress bar). "
              "Experimental: ranked, which lost to uniform interleave on the head-to-head "
              "(studies/expansion-head-to-head-notes.md).")
@click.option("--max-statistics-gib", type=FiniteFloatRange(min=0, min_open=True, max=2**30), default=None,
              metavar="GIB",
              help="The most probe statistics the decision holds at once (both splits), in GiB: the places are "
              "probed in groups that fit, one pass over the data per group (default: all places in one pass). "
              "At least the last block's and the head's together (they share one pass).")
@click.pass_context
def expand(ctx, model_dir, data_path, blocks, out_dir, at, init, freeze_old, optimizer, lr, steps, batch_size,
           decision_budget, general_path, max_forgetting, tolerance, race, plot_path, quiet, seq_len, max_windows,
           max_blocks, seed, decision, layout, max_statistics_gib):
    """Grow the decoder in MODEL_DIR by identity blocks where the evidence on FILE says; write OUT_DIR.

    --blocks auto decides whether to expand and by how many blocks: short trials of K = 0 (the model as it is,
    trained the same way) and K = 1, 2, 4, ... blocks at LLaMA-Pro's uniform places, within --decision-budget of
    the training you plan (--steps, --batch-size, --lr); it adds blocks only where they beat K = 0 credibly (the
    fewest within --tolerance of the best of those), and none when expanding does not pay.  --blocks K places K blocks: uniform places unless a trial credibly
    favours a move."""
    if blocks is not None and at is not None:
        raise click.UsageError("give --blocks K|auto or --at NAME,..., not both")
    if blocks is None and at is None:
        raise click.UsageError("give --blocks K|auto, or --at NAME,... to force the positions")
    if data_path is None and at is None:
        raise click.UsageError("--data FILE is required unless --at forces the positions")
    if max_blocks is not None and blocks != "auto":
        raise click.UsageError(f"--max-blocks caps --blocks auto only; with {'--at' if at else f'--blocks {blocks}'} "
                               "it would be ignored")
    if ctx.get_parameter_source("layout") is not click.core.ParameterSource.DEFAULT and (blocks == "auto" or at):
        # --blocks auto's arms sit at LLaMA-Pro's uniform places and --at names them: a layout given went unused
        raise click.UsageError(f"--layout places --blocks K's blocks; with {'--at' if at else '--blocks auto'} (its "
                               f"{'places as given' if at else 'arms at uniform places'}) it would be ignored")
    if max_statistics_gib is not None and at is not None:
        raise click.UsageError("--max-statistics-gib caps the decision's probe; with --at no decision is made, so it "
                               "would be ignored")
    race_flag = ("--race" if race else "--no-race") \
        if ctx.get_parameter_source("race") is not click.core.ParameterSource.DEFAULT else None
    frontier_only = [flag for flag, value in (("--general-data", general_path), ("--max-forgetting", max_forgetting),
                                              ("--plot", plot_path), (race_flag, race_flag)) if value is not None]
    if frontier_only and blocks != "auto":  # name what was given, and with what, as --max-blocks's refusal does
        raise click.UsageError(f"{' and '.join(frontier_only)} belong{'s' if len(frontier_only) == 1 else ''} to "
                               f"--blocks auto's frontier; with {'--at' if at else f'--blocks {blocks}'} "
                               f"{'it' if len(frontier_only) == 1 else 'they'} would be ignored")
    if max_forgetting is not None and general_path is None:
        raise click.UsageError("--max-forgetting needs --general-data (the general loss is measured on it)")
    if general_path is not None and data_path is not None and _same_file(general_path, data_path):
        # its windows would be the trials' training windows: a "general change" that only falls, whatever it costs
        raise click.UsageError(f"--general-data {display_name(general_path)} is the --data file; give other text, of "
                               "the model's old domain: the general loss measures what the training costs there")
    if max_forgetting is not None and race_flag == "--race":
        raise click.UsageError("--race with --max-forgetting: the race is off under --max-forgetting (an arm over it "
                               "can leave K = 0 out, the arm the race compares against); drop --race")
    if blocks == "auto" and decision == "screen":
        raise click.UsageError("--blocks auto with --decision screen: the screen runs no trial, so it cannot price "
                               "K = 0 against K > 0; give --blocks K with --decision screen, or drop --decision "
                               "screen for the trial frontier")
    max_statistics_bytes = None if max_statistics_gib is None else int(max_statistics_gib * 2**30)
    if max_statistics_bytes == 0:
        raise click.UsageError(f"--max-statistics-gib {max_statistics_gib:g}: less than one byte")
    check_out_dir(out_dir, source_dir=model_dir)
    for path, option in ((data_path, "--data"), (general_path, "--general-data")):
        if path is not None:
            _check_recorded_path(path, option)
    if plot_path is not None:  # its target and format before any work; a missing matplotlib only skips the figure
        from satcore.adapter_api import check_target

        from .plot import plot_format

        # the figure may go into the -o directory, which expand makes; any other folder must be there now
        into_out_dir = os.path.dirname(os.path.abspath(plot_path)) == os.path.abspath(out_dir)
        check_target(plot_path, [p for p in (data_path, general_path) if p], folder_exists=not into_out_dir)
        refuse_inside_model_dir(plot_path, model_dir)
        plot_format(plot_path)
    from satcore import DecisionPolicy, Recipe
    from satcore.adapter_api import regular_file
    from satcore.adapters.torch.checkpoint_dir import (EXPAND_COPIES, MIN_WINDOWS, check_checkpoint_dir,
                                                       checkpoint_dtype, hf_config, load_causal_lm,
                                                       load_tokenizer, read_config, read_token_windows,
                                                       tokenizer_load_note)
    from satcore.adapters.torch.expansion import ExpansionOptions, check_trials_batch, decoder_stack, split_batches
    from satcore.adapters.torch.expansion import expand as expand_model
    from satcore.adapters.torch.expansion_exports import lora_adapter_config, write_training_exports
    from satcore.adapters.torch.expansion_frontier import decision_time_line
    from satcore.adapters.torch.locate import find_blocks
    from satcore.adapters.torch.hf import context_length

    import torch

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one report on stdout, no bars on stderr
    on_gpu = torch.cuda.is_available()
    check_checkpoint_dir(model_dir)
    for name in COPIED_FILES:  # copied into OUT_DIR at the end: a FIFO or a device is refused now, not skipped then
        regular_file(os.path.join(model_dir, name), f"{display_name(model_dir)}/{name}")
    config = read_config(model_dir)
    # each read once, where first needed (text data needs the tokenizer; it and the model take the built config)
    read_hf_config = functools.cache(lambda: hf_config(model_dir))
    tokenizer = functools.cache(lambda: announced(None if quiet else tokenizer_load_note(model_dir),
                                                  lambda: load_tokenizer(model_dir, read_hf_config())))
    saved_dtype = checkpoint_dtype(config)
    _check_counts(config, blocks, max_blocks, model_dir)  # before the weights are read
    _check_seq_len(seq_len, context_length(config), model_dir)  # so too where config.json names the context
    if isinstance(config.get("vocab_size"), int):  # a file's refusal (empty, too short, text without a tokenizer,
        # not UTF-8, ids past the vocabulary) before the weights are read: the fewest windows expand takes, read
        # again in full once the model has sized them
        for path, option in ((data_path, None), (general_path, "--general-data")):
            with _led_by(option):
                if path is not None:
                    read_token_windows(path, tokenizer_dir=model_dir, vocab_size=config["vocab_size"],
                                       seq_len=_window_tokens(seq_len, config, on_gpu), max_windows=MIN_WINDOWS,
                                       tokenizer=tokenizer)
    # decided in float32, saved in the checkpoint's dtype
    model = load_causal_lm(model_dir, copies=EXPAND_COPIES, raw=config, read_hf_config=read_hf_config)
    try:
        names, _ = decoder_stack(model)
    except ProbeError as exc:
        raise ProbeError(f"{display_name(model_dir)}: {exc}") from None
    recipe = Recipe(optimizer, lr=lr, steps=steps, batch_size=batch_size, trainable="block")
    forced = None if at is None else _at_option(at, len(names), names)
    _check_seq_len(seq_len, context_length(model.config), model_dir)  # the architecture's default context
    data = general = None
    windows = {"seq_len": _window_tokens(seq_len, model.config, on_gpu),
               "max_windows": max_windows or (256 if on_gpu else 64)}
    windows_rule = "given" if max_windows is not None else "default"
    if max_windows is None and blocks == "auto" and decision == "trial" and data_path is not None:
        windows["max_windows"], windows_rule = _sized_windows(model, recipe, windows, decision_budget, general_path,
                                                              max_blocks, freeze_old)
    if data_path is not None:  # with --at, read only to check it: the places are forced
        data = read_token_windows(data_path, tokenizer_dir=model_dir, vocab_size=model.config.vocab_size,
                                  tokenizer=tokenizer, **windows)
    if general_path is not None:  # held out only: as many windows as the target's held-out half
        with _led_by("--general-data"):
            general = read_token_windows(general_path, tokenizer_dir=model_dir, vocab_size=model.config.vocab_size,
                                         seq_len=windows["seq_len"], max_windows=max(4, windows["max_windows"] // 2),
                                         tokenizer=tokenizer)
    tokenizer.cache_clear()  # every file is read: not held through the decision (2 GB for a 64 MB tokenizer.json)
    if forced is not None and data is not None:
        click.echo(f"--data {display_name(data_path)}: checked, not read: --at forces the positions")
        data = None
    # the flags, as the two objects expand reads: the decision's policy and how the model grows
    policy = DecisionPolicy(recipe, seed=seed, max_statistics_bytes=max_statistics_bytes)
    if max_statistics_bytes is not None and data is not None:
        _check_statistics_cap(model, data, policy, max_statistics_gib)
    if forced is None and decision == "trial" and blocks != "auto" and layout == "ranked":  # before the defaults line
        check_trials_batch(*split_batches(data), recipe)
    line = None
    if forced is None and not quiet:  # every decision prices the planned training on windows so read
        assumed = {f"--{name.replace('_', '-')}": value for name, value in
                   (("optimizer", optimizer), ("steps", steps), ("batch_size", batch_size), ("lr", lr),
                    ("seq_len", windows["seq_len"]),
                    ("max_windows", _max_windows_value(windows["max_windows"], windows_rule,
                                                       None if data is None else len(data))))
                   if ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT}
        line = defaults_line(assumed, on_gpu, sized=blocks == "auto" and decision == "trial")
    budget, announce = None, None if quiet or forced is not None else _announcer(line)
    if forced is None and decision == "trial" and (blocks == "auto" or layout == "grouped"):
        from satcore.adapters.torch.expansion_frontier import DecisionBudget

        budget = DecisionBudget(decision_budget, general=general, max_forgetting=max_forgetting, tolerance=tolerance,
                                progress=not quiet, race=race, announce=announce)
    elif line and decision != "screen":  # the screen announces its plan after the line (ExpansionOptions.announce)
        click.echo(line)
    if on_gpu and forced is None:
        model = model.to("cuda")
    options = ExpansionOptions(at=forced, init=init, train_new_only=freeze_old, max_blocks=max_blocks,
                               decision=decision, layout=layout, budget=budget, progress=not quiet,
                               announce=announce if decision == "screen" else None)
    started = time.monotonic()
    try:
        expansion = expand_model(model, data, blocks=blocks, policy=policy, options=options)
    except ModelOnDataError as exc:  # a batch the model cannot take or scores NaN on: the model's, on the data
        raise ProbeError(model_on_data(model_dir, general_path, str(exc), "--general-data") if exc.split == "general"
                         else model_on_data(model_dir, data_path, str(exc))) from None
    took = time.monotonic() - started  # the decision's wall time (with the blocks' insertion, a copy), not the saving
    with staged_out_dir(out_dir, prefix=".satcore-expand-") as staging:
        grown = expansion.model.to(getattr(torch, saved_dtype))
        grown.save_pretrained(staging, safe_serialization=True)
        for name in COPIED_FILES:
            if os.path.isfile(os.path.join(model_dir, name)):
                shutil.copyfile(os.path.join(model_dir, name), os.path.join(staging, name))
        record = expansion.to_dict()
        record["source"] = os.path.abspath(model_dir)
        record["max_statistics_bytes"] = max_statistics_bytes  # None: every place in one probe pass
        record["data"] = None if data is None else {"file": os.path.abspath(data_path), "windows": len(data),
                                                    "seq_len": data.shape[1], "max_windows": windows["max_windows"],
                                                    "max_windows_rule": windows_rule}
        # read: what the file gave (half the target's --max-windows); used: what the trials were read on
        record["general_data"] = None if general is None else {
            "file": os.path.abspath(general_path), "windows_read": len(general),
            "windows_used": record["decision"]["windows"]["general"]}
        with open(os.path.join(staging, "expansion.json"), "w") as stream:
            json.dump(record, stream, indent=1)
        with open(os.path.join(staging, "mergekit.yaml"), "w") as stream:
            stream.write(expansion.mergekit_yaml(os.path.abspath(model_dir), saved_dtype))
        peft_config = lora_adapter_config(grown, find_blocks(grown), expansion.positions, os.path.abspath(out_dir))
        write_training_exports(staging, record, peft_config, out_dir)
    click.echo(_report(expansion))
    if forced is None and not quiet:  # beside the estimate printed before its work ran
        click.echo(decision_time_line(took, expansion.step_times))
    if plot_path is not None and (skipped := plot_frontier(expansion, plot_path,
                                                           inputs=[p for p in (data_path, general_path) if p])):
        click.echo(skipped)
    grown_layers = (f"{expansion.n_original} -> {expansion.n_original + len(expansion.new_blocks)} layers"
                    if expansion.new_blocks else f"the model unchanged ({expansion.n_original} layers, no block "
                    "inserted)")
    written = [name for name in ("expansion.json", "mergekit.yaml", "peft/adapter_config.json", "llamafactory.yaml")
               if os.path.exists(os.path.join(out_dir, name))]
    if os.path.exists(os.path.join(out_dir, "README.md")):
        written.append("README.md (the model card" + (": how to train the new blocks)" if expansion.new_blocks else ")"))
    click.echo(f"wrote {display_name(out_dir)}: {grown_layers}, {', '.join(written)}")

