"""Hugging Face checkpoint directories and token files, read for ``satcore expand`` / ``satcore probe``.

A checkpoint directory is what ``save_pretrained`` writes: ``config.json``, the
weights (``*.safetensors``; ``pytorch_model*.bin`` is read by transformers with
``weights_only=True``), and for text data its tokenizer files.  Nothing in it is
executed (``trust_remote_code`` stays off) and nothing is written to it.

Token data (``--data``), cut into windows of ``seq_len`` tokens:

* plain UTF-8 text (any other suffix): tokenised with the checkpoint's own
  tokenizer; at most ``max_windows * seq_len`` tokens are used, and only the
  characters that can hold them are read (``MAX_TEXT_CHARS_PER_TOKEN`` each);
* ``.npz``: one integer array ``input_ids`` (any shape: flattened in order),
  read through satcore's bounded reader (nothing unpickled);
* ``.jsonl``: one JSON list of integers per line, or an object with an
  ``input_ids`` list; lines are concatenated.

Every id must lie in ``0 .. vocab_size - 1``.  A problem is one
:class:`~satcore._shared.errors.InputError` naming the file (and the key or line).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from satcore.adapter_api import display_name
from satcore.adapter_api import NpzArchive
from satcore import InputError, ProbeError

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
MAX_TEXT_CHARS_PER_TOKEN = 16  # generous: English subword tokenizers average ~4 characters a token
MAX_JSONL_LINE_BYTES = 2**24


def is_checkpoint_dir(path) -> bool:
    """Whether ``path`` is a directory holding a ``config.json``."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def check_checkpoint_dir(path) -> None:
    """Refuse, in one line naming what is missing, a directory ``from_pretrained`` cannot load."""
    shown = display_name(os.fspath(path))
    if not os.path.isdir(path):
        raise InputError(f"{shown}: not a directory (a Hugging Face checkpoint directory is expected)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InputError(f"{shown}: no config.json (not a Hugging Face checkpoint directory)")
    if not any(any(Path(path).glob(p)) for p in WEIGHT_PATTERNS):
        raise InputError(f"{shown}: no weights (model.safetensors or pytorch_model.bin)")
    try:
        with open(os.path.join(path, "config.json"), "rb") as stream:
            config = json.loads(stream.read(2**24))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{shown}/config.json: not JSON ({exc})") from None
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if quantization is not None:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise InputError(f"{shown}/config.json: quantized checkpoints (quantization_config, {method!r}) are not "
                         "supported: their weights cannot be grown and saved; de-quantise to a float checkpoint")


def load_causal_lm(path, *, dtype=None):
    """``AutoModelForCausalLM.from_pretrained(path)`` in eval mode, or a one-line :class:`ProbeError`."""
    check_checkpoint_dir(path)
    shown = display_name(os.fspath(path))
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as exc:
        raise ProbeError(f"{shown}/config.json: {' '.join(str(exc).split())[:300]}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, dtype=dtype or "auto")
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        kind = getattr(config, "model_type", "?")
        raise ProbeError(f"{shown}: cannot load model_type {kind!r} as a causal LM "
                         f"({' '.join(str(exc).split())[:300]})") from None
    return model.eval()


def load_tokenizer(path):
    """The checkpoint's own tokenizer, or a one-line :class:`InputError` naming what is missing."""
    shown = display_name(os.fspath(path))
    if not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise InputError(f"{shown}: no tokenizer (tokenizer.json or tokenizer_config.json) to tokenise text "
                         "data with; pass token ids (.npz with input_ids, or .jsonl) instead")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (ValueError, KeyError, OSError) as exc:
        raise InputError(f"{shown}: its tokenizer does not load ({' '.join(str(exc).split())[:300]})") from None


def _text_ids(path, tokenizer, n_tokens: int) -> np.ndarray:
    shown = display_name(os.fspath(path))
    with open(path, "rb") as stream:
        raw = stream.read(n_tokens * MAX_TEXT_CHARS_PER_TOKEN)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(raw) - 3:  # a character cut at the read limit is not an error
            raise InputError(f"{shown}: not UTF-8 text (byte {exc.start}); token ids go in .npz or .jsonl") from None
        text = raw[: exc.start].decode("utf-8")
    if not text.strip():
        raise InputError(f"{shown}: no text")
    # verbose=False: the whole text is longer than the model's context, which transformers would warn of
    # ("indexing errors"); the ids are cut into windows no longer than the context, so nothing is indexed past it
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return np.asarray(ids[:n_tokens], dtype=np.int64)


def _npz_ids(path) -> np.ndarray:
    shown = display_name(os.fspath(path))
    with NpzArchive(path) as archive:
        if "input_ids" not in archive.members:
            raise InputError(f"{shown}: no member 'input_ids' (members: {', '.join(sorted(archive.members))})")
        header = archive.header("input_ids")
        if header.dtype.kind not in "iu":
            raise InputError(f"{shown}: member 'input_ids' must hold integers, got dtype {header.dtype}")
        return np.asarray(archive.read("input_ids"), dtype=np.int64).reshape(-1)


def _jsonl_ids(path, n_tokens: int) -> np.ndarray:
    shown = display_name(os.fspath(path))
    ids: list[int] = []
    with open(path, "rb") as stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_JSONL_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_JSONL_LINE_BYTES:
                raise InputError(f"{shown}: line {number} is longer than {MAX_JSONL_LINE_BYTES} bytes")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                raise InputError(f"{shown}: line {number} is not JSON ({exc})") from None
            if isinstance(row, dict):
                row = row.get("input_ids")
            if not isinstance(row, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise InputError(f"{shown}: line {number}: expected a list of integer token ids or "
                                 "{\"input_ids\": [...]}")
            ids += row
            if len(ids) >= n_tokens:
                break
    return np.asarray(ids[:n_tokens], dtype=np.int64)


def read_token_windows(path, *, tokenizer_dir, vocab_size: int, seq_len: int, max_windows: int) -> torch.Tensor:
    """``(N, seq_len)`` token ids from ``path`` (module docstring), ``N <= max_windows``."""
    shown = display_name(os.fspath(path))
    if os.path.isdir(path):
        raise InputError(f"{shown}: is a directory, not a data file (UTF-8 text, .npz or .jsonl)")
    if not os.path.isfile(path):
        raise InputError(f"{shown}: no such file")
    n_tokens = seq_len * max_windows
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        ids = _npz_ids(path)[:n_tokens]
    elif suffix == ".jsonl":
        ids = _jsonl_ids(path, n_tokens)
    else:
        ids = _text_ids(path, load_tokenizer(tokenizer_dir), n_tokens)
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise InputError(f"{shown}: token id {bad} is outside the model's vocabulary 0..{vocab_size - 1}")
    n = len(ids) // seq_len
    if n < 4:
        raise InputError(f"{shown}: {len(ids)} tokens make {n} window(s) of {seq_len}; expand needs at least 4 "
                         "(lower --seq-len or give more data)")
    return torch.from_numpy(ids[: n * seq_len].reshape(n, seq_len).copy())
