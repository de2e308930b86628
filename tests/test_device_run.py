"""The device script's dry run (tiny sizes, on the CPU): every part runs and its figures hang together.
Nothing is timed: the timings of a dry run mean nothing, only that the GPU run will not break on a code path."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_device_run_dry_run_writes_every_part(tmp_path):
    out = tmp_path / "device_run.json"
    done = subprocess.run([sys.executable, "-m", "bench.device_run", "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["dry_run"] and data["skipped"] == []
    for workload in ("gpt2", "resnet8"):
        row = data["probe_cost"][workload]
        assert set(row["ratio"]) == {"default", "float32", "float32_tf32"}
        assert all(v == 0 for v in row["max_rel_error"]["default"].values())  # the reference against itself
        # float32 per-batch products: errors at float32's round-off, not zero and not float64's
        assert 1e-9 < max(row["max_rel_error"]["float32"].values()) < 1e-4
        assert row["verdicts_unchanged"]["default"]
    llama = data["decoder_1b"]
    assert llama["candidates"] == llama["config"]["num_hidden_layers"] + 1  # every block and the head
    assert llama["n_features"] == llama["config"]["hidden_size"]
    decision = data["decide_1b"]
    assert 0 < decision["cost_block_steps"] <= decision["recipe_steps"]
    assert (decision["choice"] is None) != (decision["stop_reason"] is None)
