"""Malformed dumps are refused: one line naming key and problem, exit 2, nothing executed."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from malformed.corpus import CASE_IDS, cases, object_npy_with_payload, pickle_payload
from satcore.cli.main import main
from satcore._io.dump import DumpError, read_dump

SATCORE = Path(sys.executable).parent / "satcore"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("malformed")
    target = tmp / "PWNED"
    built = {case_id: (path, expect) for case_id, path, expect in cases(tmp, target)}
    assert tuple(built) == CASE_IDS
    yield built, target
    assert not target.exists(), "a pickle payload from a dump was executed"


def assert_one_line(text: str, expect):
    lines = text.splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("satcore: error: ")
    assert "Traceback" not in text
    for part in expect:
        assert part in lines[0], (part, lines[0])


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_reader_raises_dump_error(corpus, case_id):
    built, target = corpus
    path, expect = built[case_id]
    with pytest.raises(DumpError) as info:
        read_dump(path).statistics(chunk_samples=4)
    message = str(info.value)
    assert "\n" not in message
    for part in expect:
        assert part in message, (part, message)
    assert not target.exists()


@pytest.mark.parametrize("command", ["score", "inspect", "merge"])
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_cli_refuses_with_exit_2_and_one_line(corpus, case_id, command, tmp_path):
    built, target = corpus
    path, expect = built[case_id]
    args = [command, str(path)] + (["-o", str(tmp_path / "out.npz")] if command == "merge" else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert_one_line(result.stderr, expect)
    assert not target.exists()
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("case_id", ["not_a_zip", "pickle_in_npy", "bare_pickle_member", "nan_inf", "nonsymmetric_gram"])
def test_installed_script_refuses(corpus, case_id):
    built, target = corpus
    path, expect = built[case_id]
    proc = subprocess.run([str(SATCORE), "score", str(path), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert_one_line(proc.stderr, expect)
    assert not target.exists()


def test_pickle_payloads_are_live(tmp_path):
    """The corpus's payloads really would create the file if unpickled (so the checks above can fail)."""
    first, second = tmp_path / "by_pickle", tmp_path / "by_numpy"
    pickle.loads(pickle_payload(first))
    assert first.exists()
    npy = tmp_path / "payload.npy"
    npy.write_bytes(object_npy_with_payload(second))
    np.load(npy, allow_pickle=True)  # what a careless reader would do
    assert second.exists()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["score"], "Missing argument"),
        (["score", "x.npz", "--t", "nan"], "'nan' is not a finite number"),
        (["score", "x.npz", "--t", "inf"], "'inf' is not a finite number"),
        (["score", "x.npz", "--delta", "nan", "--t", "1"], "'nan' is not a finite number"),
        (["sweep", "x.npz", "--rel-tol", "nan"], "'nan' is not a finite number"),
        (["merge", "a.npz", "b.npz", "a.npz", "-o", "c.npz"], "a.npz is given twice"),
        (["merge", "a.npz", "b.npz", "-o", "b.npz"], "-o b.npz is also an input"),
        (["score", "x.npz", "--error", "2"], "--error"),
        (["frobnicate"], "No such command"),
        (["merge", "a.npz"], "-o"),
    ],
)
def test_bad_usage_is_one_line_exit_2(args, expect):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert_one_line(result.stderr, [expect])
