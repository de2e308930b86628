"""bench/predictive_validity.py --quick: real inserted blocks trained on two digits ResNets, every
predictor scored; the JSON holds the recipe, one row per scored candidate and its realized changes."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "predictive_validity.py"


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
