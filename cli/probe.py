"""``satcore probe MODEL.onnx --data DATA.npz -o DUMP``: a dump from an ONNX file alone.

DATA.npz (read with ``allow_pickle=False``) holds either ``inputs`` (single
input models) or one array per model input name, plus ``targets`` unless the
loss is a per-sample loss output of the model.  All arrays share the first
(sample) axis; they are fed in batches of ``--batch-size``.
"""

from __future__ import annotations

import zipfile

import click
import numpy as np

from satcore.families import FAMILIES

from .common import FiniteFloatRange

TARGETS = "targets"


def read_data(path: str) -> dict[str, np.ndarray]:
    """The arrays of DATA.npz, validated: numeric, finite, one common sample count."""
    if not zipfile.is_zipfile(path):
        raise click.BadParameter(f"{path}: not an .npz file", param_hint="--data")
    with np.load(path, allow_pickle=False) as npz:
        arrays = {}
        for key in npz.files:
            try:
                value = npz[key]
            except ValueError as exc:  # object arrays refuse to load without pickle
                raise click.BadParameter(f"{path}: member {key!r}: {exc}", param_hint="--data") from None
            if value.dtype.kind not in "biuf" or value.ndim == 0:
                raise click.BadParameter(
                    f"{path}: member {key!r} must be a numeric array with a sample axis, got dtype {value.dtype} "
                    f"shape {value.shape}",
                    param_hint="--data",
                )
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise click.BadParameter(f"{path}: member {key!r} holds NaN or Inf", param_hint="--data")
            arrays[key] = value
    if not arrays:
        raise click.BadParameter(f"{path}: no arrays", param_hint="--data")
    counts = {k: len(v) for k, v in arrays.items()}
    if len(set(counts.values())) != 1:
        raise click.BadParameter(f"{path}: members have different sample counts {counts}", param_hint="--data")
    return arrays


def batches(arrays: dict[str, np.ndarray], batch_size: int):
    """``(inputs, targets)`` batches, or mappings of input names plus ``targets``."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, batch_size):
        chunk = {k: v[start : start + batch_size] for k, v in arrays.items()}
        yield (chunk["inputs"], chunk.get(TARGETS)) if "inputs" in chunk else chunk


@click.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--data", "data_path", required=True, metavar="DATA.npz",
    help="'inputs' (single-input models) or one array per model input name, plus 'targets' unless --loss names "
    "a loss output; one shared sample axis.",
)
@click.option(
    "--loss",
    default="cross_entropy",
    show_default=True,
    help="cross_entropy, mse, or the name of a model output holding per-sample losses.",
)
@click.option("--candidates", default=None, help="Comma-separated tensor names (default: inputs of residual Adds).")
@click.option(
    "--family", type=click.Choice(("auto",) + FAMILIES), default="auto", show_default=True,
    help="Feature family of the probed blocks (auto: conv for NCHW activations, mlp otherwise).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the family's fixed weights.")
@click.option(
    "--init-std", type=FiniteFloatRange(min=0, min_open=True), default=None,
    help="Weight scale of the mlp family (default width**-0.5; e.g. 0.02 for GPT-2-style models).",
)
@click.option("--output", "output_name", default=None, help="Model output the loss reads (default: the first).")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Samples per ONNX Runtime run.")
@click.option("--split", default=None, help="Name of the split DATA comes from (recorded in the dump).")
@click.option("--variance", is_flag=True,
              help="Also accumulate sum X_i^T X_i (debiased growth value; satcore sweep's noise floor).")
@click.option("-o", "--out", "out_path", required=True, metavar="DUMP", help="Dump file to write (.npz).")
def probe(model, data_path, loss, candidates, family, seed, init_std, output_name, batch_size, split, variance,
          out_path):
    """Probe the ONNX file MODEL on DATA.npz and write a dump for 'satcore score'."""
    from satcore.adapters.onnx import probe as onnx_probe

    arrays = read_data(data_path)
    if "inputs" in arrays and len(arrays) > 2:
        raise click.BadParameter(
            f"{data_path}: 'inputs' goes with 'targets' only; name each model input instead", param_hint="--data"
        )
    names = [c.strip() for c in candidates.split(",")] if candidates else None
    if names is not None and not all(names):
        raise click.BadParameter("empty candidate name", param_hint="--candidates")
    result = onnx_probe(
        model,
        batches(arrays, batch_size),
        loss=loss,
        candidates=names,
        family=family,
        seed=seed,
        init_std=init_std,
        output=output_name,
        split=split,
        variance=variance,
    )
    result.save(out_path)
    n_samples = next(iter(result.statistics.values())).n_samples
    click.echo(f"wrote {out_path}: {len(result.statistics)} candidate(s), {n_samples} samples")
