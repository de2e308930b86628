"""A corpus of malformed dumps, built at test time (no binaries in the repository).

Each case writes one file and names the substrings the single error line must
contain (the key and the problem).  ``PICKLE_TARGET`` cases carry a pickle
whose execution would create a file; the tests check that it never appears.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import zipfile

import numpy as np

SCHEMA = "satcore-dump/1"


class CreatesFile:
    """Unpickling this calls ``pathlib.Path(target).touch()``: a visible side effect."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.target),))


def pickle_payload(target) -> bytes:
    return pickle.dumps(CreatesFile(target), protocol=2)


def npy_bytes(array) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=True)
    return buf.getvalue()


def object_npy_with_payload(target) -> bytes:
    """A ``.npy`` of dtype object whose body is a pickle that creates ``target`` when loaded."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    return buf.getvalue() + pickle.dumps([CreatesFile(target)], protocol=2)


def write_zip(path, members: dict, compression=zipfile.ZIP_STORED):
    """``members`` maps key -> array or raw bytes; keys get the ``.npy`` suffix ``numpy.savez`` uses."""
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for key, value in members.items():
            z.writestr(key + ".npy", value if isinstance(value, bytes) else npy_bytes(value))
    return path


def header(meta=None, names=("blk",)):
    info = {"candidates": list(names)} if meta is None else meta
    return {"satcore_schema": np.array(SCHEMA), "meta": np.array(json.dumps(info))}


def good_pair(rng, M=20, N=4, r=3, T=None):
    shape_q = (M, N) if T is None else (M, T, N)
    shape_p = (M, r) if T is None else (M, T, r)
    return rng.standard_normal(shape_q), rng.standard_normal(shape_p)


def good_stats(rng):
    from satcore import CandidateStatistics

    q, p = good_pair(rng)
    return {f"stats/blk/{k}": np.asarray(v) for k, v in CandidateStatistics.from_samples(q, p).to_arrays().items()}


def truncated_member_bytes(rng) -> bytes:
    """A valid header for 20 rows followed by the data of only 10."""
    q, _ = good_pair(rng)
    full = npy_bytes(q)
    return full[: len(full) - 10 * q.shape[1] * 8]


def cases(tmp: pathlib.Path, pickle_target: pathlib.Path):
    """``[(case_id, path, [substrings of the error line])]``."""
    rng = np.random.default_rng(7)
    q, p = good_pair(rng)
    out = []

    def add(case_id, members, expect, compression=zipfile.ZIP_STORED):
        out.append((case_id, write_zip(tmp / f"{case_id}.npz", members, compression), expect))

    (tmp / "not_a_zip.npz").write_bytes(b"this is not a zip file\n" * 10)
    out.append(("not_a_zip", tmp / "not_a_zip.npz", ["not a zip"]))
    valid = write_zip(tmp / "valid.npz", {**header(), "q/blk": q, "psi/blk": p})
    cut = valid.read_bytes()
    (tmp / "truncated_file.npz").write_bytes(cut[: len(cut) // 2])
    out.append(("truncated_file", tmp / "truncated_file.npz", ["not a zip"]))
    corrupt = bytearray(cut)
    at = bytes(cut).find(np.ascontiguousarray(q).tobytes()[:64])
    corrupt[at + 5] ^= 0xFF
    (tmp / "corrupt_member.npz").write_bytes(bytes(corrupt))
    out.append(("corrupt_member", tmp / "corrupt_member.npz", ["q/blk", "CRC"]))
    for comp, tag in ((zipfile.ZIP_STORED, "stored"), (zipfile.ZIP_DEFLATED, "deflated")):
        add(f"truncated_member_{tag}", {**header(), "q/blk": truncated_member_bytes(rng), "psi/blk": p},
            ["q/blk", "truncated"], comp)
    add("object_array", {**header(), "q/blk": np.array([1.0, "x"], dtype=object), "psi/blk": p},
        ["q/blk", "Python objects"])
    add("pickle_in_npy", {**header(), "q/blk": object_npy_with_payload(pickle_target), "psi/blk": p},
        ["q/blk", "pickle"])
    add("bare_pickle_member", {"q/blk": pickle_payload(pickle_target), "psi/blk": p}, ["q/blk", "not a .npy"])
    add("pickle_as_meta", {"satcore_schema": np.array(SCHEMA), "meta": object_npy_with_payload(pickle_target),
                           "q/blk": q, "psi/blk": p}, ["meta", "pickle"])
    add("string_dtype", {**header(), "q/blk": np.array([["a", "b"]] * 20), "psi/blk": p}, ["q/blk", "dtype"])
    add("integer_dtype", {**header(), "q/blk": q, "psi/blk": np.ones((20, 3), dtype=np.int64)}, ["psi/blk", "int64"])
    add("complex_dtype", {**header(), "q/blk": q.astype(np.complex128), "psi/blk": p}, ["q/blk", "complex128"])
    q_nan = q.copy()
    q_nan[[0, 3, 5], [0, 1, 2]] = [np.nan, np.inf, -np.inf]
    add("nan_inf", {**header(), "q/blk": q_nan, "psi/blk": p}, ["q/blk", "'blk'", "3 non-finite"])
    add("mismatched_samples", {**header(), "q/blk": q, "psi/blk": p[:19]}, ["psi/blk", "19 samples", "20"])
    qt, pt = good_pair(rng, T=3)
    add("mismatched_positions", {**header(), "q/blk": qt, "psi/blk": pt[:, :2]}, ["psi/blk", "positions"])
    add("mismatched_rank", {**header(), "q/blk": qt, "psi/blk": p}, ["psi/blk", "does not match"])
    add("mismatched_jac_width", {**header(), "q/blk": q, "jac/blk": rng.standard_normal((20, 5, 2))},
        ["jac/blk", "(20, 4, p)"])
    add("empty_candidate", {**header(), "q/blk": q[:0], "psi/blk": p[:0]}, ["q/blk", "empty candidate"])
    add("zero_width", {**header(), "q/blk": q[:, :0], "psi/blk": p}, ["q/blk", "empty candidate"])
    add("q_without_psi", {**header(), "q/blk": q}, ["q/blk", "no matching psi/blk"])
    add("unknown_schema", {"satcore_schema": np.array("satcore-dump/2"), "meta": header()["meta"], "q/blk": q,
                           "psi/blk": p}, ["satcore_schema", "satcore-dump/2"])
    add("meta_not_json", {"satcore_schema": np.array(SCHEMA), "meta": np.array("{candidates: blk"), "q/blk": q,
                          "psi/blk": p}, ["meta", "JSON"])
    add("meta_missing_candidate", {**header(names=("blk", "other")), "q/blk": q, "psi/blk": p},
        ["'other'", "listed in meta"])
    add("unknown_key", {**header(), "q/blk": q, "psi/blk": p, "weights/blk": p}, ["weights/blk", "unknown key"])
    stats = good_stats(rng)
    add("negative_count", {**header(), **stats, "stats/blk/n_samples": np.array(-5)}, ["stats/blk", "whole number"])
    asym = stats["stats/blk/sum_gram"].copy()
    asym[0, 1] += 1.0
    add("nonsymmetric_gram", {**header(), **stats, "stats/blk/sum_gram": asym}, ["stats/blk", "sum_gram", "symmetric"])
    add("stats_nan", {**header(), **stats, "stats/blk/sum_q_sq": np.array(np.nan)}, ["stats/blk/sum_q_sq", "non-finite"])
    add("stats_unknown_field", {**header(), **stats, "stats/blk/sum_foo": np.array(1.0)},
        ["stats/blk/sum_foo", "not a statistics field"])
    add("stats_negative_variance", {**header(), **stats, "stats/blk/sum_xi_sq": stats["stats/blk/sum_xi_sq"] * 1e-3},
        ["stats/blk", "negative variance"])
    add("stats_fractional_count", {**header(), **stats, "stats/blk/n_samples": np.array(2.7)},
        ["stats/blk", "n_samples", "whole number"])
    add("meta_split_not_text", {**header({"candidates": ["blk"], "split": 5}), "q/blk": q, "psi/blk": p},
        ["meta", "split must be a string"])
    add("meta_model_depth", {**header({"candidates": ["blk"], "model_depth": 2.5}), "q/blk": q, "psi/blk": p},
        ["meta", "model_depth must be a positive integer"])
    deep = '{"candidates": ["blk"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    add("meta_deeply_nested", {"satcore_schema": np.array(SCHEMA), "meta": np.array(deep), "q/blk": q, "psi/blk": p},
        ["meta", "nested too deeply"])
    add("negative_dimension", {**header(), "q/blk": npy_with_shape(q, (20, -4)), "psi/blk": p},
        ["q/blk", "negative dimension"])
    # a header whose dictionary is not a literal: numpy's parser names the node by its memory address
    add("header_not_a_literal", {**header(), "q/blk": npy_header_text(q, "{'descr': '<f8', 'fortran_order': maybe, "
                                                                        "'shape': (20, 4), }"), "psi/blk": p},
        ["q/blk", "malformed .npy header", "<ast.Name>)"])
    # JSON readers keep a repeated key's last value: is this probe of the held-out split or of the training one?
    twice = '{"candidates": ["blk"], "split": "train", "split": "heldout"}'
    add("meta_duplicate_key", {"satcore_schema": np.array(SCHEMA), "meta": np.array(twice), "q/blk": q, "psi/blk": p},
        ["meta: key 'split' appears twice in one object"])
    return out


def npy_header_text(array, text: str) -> bytes:
    """``array``'s data under a version 1.0 header of exactly ``text`` (padded as numpy pads it)."""
    padded = text.encode("latin1") + b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(padded).to_bytes(2, "little") + padded + np.ascontiguousarray(array).tobytes()


def npy_with_shape(array, shape) -> bytes:
    """``array``'s data under a header that declares ``shape`` (numpy would refuse to write it)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": array.dtype.str, "fortran_order": False, "shape": shape})
    return buf.getvalue() + np.ascontiguousarray(array).tobytes()


CASE_IDS = (
    "not_a_zip", "truncated_file", "corrupt_member", "truncated_member_stored", "truncated_member_deflated", "object_array",
    "pickle_in_npy", "bare_pickle_member", "pickle_as_meta", "string_dtype", "integer_dtype", "complex_dtype",
    "nan_inf", "mismatched_samples", "mismatched_positions", "mismatched_rank", "mismatched_jac_width",
    "empty_candidate", "zero_width", "q_without_psi", "unknown_schema", "meta_not_json",
    "meta_missing_candidate", "unknown_key", "negative_count", "nonsymmetric_gram", "stats_nan",
    "stats_unknown_field", "stats_negative_variance", "stats_fractional_count", "meta_split_not_text",
    "meta_model_depth", "meta_deeply_nested", "negative_dimension", "header_not_a_literal", "meta_duplicate_key",
)
