"""Fault injection on outputs: SIGKILL/SIGTERM at named points of a write, RLIMIT_FSIZE, RLIMIT_AS.

Every output goes through :func:`satcore._io.atomic.atomic_write`.  Whatever happens during the write,
the target afterwards holds either its old bytes or a complete new file.  Nothing else appears in the
folder, except after SIGKILL (which no process can catch) between the finished file's hidden link and its
rename, or during a write without ``O_TMPFILE``: then the killed writer's hidden name
``.NAME.PID.RANDOM.part`` stays, and the next write of the same target removes it.  The writer is killed
at named points of the write (it stops there and says so), not after a guessed delay, so no outcome
depends on the machine's speed or load.
"""

from __future__ import annotations

import itertools
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from satcore import write_dump
from satcore._io.atomic import atomic_write
from satcore._io.dump import read_dump

SATCORE = str(Path(sys.executable).parent / "satcore")
OLD = b"the old file, which must survive intact\n"
M, N, R = 4000, 256, 512  # ~25 MB of float64 per write: long enough to be killed in the middle

# A writer that stops at ``stage`` and says so on stdout, where the parent kills it: "writing" halfway through
# the data, "renaming" just before the finished file's hidden name is renamed over the target (the window a
# SIGKILL can leave that name in).  os.replace is wrapped in the child only, to stop there.
WRITER = """
import os, sys, time
import satcore._io.atomic
from satcore._io.atomic import atomic_write
target, mode, stage = sys.argv[1:]
if mode == "fallback":  # the platform without O_TMPFILE: a hidden temporary name from the start
    satcore._io.atomic._unnamed_file = lambda dir_fd: None
replace = os.replace

def stop(at):
    print(at, flush=True)
    time.sleep(3600)

def replace_after_stop(src, dst, **kw):
    if stage == "renaming":
        stop("renaming")
    return replace(src, dst, **kw)

def write(stream):
    stream.write(b"new" * 1000)
    stream.flush()
    if stage == "writing":
        stop("writing")
    stream.write(b"new" * 1000)

os.replace = replace_after_stop
print("ready", flush=True)
atomic_write(target, write)
"""
NEW = b"new" * 2000


def stale_temporaries(folder: Path, target: Path) -> list[str]:
    return [n for n in os.listdir(folder) if n != target.name]


@pytest.mark.parametrize("stage", ["writing", "renaming"])
@pytest.mark.parametrize("sig, mode", [(signal.SIGKILL, "tmpfile"), (signal.SIGKILL, "fallback"),
                                       (signal.SIGTERM, "tmpfile"), (signal.SIGTERM, "fallback")])
def test_killed_mid_write_leaves_old_file_or_complete_file(tmp_path, sig, mode, stage):
    """Killed at each stage: the old file intact; SIGTERM cleans up, SIGKILL leaves at most the killed writer's
    own hidden name (none where the unnamed file was never linked), which the next write removes."""
    target = tmp_path / "out.npz"
    target.write_bytes(OLD)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), mode, stage], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert proc.stdout.readline().strip() == stage  # stopped there: killed at that point, not after a delay
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == -sig
    assert target.read_bytes() == OLD
    left = stale_temporaries(tmp_path, target)
    unnamed = mode == "tmpfile" and stage == "writing"  # an O_TMPFILE file has no name until it is complete
    if sig == signal.SIGTERM or unnamed:
        assert left == []
    else:
        assert len(left) == 1 and re.fullmatch(rf"\.out\.npz\.{proc.pid}\.[0-9a-f]{{8}}\.part", left[0]), left
    live = tmp_path / f".out.npz.{os.getpid()}.0123abcd.part"  # a running writer's name: never removed
    live.write_bytes(b"in progress")
    atomic_write(target, lambda stream: stream.write(NEW))
    assert target.read_bytes() == NEW
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, live.name])


# A writer whose SIGTERM lands as the write's handler is being put back, the write done: ``signal.signal`` is
# wrapped in the child only, to send the signal there; Python runs the handler at the next bytecode.
RESTORING = """
import os, signal, sys
import satcore._io.atomic
from satcore._io.atomic import atomic_write
install, sent = signal.signal, []

def restore_after_sigterm(signum, action):
    if signum == signal.SIGTERM and action == signal.SIG_DFL and not sent:
        sent.append(signum)  # one signal, as a user's one kill sends
        os.kill(os.getpid(), signal.SIGTERM)
    return install(signum, action)

satcore._io.atomic.signal.signal = restore_after_sigterm
atomic_write(sys.argv[1], lambda stream: stream.write(b"new" * 2000))
"""


def test_sigterm_as_the_default_is_put_back_dies_of_sigterm_with_the_file_complete(tmp_path):
    """A SIGTERM landing while the default action is being restored, after the write: the writer dies of the
    signal (it escaped as an uncaught exception, exit status 1, with a traceback), the target complete."""
    target = tmp_path / "out.npz"
    target.write_bytes(OLD)
    proc = subprocess.run([sys.executable, "-c", RESTORING, str(target)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (-signal.SIGTERM, "")
    assert target.read_bytes() == NEW
    assert stale_temporaries(tmp_path, target) == []


def test_writes_interrupted_anywhere_leave_the_old_dump_or_a_complete_one(tmp_path):
    """SIGKILL and SIGTERM at spread points of a real dump's write (``write_dump``, ~25 MB): whichever point
    each lands on, the target is the old file or a complete dump (every member and its CRC), and after the next
    write no temporary name is left.  How many land mid-write depends on the machine and is not asserted: the
    stage test above kills at each point deterministically."""
    writer = f"""
import sys
import numpy as np
from satcore import write_dump
rng = np.random.default_rng(0)
q, p = rng.standard_normal(({M}, {N})), rng.standard_normal(({M}, {R}))
print("ready", flush=True)
write_dump(sys.argv[1], raw={{"blk": (q, p)}})
"""
    for run, (sig, delay) in enumerate(itertools.product((signal.SIGKILL, signal.SIGTERM), (0.0, 0.05, 0.2, 0.5))):
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        target = folder / "out.npz"
        target.write_bytes(OLD)
        proc = subprocess.Popen([sys.executable, "-c", writer, str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(sig)
        assert proc.wait(timeout=120) in (-sig, 0)  # killed by the signal (SIGTERM after its clean-up), or done
        data = target.read_bytes()
        if data != OLD:
            dump = read_dump(target)  # complete: every member and its CRC
            assert dump.raw["blk"].n_samples == M
            dump.statistics()
        for name in stale_temporaries(folder, target):
            assert sig == signal.SIGKILL and re.fullmatch(rf"\.out\.npz\.{proc.pid}\.[0-9a-f]{{8}}\.part", name)
        atomic_write(target, lambda stream: stream.write(NEW))
        assert os.listdir(folder) == [target.name]


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
