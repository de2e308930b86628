"""``satcore probe MODEL.onnx --data DATA.npz -o DUMP``: a dump from an ONNX file alone.

DATA.npz holds either ``inputs`` (single input models) or one array per model
input name, plus ``targets`` unless the loss is a per-sample loss output of the
model.  All arrays share the first (sample) axis; they are fed in batches of
``--batch-size``.  It is read through satcore's bounded ``.npz`` reader
(:mod:`satcore._io.zipnpy`: nothing unpickled, sizes and compression checked
before any allocation): the headers are validated up front and the arrays
streamed one batch at a time, so memory is one batch whatever the file
declares.
"""

from __future__ import annotations

import os

import click
import numpy as np

from satcore.adapter_api import check_target
from satcore.adapter_api import NpyHeader, NpzArchive
from satcore import FAMILIES, ModelOnDataError, ProbeError
from satcore.adapter_api import DEFAULT_FOLDS

from .common import FiniteFloatRange, display_name, model_on_data
from .numbers import MAX_SEED, Count
from .out_dir import refuse_inside_model_dir

TARGETS = "targets"
# the default batch size: at most this, and small enough that the data makes one batch per fold of the fold test
MAX_DEFAULT_BATCH = 64


def _bad(message: str):
    return click.BadParameter(message, param_hint="--data")


def read_data(path: str) -> dict[str, NpyHeader]:
    """The headers of DATA.npz's arrays, validated: numeric, a sample axis, no empty axis, one sample count."""
    shown = display_name(path)
    with NpzArchive(path) as archive:
        headers = {key: archive.header(key) for key in archive.members}
    for key, h in headers.items():
        if h.dtype.kind not in "biuf" or not h.shape or 0 in h.shape:
            raise _bad(f"{shown}: member {display_name(key)!r} must be a numeric array with a sample axis and no "
                       f"empty axis, got dtype {h.dtype} shape {h.shape}")
    if not headers:
        raise _bad(f"{shown}: no arrays")
    counts = {k: h.shape[0] for k, h in headers.items()}
    if len(set(counts.values())) != 1:
        shown_counts = {display_name(k): c for k, c in counts.items()}
        raise _bad(f"{shown}: members have different sample counts {shown_counts}")
    return headers


def batches(path: str, headers: dict[str, NpyHeader], batch_size: int):
    """``(inputs, targets)`` batches, or mappings of input names plus ``targets``, streamed from DATA.npz.

    Each batch is checked finite as it is read; the error names the file, the key and the batch.
    """
    n = next(iter(headers.values())).shape[0]
    with NpzArchive(path) as archive:
        readers = {key: archive.rows(key) for key in headers}
        try:
            for index, start in enumerate(range(0, n, batch_size)):
                chunk = {key: reader.read(batch_size) for key, reader in readers.items()}
                for key, value in chunk.items():
                    if value.dtype.kind == "f" and not np.isfinite(value).all():
                        raise _bad(f"{display_name(path)}: member {display_name(key)!r} holds NaN or Inf "
                                   f"(batch {index}, samples {start}..{start + len(value) - 1})")
                yield (chunk["inputs"], chunk.get(TARGETS)) if "inputs" in chunk else chunk
        finally:
            for reader in readers.values():
                reader.close()


def candidate_names(candidates: str | None) -> list[str] | None:
    """``--candidates``' comma-separated names, ``None`` when the option is not given (every block and the head); an
    empty name is refused, ``--candidates ""`` included (which used to mean every block)."""
    if candidates is None:
        return None
    names = [c.strip() for c in candidates.split(",")]
    if not all(names):
        raise click.BadParameter("empty candidate name", param_hint="--candidates")
    return names


@click.command()
@click.argument("model", type=click.Path())
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
@click.option("--candidates", default=None,
              help="Comma-separated block names, 'head' or tensor names (default: every residual block and head).")
@click.option(
    "--family", type=click.Choice(("auto",) + FAMILIES), default="auto", show_default=True,
    help="Feature family of the probed blocks (auto: conv for NCHW activations, mlp otherwise).",
)
@click.option("--seed", type=Count(min=0, max=MAX_SEED), default=0, show_default=True, help="Seed of the family's fixed weights.")
@click.option(
    "--init-std", type=FiniteFloatRange(min=0, min_open=True), default=None,
    help="Weight scale of the mlp family (default width**-0.5; e.g. 0.02 for GPT-2-style models).",
)
@click.option(
    "--n-features", type=Count(), default=None,
    help="Feature count r of the built-in families (mlp: its hidden width, default 4x the stream width; "
    "conv: 9x its mid channels).",
)
@click.option("--output", "output_name", default=None, help="Model output the loss reads (default: the first).")
@click.option("--batch-size", type=Count(), default=None,
              help=f"Samples per batch: per ONNX Runtime run, or windows for a checkpoint folder (default: "
              f"{MAX_DEFAULT_BATCH}, or fewer so that the data makes {DEFAULT_FOLDS} batches: the verdict's fold "
              f"test deals batches, not samples, into {DEFAULT_FOLDS} folds, and fewer batches than folds can never "
              "show a candidate improvable).")
@click.option("--split", default=None,
              help="Name of the split DATA comes from, recorded in the dump (default: none recorded; satcore score "
              "then warns that the split is not stated, or takes --probe-split).")
@click.option("--variance", is_flag=True,
              help="Also accumulate sum X_i^T X_i (debiased growth value; satcore sweep's noise floor).")
@click.option("--providers", default=None, metavar="EP[,EP...]",
              help="ONNX Runtime execution providers in order of preference, e.g. "
              "CUDAExecutionProvider,CPUExecutionProvider (default: CPU).")
@click.option("-o", "--out", "out_path", required=True, metavar="DUMP", help="Dump file to write (.npz).")
def probe(model, data_path, loss, candidates, family, seed, init_std, n_features, output_name, batch_size, split,
          variance, providers, out_path):
    """Probe MODEL (an ONNX file, or a Hugging Face checkpoint directory) on DATA and write a dump for
    'satcore score'.  A directory takes text or token ids as DATA (see 'satcore expand --help')."""
    check_target(out_path, (model, data_path))  # before the probe: -o MODEL or -o DATA is refused now
    names = candidate_names(candidates)
    if os.path.isdir(model):
        refuse_inside_model_dir(out_path, model)  # -o MODEL_DIR/model.safetensors would replace the weights
        onnx_only = [flag for flag, given in (("--loss", loss != "cross_entropy"), ("--output", output_name),
                                              ("--providers", providers)) if given]
        if onnx_only:  # name the folder and what was given, as expand's refusals of options it would ignore do
            raise click.UsageError(f"{display_name(model)}: {' and '.join(onnx_only)} belong{'s' if len(onnx_only) == 1 else ''} to "
                                   "an ONNX model; a checkpoint directory is probed with torch on its own next-token "
                                   f"cross-entropy, so {'it' if len(onnx_only) == 1 else 'they'} would be ignored")
        from satcore.adapters.torch import ProbeConfig

        from .hf_dir import probe_checkpoint_dir

        config = ProbeConfig(candidates=names, family=family, seed=seed, init_std=init_std, n_features=n_features,
                             split=split, variance=variance)
        return probe_checkpoint_dir(model, data_path, config, batch_size=batch_size, out_path=out_path)
    arrays = read_data(data_path)
    if "inputs" in arrays and len(arrays) > 2:
        raise click.BadParameter(
            f"{data_path}: 'inputs' goes with 'targets' only; name each model input instead", param_hint="--data"
        )
    from satcore.adapters.onnx import OnnxProbeError
    from satcore.adapters.onnx import probe as onnx_probe  # after the data check: a refusal loads no runtime

    n_data = next(iter(arrays.values())).shape[0]
    chosen = batch_size is None
    if chosen:
        batch_size = default_batch_size(n_data)
    if providers is not None:
        import onnxruntime

        providers = [p.strip() for p in providers.split(",")]
        unknown = [p for p in providers if p not in onnxruntime.get_available_providers()]
        if unknown or not all(providers):
            raise click.BadParameter(f"{unknown[0] if unknown else 'an empty name'} is not available here; this "
                                     f"onnxruntime has {', '.join(onnxruntime.get_available_providers())}",
                                     param_hint="--providers")

    try:
        result = onnx_probe(
            model,
            batches(data_path, arrays, batch_size),
            loss=loss,
            candidates=names,
            family=family,
            seed=seed,
            init_std=init_std,
            output=output_name,
            split=split,
            variance=variance,
            providers=providers,
            n_features=n_features,
        )
    except OnnxProbeError as exc:
        hint = fixed_batch_hint(model, batch_size, n_data) if isinstance(exc, ModelOnDataError) else ""
        raise named_refusal(exc, model, data_path, hint=hint) from None
    result.save(out_path, inputs=(model, data_path))
    n_samples = next(iter(result.statistics.values())).n_samples
    n_batches = -(-n_data // batch_size)
    say_written(out_path, f"{len(result.statistics)} candidate(s), {n_samples} samples", n_batches, batch_size,
                chosen=chosen)


def named_refusal(exc: ProbeError, model, data_path, *, hint: str = "") -> Exception:
    """The probe's refusal ``exc`` led by the files it is about: MODEL's and DATA's for a
    :class:`~satcore.ModelOnDataError` (:func:`model_on_data`), else MODEL's (its graph or checkpoint, or the loss,
    candidates or family given for it) unless the message names it already.  ``hint`` (what to pass instead, or "") follows a refused batch's message."""
    if isinstance(exc, ModelOnDataError):
        said = str(exc).rstrip(".") if hint else str(exc)  # the hint continues the sentence
        return type(exc)(model_on_data(model, data_path, said + hint))
    if display_name(model) not in str(exc):
        return type(exc)(f"{display_name(model)}: {exc}")
    return exc


def fixed_batch_hint(model_path: str, batch_size: int, n_samples: int) -> str:
    """What to do where a batch was refused and the model's inputs have a fixed batch size other than the batches'
    (an exporter writes its example's batch size unless told the axis is dynamic; ONNX Runtime's refusal names the
    dimension but not the way out); "" otherwise.  Read only after a refusal: the happy path loads nothing more."""
    from satcore.adapters.onnx import load_model

    graph = load_model(model_path).graph
    constants = {i.name for i in graph.initializer}
    fixed = {i.name: i.type.tensor_type.shape.dim[0].dim_value for i in graph.input
             if i.name not in constants and len(i.type.tensor_type.shape.dim) > 0
             and i.type.tensor_type.shape.dim[0].HasField("dim_value")}
    if len(set(fixed.values())) != 1:
        return ""
    name, size = next(iter(fixed.items()))
    if size == batch_size and n_samples % size == 0:
        return ""
    if size < 1:  # a hostile file's batch axis of 0: no --batch-size fits it, only a dynamic axis does
        remedy = ""
    else:
        count = "" if n_samples % size == 0 else (f" and a sample count that is a multiple of {size} (DATA holds "
                                                  f"{n_samples})")
        remedy = f" (an export's example batch): pass --batch-size {size}{count}, or"
    return (f"; the model's input {name!r} has a fixed batch size of {size}{remedy or ':'} "
            f"export the model with a dynamic batch axis (torch.onnx.export(..., "
            f"dynamic_shapes={{{name!r}: {{0: torch.export.Dim('batch')}}}}), or with dynamo=False "
            f"dynamic_axes={{{name!r}: {{0: 'batch'}}}}))")


def default_batch_size(n_samples: int) -> int:
    """``--batch-size``'s default: :data:`MAX_DEFAULT_BATCH`, or fewer so that ``n_samples`` make at least
    :data:`DEFAULT_FOLDS` batches (the fold test deals batches, not samples, into its folds).

    ``ceil(n_samples / DEFAULT_FOLDS)``, or one less where that makes fewer batches than folds: 113 windows in
    batches of 8 are 15 (a fold left empty), in batches of 7 are 17; 400 samples keep batches of 25 (16), 31 of 2."""
    size = -(-n_samples // DEFAULT_FOLDS)
    if -(-n_samples // size) < DEFAULT_FOLDS:
        size = max(1, size - 1)  # n > 16 (size - 1), so batches of size - 1 are more than 16
    return min(MAX_DEFAULT_BATCH, size)


def say_written(out_path, what: str, n_batches: int, batch_size: int, *, chosen: bool) -> None:
    """The line that reports the dump (``what`` it holds, in how many batches of what size), and on stderr a note
    where the batches fill fewer folds than the fold test has."""
    click.echo(f"wrote {display_name(out_path)}: {what} in {n_batches} batch(es) of {batch_size}"
               + (f" (the default --batch-size: one batch per fold of the {DEFAULT_FOLDS}-fold test where the data "
                  f"allows)" if chosen else ""))
    if n_batches < DEFAULT_FOLDS:
        click.echo(f"note: {n_batches} batch(es) fill only {n_batches} of the fold test's {DEFAULT_FOLDS} folds "
                   f"(folds are made of batches, not samples); a smaller --batch-size or more data gives more",
                   err=True)
