"""Fault injection on outputs: SIGKILL/SIGTERM at random points of a large write, RLIMIT_FSIZE, RLIMIT_AS.

Every output goes through :func:`satcore._io.atomic.atomic_write`.  Whatever happens during the write,
the target afterwards holds either its old bytes or a complete new file, and nothing else appears
in the folder (no partial file, no temporary name).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from satcore import write_dump
from satcore._io.dump import read_dump

SATCORE = str(Path(sys.executable).parent / "satcore")
OLD = b"the old file, which must survive intact\n"
M, N, R = 4000, 256, 512  # ~25 MB of float64 per write: long enough to be killed in the middle

WRITER = f"""
import sys, time
import numpy as np
import satcore._io.atomic
from satcore import write_dump
if sys.argv[2] == "fallback":  # the platform without O_TMPFILE: a hidden temporary name
    satcore._io.atomic._unnamed_file = lambda dir_fd: None
rng = np.random.default_rng(0)
q, p = rng.standard_normal(({M}, {N})), rng.standard_normal(({M}, {R}))
print("ready", flush=True)
start = time.monotonic()
write_dump(sys.argv[1], raw={{"blk": (q, p)}})
print(time.monotonic() - start, flush=True)
"""


def start_writer(target, mode="tmpfile"):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def assert_old_or_complete(folder: Path, target: Path):
    assert sorted(os.listdir(folder)) == [target.name], os.listdir(folder)
    data = target.read_bytes()
    if data != OLD:
        dump = read_dump(target)  # complete: every member and its CRC
        assert dump.raw["blk"].n_samples == M
        dump.statistics()
    return data != OLD


def write_seconds(folder: Path, mode: str) -> float:
    """How long one uninterrupted write takes now, in this mode (the machine's load changes it)."""
    proc = start_writer(folder / "timing.npz", mode)
    seconds = float(proc.stdout.readline())
    assert proc.wait() == 0
    (folder / "timing.npz").unlink()
    return seconds


@pytest.mark.parametrize("sig, mode", [(signal.SIGKILL, "tmpfile"), (signal.SIGTERM, "tmpfile"),
                                       (signal.SIGTERM, "fallback")])
def test_killed_mid_write_leaves_old_file_or_complete_file(tmp_path, sig, mode):
    rng = np.random.default_rng(int(sig) * 10 + len(mode))
    outcomes = []
    for attempt in range(3):  # signals sent within the write's duration, re-timed if none landed mid-write
        seconds = write_seconds(tmp_path, mode)
        for delay in rng.uniform(0.05, 0.9, size=5) * seconds:
            folder = tmp_path / f"run{len(outcomes)}"
            folder.mkdir()
            target = folder / "out.npz"
            target.write_bytes(OLD)
            proc = start_writer(target, mode)
            time.sleep(delay)
            proc.send_signal(sig)
            code = proc.wait()
            outcomes.append(assert_old_or_complete(folder, target))
            assert code in (-sig, 0), code  # killed by the signal (SIGTERM too, after the clean-up), or done first
        if not all(outcomes):
            break
    assert not all(outcomes), f"no run was interrupted in {len(outcomes)} (a write takes {seconds:.2f}s)"


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_file_size_limit_keeps_old_file_and_names_it(tmp_path):
    rng = np.random.default_rng(1)
    source = tmp_path / "in.npz"
    write_dump(source, raw={"blk": (rng.standard_normal((40, 6)), rng.standard_normal((40, 5)))})
    png = tmp_path / "plot.png"
    png.write_bytes(OLD)
    dump_out = tmp_path / "merged.npz"
    dump_out.write_bytes(OLD)
    for args, target in ((["score", str(source), "--plot", str(png)], png),
                         (["merge", str(source), "-o", str(dump_out)], dump_out)):
        if args[0] == "score":
            pytest.importorskip("matplotlib")
        proc = subprocess.run([SATCORE] + args, capture_output=True, text=True, preexec_fn=_limit_file_size,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("satcore: error: "), proc.stderr
        assert target.name in lines[0] and "File too large" in lines[0], lines[0]
        assert target.read_bytes() == OLD
    assert sorted(os.listdir(tmp_path)) == ["in.npz", "merged.npz", "plot.png"]


def _address_space_after_import() -> int:
    code = ("import satcore.cli.main, re; "
            "print(re.search(r'VmPeak:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmPeak from /proc")
def test_address_space_limit_is_one_line_and_keeps_output(tmp_path):
    """Under RLIMIT_AS a little above the interpreter's own, a 72 MB statistics member cannot be read:
    'out of memory', exit 2, one line, and the output file untouched."""
    from satcore import CandidateStatistics
    from satcore._statistics.depth import DepthStatistics

    rng = np.random.default_rng(2)
    r = 3000
    stats = CandidateStatistics.from_samples(rng.standard_normal((2, 1)), rng.standard_normal((2, r)), variance=False)
    source = tmp_path / "wide.npz"
    write_dump(source, DepthStatistics({"blk": stats}))
    out = tmp_path / "out.npz"
    out.write_bytes(OLD)
    limit = _address_space_after_import() + 48 * 2**20

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([SATCORE, "merge", str(source), "-o", str(out)], capture_output=True, text=True,
                          preexec_fn=limit_address_space, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines == ["satcore: error: out of memory"], proc.stderr
    assert out.read_bytes() == OLD
    assert sorted(os.listdir(tmp_path)) == ["out.npz", "wide.npz"]
