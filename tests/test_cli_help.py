"""Every ``satcore`` command's ``--help`` is plain text for users: no Sphinx roles or reStructuredText literals
(a docstring written for the API docs shows through click as ``:func:`model_identity``` otherwise), and the
words of ``expand --help`` are the documented rule (auto: the fewest blocks within the tolerance of the best of the
frontier, none when expanding does not pay; not "significant")."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from satcore.cli.main import main


@pytest.mark.parametrize("command", sorted(main.commands))
def test_help_has_no_sphinx_markup(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert not re.search(r":(func|class|mod|meth|attr|data):|``", result.output), result.output


def test_expand_help_states_the_rule_auto_counts_by():
    text = " ".join(CliRunner().invoke(main, ["expand", "--help"]).output.split())
    assert "significant" not in text
    assert ("auto (K = 0, 1, 2, 4, ... --max-blocks at uniform places; a K > 0 counts only where it beats K = 0 "
            "credibly, paired on the same windows (its 95% interval, the trials' noise and the error of carrying them to "
            "your steps, below 0, its point below minus --tolerance); of "
            "those, the fewest whose predicted held-out loss after your training is within --tolerance of the best; "
            "none when expanding does not pay") in text
    assert "default 0.3% of the held-out loss" in text  # the tolerance, as docs/expansion.md states it


def test_expand_help_and_the_line_of_defaults_state_one_seq_len_rule():
    """--seq-len's default is min(the model's context, 128 on a CPU, 256 on a GPU): the help said "256 on a GPU",
    the line of defaults "min(256, context)"; both now say the rule the command applies."""
    from satcore.cli.expand_report import defaults_line

    text = " ".join(CliRunner().invoke(main, ["expand", "--help"]).output.split())
    rule = "min(128, the model's context) on a CPU, min(256, the model's context) on a GPU"
    assert f"Tokens per window (default {rule})." in text
    assert f"--seq-len: {rule}" in defaults_line({"--seq-len": 128}, on_gpu=False, sized=False)


def _options():
    """``(command path, option)`` of every option of ``satcore`` and its subcommands, ``--help`` left out."""
    import click

    def walk(command, path):
        for param in command.params:
            if isinstance(param, click.Option) and param.name != "help":
                yield path, param
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            yield from walk(sub, f"{path} {name}")

    return list(walk(main, "satcore"))


def test_every_option_has_help_that_states_its_default():
    """Every option of every command says what it does, and one that takes a value says what happens without it:
    a shown default, the word default in its help, or that it is required (an on/off flag is off unless given).
    --at, --plot, --rho, --t, --split, ... said nothing of what they are when not given."""
    options = _options()
    assert len(options) > 60  # the walk reached the subcommands
    missing = []
    for path, option in options:
        text = " ".join((option.help or "").split())
        on_off = option.is_flag and not option.secondary_opts
        shown = option.show_default and option.default is not None
        if not text or not (on_off or shown or option.required or re.search(r"\b(default|required)\b", text, re.I)):
            missing.append(f"{path} {option.opts[-1]}: {text!r}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("command, option, unit", [
    ("expand", "--tolerance", "nats per token"), ("expand", "--max-forgetting", "nats per token"),
    ("expand", "--decision-budget", "a fraction"), ("expand", "--max-statistics-gib", "in GiB"),
    ("expand", "--seq-len", "Tokens per window"), ("expand", "--batch-size", "(windows)"),
    ("score", "--delta", "||C||_F units"), ("score", "--t", "||C||_F units"), ("score", "--detector-scale", "||C||_F units"),
    ("score", "--tolerance", "growth-value units"), ("sweep", "--rel-tol", "a fraction"),
    ("score", "--chunk-samples", "Samples per chunk"), ("probe", "--batch-size", "Samples per batch"),
])
def test_options_with_a_quantity_state_its_unit(command, option, unit):
    """A number's unit is in its help: --tolerance and --max-forgetting are nats per token, --t a separation in
    ||C||_F units (neither said so)."""
    (found,) = [o for path, o in _options() if path == f"satcore {command}" and option in o.opts]
    assert unit in " ".join(found.help.split())
