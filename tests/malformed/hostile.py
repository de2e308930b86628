"""Hostile inputs by failure class, built at test time: containers, sizes, text, names, paths, models.

Each case is ``(case_id, path, expect, scope)``: ``expect`` lists substrings of the one error line;
``scope`` says which readers must refuse it:

* ``"container"``: the file is no safe ``.npz`` at all (non-regular paths, zip and zlib damage,
  compression, sizes, ``.npy`` headers): every command refuses it, ``probe --data`` included;
* ``"dump"``: a well-formed ``.npz`` that is no valid dump: ``score``, ``inspect``, ``merge``,
  ``sweep`` refuse it;
* ``"scoring"``: a readable dump whose statistics no data could give, found when scoring:
  ``score`` and ``sweep`` refuse it.

``DECLARED`` cases declare (in the ``.npy`` header or the zip directory) gigabytes that the
file does not hold: their refusal must not allocate them.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile

import numpy as np

from .corpus import SCHEMA, good_pair, good_stats, header, npy_bytes, write_zip

GIB = 2**30


def npy_header_only(shape, descr="<f8", fortran=False) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": fortran, "shape": shape})
    return buf.getvalue()


def npy_raw_header(text: str) -> bytes:
    """A version 1.0 ``.npy`` header holding ``text`` verbatim (numpy would refuse to write some of them)."""
    body = text.encode("latin1") + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


def _central_entries(data: bytes):
    """``{name: (central offset, local offset)}`` of a zip's members, from its end record."""
    end = data.rfind(b"PK\x05\x06")
    n_entries, _, cd_offset = struct.unpack("<HII", data[end + 10 : end + 20])
    out, at = {}, cd_offset
    for _ in range(n_entries):
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[at + 28 : at + 34])
        (local,) = struct.unpack("<I", data[at + 42 : at + 46])
        out[data[at + 46 : at + 46 + name_len].decode()] = (at, local)
        at += 46 + name_len + extra_len + comment_len
    return out


def patch_member(path, member: str, **fields):
    """Overwrite ``flag``, ``method``, ``crc``, ``compress_size`` or ``file_size`` of ``member`` in both its
    local header and its central directory entry (what zipfile itself cannot write: encryption flags,
    unknown methods, sizes that lie)."""
    data = bytearray(open(path, "rb").read())
    central, local = _central_entries(bytes(data))[member]
    layout = {"flag": ("<H", 8, 6), "method": ("<H", 10, 8), "crc": ("<I", 16, 14),
              "compress_size": ("<I", 20, 18), "file_size": ("<I", 24, 22)}
    for field, value in fields.items():
        fmt, in_central, in_local = layout[field]
        struct.pack_into(fmt, data, central + in_central, value)
        struct.pack_into(fmt, data, local + in_local, value)
    open(path, "wb").write(bytes(data))
    return path


def patch_end_record(path, directory_bytes: int):
    """Make the end record claim a central directory of ``directory_bytes``."""
    data = bytearray(open(path, "rb").read())
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<I", data, end + 12, directory_bytes)
    open(path, "wb").write(bytes(data))
    return path


def deflated_zeros_member(path, key: str, n_bytes: int, extra: dict):
    """A dump whose ``key`` is ``n_bytes`` of float64 zeros, deflated (about 1000:1), beside ``extra``."""
    n = n_bytes // 8
    body = npy_header_only((n // 4, 4))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in extra.items():
            z.writestr(k + ".npy", npy_bytes(v))
        with z.open(key + ".npy", "w", force_zip64=True) as stream:
            stream.write(body)
            zeros = bytes(2**20)
            for _ in range(n_bytes // len(zeros)):
                stream.write(zeros)
    return path


def container_cases(tmp):
    """Damaged, hostile or oversized ``.npz`` containers (scope ``"container"``)."""
    rng = np.random.default_rng(11)
    q, p = good_pair(rng)
    out = []

    def add(case_id, path, expect):
        out.append((case_id, path, expect, "container"))

    def zip_case(case_id, members, expect, compression=zipfile.ZIP_STORED, **patch):
        path = write_zip(tmp / f"{case_id}.npz", members, compression)
        if patch:
            patch_member(path, patch.pop("member", "q/blk.npy"), **patch)
        add(case_id, path, expect)

    # -- paths that are not regular files: refused from stat, never opened for reading
    fifo = tmp / "fifo.npz"
    os.mkfifo(fifo)
    add("fifo", fifo, ["fifo.npz", "a FIFO", "not a regular file"])
    (tmp / "a_directory.npz").mkdir()
    add("directory", tmp / "a_directory.npz", ["a_directory.npz", "a directory"])
    add("dev_zero", "/dev/zero", ["/dev/zero", "a character device"])
    os.symlink("/dev/zero", tmp / "link_to_zero.npz")
    add("symlink_to_dev_zero", tmp / "link_to_zero.npz", ["link_to_zero.npz", "a character device"])
    add("missing_file", tmp / "no_such.npz", ["no_such.npz", "no such file"])
    (tmp / "empty_file.npz").write_bytes(b"")
    add("empty_file", tmp / "empty_file.npz", ["empty_file.npz", "not a zip"])

    dump = {**header(), "q/blk": q, "psi/blk": p}
    # -- zip and zlib damage
    zip_case("bzip2_member", dump, ["satcore_schema", "compression bzip2"], zipfile.ZIP_BZIP2)
    zip_case("lzma_member", dump, ["satcore_schema", "compression lzma"], zipfile.ZIP_LZMA)
    zip_case("encrypted_member", dump, ["q/blk", "encrypted"], flag=0x1)
    zip_case("unknown_compression", dump, ["q/blk", "compression method 99"], method=99)
    zip_case("zero_byte_member", {**header(), "q/blk": b"", "psi/blk": p}, ["q/blk", "empty member"])
    zip_case("bad_crc", dump, ["q/blk", "CRC"], crc=0x12345678)
    zip_case("bad_crc_deflated", dump, ["q/blk", "CRC"], zipfile.ZIP_DEFLATED, crc=0x12345678)
    path = write_zip(tmp / "corrupt_deflate.npz", dump, zipfile.ZIP_DEFLATED)
    data = bytearray(path.read_bytes())
    central, local = _central_entries(bytes(data))["q/blk.npy"]
    name_len, extra_len = struct.unpack("<HH", data[local + 26 : local + 30])
    start = local + 30 + name_len + extra_len
    data[start + 40 : start + 200] = os.urandom(160)  # inside the deflate stream, past the .npy header
    path.write_bytes(bytes(data))
    add("corrupt_deflate", path, ["q/blk", "unreadable zip member"])
    # -- sizes: what the zip directory or the .npy header declares, against what the file holds
    zip_case("zip_declares_2gib", dump, ["q/blk", "inflates to 2147483648 bytes", "SATCORE_MAX_INFLATE_RATIO"],
             zipfile.ZIP_DEFLATED, file_size=2 * GIB)
    zip_case("compressed_size_beyond_file", dump, ["q/blk", "compressed bytes in a file of"],
             zipfile.ZIP_DEFLATED, compress_size=GIB)
    path = write_zip(tmp / "huge_directory.npz", dump)
    add("huge_directory", patch_end_record(path, 2**31), ["huge_directory.npz", "zip directory", "over the"])
    path = tmp / "deflate_bomb.npz"
    add("deflate_bomb", deflated_zeros_member(path, "q/blk", 16 * 2**20, {**header(), "psi/blk": p}),
        ["q/blk", "inflates to", "over 100x"])
    zip_case("header_declares_1tib", {**header(), "q/blk": npy_header_only((2**37, 1)), "psi/blk": p},
             ["q/blk", "truncated", "1099511627776 bytes"], zipfile.ZIP_DEFLATED)
    zip_case("stats_declare_2gib",
             {**header(), **good_stats(rng), "stats/blk/sum_gram": npy_header_only((16384, 16384))},
             ["stats/blk/sum_gram", "truncated", "2147483648"])
    zip_case("trailing_data", {**header(), "q/blk": npy_bytes(q) + b"\0" * 64, "psi/blk": p},
             ["q/blk", "data beyond"])
    # -- .npy headers
    zip_case("zero_itemsize", {**header(), "q/blk": npy_header_only((20, 4), descr="|V0"), "psi/blk": p},
             ["q/blk", "zero-size items"])
    zip_case("huge_integer_in_shape", {**header(), "q/blk": npy_raw_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1" + "0" * 5000 + ",), }"), "psi/blk": p},
             ["q/blk", "malformed .npy header"])
    zip_case("not_npy_magic", {**header(), "q/blk": b"\x93NUMPZ" + bytes(200), "psi/blk": p},
             ["q/blk", "not a .npy array"])
    return out


def dump_cases(tmp):
    """Well-formed ``.npz`` files that are no valid dump (scope ``"dump"``), and one for scoring."""
    rng = np.random.default_rng(12)
    q, p = good_pair(rng)
    out = []

    def add(case_id, members, expect, scope="dump"):
        out.append((case_id, write_zip(tmp / f"{case_id}.npz", members), expect, scope))

    meta_bytes = np.array(b'{"candidates": ["blk"], "split": "\xff\xfe"}')  # an S string, not UTF-8
    add("meta_bad_utf8", {"satcore_schema": np.array(SCHEMA), "meta": meta_bytes, "q/blk": q, "psi/blk": p},
        ["meta", "not valid UTF-8"])
    bad_code_point = npy_header_only((), descr="<U2") + b"\xff\xff\xff\xff" * 2
    add("meta_bad_code_point", {"satcore_schema": np.array(SCHEMA), "meta": bad_code_point, "q/blk": q,
                                "psi/blk": p}, ["meta", "not valid UTF-32"])
    huge = '{"candidates": ["blk"], "batch_size": 1' + "0" * 5000 + "}"
    add("meta_huge_integer", {"satcore_schema": np.array(SCHEMA), "meta": np.array(huge), "q/blk": q, "psi/blk": p},
        ["meta", "not readable JSON"])
    evil = "blk\x1b]0;PWNED\x07\x1b[2J\nsatcore: error: FORGED\r"
    q_nan = q.copy()
    q_nan[0, 0] = np.nan
    add("escape_in_bad_key", {**header(names=(evil,)), f"q/{evil}": q_nan, f"psi/{evil}": p},
        ["non-finite", "\\x1b]0;PWNED\\x07"])
    add("escape_in_unknown_key", {**header(), "q/blk": q, "psi/blk": p, "x\x1b[31m/\nFORGED": p},
        ["unknown key", "x\\x1b[31m/\\nFORGED"])
    stream = {**good_stats(rng), "stats/blk/sum_z_sq": np.array(10.0), "stats/blk/n_stream_vectors": np.array(0.0)}
    add("stream_sum_without_vectors", {**header(), **stream},  # its RMS per position was sqrt(10 / max(0, 1))
        ["stream_sum_without_vectors.npz", "n_stream_vectors is 0 but sum_z_sq is 10"])
    batches = {**good_stats(rng), "stats/blk/sum_batch_grad_norm": np.array(2.5), "stats/blk/n_batches": np.array(0.0)}
    add("batch_norm_sum_without_batches", {**header(), **batches},  # its ag_batch was left out, without a word
        ["batch_norm_sum_without_batches.npz", "n_batches is 0 but sum_batch_grad_norm is 2.5"])
    stats = good_stats(rng)
    stats["stats/blk/sum_gram"] = np.array([[1e-320, 1e300], [1e300, 1e-320]])
    stats["stats/blk/sum_cross"] = np.zeros((4, 2))
    stats["stats/blk/sum_xtx"] = np.zeros((2, 2))
    stats["stats/blk/sum_xi_sq"] = np.array(0.0)
    stats["stats/blk/fold_cross"] = np.zeros((16, 4, 2))  # the folds add up to the new sum_cross
    add("gram_overflows_when_scaled", {**header(), **stats}, ["gram_overflows_when_scaled.npz", "'blk'", "sum_gram", "not positive semi-definite"],
        scope="scoring")
    add("values_overflow_when_squared", {**header(), "q/blk": q * 1e200, "psi/blk": p * 1e200},
        ["values_overflow_when_squared.npz", "'blk'", "not finite"], scope="scoring")
    return out


def evil_name_dump(tmp, names):
    """A valid raw dump whose candidates carry ``names`` (terminal escapes, newlines, mathtext)."""
    rng = np.random.default_rng(13)
    members = {**header(names=names)}
    for name in names:
        q, p = good_pair(rng, M=30)
        members[f"q/{name}"], members[f"psi/{name}"] = q, p
    return write_zip(tmp / "evil_names.npz", {**members, "meta": np.array(json.dumps(
        {"candidates": list(names), "split": "val\x1b]0;TITLE\x07", "x\x1b[1m": "y\nFORGED"}))})


def write_data(path, **arrays):
    """A DATA.npz for ``satcore probe`` (numpy.savez, as a user would write it)."""
    np.savez(path, **arrays)
    return path


def cyclic_model(path):
    """An ONNX file whose graph has a data cycle: ``a = x + y``, ``y = relu(a)`` (no valid topological order)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    out = helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 4])
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "cycle", [x], [out]),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path

