"""``satcore inspect DUMP``: validate a dump and summarise what it holds."""

from __future__ import annotations

import json

import click

from satcore import read_dump

from .common import CHUNK_OPTION, QUIET_OPTION, display_name, human_bytes, statistics, table


@click.command()
@click.argument("dump")
@click.option("--headers-only", is_flag=True, help="Check structure, dtypes and shapes only; skip the data pass.")
@QUIET_OPTION
@CHUNK_OPTION
def inspect(dump, headers_only, quiet, chunk_samples):
    """Validate DUMP and print its schema, meta and candidates.

    By default every raw member is read once (streamed), so NaN/Inf values and
    truncated members are found too.
    """
    source = read_dump(dump)
    if not headers_only:
        statistics(source, quiet=quiet, chunk_samples=chunk_samples)
    form = source.schema or "bare form (q/ and psi/ keys only, no schema or meta)"
    click.echo(f"{display_name(dump)}: {form}; {len(source.candidates)} candidate(s); raw data {human_bytes(source.raw_bytes)}")
    extra = {k: v for k, v in source.meta.items() if k != "candidates"}
    for key in sorted(extra):
        click.echo(f"meta {display_name(key, 60)}: {_short(json.dumps(extra[key], sort_keys=True))}")
    rows = []
    for name in source.candidates:
        if name in source.raw:
            raw = source.raw[name]
            rows.append([display_name(name), raw.kind, f"{raw.q_header.shape} {raw.q_header.dtype}",
                         f"{raw.features_header.shape} {raw.features_header.dtype}"])
        else:
            s = source.stored[name]
            rows.append([display_name(name), "stats", f"n={s.n_samples} N={s.n_hidden} T={s.n_positions}",
                         f"r={s.n_features} sum_xtx={'yes' if s.variance else 'no'}"])
    click.echo(table(["candidate", "form", "q / counts", "psi or jac / widths"], rows))
    click.echo("valid: structure and headers checked" + ("" if headers_only else "; all data read, all values finite"))


def _short(text: str, limit: int = 100) -> str:
    """One readable line per meta field: long values are cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
