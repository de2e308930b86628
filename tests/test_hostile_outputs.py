"""Hostile input on the command's own outputs and text, by failure class (the sibling of test_hostile_inputs).

* outputs that would replace an input: every file a command reads is protected, by resolved path and
  by inode (symbolic and hard links), ``--plot`` is checked before any work, a replaced file keeps its
  mode, a failed write leaves nothing;
* tracebacks: every integer option is bounded, formats needing an external program are refused up
  front, an overflowing tolerance is represented (JSON ``null``) rather than crashing the encoder;
* the wrong file blamed: a training dump of other shapes is named, with both shapes; a tampered or
  foreign probe checkpoint is refused naming the file and the key;
* escapes: CSV writes names as the table shows them; a successful plot writes nothing to stderr.
"""

from __future__ import annotations

import csv
import errno
import io
import itertools
import json
import os
import stat
import subprocess

import click
import numpy as np
import pytest
from click.testing import CliRunner

from satcore import write_dump
from satcore._io.atomic import OutputError, atomic_write, command_inputs
from satcore._shared.display import display_name
from satcore.cli.main import main
from satcore._io.dump import read_dump
from test_hostile_inputs import CONTROL, RSS_LIMIT_BYTES, SATCORE, assert_one_line, peak_rss

EVIL = ("blk\x1b]0;PWNED\x07", "two\nline", "clear\x1b[2J\x1b[H", 'quote",comma', "bidi\u202eevil")


def make_dump(path, *, r=5, names=("a", "b"), split="val", seed=0):
    """A raw dump of ``names`` (M = 40, N = 6, r features) with a stream RMS per candidate (``--rho``)."""
    rng = np.random.default_rng(seed)
    raw = {n: (rng.standard_normal((40, 6)), rng.standard_normal((40, r))) for n in names}
    write_dump(path, raw=raw, meta={"split": split, "diagnostics": {n: {"stream_rms": 1.0} for n in names}})
    return str(path)


@pytest.fixture
def dumps(tmp_path):
    return make_dump(tmp_path / "H.npz"), make_dump(tmp_path / "T.png", split="train", seed=1)


# -- outputs that would replace an input --------------------------------------------------------------


def test_plot_never_replaces_the_training_dump_however_spelled(dumps, tmp_path):
    """``--train T --plot T``: refused before anything is printed, for the path, a symbolic link,
    a hard link and another spelling of it; the training dump is untouched."""
    heldout, train = dumps
    before = open(train, "rb").read()
    os.symlink(train, tmp_path / "link.png")
    os.link(train, tmp_path / "hard.png")
    (tmp_path / "sub").mkdir()
    for target in (train, str(tmp_path / "link.png"), str(tmp_path / "hard.png"), str(tmp_path / "sub" / ".." / "T.png")):
        result = CliRunner().invoke(main, ["score", heldout, "--train", train, "--lr", "0.1", "--plot", target])
        assert result.exit_code == 2, (target, result.output)
        assert result.stdout == ""
        assert_one_line(result.stderr, ["is also an input of this command"])
    assert open(train, "rb").read() == before
    assert os.path.islink(tmp_path / "link.png")


def test_every_file_read_inside_a_command_is_protected(tmp_path):
    """Inside ``command_inputs`` a file read through the bounded reader cannot be written over, even when the
    caller lists no inputs; outside it (an API user resuming and saving a checkpoint) it can."""
    path = make_dump(tmp_path / "d.npz")
    with command_inputs():
        stats = read_dump(path).statistics()
        with pytest.raises(OutputError, match="d.npz: is also an input of this command"):
            write_dump(path, stats)
    write_dump(path, stats)
    assert read_dump(path).statistics()["a"] == stats["a"]


def test_join_output_is_checked_against_its_inputs_after_reading(tmp_path):
    """``merge --join`` wrote its output without naming its inputs: a target swapped for a hard link of an
    input between the early check and the write replaced the input."""
    a = make_dump(tmp_path / "a.npz", names=("x",))
    b = make_dump(tmp_path / "b.npz", names=("y",))
    out = tmp_path / "out.npz"
    before = open(a, "rb").read()
    from satcore.cli import merge as merge_module

    real_load = merge_module.load

    def load_then_swap(path, **kwargs):
        loaded = real_load(path, **kwargs)
        if not out.exists():
            os.link(a, out)  # the target becomes the input while the command runs
        return loaded

    merge_module.load = load_then_swap
    try:
        result = CliRunner().invoke(main, ["merge", "--join", a, b, "-o", str(out)])
    finally:
        merge_module.load = real_load
    assert result.exit_code == 2, result.output
    assert_one_line(result.stderr, ["out.npz", "is also an input"])
    assert open(a, "rb").read() == before


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o604])
def test_replaced_file_keeps_its_mode(tmp_path, mode):
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")
    os.chmod(target, mode)
    make_dump(target)
    assert stat.S_IMODE(os.stat(target).st_mode) == mode
    assert list(read_dump(target).candidates) == ["a", "b"]


def test_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        make_dump(tmp_path / "new.npz")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new.npz").st_mode) == 0o640


@pytest.mark.parametrize("fallback", [False, True])
def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, fallback):
    """A write that fails with ENOSPC after 1 MiB: one line naming the file, the old file intact, nothing else."""
    import satcore._io.atomic

    if fallback:  # the platform without O_TMPFILE: a hidden temporary name, removed on failure
        monkeypatch.setattr(satcore._io.atomic, "_unnamed_file", lambda dir_fd: None)
    target = tmp_path / "out.npz"
    target.write_bytes(b"old")

    def fill_the_disk(stream):
        stream.write(b"\0" * 2**20)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputError) as info:
        atomic_write(target, fill_the_disk)
    assert str(info.value) == f"{display_name(str(target))}: cannot write (No space left on device)"
    assert os.listdir(tmp_path) == ["out.npz"] and target.read_bytes() == b"old"


# -- tracebacks -----------------------------------------------------------------------------------------

HUGE = "9" * 400


def integer_option_cases(heldout, train, tmp_path):
    data = str(tmp_path / "data.npz")
    np.savez(data, inputs=np.ones((4, 3), np.float32), targets=np.zeros(4, np.int64))
    probe = ["probe", str(tmp_path / "m.onnx"), "--data", data, "-o", str(tmp_path / "o.npz")]
    expand = ["expand", str(tmp_path / "model"), "--data", data, "--blocks", "2", "-o", str(tmp_path / "grown")]
    return {
        ("score", "--steps"): ["score", heldout, "--train", train, "--lr", "0.1", "--steps", HUGE],
        ("score", "--chunk-samples"): ["score", heldout, "--chunk-samples", HUGE],
        ("sweep", "--chunk-samples"): ["sweep", heldout, "--chunk-samples", HUGE],
        ("inspect", "--chunk-samples"): ["inspect", heldout, "--chunk-samples", HUGE],
        ("merge", "--chunk-samples"): ["merge", heldout, "-o", str(tmp_path / "m.npz"), "--chunk-samples", HUGE],
        ("probe", "--seed"): probe + ["--seed", HUGE],
        ("probe", "--n-features"): probe + ["--n-features", HUGE],
        ("probe", "--batch-size"): probe + ["--batch-size", HUGE],
        **{("expand", option): expand + [option, HUGE] for option in
           ("--steps", "--batch-size", "--seq-len", "--max-windows", "--max-blocks", "--seed")},
    }


def test_every_integer_option_refuses_400_digits_in_one_line(dumps, tmp_path):
    heldout, train = dumps
    cases = integer_option_cases(heldout, train, tmp_path)
    declared = {(name, max(p.opts, key=len)) for name, command in main.commands.items()
                for p in command.params if isinstance(p.type, click.types.IntParamType)}
    assert declared == set(cases), declared ^ set(cases)  # a new integer option needs its case here
    for (command, option), args in cases.items():
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (option, result.output, result.exception)
        assert result.stdout == ""
        assert_one_line(result.stderr, [option, "400-character number", "not in the range"])


@pytest.mark.parametrize("target", ["out.pgf", "out.avi"])
def test_plot_format_is_refused_before_the_scores(dumps, tmp_path, target):
    heldout, _ = dumps
    for command in ("score", "sweep"):
        result = CliRunner().invoke(main, [command, heldout, "--plot", str(tmp_path / target)])
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert_one_line(result.stderr, [target, "image format", "png"])
    assert sorted(os.listdir(tmp_path)) == ["H.npz", "T.png"]


def refuse_new_files_in(monkeypatch, folder) -> None:
    """Make ``folder`` take no new file or folder, as a read-only mount, an ACL or ``/proc`` does even for root
    (whom its permission bits, and so ``os.access``, never stop): the unnamed file the atomic writer and its
    check create, and the temporary directory an output directory is staged in, fail with EACCES there."""
    import tempfile

    import satcore._io.atomic

    locked = os.stat(folder)
    refused = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    unnamed_file, mkdtemp = satcore._io.atomic._unnamed_file, tempfile.mkdtemp

    def no_unnamed_file(dir_fd):
        if os.path.samestat(os.fstat(dir_fd), locked):
            raise refused
        return unnamed_file(dir_fd)

    def no_folder(*args, dir=None, **kwargs):
        if dir is not None and os.path.samestat(os.stat(dir), locked):
            raise refused
        return mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(satcore._io.atomic, "_unnamed_file", no_unnamed_file)
    monkeypatch.setattr(tempfile, "mkdtemp", no_folder)


@pytest.mark.parametrize("command", ["score", "sweep", "merge"])
@pytest.mark.parametrize("folder, reason", [("missing", "No such file"), ("locked", "Permission denied")])
def test_output_into_a_folder_it_cannot_write_is_refused_before_any_work(dumps, tmp_path, monkeypatch, command,
                                                                           folder, reason):
    """An output whose folder does not exist, or is there but takes no new file (its permission bits allow it:
    checked by creating a file there, not by ``os.access``), is one line naming the file and the folder, before
    anything is read or printed (it used to come after the whole table on stdout, or after a whole probe)."""
    heldout, train = dumps
    if folder == "locked":
        (tmp_path / folder).mkdir()
        refuse_new_files_in(monkeypatch, tmp_path / folder)
    target = str(tmp_path / folder / "out.png")
    args = [command, heldout, "--plot", target] if command != "merge" else [command, heldout, train, "-o", target]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert_one_line(result.stderr, [target, "cannot write into", str(tmp_path / folder), reason])
    assert sorted(os.listdir(tmp_path)) == ["H.npz", "T.png"] + (["locked"] if folder == "locked" else [])
    assert folder == "missing" or os.listdir(tmp_path / folder) == []


def strict_json(text: str):
    def refuse(constant):
        raise AssertionError(f"non-JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("tolerance, rho", [("1e308", "1e-300"), ("1e-300", "1e300")])
def test_extreme_tolerance_and_rho_are_valid_json(dumps, tolerance, rho):
    """tolerance / (rho ||z||_S) overflows to inf (or a gain rho ||z||_S V does): JSON says null there."""
    heldout, _ = dumps
    result = CliRunner().invoke(main, ["score", heldout, "--tolerance", tolerance, "--rho", rho, "--json"])
    assert result.exit_code == 0, result.output
    report = strict_json(result.stdout)
    taus = [c["test"]["tolerance"] for c in report["candidates"]]
    assert taus == ([None, None] if tolerance == "1e308" else pytest.approx([1e-600 / 1e-300] * 2, abs=1e-300))
    lines = CliRunner().invoke(main, ["score", heldout, "--tolerance", tolerance, "--rho", rho, "--format", "jsonl"])
    assert lines.exit_code == 0 and all(strict_json(line) for line in lines.stdout.splitlines())


@pytest.mark.parametrize("alpha", ["1e-320", "5e-324"])
def test_subnormal_alpha_names_the_batches_it_needs(dumps, alpha):
    """k / alpha overflows to inf for a subnormal --alpha: the folds it needs are still a whole number, the
    fewest m with 2^-(m-1) < alpha / k, found here in exact fractions."""
    from fractions import Fraction

    heldout, _ = dumps
    result = CliRunner().invoke(main, ["score", heldout, "--alpha", alpha, "--json"])
    assert result.exit_code == 0, result.output
    k = 2  # candidates: Holm's alpha / k
    needed = next(m for m in itertools.count(2) if Fraction(1, 2 ** (m - 1)) < Fraction(float(alpha)) / k)
    reason = strict_json(result.stdout)["verdict"]["reason"]
    assert f"probe at least {needed} batches" in reason, reason
    assert CliRunner().invoke(main, ["score", heldout, "--alpha", alpha]).exit_code == 0


# -- the wrong file blamed ------------------------------------------------------------------------------


def test_training_dump_of_other_shapes_is_named_with_both_shapes(dumps, tmp_path):
    heldout, _ = dumps
    wide = make_dump(tmp_path / "wide.npz", r=7, split="train")
    result = CliRunner().invoke(main, ["score", heldout, "--train", wide, "--lr", "0.1"])
    assert result.exit_code == 2, result.output
    assert_one_line(result.stderr, ["error: " + wide + ": candidate 'a'", "r = 7 features", "r = 5", "H.npz"])
    other = make_dump(tmp_path / "other.npz", names=("a", "c"), split="train")
    result = CliRunner().invoke(main, ["score", heldout, "--train", other, "--lr", "0.1"])
    assert result.exit_code == 2
    assert_one_line(result.stderr, ["error: " + other + ": candidate lists differ", "['a', 'c']", "['a', 'b']"])


def test_refusals_before_any_work_stay_small(dumps, tmp_path):
    heldout, train = dumps
    wide = make_dump(tmp_path / "wide.npz", r=7, split="train")
    for args in (["score", heldout, "--plot", str(tmp_path / "o.pgf")],
                 ["score", heldout, "--train", train, "--lr", "1", "--steps", HUGE],
                 ["score", heldout, "--train", train, "--lr", "1", "--plot", train],
                 ["score", heldout, "--train", wide, "--lr", "1"]):
        code, err, rss = peak_rss(args)
        assert code == 2, err
        assert_one_line(err, [])
        assert rss < RSS_LIMIT_BYTES, f"{args}: peak RSS {rss / 2**20:.0f} MiB"


# -- escapes ----------------------------------------------------------------------------------------------


def test_csv_writes_names_as_the_table_shows_them(tmp_path):
    path = make_dump(tmp_path / "evil.npz", names=EVIL)
    result = CliRunner().invoke(main, ["score", path, "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert not CONTROL.search(result.stdout.replace("\n", "")), repr(result.stdout)
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(rows) == 1 + len(EVIL) and len(result.stdout.splitlines()) == 1 + len(EVIL)
    assert [row[0] for row in rows[1:]] == [display_name(n, None) for n in EVIL]
    assert rows[2][0] == "two\\nline" and rows[4][0] == 'quote",comma'  # CSV quoting kept valid
    assert {len(row) for row in rows} == {len(rows[0])}
    report = read_dump(path).statistics().report()
    assert report.to_csv() == result.stdout


def test_successful_plot_writes_nothing_to_stderr(tmp_path):
    """Glyphs missing from the font and a layout that cannot fit 300-character names are matplotlib's
    warnings about the figure, printed after a successful command: none reach stderr."""
    pytest.importorskip("matplotlib")
    path = make_dump(tmp_path / "wide_names.npz", names=("blk\u4e2d\u6587", "x" * 300, *(f"n{i}" for i in range(40))))
    for args in (["score", path, "--plot", str(tmp_path / "s.png")], ["sweep", path, "--plot", str(tmp_path / "w.svg")]):
        proc = subprocess.run([SATCORE[0]] + args, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONWARNINGS": "default"})
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG" and b"<svg" in (tmp_path / "w.svg").read_bytes()



# -- probe checkpoints --------------------------------------------------------------------------------------


def rewrite_meta(path, change):
    """The checkpoint at ``path`` with ``change(meta)`` applied to its meta (every other member as it was)."""
    with np.load(path, allow_pickle=False) as data:
        members = {k: data[k] for k in data.files}
    meta = json.loads(str(members["meta"]))
    change(meta)
    members["meta"] = np.array(json.dumps(meta))
    np.savez(path, **members)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A finished checkpoint of two batches of the digits ResNet, and what resumes it."""
    pytest.importorskip("torch")
    from zoo import models_torch as mt

    path = tmp_path_factory.mktemp("checkpoint") / "c.npz"
    model, batches = mt.digits_resnet(), mt.digits_batches(4, 2)
    from satcore.adapters.torch import probe

    probe(model, batches, mt.per_sample_ce, checkpoint=path)
    return path, model, batches


TAMPERED = {
    "batches_done_negative": (lambda m: m["checkpoint"].update(batches_done=-5), ["checkpoint.batches_done", "-5"]),
    "batches_done_text": (lambda m: m["checkpoint"].update(batches_done="2"), ["checkpoint.batches_done", "'2'"]),
    "batches_done_flag": (lambda m: m["checkpoint"].update(batches_done=True), ["checkpoint.batches_done", "True"]),
    "batches_done_fewer": (lambda m: m["checkpoint"].update(batches_done=1),
                           ["checkpoint.batches_done = 1", "holds 2 batches"]),
    "batches_done_missing": (lambda m: m["checkpoint"].pop("batches_done"), ["checkpoint.batches_done", "None"]),
    "no_checkpoint": (lambda m: m.pop("checkpoint"), ["not a satcore probe checkpoint"]),
    "checkpoint_not_a_mapping": (lambda m: m.update(checkpoint=[1, 2]), ["not a satcore probe checkpoint"]),
    "setting_missing": (lambda m: m["checkpoint"].pop("seed"), ["checkpoint.seed is missing"]),
    "setting_extra": (lambda m: m["checkpoint"].update(colour="red"), ["checkpoint.colour = 'red'"]),
    "setting_wrong_type": (lambda m: m["checkpoint"].update(variance="no"), ["checkpoint.variance = 'no'"]),
    "model_missing": (lambda m: m["checkpoint"].pop("model"), ["checkpoint.model is missing"]),
    "streams_not_a_mapping": (lambda m: m["checkpoint"].update(streams=3), ["checkpoint.streams"]),
    "streams_lack_a_candidate": (lambda m: m["checkpoint"].update(streams={}),
                                 ["checkpoint.streams: no stream sums for candidate"]),
    "streams_lack_a_sum": (lambda m: m["checkpoint"].update(streams={n: {"n_vectors": 1} for n in m["candidates"]}),
                           ["checkpoint.streams.", "missing or not a number: 'sum_z_sq'"]),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_tampered_checkpoint_is_refused_naming_file_and_key(checkpoint, tmp_path, case):
    import shutil

    from zoo import models_torch as mt
    from satcore.adapters.torch import probe
    from satcore._shared.errors import ProbeError

    source, model, batches = checkpoint
    path = tmp_path / "tampered.npz"
    shutil.copy(source, path)
    change, expect = TAMPERED[case]
    rewrite_meta(path, change)
    with pytest.raises(ProbeError) as info:
        probe(model, batches, mt.per_sample_ce, checkpoint=path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for part in expect:
        assert part in message, (part, message)


def test_checkpoint_of_another_model_or_candidates_is_refused(checkpoint):
    """Same architecture, other weights (another seed's training): the fingerprint differs; other candidates:
    the candidate list differs; both refused by key.  The writing model itself resumes."""
    from zoo import models_torch as mt
    from satcore.adapters.torch import probe
    from satcore.adapters.torch.checkpoint import model_fingerprint
    from satcore._shared.errors import ProbeError

    path, model, batches = checkpoint
    other = mt.digits_resnet(seed=1)
    assert [(n, p.shape) for n, p in other.state_dict().items()] == [(n, p.shape) for n, p in model.state_dict().items()]
    with pytest.raises(ProbeError, match=r"checkpoint\.model = '[0-9a-f]{32}' .*another model"):
        probe(other, batches, mt.per_sample_ce, checkpoint=path)
    names = [c for c in json.loads(str(np.load(path)["meta"]))["candidates"]][:1]
    with pytest.raises(ProbeError, match=r"checkpoint\.candidates = "):
        probe(model, batches, mt.per_sample_ce, checkpoint=path, candidates=names)
    assert model_fingerprint(model) == model_fingerprint(mt.digits_resnet())  # deterministic, device-free
    resumed = probe(model, batches, mt.per_sample_ce, checkpoint=path)
    assert list(resumed.statistics) == json.loads(str(np.load(path)["meta"]))["candidates"]


def test_fingerprint_covers_names_shapes_dtypes_and_sampled_values():
    torch = pytest.importorskip("torch")
    from satcore.adapters.torch.checkpoint import model_fingerprint

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    same = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    same.load_state_dict(base.state_dict())
    assert model_fingerprint(base) == model_fingerprint(same)
    wider = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2))
    renamed = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Identity(), torch.nn.Linear(3, 2))
    renamed[0].load_state_dict(base[0].state_dict())
    renamed[2].load_state_dict(base[1].state_dict())
    halved = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).double()
    halved.load_state_dict(base.state_dict())
    nudged = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    nudged.load_state_dict(base.state_dict())
    with torch.no_grad():
        nudged[1].bias[-1] += 1e-6  # among the last four values of a tensor
    prints = [model_fingerprint(m) for m in (base, wider, renamed, halved, nudged)]
    assert len(set(prints)) == len(prints)


def test_probe_output_never_replaces_the_models_external_data(tmp_path):
    """``probe -o weights.bin`` where the model keeps W in weights.bin: an input of the command like the model."""
    pytest.importorskip("onnxruntime")
    from test_onnx_errors import batch, with_external_weight

    model = with_external_weight(tmp_path / "m", lambda folder: None)
    weights = model.parent / "weights.bin"
    before = weights.read_bytes()
    x, y = batch()
    data = tmp_path / "data.npz"
    np.savez(data, inputs=x, targets=y)
    result = CliRunner().invoke(main, ["probe", str(model), "--data", str(data), "--family", "linear",
                                       "-o", str(weights)])
    assert result.exit_code == 2, result.output
    assert_one_line(result.stderr, ["weights.bin: is also an input of this command"])
    assert weights.read_bytes() == before
