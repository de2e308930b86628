"""``satcore merge A B ... -o OUT``: add the statistics of dumps over disjoint samples."""

from __future__ import annotations

import os

import click

from satcore.adapter_api import check_target
from satcore import write_dump
from satcore import InputError

from .common import CHUNK_OPTION, QUIET_OPTION, display_name, load


@click.command()
@click.argument("dumps", nargs=-1, required=True)
@click.option("-o", "--output", required=True, metavar="OUT", help="Path of the merged statistics dump (.npz).")
@click.option("--join", "join_candidates", is_flag=True,
              help="The dumps hold disjoint candidates of one model over the same samples (probed in groups): "
              "write one dump of all their candidates, in the order given.")
@QUIET_OPTION
@CHUNK_OPTION
def merge(dumps, output, join_candidates, quiet, chunk_samples):
    """Merge DUMPS (shards over disjoint samples, same candidates) into one statistics dump.

    With --join, dumps of disjoint candidates (a model probed in groups of
    candidates over the same samples) become one dump of all their candidates.

    Scoring the result equals scoring the union of the shards.  Raw inputs are
    reduced to statistics first, so a single input compacts a raw dump.  Meta
    fields on which all inputs agree are kept; merged_from lists the inputs.
    """
    inputs = [os.path.realpath(p) for p in dumps]
    repeated = next((p for i, p in enumerate(dumps) if inputs[i] in inputs[:i]), None)
    if repeated is not None:
        raise click.UsageError(f"{display_name(repeated)} is given twice: its samples would count twice")
    if os.path.realpath(output) in inputs:
        raise click.UsageError(f"-o {display_name(output)} is also an input: write the merge to a new file")
    check_target(output, dumps)  # before reading: a device or a hard link of an input is refused now, not after
    loaded = [load(path, quiet=quiet, chunk_samples=chunk_samples) for path in dumps]
    if join_candidates:
        return join(dumps, loaded, output)
    merged = _combine(dumps, loaded, "merge", f"cannot merge with {display_name(dumps[0])}")
    meta = common_meta([source.meta for source, _ in loaded])
    meta["merged_from"] = [os.path.basename(p) for p in dumps]
    write_dump(output, merged, meta=meta, inputs=dumps)
    total = sum(s.n_samples for s in merged.values()) // max(1, len(merged))
    click.echo(f"wrote {display_name(output)}: {len(merged)} candidate(s), {total} samples per candidate, from {len(dumps)} dump(s)")


def _combine(dumps, loaded, method: str, refusal: str):
    """The loaded statistics combined left to right by ``DepthStatistics.<method>``; a refusal names the dump."""
    combined = loaded[0][1]
    for path, (_, stats) in zip(dumps[1:], loaded[1:]):
        try:
            combined = getattr(combined, method)(stats)
        except InputError as exc:
            raise click.ClickException(f"{display_name(path)}: {refusal}: {exc}") from None
    return combined


def join(dumps, loaded, output) -> None:
    """Dumps of disjoint candidates (one model probed in groups of candidates, each pass over the
    same samples): one dump holding all of them in the order given; per-candidate meta (``family``,
    ``diagnostics``) is united, the rest kept where all inputs agree."""
    joined = _combine(dumps, loaded, "join", "cannot join with the dumps before it")
    counts = {name: s.n_samples for name, s in joined.items()}
    if len(set(counts.values())) > 1:
        raise click.ClickException(f"the dumps hold different samples {counts}: join needs one pass over the same data")
    metas = [source.meta for source, _ in loaded]
    meta = common_meta(metas)
    for key in ("family", "diagnostics"):
        parts = [m.get(key) for m in metas]
        if all(isinstance(p, dict) for p in parts):
            meta[key] = {name: value for part in parts for name, value in part.items()}
    meta["joined_from"] = [os.path.basename(p) for p in dumps]
    write_dump(output, joined, meta={**meta, "candidates": list(joined)}, inputs=dumps)
    click.echo(f"wrote {display_name(output)}: {len(joined)} candidate(s) joined from {len(dumps)} dump(s), "
               f"{next(iter(counts.values()))} samples each")


def common_meta(metas: list[dict]) -> dict:
    """Meta fields (other than ``candidates``) equal in every input."""
    first = metas[0]
    return {k: v for k, v in first.items() if k != "candidates" and all(m.get(k) == v for m in metas[1:])}
