"""``satcore merge A B ... -o OUT``: add the statistics of dumps over disjoint samples."""

from __future__ import annotations

import os

import click

from satcore._atomic import check_target
from satcore.dump import write_dump

from .common import CHUNK_OPTION, QUIET_OPTION, display_name, load


@click.command()
@click.argument("dumps", nargs=-1, required=True)
@click.option("-o", "--output", required=True, metavar="OUT", help="Path of the merged statistics dump (.npz).")
@QUIET_OPTION
@CHUNK_OPTION
def merge(dumps, output, quiet, chunk_samples):
    """Merge DUMPS (shards over disjoint samples, same candidates) into one statistics dump.

    Scoring the result equals scoring the union of the shards.  Raw inputs are
    reduced to statistics first, so a single input compacts a raw dump.  Meta
    fields on which all inputs agree are kept; ``merged_from`` lists the inputs.
    """
    inputs = [os.path.realpath(p) for p in dumps]
    repeated = next((p for i, p in enumerate(dumps) if inputs[i] in inputs[:i]), None)
    if repeated is not None:
        raise click.UsageError(f"{display_name(repeated)} is given twice: its samples would count twice")
    if os.path.realpath(output) in inputs:
        raise click.UsageError(f"-o {display_name(output)} is also an input: write the merge to a new file")
    check_target(output, dumps)  # before reading: a device or a hard link of an input is refused now, not after
    loaded = [load(path, quiet=quiet, chunk_samples=chunk_samples) for path in dumps]
    merged = loaded[0][1]
    for path, (_, stats) in zip(dumps[1:], loaded[1:]):
        try:
            merged = merged.merge(stats)
        except ValueError as exc:
            raise click.ClickException(f"{display_name(path)}: cannot merge with {display_name(dumps[0])}: {exc}") from None
    meta = common_meta([source.meta for source, _ in loaded])
    meta["merged_from"] = [os.path.basename(p) for p in dumps]
    write_dump(output, merged, meta=meta, inputs=dumps)
    total = sum(s.n_samples for s in merged.values()) // max(1, len(merged))
    click.echo(f"wrote {display_name(output)}: {len(merged)} candidate(s), {total} samples per candidate, from {len(dumps)} dump(s)")


def common_meta(metas: list[dict]) -> dict:
    """Meta fields (other than ``candidates``) equal in every input."""
    first = metas[0]
    return {k: v for k, v in first.items() if k != "candidates" and all(m.get(k) == v for m in metas[1:])}
