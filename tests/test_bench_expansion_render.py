"""studies/expansion.py --render: a rerun row replaces the stored row with the same key, the paired differences are
the documented Student-t intervals, and files of another setup are refused (every difference stays paired)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
from scipy import stats

BENCH = Path(__file__).resolve().parent.parent / "studies" / "expansion.py"
SETUP = {"steps": 120, "layers": 8}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_expansion", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _write(path, rows, setup=SETUP, before=2.5):
    path.write_text("".join(json.dumps({"key": {"phase": "main", "seed": s, "mode": "llama_pro", "K": 2,
                                                "placement": p}, "setup": setup, "pretrain": {},
                                        "heldout_before": before, "heldout": v, "steps_trained": n}) + "\n"
                            for s, p, v, n in rows))


def test_render_replaces_rerun_rows_and_refuses_unpaired_files(tmp_path):
    bench = _bench()
    uniform = [2.10, 2.20, 2.15]
    _write(tmp_path / "a.jsonl", [(s, "uniform", v, 120) for s, v in enumerate(uniform)]
           + [(s, "satcore", 9.0, 53) for s in range(3)])
    rerun = [2.31, 2.24, 2.29]
    _write(tmp_path / "b.jsonl", [(s, "satcore", v, 60) for s, v in enumerate(rerun)])
    table = bench.render([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    row = next(line for line in table.splitlines() if line.startswith("| llama_pro | 2 | uniform |"))
    d = np.array(rerun) - np.array(uniform)
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert f"{d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] (n=3)" in row
    ours = next(line for line in table.splitlines() if line.startswith("| llama_pro | 2 | satcore |"))
    assert "| 60 | " + f"{np.mean(rerun):.4f}" in ours and "9.0000" not in table
    _write(tmp_path / "c.jsonl", [(0, "end", 2.3, 120)], setup={**SETUP, "steps": 240})
    assert bench.render([tmp_path / "a.jsonl", tmp_path / "c.jsonl"]).startswith("not paired")
    _write(tmp_path / "d.jsonl", [(0, "end", 2.3, 120)], before=2.6)
    assert bench.render([tmp_path / "a.jsonl", tmp_path / "d.jsonl"]).startswith("not paired")
