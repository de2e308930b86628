"""The command line the example scripts share: ``--quick`` for a smoke-test size, else the full run."""

from __future__ import annotations

import argparse


def quick_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of ``doc``, with ``--quick`` (help ``quick_help``)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser


def quick_main(doc: str, run, quick_help: str) -> None:
    """``run(quick)`` with ``quick`` from the command line."""
    run(quick_parser(doc, quick_help).parse_args().quick)
