"""Hostile checkpoint directories, token files, numbers and outputs of ``satcore expand`` / ``satcore probe MODEL_DIR``,
and the Python surface behind them (``decide``, ``expand``, ``Recipe``).

Every case is a real file (a tiny Llama saved by transformers, then its config edited or its safetensors bytes
rewritten) and must end in exit status 2 with ONE line naming the file and the field, no traceback, nothing
written; the cases that declare huge sizes run in a fresh process whose peak memory is bounded
(``peak_rss``), never by a timing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from satcore import DecisionPolicy, InputError, ModelOnDataError, Recipe, TrialSettings  # noqa: E402
from satcore.cli.main import main  # noqa: E402
from test_expand import DECODER, TEXT, build, digest, tokenizer_for  # noqa: E402
from test_hostile_inputs import CONTROL, RSS_LIMIT_BYTES, SATCORE, assert_one_line, peak_rss, probe_inputs  # noqa: E402,F401

T = transformers
# the satcore of this checkout in the child processes too (the console script may belong to another install)
REPO = {"PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile_ckpt") / "model"
    tokenizer = tokenizer_for(TEXT)
    torch.manual_seed(0)
    T.LlamaForCausalLM(T.LlamaConfig(**{**DECODER, "vocab_size": len(tokenizer), "num_hidden_layers": 4})
                       ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = folder.parent / "corpus.txt"
    text.write_text(TEXT)
    return folder, text


def edited(source, tmp_path, name="m", **changes):
    """A copy of the checkpoint with config.json's keys changed (``None``: the key removed)."""
    folder = tmp_path / name
    shutil.copytree(source[0], folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def forged_safetensors(folder, header: dict, data: bytes = b"", declared: int | None = None):
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw) if declared is None else declared) + raw
                                               + data)


def run_expand(folder, data, out, *extra):
    return CliRunner().invoke(main, ["expand", str(folder), "--data", str(data), "-o", str(out), "--seq-len", "16",
                                     "--steps", "2", *map(str, extra)])


def refused(result, *expect):
    assert result.exit_code == 2, (result.output, result.exception)
    assert_one_line(result.stderr, expect)


def checkpoint_case(case, source, tmp_path):
    """``(folder, expected parts of the line)`` of one hostile checkpoint."""
    folder = edited(source, tmp_path)
    if case == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
        return folder, ["model.safetensors", "truncated"]
    if case == "header_length_forged":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + data[8:])
        return folder, ["model.safetensors", "header declares 4,611,686,018,427,387,904 bytes"]
    if case == "header_not_json":
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", 6) + b"{oops}")
        return folder, ["model.safetensors: header: not JSON"]
    if case == "offsets_forged":
        forged_safetensors(folder, {"model.embed_tokens.weight": {"dtype": "F32", "shape": [1000, 1000],
                                                                  "data_offsets": [0, 16]}}, bytes(16))
        return folder, ["model.safetensors", "'model.embed_tokens.weight'", "data_offsets [0, 16] hold 16 bytes"]
    if case == "dtype_forged":
        forged_safetensors(folder, {"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}}, bytes(2))
        return folder, ["model.safetensors", "tensor 'w': dtype 'Q9'"]
    if case == "header_duplicate_tensor":  # the reader would keep the second 'w' and call the first's bytes a gap
        raw = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
               '"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}').encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(8))
        return folder, ["model.safetensors: header: key 'w' appears twice in one object"]
    if case == "index_duplicate_tensor":  # which shard holds model.norm.weight? json keeps the last, silently
        index = (sharded(folder) / "model.safetensors.index.json").read_text()
        (folder / "model.safetensors.index.json").write_text(index.replace(
            '"weight_map": {', '"weight_map": {"model.norm.weight": "elsewhere.safetensors", ', 1))
        return folder, ["model.safetensors.index.json: key 'model.norm.weight' appears twice in one object"]
    if case == "shard_left_out_of_index":  # the line blamed config.json alone, for the layers in the unlisted shard
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        (folder / "model.safetensors").unlink()
        names = sorted(weights)
        for shard, part in (("s1.safetensors", names[: len(names) // 2]), ("s2.safetensors", names[len(names) // 2:])):
            save_file({k: weights[k] for k in part}, folder / shard, metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: "s1.safetensors" for k in names[: len(names) // 2]}}))
        return folder, ["config.json: num_hidden_layers = 4, but s1.safetensors holds 2 layer(s)",
                        "(or model.safetensors.index.json leaves out a shard: the folder also holds s2.safetensors, "
                        "which its weight_map does not name)"]
    if case == "index_outside_only":  # every shard outside the folder: 'no weights (... or ...index.json)' beside it
        index = (sharded(folder) / "model.safetensors.index.json").read_text()
        (folder / "shard.safetensors").rename(tmp_path / "shard.safetensors")
        (folder / "model.safetensors.index.json").write_text(index.replace('"shard.safetensors"',
                                                                            '"../shard.safetensors"'))
        return folder, ["model.safetensors.index.json: shard '../shard.safetensors' is not a .safetensors file of the "
                        "directory"]
    if case == "int8_weights":  # the reader cast them to float and expand grew a model of garbage, silently
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        save_file({k: (v * 100).to(torch.int8) for k, v in weights.items()}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        return folder, ["model.safetensors: tensor 'model.embed_tokens.weight' is I8, not a float dtype"]
    if case == "layers_word":
        return edited(source, tmp_path, "w", num_hidden_layers="four"), [
            "config.json: num_hidden_layers must be a whole number, got 'four'"]
    if case == "layers_fraction":
        return edited(source, tmp_path, "w", num_hidden_layers=4.5), ["config.json: num_hidden_layers", "4.5"]
    if case == "layers_more_than_weights":
        return edited(source, tmp_path, "w", num_hidden_layers=5), [
            "config.json: num_hidden_layers = 5, but model.safetensors holds 4 layer(s) (model.layers.0 .. "
            "model.layers.3)"]
    if case == "layers_fewer_than_weights":
        return edited(source, tmp_path, "w", num_hidden_layers=2), ["num_hidden_layers = 2", "holds 4 layer(s)"]
    if case == "layers_absent":
        return edited(source, tmp_path, "w", num_hidden_layers=None), [
            "no num_hidden_layers (the architecture's default 32)", "holds 4 layer(s)"]
    if case == "layers_billion":
        return edited(source, tmp_path, "w", num_hidden_layers=10**9), ["num_hidden_layers = 1000000000"]
    if case == "head_dim_forged":
        return edited(source, tmp_path, "w", head_dim=8), [
            "config.json does not match the weights", "q_proj.weight is [32, 16] by the config, [16, 16] in "
            "model.safetensors"]
    if case == "no_heads":
        return edited(source, tmp_path, "w", num_attention_heads=0), [
            "config.json: num_attention_heads: 0 is not in the range 1..2147483648"]
    if case == "heads_indivisible":
        return edited(source, tmp_path, "w", num_key_value_heads=3), [
            "num_attention_heads 4 is not a multiple of num_key_value_heads 3"]
    if case == "width_huge":
        return edited(source, tmp_path, "w", hidden_size=10**40), ["config.json: hidden_size", "not in the range"]
    if case == "bad_dtype":
        return edited(source, tmp_path, "w", dtype="int8"), ["config.json: dtype 'int8'"]
    if case == "tie_word_embeddings_word":  # the tokenizer's loader reads config.json too: it was named the cause
        return edited(source, tmp_path, "w", tie_word_embeddings="yes"), [
            "w/config.json: Validation error for field 'tie_word_embeddings'", "expected bool, got str"]
    if case == "deep_config":
        (folder / "config.json").write_text("[" * 200_000 + "]" * 200_000)
        return folder, ["config.json: nested more than 32 levels deep"]
    if case == "tokenizer_list":
        (folder / "tokenizer.json").write_text("[1, 2, 3]")
        return folder, ["tokenizer.json: not a tokenizer's JSON object"]
    if case == "pickled_weights":
        (folder / "model.safetensors").unlink()
        torch.save({"model.embed_tokens.weight": torch.zeros(2)}, folder / "pytorch_model.bin")
        return folder, ["pytorch_model.bin: pickled weights are not read"]
    if case == "unexpected_tensor":
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        tensors["model.smuggled.weight"] = torch.zeros(3)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return folder, ["config.json does not match the weights", "1 unexpected keys (first model.smuggled.weight)"]
    if case.startswith("index_metadata_"):  # sharded weights whose index lacks the metadata object transformers reads
        from safetensors import safe_open

        (folder / "model.safetensors").rename(folder / "shard.safetensors")
        with safe_open(folder / "shard.safetensors", "np") as weights:
            index = {"weight_map": {key: "shard.safetensors" for key in weights.keys()}}
        if case == "index_metadata_number":
            index["metadata"] = 7
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        found = "7" if case == "index_metadata_number" else "none"
        return folder, ["model.safetensors.index.json: metadata must be a JSON object", f"found {found}"]
    raise AssertionError(case)


CHECKPOINT_CASES = ["truncated", "header_length_forged", "header_not_json", "offsets_forged", "dtype_forged",
                    "header_duplicate_tensor", "index_duplicate_tensor", "int8_weights", "shard_left_out_of_index",
                    "index_outside_only",
                    "layers_word", "layers_fraction", "layers_more_than_weights", "layers_fewer_than_weights",
                    "layers_absent", "layers_billion", "head_dim_forged", "no_heads", "heads_indivisible",
                    "width_huge", "bad_dtype", "tie_word_embeddings_word", "deep_config", "tokenizer_list", "pickled_weights",
                    "unexpected_tensor", "index_metadata_number", "index_metadata_absent"]


@pytest.mark.parametrize("case", CHECKPOINT_CASES)
def test_hostile_checkpoints_are_one_line_before_any_work(case, source, tmp_path):
    folder, expect = checkpoint_case(case, source, tmp_path)
    before = digest(folder)
    out = tmp_path / "out"
    refused(run_expand(folder, source[1], out, "--blocks", "1"), *expect)
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".satcore")]
    assert digest(folder) == before
    if case != "tokenizer_list":  # probe reads the same directory through the same loader
        result = CliRunner().invoke(main, ["probe", str(folder), "--data", str(source[1]), "-o",
                                           str(tmp_path / "d.npz")])
        refused(result, *expect)


def sharded(folder):
    """``folder`` with its weights in one shard, ``shard.safetensors``, named by ``model.safetensors.index.json``."""
    from safetensors import safe_open

    (folder / "model.safetensors").rename(folder / "shard.safetensors")
    with safe_open(folder / "shard.safetensors", "np") as weights:
        index = {"metadata": {}, "weight_map": {key: "shard.safetensors" for key in weights.keys()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


SPECIAL_FILES = {  # case: (the file of the checkpoint replaced, by what, the kind the line names)
    "config_fifo": ("config.json", "fifo", "a FIFO"),
    "config_dev_zero": ("config.json", "/dev/zero", "a character device"),
    "weights_fifo": ("model.safetensors", "fifo", "a FIFO"),
    "weights_directory": ("model.safetensors", "directory", "a directory"),
    "index_fifo": ("model.safetensors.index.json", "fifo", "a FIFO"),
    "shard_dev_zero": ("shard.safetensors", "/dev/zero", "a character device"),
    "tokenizer_dev_zero": ("tokenizer.json", "/dev/zero", "a character device"),
    "tokenizer_config_fifo": ("tokenizer_config.json", "fifo", "a FIFO"),
}


@pytest.mark.parametrize("case", list(SPECIAL_FILES))
def test_a_checkpoint_file_that_is_no_regular_file_is_named_as_what_it_is(case, source, tmp_path):
    """A FIFO, a device or a directory where a checkpoint file goes is never opened (it could block or never end)
    and is refused naming it and what it is; before, it was called missing ('no config.json', 'shard ... is
    missing'), or handed to the tokenizer's loader, which failed on it in its own words."""
    name, replacement, kind = SPECIAL_FILES[case]
    folder = edited(source, tmp_path)
    if name.startswith(("shard", "model.safetensors.index")):
        sharded(folder)
    (folder / name).unlink()
    if replacement == "fifo":
        os.mkfifo(folder / name)
    elif replacement == "directory":
        (folder / name).mkdir()
    else:
        os.symlink(replacement, folder / name)
    for command in ("expand", "probe"):
        out = tmp_path / f"{command}.out"
        args = ["-o", str(out)] + (["--blocks", "1"] if command == "expand" else [])
        result = CliRunner().invoke(main, [command, str(folder), "--data", str(source[1]), *args])
        refused(result, f"{folder / name}: is {kind}, not a regular file; refused")
        assert not out.exists()


@pytest.mark.parametrize("name, target", [("model.safetensors", "model.safetensors"), ("tokenizer.json", "loop.json"),
                                          ("config.json", "gone.json")])
def test_a_checkpoint_file_that_is_a_link_to_no_file_is_named_as_one(name, target, source, tmp_path):
    """A symbolic link where a checkpoint file goes that leads to no file (a loop, or its target gone) is refused
    naming it as such: before, a weights link loop read 'no model.safetensors (...) to read the weights from' beside
    the file ls shows, and a tokenizer.json loop reached the tokenizer's loader, which failed in its own words."""
    folder = edited(source, tmp_path)
    (folder / name).unlink()
    os.symlink(target, folder / name)
    if target == "loop.json":
        os.symlink(name, folder / target)
    reason = "No such file or directory" if target == "gone.json" else "Too many levels of symbolic links"
    for command in ("expand", "probe"):
        out = tmp_path / f"{command}.out"
        args = ["-o", str(out)] + (["--blocks", "1"] if command == "expand" else [])
        result = CliRunner().invoke(main, [command, str(folder), "--data", str(source[1]), *args])
        refused(result, f"{folder / name}: is a symbolic link to no file ({reason}: a link loop, or its target "
                        f"'{target}' is missing); refused")
        assert not out.exists()


@pytest.mark.parametrize("target", ["model", "gone"])
def test_a_model_dir_that_is_a_link_to_no_directory_is_named_as_one(target, source, tmp_path):
    """MODEL_DIR given as a symbolic link that leads to no directory (a loop, or its target gone) is refused naming
    it as such, in the words a link to no file gets: before, it read 'not a directory' beside the name ls shows."""
    link = tmp_path / "model"
    os.symlink(target, link)
    reason = "No such file or directory" if target == "gone" else "Too many levels of symbolic links"
    out = tmp_path / "o"
    refused(CliRunner().invoke(main, ["expand", str(link), "--data", str(source[1]), "--blocks", "1", "-o", str(out)]),
            f"{link}: is a symbolic link to no directory ({reason}: a link loop, or its target '{target}' is missing); "
            "refused")
    assert not out.exists()
    from satcore.adapters.torch.checkpoint_dir import load_causal_lm

    with pytest.raises(InputError, match=r"^[^\n]*: is a symbolic link to no directory \("):
        load_causal_lm(link)


@pytest.mark.parametrize("name, replacement, kind", [("special_tokens_map.json", "fifo", "a FIFO"),
                                                     ("tokenizer.json", "/dev/zero", "a character device")])
def test_a_file_expand_copies_that_is_no_regular_file_is_refused_before_any_work(name, replacement, kind, source,
                                                                                 tmp_path):
    """expand --at reads no tokenizer, but copies the tokenizer's files into OUT_DIR: one that is a FIFO or a device
    is refused naming it before any work; before, the copy skipped it and OUT_DIR had no tokenizer, silently."""
    folder = edited(source, tmp_path)
    (folder / name).unlink(missing_ok=True)
    if replacement == "fifo":
        os.mkfifo(folder / name)
    else:
        os.symlink(replacement, folder / name)
    out = tmp_path / "o"
    refused(CliRunner().invoke(main, ["expand", str(folder), "--at", "1", "-o", str(out)]),
            f"{folder / name}: is {kind}, not a regular file; refused")
    assert not out.exists()


@pytest.mark.parametrize("kind, what", [("link_to_empty_dir", "a symbolic link"), ("link_to_dev_null", "a symbolic link"),
                                        ("fifo", "a FIFO"), ("full_dir", "a directory with files in it")])
def test_an_out_dir_that_is_taken_says_what_is_there(kind, what, source, tmp_path):
    """-o naming something that is not a new or empty directory is refused saying what it is: before, a symbolic
    link to an empty directory read 'exists and is not an empty directory' alone, which it seemed to be."""
    out = tmp_path / "out"
    if kind == "link_to_empty_dir":
        (tmp_path / "empty").mkdir()
        os.symlink(tmp_path / "empty", out)
    elif kind == "link_to_dev_null":
        os.symlink("/dev/null", out)
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    refused(CliRunner().invoke(main, ["expand", str(source[0]), "--at", "1", "-o", str(out)]),
            f"{out}: exists and is not an empty directory ({what}); refusing to replace it")
    assert os.path.lexists(out) and not [p for p in os.listdir(tmp_path) if p.startswith(".satcore")]


@pytest.mark.parametrize("case", ["layers_billion", "deep_config", "header_length_forged"])
def test_huge_declarations_are_refused_in_bounded_memory(case, source, tmp_path):
    folder, expect = checkpoint_case(case, source, tmp_path)
    code, err, rss = peak_rss(["expand", str(folder), "--data", str(source[1]), "--blocks", "1", "-o",
                               str(tmp_path / "o")], env=REPO)
    assert code == 2, err
    assert_one_line(err, expect)
    # torch and transformers imported: the process's floor is about 400 MiB; a layer list of 10^9 would be gigabytes
    assert rss < 3 * RSS_LIMIT_BYTES + 400 * 2**20, f"peak RSS {rss / 2**20:.0f} MiB"


def test_a_model_larger_than_memory_is_refused_before_it_is_built(source, tmp_path):
    """A consistent checkpoint whose weights (a sparse file: declared, not on disk) are far larger than memory:
    its float32 size is estimated from the meta-device build and refused before any byte is read."""
    folder = tmp_path / "big"
    folder.mkdir()
    vocab, width = 2**26, 1024  # 64 Gi parameters in the embedding alone: 256 GiB in float32
    config = {**json.loads((source[0] / "config.json").read_text()), "vocab_size": vocab, "hidden_size": width,
              "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
              "head_dim": width, "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    shapes = {"model.embed_tokens.weight": [vocab, width], "model.norm.weight": [width],
              "model.layers.0.input_layernorm.weight": [width], "model.layers.0.post_attention_layernorm.weight": [width],
              **{f"model.layers.0.self_attn.{p}_proj.weight": [width, width] for p in "qkvo"},
              "model.layers.0.mlp.gate_proj.weight": [8, width], "model.layers.0.mlp.up_proj.weight": [8, width],
              "model.layers.0.mlp.down_proj.weight": [width, 8]}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as stream:
        stream.write(struct.pack("<Q", len(raw)) + raw)
        stream.truncate(8 + len(raw) + offset)  # a hole: nothing written, nothing allocated
    code, err, rss = peak_rss(["expand", str(folder), "--at", "0", "-o", str(tmp_path / "o")], env=REPO)
    assert code == 2, err
    assert_one_line(err, ["big: the model in float32, held 3 time(s), needs", "GiB of memory is available"])
    assert rss < 3 * RSS_LIMIT_BYTES + 400 * 2**20, f"peak RSS {rss / 2**20:.0f} MiB"


def test_a_model_dir_path_that_is_not_utf8_is_one_line(source, tmp_path):
    folder = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    shutil.copytree(os.fsencode(source[0]), folder)
    result = subprocess.run([*SATCORE, "expand", os.fsdecode(folder), "--at", "1", "-o", str(tmp_path / "o")],
                            capture_output=True, text=True, timeout=300, env={**os.environ, **REPO})
    assert result.returncode == 2, result.stderr
    assert_one_line(result.stderr, ["caf\\udce9: the path is not UTF-8"])


# -- token files and numbers ---------------------------------------------------------------------


@pytest.mark.parametrize("line, expect", [
    ("[1, 2, " + str(10**30) + "]", ["ids.jsonl: line 1: token id an integer of 100 bits is outside"]),
    ("[" * 100_000 + "]" * 100_000, ["ids.jsonl: line 1: nested more than 32 levels deep"]),
    ("[" + "9" * 5001 + "]", ["ids.jsonl: line 1: not JSON", "4300"]),
    ('{"input_ids": [1, true]}', ["ids.jsonl: line 1: expected a list of integer token ids"]),
    ('{"input_ids": [1, 2], "input_ids": [3]}', ["ids.jsonl: line 1: key 'input_ids' appears twice in one object"]),
    # bytes that are not UTF-8: json.loads would guess UTF-16 from them and report a 'utf-16-le' codec error
    (b"[1, 2]\n\xff\xfe", ["ids.jsonl: line 2: not UTF-8 (byte 0xff at offset 0)"]),
    (b"[1, \xe9]", ["ids.jsonl: line 1: not UTF-8 (byte 0xe9 at offset 4)"]),
])
def test_hostile_token_lines_are_one_line(line, expect, source, tmp_path):
    data = tmp_path / "ids.jsonl"
    data.write_bytes((line if isinstance(line, bytes) else line.encode()) + b"\n")
    refused(run_expand(source[0], data, tmp_path / "o", "--blocks", "1"), *expect)


@pytest.mark.parametrize("flag", ["--data", "--general-data"])
def test_text_with_a_nul_byte_is_refused_as_not_text(flag, source, tmp_path):
    """A file of zeros (sparse, preallocated, a download cut short) is UTF-8 all the same: read as 'text', its NULs
    were tokenised and --general-data's 4 GiB of them measured as the model's old domain.  No text holds a NUL."""
    zeros = tmp_path / "zeros.txt"
    zeros.write_bytes(source[1].read_bytes()[:1000] + bytes(10_000))
    data, general = (zeros, None) if flag == "--data" else (source[1], zeros)
    out = tmp_path / "o"
    extra = ["--blocks", "1"] if general is None else ["--blocks", "auto", "--steps", "300", "--general-data", general]
    result = run_expand(source[0], data, out, *extra)
    refused(result, f"{flag + ' ' if general else ''}{zeros}: not text (a NUL byte at offset 1000); token ids go in "
                    ".npz or .jsonl")
    assert not out.exists()


def test_max_windows_is_bounded_by_the_file_not_allocated(source, tmp_path):
    """--max-windows 2**53 on a 9 kB text: the tokens read are what the file holds (no buffer of 2**53 x 16)."""
    code, err, rss = peak_rss(["expand", str(source[0]), "--data", str(source[1]), "--blocks", "1", "--seq-len", "16",
                               "--steps", "2", "--decision", "screen", "--max-windows", str(2**53), "-o",
                               str(tmp_path / "o")], env=REPO)
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "expansion.json").read_text())["data"]["windows"] > 4
    assert rss < 3 * RSS_LIMIT_BYTES + 400 * 2**20, f"peak RSS {rss / 2**20:.0f} MiB"


@pytest.mark.parametrize("value, expect", [
    ("²", ["--at", "'²' is not a block"]),
    ("1" * 5001, ["--at", "a 5001-character entry"]),
    (",".join(["1"] * 5000), ["--at: 5,000 new blocks; at most 5"]),
    ("٣", ["--at", "'٣' is not a block"]),
])
def test_hostile_at_is_one_line(value, expect, source, tmp_path):
    result = CliRunner().invoke(main, ["expand", str(source[0]), "--at", value, "-o", str(tmp_path / "o")])
    refused(result, *expect)


def test_the_top_seed_runs(source, tmp_path):
    result = run_expand(source[0], source[1], tmp_path / "o", "--blocks", "1", "--decision", "screen", "--seed",
                        str(2**63 - 1), "--init", "fresh")
    assert result.exit_code == 0, result.output


def test_python_expand_refuses_ids_past_the_vocabulary_and_too_many_places():
    from satcore.adapters.torch.expansion import ExpansionOptions, expand

    model = build("llama")
    ids = torch.randint(0, 64, (40, 8), generator=torch.Generator().manual_seed(0))
    ids[7, 3] = 64
    with pytest.raises(InputError, match=r"expand: data: batch \d+: token id 64 is outside the model's vocabulary "
                                         r"0..63"):
        expand(model, ids, blocks=1, options=ExpansionOptions(decision="screen"))
    with pytest.raises(InputError, match="expand: at: 5 new blocks; at most 4"):
        expand(model, None, blocks=None, options=ExpansionOptions(at=[0, 1, 2, "head", 0]))


@pytest.mark.parametrize("data, expect", [
    # a str iterates as its characters: 'corpus.txt' was read as 10 batches and refused for their count
    ("corpus.txt", "expand: data: got the str 'corpus.txt', not an iterable of batches"),
    (b"ids", "expand: data: got the bytes b'ids', not an iterable of batches"),
    # a float tensor was named by its shape alone, which is right
    (torch.zeros(40, 8), "token ids must be an integer (windows, tokens) tensor, got float32 (40, 8)"),
])
def test_python_expand_names_data_of_the_wrong_kind(data, expect):
    from satcore.adapters.torch.expansion import ExpansionOptions, expand

    with pytest.raises(InputError) as caught:
        expand(build("llama"), data, blocks=1, options=ExpansionOptions(decision="screen"))
    assert expect in str(caught.value)


def test_recipe_numbers():
    recipe = Recipe("adam", lr=np.float32(0.5), steps=np.int64(300), batch_size=np.uint8(8))
    assert (recipe.lr, recipe.steps, recipe.batch_size) == (0.5, 300, 8)
    assert type(recipe.steps) is int and type(recipe.lr) is float
    for kwargs, message in (({"lr": 10**400}, "recipe: lr must be a finite number, got an integer of 1329 bits "
                                              "\\(past float64's range\\)"),
                            ({"lr": float("nan")}, "recipe: lr must be a finite number"),
                            ({"steps": 1e9}, "recipe: steps must be a whole number, got 1000000000.0"),
                            ({"steps": True}, "recipe: steps must be a whole number"),
                            ({"steps": 2**60}, "recipe: steps: 1152921504606846976 is not in the range"),
                            ({"weight_decay": -1}, "recipe: weight_decay must be >= 0")):
        with pytest.raises(InputError, match=message):
            Recipe("adam", **{"lr": 1e-3, "steps": 10, "batch_size": 4, **kwargs})


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("field, value, expect", [
    ("fraction", NAN, "decision budget: fraction must be a finite number, got nan"),
    ("fraction", True, "decision budget: fraction must be a finite number, got True (bool)"),
    ("fraction", 1.5, "decision budget: fraction must be <= 1 (of the planned training), got 1.5"),
    ("replicates", True, "decision budget: replicates must be a positive integer, got True"),
    ("carry_per_doubling", INF, "decision budget: carry_per_doubling (nats) must be a finite number, got inf"),
    ("max_forgetting", -0.1, "decision budget: max_forgetting (nats) must be >= 0, got -0.1"),
    ("max_forgetting", NAN, "decision budget: max_forgetting (nats) must be a finite number, got nan"),
    ("max_forgetting", "0.1", "decision budget: max_forgetting (nats) must be a finite number, got '0.1' (str)"),
    ("tolerance", INF, "decision budget: tolerance (nats) must be a finite number, got inf"),
    ("tolerance", -1, "decision budget: tolerance (nats) must be >= 0, got -1"),
    ("tolerance", "x", "decision budget: tolerance (nats) must be a finite number, got 'x' (str)"),
])
def test_a_decision_budget_refuses_what_it_cannot_weigh_when_built(field, value, expect):
    """A NaN or inf tolerance or max_forgetting compared false and chose silently, a text one failed as a TypeError
    after the trials had run, a negative tolerance only after the model's losses: each is refused on construction."""
    from satcore.adapters.torch.expansion_frontier import DecisionBudget

    general = torch.ones(8, 4, dtype=torch.long)
    with pytest.raises(InputError) as refused:
        DecisionBudget(**{"general": general, field: value})
    assert str(refused.value) == expect
    taken = DecisionBudget(fraction=np.float32(0.25), replicates=np.int64(2), general=general,
                           max_forgetting=np.float64(0.5), tolerance=0)
    assert (taken.fraction, taken.replicates, taken.max_forgetting, taken.tolerance) == (0.25, 2, 0.5, 0.0)
    assert type(taken.fraction) is float and type(taken.replicates) is int


@pytest.mark.parametrize("optimizer, dtype, lr, weight_decay, refused_step", [
    ("adam", torch.float32, 1e38, 0.0, "1e+39"),  # Adam's first step is 10 lr: past float32's 3.4e38
    ("adamw", torch.float16, 1e4, 0.0, "100000"),  # past float16's 65504
    ("sgd", torch.float32, 1e-3, 1e39, "1e+39"),  # the weight decay itself
    ("adam", torch.float64, 1e300, 0.0, None),  # float64 holds 1e301: the trials report the divergence
    ("sgd", torch.float32, 1e30, 0.0, None),
])
def test_an_lr_past_the_parameters_range_is_refused_naming_it(optimizer, dtype, lr, weight_decay, refused_step):
    """torch hands its optimizers' step scalars to the parameters' dtype and stops with its overflow error where
    one does not fit: refused before the first step, naming the lr."""
    from satcore.adapters.torch.decide import recipe_optimizer

    recipe = Recipe(optimizer, lr=lr, steps=1, batch_size=1, weight_decay=weight_decay)
    param = torch.nn.Parameter(torch.ones(3, dtype=dtype))
    if refused_step is None:
        recipe_optimizer(recipe, [param])
        return
    with pytest.raises(InputError, match=re.escape(f"recipe: lr {lr:g} (weight_decay {weight_decay:g}) makes optimizer "
                                                   f"steps of up to {refused_step}, past the "
                                                   f"{str(dtype).removeprefix('torch.')} parameters' range")):
        recipe_optimizer(recipe, [param])


def test_expand_lr_past_float32_is_one_line(source, tmp_path):
    """--lr 1e300 used to end in torch's 'value cannot be converted to type float without overflow' traceback
    at the first trial of --blocks auto."""
    refused(run_expand(source[0], source[1], tmp_path / "o", "--blocks", "auto", "--lr", "1e300", "--steps", "300",
                       "--quiet"),
            "recipe: lr 1e+300", "past the float32 parameters' range", "--lr")
    assert not (tmp_path / "o").exists()


# -- decide and expand: bounds, the caller's random state and model ---------------------------------


def windows(n=64, seed=0):
    ids = torch.randint(1, 64, (n, 8), generator=torch.Generator().manual_seed(seed))
    return [({"input_ids": w}, w) for w in ids.split(8)]


@pytest.mark.parametrize("budget", ["5e-324", "1e-300"])
def test_a_tiny_decision_budget_names_only_the_remedies_in_range(budget, source, tmp_path):
    """--decision-budget 5e-324 made the --steps that would fit inf: an OverflowError's traceback; 1e-300 named a
    300-digit --steps, past the option's range.  Only the --decision-budget that decides is named."""
    out = tmp_path / "o"
    result = run_expand(source[0], source[1], out, "--blocks", "auto", "--steps", "200", "--decision-budget", budget)
    refused(result, f"a decision budget of {float(budget):g} (--decision-budget) of 200 planned steps (--steps)")
    assert re.search(r"fixed\): give --decision-budget 0\.\d+$", result.stderr.strip()), result.stderr
    assert not out.exists()


def test_a_decision_no_budget_or_steps_in_range_affords_says_so():
    from satcore.adapter_api import MAX_COUNT, plan_trials

    with pytest.raises(InputError) as refused_plan:  # 2 arms, 2 seeds: more than the whole of 20 steps
        plan_trials(20, 1e-300, [1.0, 1.1], [1.0, 1.0], 2, 3.0)
    assert str(refused_plan.value).endswith(f"fixed): no --decision-budget up to 1 nor --steps up to {MAX_COUNT} fits")


def test_decide_bounds_its_work_before_reading_the_data(monkeypatch):
    import itertools

    from satcore.adapters.torch import decide, sequence_loss

    model = build("llama")
    batch = windows()[0]
    with pytest.raises(InputError, match="decide: the training data: more than 65,536 batches"):
        decide(model, itertools.repeat(batch), windows(), sequence_loss, recipe=Recipe("adam", 1e-3, 4, 8))
    with pytest.raises(InputError, match="recipe: steps 1,000,000,000: the trials would train up to "
                                         "1,000,000,000 optimizer steps of 8 samples, above the bound of 100,000"):
        decide(model, windows(), windows(seed=1), sequence_loss, recipe=Recipe("adam", 1e-3, 10**9, 8))
    monkeypatch.setenv("SATCORE_MAX_TRIAL_STEPS", "²")
    with pytest.raises(InputError, match="SATCORE_MAX_TRIAL_STEPS: '²' is not a whole number"):
        decide(model, windows(), windows(seed=1), sequence_loss, recipe=Recipe("adam", 1e-3, 4, 8))


@pytest.mark.parametrize("general, expect", [
    (torch.rand(16, 8), "decision budget: general: token ids must be an integer (windows, tokens) tensor of at least 4 "
                        "windows, got float32 (16, 8)"),
    (torch.ones(16, dtype=torch.long), "tensor of at least 4 windows, got int64 (16,)"),
    (torch.ones(3, 8, dtype=torch.long), "tensor of at least 4 windows, got int64 (3, 8)"),
    (None, "decision budget: general: more than 65,536 batches (an endless iterator?)"),
])
def test_expand_names_general_data_it_cannot_read_as_the_general_data(general, expect):
    """DecisionBudget(general=...) the frontier cannot read: a float tensor failed as the model's "batch 0" and 3
    windows as "expand needs at least 4 batches of data", both read as the target data's; an endless iterator was
    read until memory ran out.  Each is refused naming the general data, before any trial."""
    import itertools

    from satcore.adapters.torch import ExpansionOptions, expand
    from satcore.adapters.torch.expansion_frontier import DecisionBudget

    general = itertools.repeat(windows()[0]) if general is None else general
    budget = DecisionBudget(general=general)
    with pytest.raises(InputError) as refused:
        expand(build("llama"), torch.randint(1, 64, (64, 8), generator=torch.Generator().manual_seed(0)),
               blocks="auto", recipe=Recipe("adamw", 1e-3, 400, 8, "block"), options=ExpansionOptions(budget=budget))
    assert expect in str(refused.value)


def test_decide_and_expand_leave_the_callers_rng_and_model_alone():
    from satcore.adapters.torch import ProbeConfig, decide, sequence_loss
    from satcore.adapters.torch.expansion import ExpansionOptions, expand

    model = build("llama").train()  # dropout-free, but train mode: what a training loop hands over
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    state = torch.get_rng_state()
    decide(model, windows(), windows(seed=1), sequence_loss, policy=DecisionPolicy(Recipe("adam", 1e-3, 4, 8), trials=TrialSettings(max_trials=2), probe=ProbeConfig(family="mlp")))
    expand(model, torch.cat([w for (_, w) in windows(128)]), blocks=1, recipe=Recipe("adam", 1e-3, 4, 8), options=ExpansionOptions(init="fresh"))
    assert torch.equal(torch.get_rng_state(), state)
    assert model.training
    after = model.state_dict()
    assert list(after) == list(weights) and all(torch.equal(after[k], weights[k]) for k in weights)


# -- outputs ----------------------------------------------------------------------------------------


def test_out_dir_too_long_is_refused_before_the_model_is_read(source, tmp_path):
    result = CliRunner().invoke(main, ["expand", str(tmp_path / "no-such-model"), "--at", "1", "-o",
                                       str(tmp_path / ("o" * 300))])
    refused(result, "its name is longer than the 255 bytes the file system allows")


@pytest.mark.parametrize("command, expect", [
    (["expand", "--seq-len", "16", "--quiet", "--blocks", "1", "--decision", "screen"],
     "batch 0: the loss is NaN or infinite for 2 of 2 sample(s)"),
    (["expand", "--seq-len", "16", "--quiet", "--blocks", "auto", "--steps", "300"],
     "the model's own held-out loss, before any training, is NaN"),
    (["probe"], "batch 0: the loss is NaN or infinite for 7 of 7 sample(s)"),  # the default: 113 windows in 17 batches
])
def test_a_model_whose_loss_is_nan_is_refused_naming_it(command, expect, source, tmp_path):
    """A final norm of NaN weights makes every output NaN (as rms_norm_eps NaN did, which config.json's check now
    refuses first): expand --decision screen wrote a grown checkpoint from a screen of NaN rows, probe a dump no reader
    takes, and --blocks auto blamed the lr."""
    from safetensors.torch import load_file, save_file

    folder = edited(source, tmp_path)
    weights = load_file(folder / "model.safetensors")
    weights["model.norm.weight"][:] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / ("d.npz" if command == ["probe"] else "o")
    result = CliRunner().invoke(main, [command[0], str(folder), "--data", str(source[1]), "-o", str(out), *command[1:]])
    refused(result, f"{folder} on {source[1]}: {expect}")
    assert not out.exists()


@pytest.mark.parametrize("changes, key", [({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
                                          ({"rope_scaling": {"type": "linear", "factor": float("nan")}},
                                           "rope_scaling.factor")])
@pytest.mark.parametrize("command", ["expand", "probe"])
def test_a_nan_in_config_json_is_refused_naming_its_key(command, changes, key, source, tmp_path):
    """JSON's NaN, which Python reads: rms_norm_eps NaN made every output NaN, refused only as a NaN loss after the
    model was built and run; it is config.json's value, named before any work."""
    folder = edited(source, tmp_path, **changes)
    out = tmp_path / ("d.npz" if command == "probe" else "o")
    extra = ["--blocks", "1", "--decision", "screen"] if command == "expand" else []
    result = CliRunner().invoke(main, [command, str(folder), "--data", str(source[1]), "-o", str(out), *extra])
    refused(result, f"{folder}/config.json: {key} is NaN; give a number")
    assert not out.exists()


def test_a_vocab_size_short_of_the_tokenizer_is_named_as_config_jsons(source, tmp_path):
    """config.json's vocab_size below the ids the checkpoint's own tokenizer gives for the text: the line named the
    data file ("token id 286 is outside the model's vocabulary"), whose text is not at fault."""
    folder = edited(source, tmp_path, vocab_size=10)
    result = run_expand(folder, source[1], tmp_path / "o", "--blocks", "1", "--decision", "screen")
    refused(result, f"{folder}/config.json: vocab_size 10 does not cover token id ")
    assert "its tokenizer gives for" in result.output and "the tokenizer and config.json disagree" in result.output
    assert not (tmp_path / "o").exists()


GENERAL_ONLY_FAULTS = {
    # the token's embedding row is NaN: the model's general loss is NaN before any training
    "nan": "the model's own general loss, before any training, is NaN or infinite",
    # the model cannot take the token (its forward raises IndexError, as an embedding lookup past its rows does)
    "untakeable": "batch 0: the model or loss_fn cannot take it (IndexError: index out of range in self)",
}


@pytest.mark.parametrize("fault", sorted(GENERAL_ONLY_FAULTS))
def test_a_fault_only_the_general_data_meets_names_general_data_and_its_file(fault, source, tmp_path, monkeypatch):
    """A token the model scores NaN on or cannot take, in --general-data and not in --data: the line led with
    MODEL_DIR on --data's file, which the model takes and scores finitely; it names --general-data and its file."""
    from safetensors.torch import load_file, save_file

    folder = edited(source, tmp_path)
    bad = json.loads((folder / "config.json").read_text())["vocab_size"] - 1
    if fault == "nan":
        weights = load_file(folder / "model.safetensors")
        weights["model.embed_tokens.weight"][bad] = float("nan")
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        forward = T.LlamaForCausalLM.forward

        def refusing(self, input_ids=None, **kwargs):
            if input_ids is not None and bool((input_ids == bad).any()):
                raise IndexError("index out of range in self")
            return forward(self, input_ids=input_ids, **kwargs)

        monkeypatch.setattr(T.LlamaForCausalLM, "forward", refusing)
    ids = np.arange(4096) % bad  # every id but the bad one
    np.savez(tmp_path / "data.npz", input_ids=ids)
    np.savez(tmp_path / "general.npz", input_ids=np.where(ids % 7 == 0, bad, ids))
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["expand", str(folder), "--data", str(tmp_path / "data.npz"), "--general-data",
                                       str(tmp_path / "general.npz"), "-o", str(out), "--seq-len", "16", "--blocks",
                                       "auto", "--steps", "300", "--quiet"])
    refused(result, f"{folder} on --general-data {tmp_path / 'general.npz'}: {GENERAL_ONLY_FAULTS[fault]}")
    assert not out.exists()


@pytest.mark.parametrize("error, led", [
    (ModelOnDataError("the grown model's loss is NaN on 3 window(s)"), True),  # no prefix to recognise it by
    (InputError("batch 0 of the data: a refusal of the data alone"), False),  # the prefix alone does not make it
])
def test_expand_leads_a_refusal_with_both_files_by_its_type(error, led, source, tmp_path, monkeypatch):
    """The model on the data (:class:`satcore.ModelOnDataError`) is told by its type, not its message's first word:
    its line leads with MODEL_DIR and DATA; any other refusal is printed as it was raised."""
    import satcore.adapters.torch.expansion as expansion

    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(expansion, "expand", refuse)
    out = tmp_path / "o"
    result = CliRunner().invoke(main, ["expand", str(source[0]), "--data", str(source[1]), "-o", str(out),
                                       "--seq-len", "16", "--at", "1", "--quiet"])
    lead = f"{source[0]} on {source[1]}: " if led else ""
    refused(result, f"satcore: error: {lead}{error}")
    assert not out.exists()


@pytest.mark.parametrize("options, expect", [
    (["--loss", "mse"], "--loss belongs to an ONNX model"),
    (["--output", "logits"], "--output belongs to an ONNX model"),
    (["--providers", "CPUExecutionProvider", "--loss", "out"], "--loss and --providers belong to an ONNX model"),
])
def test_probe_dir_refuses_the_onnx_options_it_would_ignore(options, expect, source, tmp_path):
    """A checkpoint directory is probed on its own next-token cross-entropy: --loss mse used to be taken and
    ignored, the dump then claiming nothing of it. The line leads with MODEL_DIR, as the probe's other refusals do
    (it once named only the flag)."""
    out = tmp_path / "d.npz"
    result = CliRunner().invoke(main, ["probe", str(source[0]), "--data", str(source[1]), "-o", str(out), *options])
    refused(result, f"satcore: error: {source[0]}: {expect}", "would be ignored")
    assert not out.exists()


@pytest.mark.parametrize("command, target", [
    ("probe", "model.safetensors"),  # the weights the probe reads: replacing them loses the model
    ("probe", "config.json"),
    ("probe", "../m/dump.npz"),  # a new file, the folder spelled another way
    ("expand", "frontier.png"),
])
def test_outputs_inside_model_dir_are_refused_and_it_is_left_alone(command, target, source, tmp_path):
    """MODEL_DIR is read, never written: an output path inside it (a file it holds or a new one) is one line
    naming the path, before any work, and every file of MODEL_DIR keeps its bytes."""
    folder = edited(source, tmp_path)
    before = digest(folder)
    path = str(folder / target)
    args = (["probe", str(folder), "--data", str(source[1]), "-o", path] if command == "probe" else
            ["expand", str(folder), "--data", str(source[1]), "--blocks", "auto", "--plot", path, "-o",
             str(tmp_path / "o")])
    refused(CliRunner().invoke(main, args), f"{path}: is MODEL_DIR or inside it; MODEL_DIR is never written to")
    assert digest(folder) == before and not (tmp_path / "o").exists()


def test_full_disk_while_saving_is_one_line_naming_the_file(source, tmp_path):
    """A file-size limit (RLIMIT_FSIZE: writes past it fail with EFBIG, as on a full disk) met inside the safetensors
    writer: one line naming OUT_DIR's file, nothing left behind."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))

    out = tmp_path / "o"
    result = subprocess.run([*SATCORE, "expand", str(source[0]), "--at", "1", "-o", str(out)], capture_output=True,
                            text=True, timeout=300, preexec_fn=limited, env={**os.environ, **REPO})
    assert result.returncode == 2, result.stderr
    assert_one_line(result.stderr, [f"{out}/model.safetensors: cannot be written", "File too large"])
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".satcore")]


# the command run with a kill -9 of itself at one point of the write: after the weights, or right before the rename
KILLED_AT = ("import os, shutil, signal, sys; from satcore.cli.main import main; "
             "kill = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
             "setattr(shutil if sys.argv[1] == 'copy' else os, 'copyfile' if sys.argv[1] == 'copy' else 'rename', kill); "
             "main(sys.argv[2:])")


@pytest.mark.parametrize("moment", ["copy", "rename"])
def test_a_killed_run_leaves_only_a_folder_marked_incomplete(moment, source, tmp_path):
    """kill -9 while OUT_DIR is written (after the weights: the tokenizer's copy; or at the rename itself): what is
    left is a hidden folder whose name says it is incomplete (and, until the last moment, a file in it), never
    OUT_DIR."""
    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-c", KILLED_AT, moment, "expand", str(source[0]), "--at", "1", "-o",
                           str(out)], capture_output=True, text=True, timeout=300, env={**os.environ, **REPO})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith(".satcore")]
    assert len(leftovers) == 1 and leftovers[0].startswith(".satcore-expand-incomplete-"), leftovers
    if moment == "copy":  # the weights are there: the marker says they are not a finished model
        assert (tmp_path / leftovers[0] / "model.safetensors").exists()
        assert "did not finish" in (tmp_path / leftovers[0] / "INCOMPLETE.txt").read_text()
    assert not out.exists()


@pytest.mark.parametrize("evil", ["new\nline", "car\rreturn", "nel\x85x", "esc\x1b[2J", "sep\u2028x", "plus+at@v",
                                  'quote"back\\slash', "tab\tbell\a"])
def test_mergekit_yaml_reads_back_the_model_dir_exactly(evil, source, tmp_path):
    yaml = pytest.importorskip("yaml")
    folder = tmp_path / f"m{evil}"
    shutil.copytree(source[0], folder)
    out = tmp_path / f"o{evil}"
    result = CliRunner().invoke(main, ["expand", str(folder), "--at", "1,head", "-o", str(out)])
    assert result.exit_code == 0, result.output
    factory = yaml.safe_load((out / "llamafactory.yaml").read_text(encoding="utf-8"))
    assert factory["model_name_or_path"] == str(out)
    text = (out / "mergekit.yaml").read_text(encoding="utf-8")
    assert not CONTROL.search(text.replace("\n", ""))
    config = yaml.safe_load(text)
    models = [source["model"] for s in config["slices"] for source in s["sources"]]
    paths = [m if isinstance(m, str) else m["model"]["path"] for m in models]
    assert paths == [str(folder)] * 4  # [0], the copy of 0, [1..3], the copy of 3
    mergekit_config = pytest.importorskip("mergekit.config")
    merge = mergekit_config.MergeConfiguration.model_validate(config)
    assert {str(s.model.model.path) for piece in merge.slices for s in piece.sources} == {str(folder)}
    assert all(s.model.lora is None and s.model.model.revision is None for p in merge.slices for s in p.sources)


def test_missing_execution_providers_are_one_line_without_escape_codes(probe_inputs, tmp_path):  # noqa: F811 (fixture)
    """On a machine without CUDA, ``--providers CUDAExecutionProvider`` (alone or before the CPU's) is one plain line
    naming it, before ONNX Runtime is asked (its own warning lines carry raw escape codes)."""
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has CUDA")
    _, model, data = probe_inputs
    for providers in ("CUDAExecutionProvider", "CUDAExecutionProvider,CPUExecutionProvider"):
        result = subprocess.run([*SATCORE, "probe", model, "--data", data, "--providers", providers, "-o",
                                 str(tmp_path / "a.npz")], capture_output=True, text=True, timeout=300,
                                env={**os.environ, **REPO})
        assert result.returncode == 2 and result.stdout == ""
        assert_one_line(result.stderr, ["--providers", "CUDAExecutionProvider is not available here"])


def test_decide_names_labels_outside_the_vocabulary():
    """The model's own loss (``loss_fn=None``): a label past the vocabulary is refused before any probe, naming the
    batch and the label (cross-entropy would fail inside the model)."""
    from satcore.adapters.torch import decide

    ids = torch.randint(1, 64, (64, 8), generator=torch.Generator().manual_seed(0))
    batches = [{"input_ids": w, "labels": w.clone()} for w in ids.split(8)]
    batches[3]["labels"][0, 2] = 70
    batches[1]["labels"][0, 0] = -100  # ignored: allowed
    with pytest.raises(InputError, match=r"decide: training data: batch 3: label 70 is outside the model's "
                                         r"vocabulary 0..63 \(and not -100, which is ignored\)"):
        decide(build("llama"), batches[:4], batches[4:], recipe=Recipe("adam", 1e-3, 4, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decide_leaves_the_cuda_generators_alone():
    from satcore.adapters.torch import ProbeConfig, decide, sequence_loss

    model = build("llama").cuda()
    data = [({"input_ids": x.cuda()}, y.cuda()) for x, y in ((i["input_ids"], t) for i, t in windows())]
    held = [({"input_ids": x.cuda()}, y.cuda()) for x, y in ((i["input_ids"], t) for i, t in windows(seed=1))]
    torch.cuda.manual_seed_all(9)
    cuda_state, cpu_state = torch.cuda.get_rng_state_all(), torch.get_rng_state()
    decide(model, data, held, sequence_loss, policy=DecisionPolicy(Recipe("adam", 1e-3, 4, 8), trials=TrialSettings(max_trials=2), probe=ProbeConfig(family="mlp")))
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda_state))
    assert torch.equal(torch.get_rng_state(), cpu_state)


def test_text_is_tokenised_a_piece_at_a_time(source, tmp_path):
    """A text of several megabytes reaches the tokenizer in pieces of about TEXT_PIECE_BYTES characters cut at line
    breaks (one call on the whole of a huge file aborted the Rust tokenizer), every character read once."""
    from satcore.adapters.torch import checkpoint_dir

    text = tmp_path / "big.txt"
    line = TEXT[:200] + "\n"
    text.write_text(line * (3 * checkpoint_dir.TEXT_PIECE_BYTES // len(line)))
    tokenizer, lengths = checkpoint_dir.load_tokenizer(source[0]), []

    def recording(piece, **kwargs):
        lengths.append(len(piece))
        return tokenizer(piece, **kwargs)

    ids = checkpoint_dir._text_ids(str(text), recording, 10**7)  # more than the file holds: all of it is read
    # each piece ends at a line break: at most one piece plus the line carried over from the piece before
    assert len(lengths) >= 3 and max(lengths) <= checkpoint_dir.TEXT_PIECE_BYTES + len(line)
    assert sum(lengths) == os.path.getsize(text) and len(ids) < 10**7
    per_line = len(tokenizer(line, add_special_tokens=False)["input_ids"])
    np.testing.assert_array_equal(ids[:per_line], tokenizer(line, add_special_tokens=False)["input_ids"])


def test_expand_reads_config_json_and_loads_the_tokenizer_once(source, tmp_path, monkeypatch):
    """config.json is read twice a command, once by satcore's checks of the raw JSON and once by transformers to
    build the config, and the tokenizer loaded once, for the check of --data before the weights and its read
    after: each data read had built the config and loaded the tokenizer again (a 64 MB tokenizer.json takes the
    tokenizers library half a minute, and satcore's own parse of it a third as long again), and the model's loader
    read config.json twice more."""
    import builtins

    config_json = os.path.realpath(source[0] / "config.json")
    opened, loads, real_open = [], [], builtins.open
    real_tokenizer = T.AutoTokenizer.from_pretrained

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == config_json:
            opened.append(file)
        return real_open(file, *args, **kwargs)

    def counting_tokenizer(*args, **kwargs):
        loads.append(args)
        return real_tokenizer(*args, **kwargs)

    from satcore.adapters.torch import checkpoint_dir

    real_read_json, parsed = checkpoint_dir.read_json, []

    def recorded_read_json(path, what, *args, **kwargs):
        parsed.append(os.path.basename(str(path)))
        return real_read_json(path, what, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(T.AutoTokenizer, "from_pretrained", counting_tokenizer)
    monkeypatch.setattr(checkpoint_dir, "read_json", recorded_read_json)
    monkeypatch.setattr(checkpoint_dir, "ANNOUNCED_TOKENIZER_BYTES", 1)  # this tokenizer.json is 8 kB
    result = run_expand(source[0], source[1], tmp_path / "out", "--blocks", "1", "--decision", "screen")
    assert result.exit_code == 0, (result.output, result.exception)
    assert (len(opened), len(loads)) == (2, 1), opened
    # the library parses tokenizer.json; satcore reads it only to say why the library refused it
    assert "tokenizer.json" not in parsed and "tokenizer_config.json" in parsed
    # the load's cost is said before it starts, once
    announced = [line for line in result.stderr.splitlines() if "tokenizer.json (0.0 MB): about 0 s" in line]
    assert len(announced) == 1 and announced[0].startswith(f"loading {source[0]}/tokenizer.json"), result.stderr


@pytest.mark.parametrize("flag", ["--data", "--general-data"])
def test_a_data_path_that_cannot_be_looked_up_is_not_called_missing(flag, source, tmp_path):
    """A --data name longer than the file system allows, or a path through a regular file, named 'no such file'
    before: the user looked for a file that is not the problem; the line says why it cannot be read."""
    for path, reason in ((tmp_path / ("a" * 300 + ".txt"), "File name too long"),
                         (source[1] / "corpus.txt", "Not a directory")):
        args = ["--data", str(path)] if flag == "--data" else ["--data", str(source[1]), "--general-data", str(path)]
        result = CliRunner().invoke(main, ["expand", str(source[0]), *args, "-o", str(tmp_path / "o"), "--blocks",
                                           "auto", "--seq-len", "16"])
        refused(result, f": cannot be read ({reason})")
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--data", "--general-data"])
def test_a_data_path_that_is_not_utf8_is_refused_before_any_work(flag, source, tmp_path):
    """A data file whose name is not UTF-8 was read and decided on, then writing the model card (UTF-8 text that
    records the path) raised UnicodeEncodeError with a traceback; it is refused in one line before any work."""
    named = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.txt")
    shutil.copyfile(source[1], named)
    args = ["--data", named] if flag == "--data" else ["--data", str(source[1]), "--general-data", named]
    extra = ["--blocks", "1", "--decision", "screen"] if flag == "--data" else ["--blocks", "auto"]
    result = CliRunner().invoke(main, ["expand", str(source[0]), *args, "-o", str(tmp_path / "o"), "--seq-len", "16",
                                       "--steps", "2", *extra])
    refused(result, f"{flag} {tmp_path}/caf\\udce9.txt: the path is not UTF-8, which expansion.json and the model "
                    "card record")
    assert not (tmp_path / "o").exists()
