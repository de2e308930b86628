"""studies/predictive_validity.py --quick: real inserted blocks trained on two digits ResNets, every
predictor scored; the JSON holds the recipe, one row per scored candidate and its realized changes."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "studies" / "predictive_validity.py"


def test_quick_bench_measures_and_scores(tmp_path):
    spec = importlib.util.spec_from_file_location("predictive_validity", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "predictive_validity_quick.json").read_text())
    assert (tmp_path / "predictive_validity_quick.png").stat().st_size > 0
    assert result["recipe"]["steps"] == bench.QUICK_STEPS and result["recipe"]["seeds"] == list(bench.SEEDS)
    rows = result["rows"]
    assert len(rows) + len(result["skipped"]) == 6  # 2 models x 3 candidates
    for row in rows:
        realized = row["realized"]["terminal_sgd"]
        assert len(realized["per_seed"]) == len(bench.SEEDS)
        assert realized["train_gain"] == pytest.approx(np.mean([g[0] for g in realized["per_seed"]]))
        # a few small SGD steps from a zero-output block lower the training loss, by the first-order
        # prediction within a factor 5 (curvature and minibatch noise; measured 1.0-3.0)
        predicted = row["predictors"]["first_order_sgd"]
        assert predicted / 5 < realized["train_gain"] < 5 * predicted
    scores = result["scores"]["terminal_sgd/train"]["predictors"]
    assert scores["first_order_sgd"]["n"] == len(rows)
    assert scores["first_order_sgd"]["spearman_pooled"] > 0.5


def test_only_reruns_one_model_set_and_merges(tmp_path):
    """``--only SET`` replaces that set's rows in the JSON under --out and rescores all rows; without a JSON,
    or with a set the mode does not have, it is exit 2."""
    spec = importlib.util.spec_from_file_location("predictive_validity", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "predictive_validity_quick.json"
    assert bench.main(["--quick", "--only", "digits", "--out", str(tmp_path)]) == 2  # nothing to merge into yet
    # a first run whose rows are all digits; mark them so the re-run's replacements can be told apart
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    first = json.loads(out.read_text())
    first["rows"].append({**first["rows"][0], "model": "minilm", "candidate": "encoder.layer.0"})
    for row in first["rows"][:-1]:
        row["base_train_loss"] = -1.0
    out.write_text(json.dumps(first))
    assert bench.main(["--quick", "--only", "minilm", "--out", str(tmp_path)]) == 2  # not a quick-mode set
    assert bench.main(["--quick", "--only", "digits", "--out", str(tmp_path)]) == 0
    merged = json.loads(out.read_text())
    digits = [r for r in merged["rows"] if r["model"].startswith("digits/")]
    assert len(digits) == len(first["rows"]) - 1 and all(r["base_train_loss"] > 0 for r in digits)
    assert [r["candidate"] for r in merged["rows"] if r["model"] == "minilm"] == ["encoder.layer.0"]  # kept
    assert merged["scores"]["terminal_sgd/train"]["predictors"]["cnorm_train"]["n"] == len(merged["rows"])
    assert [p["command"] for p in merged["parts"]] == ["python -m studies.predictive_validity --quick",
                                                       "python -m studies.predictive_validity --quick --only digits"]
    assert merged["wall_seconds"] == pytest.approx(sum(p["seconds"] for p in merged["parts"]))
