"""The weights of a checkpoint directory as their safetensors headers say, read and checked without the data.

A ``.safetensors`` file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``) and the
data, whose tensors must tile it exactly (the format's own rule).  :func:`weight_headers` reads
the file ``from_pretrained`` would read (``transformers_weights`` in the config, else
``model.safetensors``, else the shards of ``model.safetensors.index.json``, each a file of the
directory) and checks every header against the file's size before anything is built: a truncated
or forged file is one :class:`~satcore.InputError` naming the file and the tensor, where the
safetensors reader would raise ``SafetensorError`` from inside the model's loading.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from satcore import InputError
from satcore.adapter_api import MAX_COUNT, DuplicateKeyError, display_name, loads_unique, regular_file, whole_number

# bytes per element of the dtypes torch reads from safetensors
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
              "U16": 2, "U32": 4, "U64": 8, "C64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors reader's own limit
MAX_INDEX_BYTES = 2**26
MAX_JSON_DEPTH = 32  # a config is a few levels deep; a deeper document is refused before it is walked


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its file's header declares it."""

    shape: tuple[int, ...]
    dtype: str
    file: str  # the file's name in the directory

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_json(path: str, what: str, max_bytes: int, *, data: bytes | None = None, unique_keys: bool = True):
    """The JSON document in ``path`` (or ``data``, read from it), at most ``max_bytes`` and
    :data:`MAX_JSON_DEPTH` levels deep, no object naming a key twice; a problem is one line naming ``what``.
    ``unique_keys=False``: a repeated key's last value is kept, for a file another library reads after satcore
    (``config.json``, the tokenizer's files), so that its values are checked as that library reads them."""
    if data is None:
        if os.path.getsize(path) > max_bytes:
            raise InputError(f"{what}: larger than {max_bytes:,} bytes")
        with open(path, "rb") as stream:
            data = stream.read(max_bytes + 1)
    try:  # JSON is UTF-8 (RFC 8259); json.loads would guess UTF-16 or UTF-32 from the first bytes and misreport
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    try:
        document = loads_unique(text) if unique_keys else json.loads(text)
    except DuplicateKeyError as exc:
        raise InputError(f"{what}: {exc}") from None
    except RecursionError:
        raise InputError(f"{what}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:
        raise InputError(f"{what}: not JSON ({display_name(' '.join(str(exc).split()), 200)})") from None
    level, depth = [document], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise InputError(f"{what}: nested more than {MAX_JSON_DEPTH} levels deep")
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, (dict, list))]
    return document


def weight_files(directory: str, config: dict) -> tuple[str, ...]:
    """The names of the ``.safetensors`` files ``from_pretrained`` reads, each a file of ``directory``."""
    shown = display_name(directory)
    explicit = config.get("transformers_weights")
    if explicit is not None:
        if not isinstance(explicit, str) or not _plain_name(explicit) or not explicit.endswith(
                (".safetensors", ".safetensors.index.json")):
            raise InputError(f"{shown}/config.json: transformers_weights must name a .safetensors file of the "
                             f"directory, got {display_name(repr(explicit), 80)}")
        name = explicit
    elif regular_file(os.path.join(directory, "model.safetensors"), f"{shown}/model.safetensors"):
        name = "model.safetensors"
    elif regular_file(os.path.join(directory, "model.safetensors.index.json"),
                      f"{shown}/model.safetensors.index.json"):
        name = "model.safetensors.index.json"
    else:
        raise InputError(f"{shown}: no model.safetensors (or model.safetensors.index.json) to read the weights from")
    if not regular_file(os.path.join(directory, name), f"{shown}/{display_name(name)}"):
        raise InputError(f"{shown}: no {display_name(name)} (config.json's transformers_weights names it)")
    if not name.endswith(".index.json"):
        return (name,)
    index = read_json(os.path.join(directory, name), f"{shown}/{name}", MAX_INDEX_BYTES)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{shown}/{name}: no weight_map (a mapping of tensor names to shard files)")
    if not isinstance(index.get("metadata"), dict):  # transformers' loader indexes and extends it
        found = display_name(repr(index["metadata"]), 80) if "metadata" in index else "none"
        raise InputError(f"{shown}/{name}: metadata must be a JSON object (save_pretrained writes "
                         f"{{\"total_size\": ...}}), found {found}")
    shards = sorted(set(map(str, weight_map.values())))
    for shard in shards:
        if not _plain_name(shard) or not shard.endswith(".safetensors"):
            raise InputError(f"{shown}/{name}: shard {display_name(repr(shard), 80)} is not a .safetensors file of "
                             "the directory")
        if not regular_file(os.path.join(directory, shard), f"{shown}/{display_name(shard)}"):
            raise InputError(f"{shown}/{name}: shard {display_name(shard)} is missing")
    return tuple(shards)


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and os.sep not in name and "\0" not in name


def weight_headers(directory: str, config: dict) -> dict[str, TensorHeader]:
    """Every tensor of the weights ``from_pretrained`` would read (:func:`weight_files`), checked."""
    tensors: dict[str, TensorHeader] = {}
    for name in weight_files(directory, config):
        for key, header in file_header(os.path.join(directory, name)).items():
            if key in tensors:
                raise InputError(f"{display_name(directory)}: tensor {display_name(repr(key), 120)} is in both "
                                 f"{tensors[key].file} and {display_name(name)}")
            tensors[key] = header
    return tensors


def file_header(path: str) -> dict[str, TensorHeader]:
    """The tensors of one ``.safetensors`` file, its header checked against its size: JSON, known dtypes,
    whole-number shapes, each tensor's bytes its shape's, the tensors tiling the data exactly."""
    shown = display_name(path)
    size = os.path.getsize(path)
    with open(path, "rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            raise InputError(f"{shown}: truncated: {size} bytes, not even the 8-byte header length of a safetensors file")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise InputError(f"{shown}: not a safetensors file, or truncated: its header declares {n:,} bytes "
                             f"(the file holds {size:,})")
        raw = stream.read(n)
    header = read_json(path, f"{shown}: header", n, data=raw)
    if not isinstance(header, dict):
        raise InputError(f"{shown}: header is not a JSON object")
    data_bytes, spans, tensors = size - 8 - n, [], {}
    name = os.path.basename(path)
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        what = f"{shown}: tensor {display_name(repr(key), 120)}"
        if not isinstance(entry, dict) or entry.get("dtype") not in ITEM_BYTES:
            dtype = entry.get("dtype") if isinstance(entry, dict) else None
            raise InputError(f"{what}: dtype {display_name(repr(dtype), 40)} is not one of {', '.join(ITEM_BYTES)}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
            raise InputError(f"{what}: needs a shape list and data_offsets [begin, end]")
        shape = tuple(whole_number(s, f"{what}: shape", 0, MAX_COUNT) for s in shape)
        begin, end = (whole_number(o, f"{what}: data_offsets", 0, MAX_COUNT) for o in offsets)
        if end - begin != math.prod(shape) * ITEM_BYTES[entry["dtype"]]:
            raise InputError(f"{what}: data_offsets [{begin}, {end}] hold {end - begin:,} bytes, its shape "
                             f"{list(shape)} of {entry['dtype']} {math.prod(shape) * ITEM_BYTES[entry['dtype']]:,}")
        spans.append((begin, end, key))
        tensors[key] = TensorHeader(shape, entry["dtype"], name)
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            raise InputError(f"{shown}: tensor {display_name(repr(key), 120)} starts at byte {begin:,} of the data, "
                             f"{'overlapping the one before' if begin < position else f'leaving a gap after {position:,}'}")
        position = end
    if position != data_bytes:
        raise InputError(f"{shown}: truncated or padded: the header's tensors hold {position:,} bytes of data, the "
                         f"file {data_bytes:,}")
    return tensors
