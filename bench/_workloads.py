"""The workloads, the floor pass and measuring helpers shared by the probe benchmarks.

Workloads (real models, real data shipped with the OS / scikit-learn; the
models and batches are in the shared zoo, :mod:`zoo.models_torch`, beside the
tests' models they are built from):

* ``gpt2``: Hugging Face ``GPT2LMHeadModel`` from a small config (``n_embd``
  256, 8 blocks, 8 heads, ``T`` 128, byte vocabulary 256) over byte windows of
  ``/usr/share/common-licenses/Apache-2.0``; loss :func:`sequence_loss`.
* ``resnet8``: the paper's stagewise ResNet-8 (stem conv3x3 -> one
  BasicBlock per stage, widths 16/32/64, stride 2 between stages) on
  ``load_digits`` images upsampled 8x8 -> 32x32 and repeated to 3 channels.

Weights are the seeded initialisation (timings and memory do not depend on
training).  The floor is a plain forward + backward of ``sum_i loss_i`` over
the same batches in ``eval()`` mode (what the probe runs too): activation
gradients cannot be had for less.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

from zoo.models_torch import gpt2_batches, gpt2_model, per_sample_ce, resnet8_batches, resnet8_model

from satcore.adapters.torch import probe, sequence_loss
from satcore.adapters.torch.probe import call_model


def parse_bench_args(doc: str, options: dict | None = None):
    """The options every probe bench shares (``--quick``, ``--threads``, ``--repeats``) and a script's own
    string ``options`` (flag -> help); pins the threads."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None)
    for flag, text in (options or {}).items():
        parser.add_argument(flag, default=None, help=text)
    args = parser.parse_args()
    set_threads(args.threads)
    return args


def set_threads(n: int) -> None:
    """Pin torch's intra-op threads and NumPy's and SciPy's BLAS threads to ``n``.

    The bench machine has 2 cores shared with other work: oversubscribed
    OpenBLAS threads spin and made one ``eigh`` 5x slower in a trial.
    SciPy ships its own OpenBLAS, which satcore loads lazily (``dsyrk`` of the
    Grams, the score's Cholesky factors): ``threadpool_limits`` pins only the
    libraries loaded when it runs, so SciPy's is loaded first.  Before, it ran
    on every core while the bench reported one thread, and the CPU seconds of
    its spinning workers were counted against satcore (``dpotrf`` at
    ``r = 1024``: 58 ms of CPU against 16 ms on one thread, under load).
    """
    import scipy.linalg  # noqa: F401  (its BLAS, for threadpool_limits to see)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(n)


def stream(make_batches, batch_size, n_batches):
    """The batches of ``make_batches`` made one at a time: memory does not grow with ``n_batches``."""
    for b in range(n_batches):
        yield make_batches(batch_size, 1, b * batch_size)[0]


WORKLOADS = {
    "gpt2": (gpt2_model, gpt2_batches, sequence_loss),
    "resnet8": (resnet8_model, resnet8_batches, per_sample_ce),
}


# -- the floor and the probe --------------------------------------------------------------
def floor_pass(model, batches, loss_fn):
    """Forward + backward of ``sum_i loss_i`` to the parameters, batch by batch (eval mode)."""
    for inputs, targets in batches:
        loss_fn(call_model(model, inputs), targets).sum().backward()
        for p in model.parameters():
            p.grad = None


def probe_pass(model, batches, loss_fn, **options):
    return probe(model, batches, loss_fn, **options)


# -- measuring ----------------------------------------------------------------------------
def interleaved(functions: dict, repeats: int, clock=time.perf_counter) -> dict:
    """Median time of each function by ``clock`` (default: wall time), run in rotating order ``repeats`` times.

    Rotation spreads slow phases of a shared machine over all contenders; a
    ratio of two medians from the same run is what the benches report.
    ``clock=time.process_time`` (CPU seconds, user + system, of this process)
    leaves out the time other processes hold the cores: on one thread it is
    the wall time of an idle machine, and far steadier on a loaded one.
    """
    names = list(functions)
    times = {n: [] for n in names}
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            start = clock()
            functions[name]()
            times[name].append(clock() - start)
    return {n: statistics.median(t) for n, t in times.items()}


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_rss_increase(fn) -> int:
    """Bytes the process's resident peak rose above its current RSS while ``fn`` ran.

    Resets the kernel's high-water mark (``/proc/self/clear_refs`` = 5) first,
    so this covers torch's CPU allocations, which tracemalloc does not see.
    glibc is told to serve every allocation over 64 KiB by ``mmap`` and to
    give freed memory back (``mallopt``, ``malloc_trim``): otherwise memory
    freed by an earlier call is reused without raising the RSS and later
    calls look free.  This slows allocation, so benches measure memory only
    after their timings.
    """
    import ctypes
    import gc

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(M_MMAP_THRESHOLD, 1 << 16)
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 16)
    gc.collect()
    libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kib("VmRSS")
    fn()
    return max(0, _status_kib("VmHWM") - base) * 1024


def fresh_process_peaks(command_for, names, repeats: int) -> dict:
    """Median, over ``repeats``, of the last stdout line (an int: bytes) of ``command_for(name)`` for each name,
    every command a fresh process; the order rotates from repeat to repeat, as :func:`interleaved`'s.

    The peak a user running one tool sees: :func:`peak_rss_increase` inside one process
    also counts what earlier calls left to the allocator (see ``bench_peers.py``).
    Returns ``{"median": {name: bytes}, "runs": {name: [bytes, ...]}}``, the runs in the order they ran.
    """
    import subprocess

    names = list(names)
    runs = {n: [] for n in names}
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            done = subprocess.run(command_for(name), capture_output=True, text=True, check=True)
            runs[name].append(int(done.stdout.split()[-1]))
    return {"median": {n: statistics.median(r) for n, r in runs.items()}, "runs": runs}


def code_state() -> dict:
    """The commit measured, and whether the library's sources had uncommitted edits (shared checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()
        except FileNotFoundError:  # no git where the bench runs (a lent GPU machine)
            return ""

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "satcore", "adapters").splitlines()}


CODE_STATE = code_state()  # at import, i.e. when the bench started


def versions() -> dict:
    import numpy
    import transformers

    return {"torch": torch.__version__, "numpy": numpy.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],  # other processes share the machine
            **CODE_STATE}
