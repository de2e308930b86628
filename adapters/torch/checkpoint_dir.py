"""Hugging Face checkpoint directories and token files, read for ``satcore expand`` / ``satcore probe``.

A checkpoint directory is what ``save_pretrained`` writes: ``config.json``, the
weights (``*.safetensors``; pickled ``pytorch_model*.bin`` are refused, nothing is
unpickled), and for text data its tokenizer files.  Nothing in it is executed
(``trust_remote_code`` stays off) and nothing is written to it.  :func:`load_causal_lm`
is the one loader: it checks the config against the weights' headers before anything
is built (:func:`load_causal_lm` says in what order).

Token data (``--data``), cut into windows of ``seq_len`` tokens:

* plain UTF-8 text (any other suffix): tokenised with the checkpoint's own
  tokenizer a piece at a time; at most ``max_windows * seq_len`` tokens are used,
  and only the characters that can hold them are read (``MAX_TEXT_CHARS_PER_TOKEN`` each);
* ``.npz``: one integer array ``input_ids`` (any shape: flattened in order),
  read through satcore's bounded reader (nothing unpickled);
* ``.jsonl``: one JSON list of integers per line, or an object with an
  ``input_ids`` list; lines are concatenated.

Every id must lie in ``0 .. vocab_size - 1``.  A problem is one
:class:`~satcore._shared.errors.InputError` naming the file (and the key or line).
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import torch

from satcore.adapter_api import display_name
from satcore.adapter_api import NpzArchive
from satcore import InputError, ProbeError
from satcore.adapter_api import check_memory, directory, regular_file, shown_value, whole_number

from .input_bounds import check_token_ids
from .safetensors_headers import read_json, weight_headers

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
INDEX = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
MAX_TEXT_CHARS_PER_TOKEN = 16  # generous: English subword tokenizers average ~4 characters a token
TEXT_PIECE_BYTES = 2**20  # text is tokenised a piece at a time: a tokenizer handed gigabytes at once may abort
MAX_JSONL_LINE_BYTES = 2**24
MAX_CONFIG_BYTES = 2**24
MAX_TOKENIZER_BYTES = 2**28
# what loading tokenizer.json costs, all of it in its libraries (the tokenizers library's parse, then transformers'
# own json.load of it): AutoTokenizer took 46 s for a 64.7 MB file on a shared 2-core machine; a load expected past
# a few seconds is announced first (tokenizer_load_note)
TOKENIZER_SECONDS_PER_MB = 0.7
ANNOUNCED_TOKENIZER_BYTES = 8 * 10**6
# the sizes a decoder's config declares: whole numbers >= 1 (None allowed where transformers reads None as "derive it")
SIZE_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "intermediate_size", "n_inner",
             "num_attention_heads", "n_head", "num_key_value_heads", "head_dim", "vocab_size",
             "max_position_embeddings", "n_positions", "n_ctx", "sliding_window")
NULLABLE_SIZES = ("n_inner", "num_key_value_heads", "head_dim", "sliding_window")
MAX_SIZE = 2**31  # no dimension of a real model comes near; a larger one is a forged or mistyped config
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
DTYPES = ("float32", "float16", "bfloat16", "float64")
FLOAT_WEIGHTS = ("F32", "F16", "BF16", "F64")  # the safetensors dtypes of those
# how many float32 copies of the model expand holds at once: the model, the grown copy, a trial's copy
EXPAND_COPIES = 3
_LAYER_NAME = re.compile(r"(.*?)\.([0-9]{1,9})\.")


def check_checkpoint_dir(path) -> None:
    """Refuse, in one line naming what is missing, a directory the loader does not read: a path where no directory is (missing, a file, a
    symbolic link to none: :func:`~satcore.adapter_api.directory`), no
    ``config.json`` (or something else than a regular file there: :func:`~satcore.adapter_api.regular_file`), a path that is not UTF-8 (the safetensors reader takes UTF-8 paths only), pickled weights
    (``pytorch_model.bin``: nothing is unpickled) or no weights."""
    shown = display_name(os.fspath(path))
    directory(path, shown, expected="a Hugging Face model folder")
    try:
        os.fsencode(os.path.abspath(path)).decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{shown}: the path is not UTF-8, which the safetensors reader needs; rename the directory "
                         "(or link it under a UTF-8 name)") from None
    if not regular_file(os.path.join(path, "config.json"), f"{shown}/config.json"):
        raise InputError(f"{shown}: no config.json (not a Hugging Face checkpoint directory)")
    # an index without shards in the folder is read (weight_files names what its weight_map points to)
    if not any(Path(path).glob("*.safetensors")) and not os.path.lexists(os.path.join(path, INDEX)):
        pickled = next((p.name for pattern in PICKLED_WEIGHTS for p in sorted(Path(path).glob(pattern))), None)
        if pickled is not None:
            raise InputError(f"{shown}/{display_name(pickled)}: pickled weights are not read (unpickling runs code); "
                             "save them as safetensors (model.save_pretrained(dir, safe_serialization=True))")
        raise InputError(f"{shown}: no weights (model.safetensors or model.safetensors.index.json)")


def read_config(path) -> dict:
    """``config.json`` of the checkpoint directory ``path``, checked before anything is built from it: a JSON
    object at most :data:`MAX_CONFIG_BYTES` and 32 levels deep, every size of :data:`SIZE_KEYS` it holds a whole
    number in ``1 .. MAX_SIZE``, the heads dividing the width and each other, a float ``dtype`` expand writes,
    no ``quantization_config``, no NaN (JSON's ``NaN``, which Python reads; ``Infinity`` is a value some configs
    hold)."""
    shown = f"{display_name(os.fspath(path))}/config.json"
    # unique_keys=False: transformers reads config.json after this, keeping a repeated key's last value; checked so
    config = read_json(os.path.join(path, "config.json"), shown, MAX_CONFIG_BYTES, unique_keys=False)
    if not isinstance(config, dict):
        raise InputError(f"{shown}: not a JSON object")
    if (nan := _nan_key(config)) is not None:  # JSON's NaN, which Python reads: every output NaN, or worse, silently
        raise InputError(f"{shown}: {nan} is NaN; give a number")
    for key in SIZE_KEYS:
        if key in config and not (config[key] is None and key in NULLABLE_SIZES):
            whole_number(config[key], f"{shown}: {key}", 1, MAX_SIZE)
    sizes = {k: config.get(k) for k in ("hidden_size", "n_embd", "num_attention_heads", "n_head",
                                         "num_key_value_heads", "head_dim")}
    width, heads = sizes["hidden_size"] or sizes["n_embd"], sizes["num_attention_heads"] or sizes["n_head"]
    if width and heads and sizes["head_dim"] is None and width % heads:
        raise InputError(f"{shown}: the width {width} is not a multiple of the {heads} attention heads (and no "
                         "head_dim says otherwise)")
    if heads and sizes["num_key_value_heads"] and heads % sizes["num_key_value_heads"]:
        raise InputError(f"{shown}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{sizes['num_key_value_heads']}")
    checkpoint_dtype(config, shown)
    quantization = config.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise InputError(f"{shown}: quantized checkpoints (quantization_config, {display_name(repr(method), 40)}) are "
                         "not supported: their weights cannot be grown and saved; de-quantise to a float checkpoint")
    return config


def _nan_key(value, path: str = "") -> str | None:
    """The first key (dotted, list items by index) of a parsed JSON value that holds a NaN, None where none does
    (the value is at most 32 levels deep: :func:`read_config` read it)."""
    if isinstance(value, float) and math.isnan(value):
        return path or "the value"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _nan_key(item, f"{path}.{key}" if path else str(key))) is not None:
            return found
    return None


def checkpoint_dtype(config: dict, shown: str = "config.json") -> str:
    """The dtype name the checkpoint's config declares (``float32`` when it declares none), one of :data:`DTYPES`."""
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise InputError(f"{shown}: dtype {display_name(repr(name), 40)} is not one expand reads and writes "
                         f"({', '.join(DTYPES)})")
    return name


def _stack(tensors) -> tuple[str | None, int]:
    """``(prefix, n)``: the numbered stack with the most members among the weights' names (the decoder's
    blocks, ``model.layers.0 .. n-1``) and how many it holds (indices 0..n-1 without gaps, else -1)."""
    indices: dict[str, set] = {}
    for name in tensors:
        match = _LAYER_NAME.match(name)
        if match:
            indices.setdefault(match[1], set()).add(int(match[2]))
    if not indices:
        return None, 0
    prefix, found = max(indices.items(), key=lambda kv: len(kv[1]))
    return prefix, len(found) if found == set(range(len(found))) else -1


def check_layers(path, config: dict, declared: int | None, tensors) -> None:
    """Refuse a config whose layer count is not the weights' (``declared``: the value the config builds,
    ``None`` when not yet known); transformers would fill missing layers with random ones, or drop layers."""
    shown = display_name(os.fspath(path))
    key = next((k for k in LAYER_KEYS if k in config), None)
    count = config[key] if key is not None else declared
    if count is None:
        return
    prefix, held = _stack(tensors)
    files = ", ".join(sorted({t.file for t in tensors.values()}))
    if held < 0:
        raise InputError(f"{shown}/{files}: the layers of {prefix} are not numbered 0, 1, 2, ... without gaps")
    if count != held:
        given = f"{key} = {count}" if key is not None else f"no num_hidden_layers (the architecture's default {count})"
        raise InputError(f"{shown}/config.json: {given}, but {files} holds {held} layer(s)"
                         + (f" ({prefix}.0 .. {prefix}.{held - 1})" if held else "")
                         + "; the config must describe the weights" + _unlisted_shards(path, tensors))


def _unlisted_shards(path, tensors) -> str:
    """Where the weights come from ``model.safetensors.index.json`` and the folder holds ``.safetensors`` files its
    weight_map does not name (a shard left out of the index, the likelier fault than the config), the words that
    say so, else ``""``.  Such files are not refused: some repositories ship a consolidated copy beside shards."""
    read = {t.file for t in tensors.values()}
    if "model.safetensors" in read or not os.path.isfile(os.path.join(path, INDEX)):
        return ""
    unlisted = sorted(p.name for p in Path(path).glob("*.safetensors") if p.name not in read)
    if not unlisted:
        return ""
    names = ", ".join(display_name(n) for n in unlisted[:3]) + (", ..." if len(unlisted) > 3 else "")
    return f" (or {INDEX} leaves out a shard: the folder also holds {names}, which its weight_map does not name)"


def available_memory() -> int | None:
    """Bytes this process may still allocate: the kernel's ``MemAvailable``, less where a cgroup limit is lower;
    ``None`` where the system does not say."""
    found = []
    try:
        with open("/proc/meminfo") as stream:
            found += [int(line.split()[1]) * 1024 for line in stream if line.startswith("MemAvailable:")]
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            text = limit.read().strip()
            if text != "max":
                found.append(int(text) - int(used.read().strip()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _build_on_meta(path, config):
    """The model ``config`` builds, on the meta device (shapes, no memory), or a one-line refusal."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError, RuntimeError) as exc:
        raise ProbeError(f"{display_name(os.fspath(path))}: cannot build model_type "
                         f"{display_name(repr(getattr(config, 'model_type', '?')), 40)} as a causal LM from its "
                         f"config.json ({_reason(exc)})") from None


def check_against_weights(path, model, tensors, copies: int) -> None:
    """Refuse, before the weights are read, a model (built on the meta device) whose tensors have other shapes
    than the weights' of the same names, a float tensor of it stored in another dtype than a float one of
    :data:`FLOAT_WEIGHTS` (integers or 8-bit floats: quantized or damaged weights, which transformers would cast
    to float silently), or whose float32 parameters, held ``copies`` times, exceed the memory available
    (:func:`available_memory`)."""
    shown = display_name(os.fspath(path))
    for name, tensor in model.state_dict().items():
        saved = tensors.get(name)
        if saved is not None and tuple(tensor.shape) != saved.shape:
            raise InputError(f"{shown}/config.json does not match the weights: {display_name(name, 120)} is "
                             f"{list(tensor.shape)} by the config, {list(saved.shape)} in {saved.file}")
        if saved is not None and tensor.is_floating_point() and saved.dtype not in FLOAT_WEIGHTS:
            raise InputError(f"{shown}/{saved.file}: tensor {display_name(repr(name), 120)} is {saved.dtype}, not "
                             f"a float dtype ({', '.join(FLOAT_WEIGHTS)}): quantized or damaged weights are not "
                             "read (transformers would cast them to float, silently); de-quantise to a float "
                             "checkpoint")
    n_bytes = copies * 4 * sum(t.numel() for t in itertools.chain(model.parameters(), model.buffers()))
    available = available_memory()
    if available is not None and n_bytes > available:
        raise InputError(f"{shown}: the model in float32, held {copies} time(s), needs {n_bytes / 2**30:.1f} GiB; "
                         f"{available / 2**30:.1f} GiB of memory is available")


def _reason(exc: BaseException) -> str:
    return display_name(" ".join(str(exc).split()), 300)


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' own log lines (its load report, config warnings) kept off the terminal: satcore reports
    what it refuses in one line of its own."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def load_causal_lm(path, *, copies: int = 1, raw: dict | None = None, read_hf_config=None):
    """``AutoModelForCausalLM.from_pretrained(path)`` in float32 and eval mode, the directory checked first.

    Order: the directory (:func:`check_checkpoint_dir`), the config (:func:`read_config`), the weights'
    headers (:func:`~.safetensors_headers.weight_headers`), the layer count against them
    (:func:`check_layers`), the model built on the meta device and its shapes and memory checked
    (:func:`check_against_weights`, ``copies``: how many float32 copies the caller holds), and only then the
    weights read (safetensors only), refused when transformers reports a tensor missing, unexpected or of
    another shape.  Every refusal is one line naming the file and the key.  ``raw``: ``path``'s
    :func:`read_config` where the caller has read it; ``read_hf_config``: a function returning ``path``'s
    :func:`hf_config`, called where this reads it, for a caller that builds it once for several readers
    (``functools.cache``): config.json is read once a command.
    """
    check_checkpoint_dir(path)
    shown = display_name(os.fspath(path))
    raw = read_config(path) if raw is None else raw
    tensors = weight_headers(os.fspath(path), raw)
    check_layers(path, raw, None, tensors)  # before the config is built: it may build a list per layer
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    config = hf_config(path) if read_hf_config is None else read_hf_config()
    with _quiet_transformers():
        check_layers(path, raw, getattr(config, "num_hidden_layers", None), tensors)
        check_against_weights(path, _build_on_meta(path, config), tensors, copies)
        try:
            model, report = AutoModelForCausalLM.from_pretrained(
                path, config=config, trust_remote_code=False, dtype=torch.float32, use_safetensors=True,
                output_loading_info=True)
        except SafetensorError as exc:
            files = ", ".join(sorted({t.file for t in tensors.values()}))
            raise InputError(f"{shown}/{files}: {_reason(exc)}") from None
        except (ValueError, KeyError, OSError, RuntimeError) as exc:
            raise ProbeError(f"{shown}: cannot load model_type {display_name(repr(config.model_type), 40)} as a "
                             f"causal LM ({_reason(exc)})") from None
    problems = [(kind, sorted(map(str, report.get(kind) or ())))
                for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")]
    problems = [(kind, names) for kind, names in problems if names]
    if problems:
        said = "; ".join(f"{len(names)} {kind.replace('_', ' ')} (first {display_name(names[0], 120)})"
                         for kind, names in problems)
        raise InputError(f"{shown}: config.json does not match the weights: {said}" + _unlisted_shards(path, tensors))
    return model.eval()


def hf_config(path):
    """transformers' config of the checkpoint directory ``path`` (``AutoConfig``, no remote code); what it refuses
    (a value of the wrong type, an unknown model_type) is one line naming config.json."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    with _quiet_transformers():
        try:
            return AutoConfig.from_pretrained(path, trust_remote_code=False)
        except (ValueError, KeyError, OSError, TypeError, ZeroDivisionError, StrictDataclassError) as exc:
            raise ProbeError(f"{display_name(os.fspath(path))}/config.json: {_reason(exc)}") from None


def load_tokenizer(path, config=None):
    """The checkpoint's own tokenizer, or a one-line :class:`InputError` naming what is missing or malformed.
    ``config``: the checkpoint's :func:`hf_config` where the caller holds it (config.json is then not read again).

    ``tokenizer.json`` is parsed by the tokenizers library alone (a 64 MB file takes it half a minute; a second
    parse of satcore's own took a third as long again); only where the library refuses it is the file read here,
    to name what is wrong with it (:func:`read_json`) rather than repeat the library's words."""
    shown = display_name(os.fspath(path))
    present = [f for f in TOKENIZER_FILES if regular_file(os.path.join(path, f), f"{shown}/{f}")]  # all checked
    if not present:
        raise InputError(f"{shown}: no tokenizer (tokenizer.json or tokenizer_config.json) to tokenise text "
                         "data with; pass token ids (.npz with input_ids, or .jsonl) instead")
    if "tokenizer.json" in present and os.path.getsize(os.path.join(path, "tokenizer.json")) > MAX_TOKENIZER_BYTES:
        raise InputError(f"{shown}/tokenizer.json: larger than {MAX_TOKENIZER_BYTES:,} bytes")
    if "tokenizer_config.json" in present:
        _tokenizer_document(path, "tokenizer_config.json", None)
    if config is None and regular_file(os.path.join(path, "config.json"), f"{shown}/config.json"):
        config = hf_config(path)  # AutoTokenizer reads it too: its refusal would be reported as the tokenizer's
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            return AutoTokenizer.from_pretrained(path, config=config, trust_remote_code=False)
    except MemoryError:
        raise
    except Exception as exc:  # the tokenizers library raises a bare Exception for a file it cannot parse
        if "tokenizer.json" in present:
            _tokenizer_document(path, "tokenizer.json", "model")  # what is wrong with it, where satcore can say
        raise InputError(f"{shown}: its tokenizer does not load ({_reason(exc)})") from None


def tokenizer_load_note(path) -> str | None:
    """The line a command prints before loading ``path``'s tokenizer where ``tokenizer.json`` is large enough for
    the load to take more than a few seconds (:data:`ANNOUNCED_TOKENIZER_BYTES`): its size and the time expected,
    at :data:`TOKENIZER_SECONDS_PER_MB`; ``None`` for a smaller file or none."""
    file = os.path.join(path, "tokenizer.json")
    size = os.path.getsize(file) if os.path.isfile(file) else 0
    if size < ANNOUNCED_TOKENIZER_BYTES:
        return None
    return (f"loading {display_name(os.fspath(path))}/tokenizer.json ({size / 1e6:.1f} MB): about "
            f"{size / 1e6 * TOKENIZER_SECONDS_PER_MB:.0f} s in the tokenizers library and transformers (measured "
            f"{TOKENIZER_SECONDS_PER_MB} s per MB on a 2-core machine)")


def _tokenizer_document(path, name: str, needs: str | None) -> None:
    """Refuse the tokenizer file ``name`` of ``path`` unless it is a JSON object (holding a ``needs`` mapping)."""
    shown = f"{display_name(os.fspath(path))}/{name}"
    # unique_keys=False: the tokenizer's libraries read it after this, keeping a repeated key's last value
    document = read_json(os.path.join(path, name), shown, MAX_TOKENIZER_BYTES, unique_keys=False)
    if not isinstance(document, dict) or (needs and not isinstance(document.get(needs), dict)):
        raise InputError(f"{shown}: not a tokenizer's JSON object" + (f" (no {needs!r} mapping)" if needs else ""))


def _text_ids(path, tokenizer, n_tokens: int) -> np.ndarray:
    """Up to ``n_tokens`` ids of the UTF-8 text in ``path``, tokenised a piece of about
    :data:`TEXT_PIECE_BYTES` at a time (each piece ends at a line break where the piece has one)."""
    shown = display_name(os.fspath(path))
    decoder = codecs.getincrementaldecoder("utf-8")()
    pieces, held, offset, carry = [], 0, 0, ""
    with open(path, "rb") as stream:
        budget = n_tokens * MAX_TEXT_CHARS_PER_TOKEN
        while held < n_tokens and budget > 0:
            raw = stream.read(min(TEXT_PIECE_BYTES, budget))
            nul = raw.find(b"\0")  # UTF-8 all the same (a sparse or preallocated file's zeros): no text holds one
            if nul >= 0:
                raise InputError(f"{shown}: not text (a NUL byte at offset {offset + nul}); token ids go in .npz or "
                                 ".jsonl")
            budget -= len(raw)
            last = not raw or budget <= 0
            try:
                text = carry + decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                if not (last and exc.start >= len(raw) - 3):  # a character cut at the read limit is not an error
                    # "(byte 10)" read as the byte's value; name both, the offset counted from the file's start
                    raise InputError(f"{shown}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                     f"{offset + exc.start}); token ids go in .npz or .jsonl") from None
                text = carry + raw[: exc.start].decode("utf-8")
            offset += len(raw)
            cut = len(text) if last else text.rfind("\n") + 1 or len(text)
            text, carry = text[:cut], text[cut:]
            if text.strip():
                # verbose=False: a piece longer than the model's context would make transformers warn of "indexing
                # errors"; the ids are cut into windows no longer than the context, so nothing is indexed past it
                ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
                pieces.append(np.asarray(ids[: n_tokens - held], dtype=np.int64))
                held += len(pieces[-1])
            if last:
                break
    if not pieces:
        raise InputError(f"{shown}: no text")
    return np.concatenate(pieces)


def _npz_ids(path, n_tokens: int) -> np.ndarray:
    shown = display_name(os.fspath(path))
    with NpzArchive(path) as archive:
        if "input_ids" not in archive.members:
            raise InputError(f"{shown}: no member 'input_ids' (members: {', '.join(sorted(archive.members))})")
        header = archive.header("input_ids")
        if header.dtype.kind not in "iu":
            raise InputError(f"{shown}: member 'input_ids' must hold integers, got dtype {header.dtype}")
        per_row = math.prod(header.shape[1:]) if header.shape else 1
        rows = archive.rows("input_ids", whole=not header.shape)
        try:  # only the rows that hold the tokens used
            ids = rows.read(-(-n_tokens // max(per_row, 1)) if header.shape else 1)
        finally:
            rows.close()
    if ids.dtype.kind == "u" and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
        raise InputError(f"{shown}: member 'input_ids' holds ids past int64 ({int(ids.max())})")
    return np.asarray(ids, dtype=np.int64).reshape(-1)[:n_tokens]


def _jsonl_ids(path, n_tokens: int, vocab_size: int) -> np.ndarray:
    shown = display_name(os.fspath(path))
    pieces, held = [], 0
    with open(path, "rb") as stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_JSONL_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_JSONL_LINE_BYTES:
                raise InputError(f"{shown}: line {number} is longer than {MAX_JSONL_LINE_BYTES} bytes")
            if not line.strip():
                continue
            row = read_json(path, f"{shown}: line {number}", MAX_JSONL_LINE_BYTES, data=line)
            if isinstance(row, dict):
                row = row.get("input_ids")
            if not isinstance(row, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
                raise InputError(f"{shown}: line {number}: expected a list of integer token ids or "
                                 "{\"input_ids\": [...]}")
            if row and not 0 <= min(row) <= max(row) < vocab_size:  # Python ints: 10**30 is not cast to int64
                bad = next(t for t in row if not 0 <= t < vocab_size)
                raise InputError(f"{shown}: line {number}: token id {shown_value(bad)} is outside the model's "
                                 f"vocabulary 0..{vocab_size - 1}")
            pieces.append(np.asarray(row[: n_tokens - held], dtype=np.int64))
            held += len(pieces[-1])
            if held >= n_tokens:
                break
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def _token_capacity(path, suffix: str) -> int:
    """The most tokens ``path`` can hold, from its size alone (a JSON id takes at least 2 bytes, ``0,``; a text
    token at least one byte; an .npz array its element count), so that a huge ``--max-windows`` reads no more."""
    if suffix == ".npz":
        with NpzArchive(path) as archive:
            if "input_ids" in archive.members:
                return math.prod(archive.header("input_ids").shape)
        return 0
    size = os.path.getsize(path)
    return size // 2 + 1 if suffix == ".jsonl" else size


MIN_WINDOWS = 4  # the fewest windows expand decides on


def read_token_windows(path, *, tokenizer_dir, vocab_size: int, seq_len: int, max_windows: int,
                       tokenizer=None) -> torch.Tensor:
    """``(N, seq_len)`` token ids from ``path`` (module docstring), ``N <= max_windows``.

    Text is tokenised with ``tokenizer()``, a function returning the checkpoint's tokenizer, called only for text
    (a command reading several files loads it once: ``functools.cache(lambda: load_tokenizer(...))``); by default
    :func:`load_tokenizer` of ``tokenizer_dir``.

    The tokens read are at most ``max_windows * seq_len`` and at most what the file can hold
    (:func:`_token_capacity`); their int64 buffer is refused above satcore's memory budget
    (``SATCORE_MEMORY_BUDGET``) before it is read.
    """
    shown = display_name(os.fspath(path))
    if os.path.isdir(path):
        raise InputError(f"{shown}: is a directory, not a data file (UTF-8 text, .npz or .jsonl)")
    if not regular_file(path, shown):  # a device or a FIFO is there but is not read (it could block or never end)
        raise InputError(f"{shown}: no such file")
    suffix = Path(path).suffix.lower()
    n_tokens = min(seq_len * max_windows, _token_capacity(path, suffix))
    check_memory(8 * n_tokens, f"{shown}: {n_tokens:,} token ids (--max-windows x --seq-len, at most the file's)")
    if suffix == ".npz":
        ids = _npz_ids(path, n_tokens)
    elif suffix == ".jsonl":
        ids = _jsonl_ids(path, n_tokens, vocab_size)
    else:
        ids = _text_ids(path, load_tokenizer(tokenizer_dir) if tokenizer is None else tokenizer(), n_tokens)
        if len(ids) and int(ids.max()) >= vocab_size:  # the checkpoint's tokenizer made it: config.json's fault
            raise InputError(f"{display_name(os.fspath(tokenizer_dir))}/config.json: vocab_size {vocab_size} does not "
                             f"cover token id {int(ids.max())}, which its tokenizer gives for {shown}: the tokenizer "
                             "and config.json disagree")
    check_token_ids(ids, vocab_size, shown)
    n = len(ids) // seq_len
    if n < MIN_WINDOWS:
        raise InputError(f"{shown}: {len(ids)} tokens make {n} window(s) of {seq_len}; expand needs at least "
                         f"{MIN_WINDOWS} (lower --seq-len or give more data)")
    return torch.from_numpy(ids[: n * seq_len].reshape(n, seq_len).copy())
