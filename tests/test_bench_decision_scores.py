"""``studies/decision_scores.py``'s merge of a later run's trial seeds into the recorded models.

A ``<part>-trialseed<seeds>.json`` file holds more trial seeds of ``<part>.json``'s models, re-trained from the
same seeds; ``load`` adds its runs to the recorded models only when the re-trained model is the recorded one
(base losses and screen to float64 round-off), and ``instances`` then targets each seed's decision at the mean
of the other seeds' realized change.  Synthetic JSON, no training.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from satcore import Recipe
from satcore._decisions.trials import halving_plan
from studies import decision_scores
from zoo.data import load_images

CANDIDATES = ["stage0", "stage1"]
LENGTHS = (30, 300)
Z95 = NormalDist().inv_cdf(0.975)  # the 95% half-width's quantile, independent of the scipy call under test


@pytest.fixture(scope="module")
def scores():
    return decision_scores


def _steps() -> list[int]:
    """Every checkpoint a decision of the synthetic runs reads, as the bench records them."""
    points = set(LENGTHS)
    for steps in LENGTHS:
        points |= decision_scores.schedule_points(len(CANDIDATES), steps, 4)
    return sorted(points)


def _run(candidate: str, seed: int, rng) -> dict:
    steps = _steps()
    return {"candidate": candidate, "column": "adam_block", "seed": seed, "steps": steps,
            **{k: {"change": rng.normal(size=len(steps)).tolist(), "se": rng.uniform(0.01, 0.1, len(steps)).tolist()}
               for k in ("heldout", "test", "train")}}


def _model(tag: str, seeds, rng) -> dict:
    screen = {f"adam_block/{s}": {c: float(rng.normal()) for c in CANDIDATES} for s in LENGTHS}
    screen["adam_block/30"]["stage1"] = None  # a candidate the screen cannot score
    return {"model": tag, "set": "toy", "source": "synthetic", "candidates": CANDIDATES,
            "base": {"heldout": 0.7, "test": 0.8, "train": 0.3}, "screen": screen,
            "runs": [_run(c, s, rng) for c in CANDIDATES for s in seeds]}


def _write(path: Path, models: list, seeds) -> None:
    path.write_text(json.dumps({"columns": {"adam_block": ["adam", 1e-3, "block", 300]}, "seeds": list(seeds),
                                "models": models, "sweeps": []}))


def _parts(tmp_path, rng):
    recorded = [_model("toy/a", (0, 1), rng), _model("toy/b", (0, 1), rng)]
    later = []
    for m in recorded[:1]:  # a partial later file: one whole model of the two
        again = copy.deepcopy(m)
        again["runs"] = [_run(c, 2, rng) for c in CANDIDATES]
        later.append(again)
    _write(tmp_path / "toy.json", recorded, (0, 1))
    return recorded, later


def test_trial_seeds_are_merged_by_model_and_each_targets_the_other_seeds(scores, tmp_path):
    rng = np.random.default_rng(0)
    recorded, later = _parts(tmp_path, rng)
    # one ulp off in a base loss and a screen value: a summation order, still the same model
    later[0]["base"]["test"] = float(np.nextafter(later[0]["base"]["test"], 1.0))
    later[0]["screen"]["adam_block/300"]["stage0"] = float(np.nextafter(later[0]["screen"]["adam_block/300"]["stage0"],
                                                                        0.0))
    # a screen value near zero moved by round-off of its length's largest value: a cancellation, still the same
    later[0]["screen"]["adam_block/300"]["stage1"] = 1e-9
    recorded[0]["screen"]["adam_block/300"]["stage1"] = 1e-9 + 1e-16 * abs(later[0]["screen"]["adam_block/300"]["stage0"])
    _write(tmp_path / "toy.json", recorded, (0, 1))
    _write(tmp_path / "toy-trialseed2.json", later, (2,))
    models, _, meta = scores.load(tmp_path)
    assert [m["model"] for m in models] == ["toy/a", "toy/b"]
    assert sorted({r["seed"] for r in models[0]["runs"]}) == [0, 1, 2]
    assert sorted({r["seed"] for r in models[1]["runs"]}) == [0, 1]  # not in the partial file: left as recorded
    assert meta["toy-trialseed2"]["seeds"] == [2]
    insts = [i for i in scores.instances(models) if i["model"] == "toy/a" and i["steps"] == 300]
    assert sorted(i["seed"] for i in insts) == [0, 1, 2]
    runs = {(r["candidate"], r["seed"]): r for r in recorded[0]["runs"] + later[0]["runs"]}
    at = _steps().index(300)
    for inst in insts:
        for row in inst["rows"]:
            others = [runs[(row["candidate"], b)]["test"]["change"][at] for b in (0, 1, 2) if b != inst["seed"]]
            assert row["target"] == pytest.approx((others[0] + others[1]) / 2, rel=4 * np.finfo(float).eps)
            assert row["own"] == runs[(row["candidate"], inst["seed"])]["test"]["change"][at]
            every = [runs[(row["candidate"], b)]["test"]["change"][at] for b in (0, 1, 2)]
            mean = sum(every) / 3
            assert row["seed_sd"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in every) / 2),
                                                   rel=16 * np.finfo(float).eps)


@pytest.mark.parametrize("change, reason", [
    (lambda m: m["base"].update(heldout=m["base"]["heldout"] * (1 + 1e-11)), "base heldout"),
    (lambda m: m["screen"]["adam_block/300"].update(stage1=m["screen"]["adam_block/300"]["stage1"] + 1e-9),
     "screen adam_block/300 stage1"),
    (lambda m: m["screen"]["adam_block/30"].update(stage1=0.5), "screen adam_block/30 stage1"),
    (lambda m: m.update(candidates=["stage1", "stage0"]), "candidates"),
    (lambda m: m.update(model="toy/c"), "not in toy.json"),
    (lambda m: m["runs"].append({**m["runs"][0], "seed": 1}), "in toy.json already"),
    (lambda m: m["runs"][1].update(steps=m["runs"][1]["steps"][:-1]), "checkpoints"),
])
def test_a_model_that_is_not_the_recorded_one_is_refused(scores, tmp_path, change, reason):
    rng = np.random.default_rng(1)
    _, later = _parts(tmp_path, rng)
    change(later[0])
    _write(tmp_path / "toy-trialseed2.json", later, (2,))
    with pytest.raises(ValueError, match=reason):
        scores.load(tmp_path)


def test_loop_scores_read_the_loop_beside_its_scratch_sweep_and_refuse_another_start(scores, tmp_path):
    """A loop's final depth is scored against its sweep's realized best (lowest test loss) and against the best of
    the models the loop trained itself; a loop that did not start from the sweep's depth-1 model is refused."""
    sweep = {"sweep": "text/seed1", "depths": [{"depth": d, "test_loss": t} for d, t in
                                               zip(range(1, 5), (2.73, 2.68, 2.70, 2.79))]}
    loop = {"loop": "text/seed1", "start_depth": 1, "start_test_loss": 2.73, "final_depth": 2,
            "stop_reason": "heldout_knee", "seconds": 1.0,
            "trained": [{"round": 0, "depth": 2, "test_loss": 2.75}, {"round": 1, "depth": 3, "test_loss": 2.83}],
            "rounds": [{"inserted_at": "head", "heldout_change": -0.02, "rolled_back": False},
                       {"inserted_at": "model.layers.0", "heldout_change": 0.14, "rolled_back": True}]}
    (tmp_path / "loops.json").write_text(json.dumps({"loops": [loop]}))
    (row,) = scores.loop_scores(tmp_path, [sweep])
    assert (row["scratch_best"], row["final_depth"], row["within_one"], row["own_best"]) == (2, 2, True, 1)
    assert row["scratch_best_test_loss"] == 2.68  # copied from the sweep's depth-2 row, no arithmetic
    assert row["final_test_loss"] == 2.75  # the kept depth-2 model's, not the rolled-back depth-3 one's
    (tmp_path / "loops.json").write_text(json.dumps({"loops": [{**loop, "start_test_loss": 2.74}]}))
    with pytest.raises(SystemExit, match="did not start from its sweep's depth-1 model"):
        scores.loop_scores(tmp_path, [sweep])


def test_trial_schedules_read_the_runs_at_their_checkpoints_at_the_plans_cost(scores):
    """The schedules ``--variants`` compares, on synthetic runs recorded at every step: the even plan trials every
    candidate ``steps // n``; two trials take the screen's first two, twice as long; successive halving trains
    every candidate half a trial and the better half (lowest held-out change at that point) on, and only those
    may be chosen.  Each costs the recipe's steps."""
    rng = np.random.default_rng(1)
    names, steps = ["a", "b", "c", "d"], list(range(1, 301))
    runs = {c: {"steps": steps, **{k: {"change": rng.normal(size=300).tolist(),
                                        "se": rng.uniform(0.01, 0.1, 300).tolist()} for k in ("heldout", "test", "train")}}
            for c in names}
    screen = {"a": 0.3, "b": -0.2, "c": -0.5, "d": 0.1}

    def heldout(c, t):
        return runs[c]["heldout"]["change"][t - 1]

    assert halving_plan(4, Recipe("sgd", 1.0, 300, 1)) == (4, 37, 2, 113)  # 4 x 37 + 2 x 76 = 300
    rows, cost = scores._trial_schedule("halving", names, screen, runs, 300)
    kept = sorted(names, key=lambda c: heldout(c, 37))[:2]
    assert cost == 300
    for c in names:
        curve, may_choose = rows[c]
        assert may_choose == (c in kept)
        assert curve.steps == ((28, 56, 113) if c in kept else (9, 18, 37))
        assert curve.heldout_change == tuple(heldout(c, t) for t in curve.steps)
    rows, cost = scores._trial_schedule("trials-2", names, screen, runs, 300)
    assert cost == 300 and [c for c in names if rows[c][0] is not None] == ["b", "c"]
    assert rows["c"][0].steps == (37, 75, 150)
    rows, cost = scores._trial_schedule("even", names, screen, runs, 300)
    assert cost == 300 and all(rows[c][1] for c in names) and rows["a"][0].steps == (18, 37, 75)


def _with_large_split(model: dict, rng) -> dict:
    """``model`` as ``--large-heldout`` records it: every run also evaluated on a larger held-out split."""
    out = copy.deepcopy(model)
    out["base"]["heldout_large"] = 0.65
    for r in out["runs"]:
        r["heldout_large"] = {"change": rng.normal(size=len(r["steps"])).tolist(),
                              "se": rng.uniform(0.001, 0.01, len(r["steps"])).tolist()}
    return out


def test_a_decision_reads_the_held_out_split_it_is_given_and_the_held_out_ceiling_its_full_run(scores):
    """``instances(..., heldout="heldout_large")`` builds every trial curve, its standard error and the tolerance's
    base loss from that split, the targets from the test split as before; the held-out ceiling predicts each
    candidate by the trial seed's own held-out change at the recipe's full length, on the split read."""
    rng = np.random.default_rng(4)
    model = _with_large_split(_model("toy/a", (0, 1, 2), rng), rng)
    runs = {(r["candidate"], r["seed"]): r for r in model["runs"]}
    for split in ("heldout", "heldout_large"):
        insts = [i for i in scores.instances([model], "even", split) if i["steps"] == 300]
        assert len(insts) == 3
        for inst in insts:
            assert inst["base_heldout"] == model["base"][split] and inst["base_test"] == 0.8
            for row in inst["rows"]:
                run = runs[(row["candidate"], inst["seed"])]
                T = row["curve"].steps[-1]
                assert T == 150  # 300 steps, 2 candidates: two trials of 150
                assert row["curve"].heldout_change[-1] == run[split]["change"][run["steps"].index(T)]
                assert row["curve"].heldout_se == run[split]["se"][run["steps"].index(T)]
                others = [runs[(row["candidate"], b)]["test"]["change"][run["steps"].index(300)]
                          for b in (0, 1, 2) if b != inst["seed"]]
                assert row["target"] == pytest.approx(np.mean(others), rel=4 * np.finfo(float).eps)
            pred, _, pick, _ = scores._predictions(inst, scores.HELDOUT_CEILING, None)
            own = [runs[(c, inst["seed"])][split]["change"][runs[(c, inst["seed"])]["steps"].index(300)]
                   for c in CANDIDATES]
            assert pred == own and pick == CANDIDATES[int(np.argmin(own))]


def test_the_larger_held_out_recording_must_hold_the_bench_recordings_runs(scores):
    """``_recorded_deviation``: the largest difference of a held-out, test or training change from the same run of
    the bench's recording (0 for the same trials), and a refusal for a run the bench never recorded."""
    rng = np.random.default_rng(5)
    recorded = [_model("toy/a", (0, 1), rng)]
    again = [_with_large_split(recorded[0], rng)]
    assert scores._recorded_deviation(again, recorded) == 0.0
    again[0]["runs"][1]["test"]["change"][3] += 0.25
    assert scores._recorded_deviation(again, recorded) == pytest.approx(0.25, abs=8 * np.finfo(float).eps)
    again[0]["runs"][1]["seed"] = 7
    with pytest.raises(SystemExit, match="is not in the bench's recording"):
        scores._recorded_deviation(again, recorded)


def test_the_larger_probe_split_extends_the_benchs_own_and_leaves_train_and_test_as_they_were():
    """``--large-heldout`` draws 4 times the probe images from the same seeded permutation: the bench's probe split
    is its first quarter, and the training and test images are the same arrays (sklearn digits, shipped)."""
    small = load_images(300, 160, 300, seed=0, digits=True)
    large = load_images(300, 640, 300, seed=0, digits=True)
    assert large.probe[0].shape[0] == 640
    for a, b in ((small.train, large.train), (small.test, large.test), (small.probe, (large.probe[0][:160],
                                                                                     large.probe[1][:160]))):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_a_recorded_paired_standard_error_is_the_margins_where_the_recording_has_it(scores):
    """``--large-heldout`` records, per (column, trial seed, held-out split), each pair of candidates' standard
    error of the difference paired over the held-out samples at every checkpoint; a decision on such a recording
    reads its margin's standard error there, at the checkpoint its trials end on (a model without the record keeps
    the bound from the trials' own errors), and only such decisions count in the close-call split."""
    rng = np.random.default_rng(6)
    model = _model("toy/a", (0, 1, 2), rng)
    steps = model["runs"][0]["steps"]
    model["paired_se"] = {f"adam_block/{a}/heldout": {"stage0|stage1": (np.arange(len(steps)) * 1e-3 + 1e-4).tolist()}
                          for a in (0, 1, 2)}
    plain = copy.deepcopy(model)
    del plain["paired_se"]
    cal = scores.Calibration(0.0, 0.0, (0.025, 0.5, 0.975), (-2.0, 0.0, 2.0), 0.0, 0.0, "test", 0.0, 0.0, 1.0)
    long = [i for i in scores.instances([model]) if i["steps"] == 300]  # (the 30-step screen has an unscored row)
    assert any(scores._decide(i, cal).runner_up is not None for i in long)
    for inst, bare in zip(long, [i for i in scores.instances([plain]) if i["steps"] == 300]):
        d, b = scores._decide(inst, cal), scores._decide(bare, cal)
        if d.runner_up is None:
            continue
        end = d.candidates[d.choice].trial.steps[-1]
        assert d.margin_se == (steps.index(end) * 1e-3 + 1e-4) and d.margin[1] == d.margin_se
        assert b.margin_se is None and b.margin[1] == math.hypot(b.candidates[b.choice].trial.heldout_se,
                                                                 b.candidates[b.runner_up].trial.heldout_se)
    scored = scores.score(long, {"toy": cal}, "decide")
    assert scored["choices_with_paired_margin"] == sum(scores._decide(i, cal).runner_up is not None for i in long)
    assert scores.score([i for i in scores.instances([plain]) if i["steps"] == 300], {"toy": cal},
                        "decide")["choices_with_paired_margin"] == 0


def test_the_recorded_paired_standard_error_is_the_sample_standard_error_of_the_differences():
    """``satcore._decisions.trials.paired_standard_error`` (what the bench records per checkpoint, and decide's margin and
    trial curves use) row by row against ``statistics.stdev`` of the per-sample differences; ``inf`` for one sample."""
    import statistics

    from satcore._decisions.trials import paired_standard_error

    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(3, 50)), rng.normal(size=(3, 50))
    got = paired_standard_error(b - a)
    assert paired_standard_error([0.5]) == math.inf and paired_standard_error(np.ones((2, 1))).tolist() == [math.inf] * 2
    for k in range(3):
        want = statistics.stdev((b[k] - a[k]).tolist()) / math.sqrt(50)
        assert got[k] == pytest.approx(want, rel=16 * np.finfo(float).eps)


def test_the_calibrated_held_out_range_is_read_from_the_recordings_sizes(scores, tmp_path):
    """``heldout_sample_range``: every model set part's probe split (images or windows), times the factor of the
    ``--large-heldout`` folder beside the bench's; parts without models (sweeps) do not count."""
    bench = tmp_path / "decision_validity"
    large = scores.large_heldout_folder(bench)
    bench.mkdir()
    large.mkdir()
    sizes = {"images": {"digits": [True, 300, 160, 300, [2]]}, "llama": {"windows": [128, 96, 128]}}
    for folder, factor in ((bench, None), (large, 4)):
        for part in ("digits", "llama-pydoc"):
            extra = {} if factor is None else {"large_heldout_factor": factor}
            (folder / f"{part}.json").write_text(json.dumps({"part": part, "sizes": {**sizes, **extra},
                                                             "models": [{"model": "m"}]}))
    (bench / "sweeps.json").write_text(json.dumps({"part": "sweeps", "sizes": sizes, "models": []}))
    assert scores.heldout_sample_range(bench) == (96, 640)


def test_transfer_sets_read_each_length_on_the_columns_recorded_for_it_with_the_shipped_calibration(scores, tmp_path):
    """A 1000-step column's first 300 steps are runs of the 300-step recipe too; the transfer scores read 300 steps
    on the 300-step columns only and 1000 on the 1000-step ones, so no run is counted twice, and decide with the
    calibrations ``decide`` ships (no fit reads a transfer set)."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION, HALVING_CALIBRATION

    rng = np.random.default_rng(7)
    folder = tmp_path / scores.TRANSFER_FOLDER
    folder.mkdir()
    short = [_model("far/a", (0, 1, 2), rng), _model("far/b", (0, 1, 2), rng)]
    long_steps = sorted(set(_steps()) | scores.schedule_points(len(CANDIDATES), 1000, 4) | {1000})
    longer = copy.deepcopy(short[:1])
    for m in longer:
        m["screen"] = {f"adam_block_1000/{s}": {c: float(rng.normal()) for c in CANDIDATES} for s in (30, 300, 1000)}
        m["runs"] = [{**_run(c, s, rng), "column": "adam_block_1000", "steps": long_steps,
                      **{k: {"change": rng.normal(size=len(long_steps)).tolist(),
                             "se": rng.uniform(0.01, 0.1, len(long_steps)).tolist()} for k in ("heldout", "test", "train")}}
                     for c in CANDIDATES for s in (0, 1, 2)]
    _write(folder / "far.json", short, (0, 1, 2))
    _write(folder / "far-adam_block_1000.json", longer, (0, 1, 2))
    res = scores.transfer_scores(tmp_path / "decision_validity")
    assert res["sets"] == ["toy"] and sorted(res["lengths"]) == ["1000", "300"]
    at = {steps: res["lengths"][steps] for steps in ("300", "1000")}
    assert at["300"]["columns"] == ["adam_block"] and at["1000"]["columns"] == ["adam_block_1000"]
    # 2 models x 3 trial seeds at 300 steps, 1 model x 3 at 1000: the 1000-step column's 300-step prefix is not read
    assert at["300"]["every set"]["decide"]["n_decisions"] == 6
    assert at["1000"]["every set"]["decide"]["n_decisions"] == 3
    for schedule, cal, key in (("even", DEFAULT_CALIBRATION, "every set"), ("halving", HALVING_CALIBRATION, "halving")):
        insts = [i for i in scores.instances(short, schedule) if i["steps"] == 300]
        expected = scores.score(insts, {"toy": cal}, "decide")
        got = at["300"][key]["decide"] if key == "every set" else at["300"][key]
        assert got == expected
    assert "large_heldout" not in res
    # --large-heldout for the transfer sets: beside their folder; each split's decisions read on that split
    large = scores.large_heldout_folder(folder)
    assert large.name == f"{scores.TRANSFER_FOLDER}_large_heldout"
    large.mkdir()
    _write(large / "far.json", [_with_large_split(m, rng) for m in short], (0, 1, 2))
    rows = scores.transfer_scores(tmp_path / "decision_validity")["large_heldout"]
    assert rows["max_deviation_from_recording"] == 0.0
    recorded = json.loads((large / "far.json").read_text())["models"]
    for label, split in (("held-out split as recorded", "heldout"), ("held-out x4", "heldout_large")):
        insts = [i for i in scores.instances(recorded, "even", split) if i["steps"] == 300]
        assert rows["rows"][f"decide ({label})"] == scores.score(insts, {"toy": DEFAULT_CALIBRATION}, "decide")
    # the two splits' readings differ here, so reading the wrong one would fail above
    assert rows["rows"]["decide (held-out split as recorded)"] != rows["rows"]["decide (held-out x4)"]
    assert scores.transfer_scores(tmp_path / "elsewhere" / "decision_validity") is None


def test_compressed_trials_are_read_at_the_even_plans_length_against_the_other_seeds_targets(scores, tmp_path):
    """``compressed_scores`` ranks a model's candidates by each trial's held-out change at the even plan's ``T``
    (the compressed run's and the recorded run of the same seed at the recipe's lr) against the other seeds' mean
    realized test change after the recipe's steps; checked against the same readings taken by hand."""
    rng = np.random.default_rng(11)
    out = tmp_path / "decision_validity"
    out.mkdir()
    recorded = [_model("toy/a", (0, 1, 2), rng)]
    _write(out / "toy.json", recorded, (0, 1, 2))
    T = 150  # 300 steps over 2 candidates
    compressed = {"model": "toy/a", "set": "toy", "candidates": CANDIDATES, "base": dict(recorded[0]["base"]),
                  "runs": [{"steps_recipe": 300, "T": T, "lr": 2e-3, "column": "adam_block", "candidate": c,
                            "seed": s, "steps": [T // 2, T],
                            **{k: {"change": rng.normal(size=2).tolist(), "se": [0.01, 0.01]}
                               for k in ("heldout", "test", "train")}} for c in CANDIDATES for s in (0, 1, 2)]}
    (tmp_path / scores.COMPRESSED_FOLDER).mkdir()
    _write(tmp_path / scores.COMPRESSED_FOLDER / "toy.json", [compressed], (0, 1, 2))
    res = scores.compressed_scores(out)
    assert res["max_base_deviation"] == 0.0
    assert list(res["rows"]) == ["300/adam_block/bench sets", "300/every column/bench sets"]
    assert res["rows"]["300/every column/bench sets"] == res["rows"]["300/adam_block/bench sets"]  # one column
    row = res["rows"]["300/adam_block/bench sets"]
    runs = {(r["candidate"], r["seed"]): r for r in recorded[0]["runs"]}
    comp = {(r["candidate"], r["seed"]): r for r in compressed["runs"]}
    best = {"even": [], "compressed": []}
    for seed in (0, 1, 2):
        target = [np.mean([runs[(c, b)]["test"]["change"][runs[(c, b)]["steps"].index(300)] for b in (0, 1, 2)
                           if b != seed]) for c in CANDIDATES]
        even = [runs[(c, seed)]["heldout"]["change"][runs[(c, seed)]["steps"].index(T)] for c in CANDIDATES]
        fast = [comp[(c, seed)]["heldout"]["change"][1] for c in CANDIDATES]
        best["even"].append(float(np.argmin(even) == np.argmin(target)))
        best["compressed"].append(float(np.argmin(fast) == np.argmin(target)))
    assert row["n_decisions"] == 3
    assert row["best_even"] == pytest.approx(np.mean(best["even"]), abs=4 * np.finfo(float).eps)
    assert row["best_compressed"] == pytest.approx(np.mean(best["compressed"]), abs=4 * np.finfo(float).eps)
    assert row["within_even"] is None  # two candidates: no within-model correlation, as in score()
    compressed["base"]["test"] += 1e-3  # another model than the recorded one shows in the deviation
    _write(tmp_path / scores.COMPRESSED_FOLDER / "toy.json", [compressed], (0, 1, 2))
    assert scores.compressed_scores(out)["max_base_deviation"] == pytest.approx(1e-3, rel=1e-9)


def test_the_compressed_sgd_schedule_reads_only_sgd_trials_from_the_compressed_runs(scores, tmp_path):
    """``COMPRESSED_SGD``: the even plan whose SGD trials (long recipes) are read from the ``--compressed`` runs at
    ``T/2`` and ``T``; their targets, and every other column's decisions, stay those of the recipe's own runs."""
    rng = np.random.default_rng(13)
    adam = _model("toy/a", (0, 1, 2), rng)
    sgd = _model("toy/a", (0, 1, 2), rng)
    for r in sgd["runs"]:
        r["column"] = "sgd_block"
    model = {**adam, "runs": adam["runs"] + sgd["runs"],
             "screen": {**adam["screen"], **{k.replace("adam_block", "sgd_block"): v for k, v in sgd["screen"].items()}}}
    T = 150  # 300 steps over 2 candidates
    runs = [{"steps_recipe": 300, "T": T, "lr": 0.1, "column": "sgd_block", "candidate": c, "seed": s,
             "steps": [T // 2, T], **{k: {"change": rng.normal(size=2).tolist(), "se": [0.01, 0.02]}
                                      for k in ("heldout", "test", "train")}} for c in CANDIDATES for s in (0, 1, 2)]
    folder = tmp_path / scores.COMPRESSED_FOLDER
    folder.mkdir()
    _write(folder / "toy.json", [{"model": "toy/a", "set": "toy", "candidates": CANDIDATES, "base": adam["base"],
                                  "runs": runs}], (0, 1, 2))
    plain = scores.instances([model], "even")
    fast = scores.instances(scores.attach_compressed([model], folder), scores.COMPRESSED_SGD)
    compressed = {(r["candidate"], r["seed"]): r for r in runs}
    assert len(plain) == len(fast) == 2 * 2 * 3  # two columns, two lengths (30, 300), three seeds
    for a, b in zip(plain, fast):
        assert (a["column"], a["steps"], a["seed"]) == (b["column"], b["steps"], b["seed"])
        for ra, rb in zip(a["rows"], b["rows"]):
            assert ra["target"] == rb["target"] and ra["own_heldout"] == rb["own_heldout"]
            if a["column"] == "sgd_block" and a["steps"] == 300:
                run = compressed[(rb["candidate"], a["seed"])]
                assert rb["curve"].steps == (T // 2, T)
                assert list(rb["curve"].heldout_change) == run["heldout"]["change"]
                assert rb["curve"].heldout_se == run["heldout"]["se"][1]
            else:
                assert rb["curve"] == ra["curve"]
    # read on a larger held-out split (the error model's second size), the compressed runs' own reading of it
    for r in runs:
        r["heldout_large"] = {"change": rng.normal(size=2).tolist(), "se": [0.003, 0.004]}
    _write(folder / "toy.json", [{"model": "toy/a", "set": "toy", "candidates": CANDIDATES, "base": adam["base"],
                                  "runs": runs}], (0, 1, 2))
    large = scores.instances(scores.attach_compressed([_with_large_split(model, rng)], folder), scores.COMPRESSED_SGD,
                             "heldout_large")
    for inst in large:
        if inst["column"] == "sgd_block" and inst["steps"] == 300:
            for row in inst["rows"]:
                run = compressed[(row["candidate"], inst["seed"])]
                assert list(row["curve"].heldout_change) == run["heldout_large"]["change"]
                assert row["curve"].heldout_se == run["heldout_large"]["se"][1]


def test_the_sensitivity_baseline_picks_the_largest_value_never_stops_and_needs_the_recorded_model(scores, tmp_path):
    """``attach_sensitivity`` joins a ``--sensitivity`` recording to the recorded models by tag, refusing a
    re-trained model whose base losses differ; the sensitivity baseline then picks, in every decision, the
    candidate of largest recorded value and inserts there (it has no stop and no probability); where no model
    has the recording, the baseline is left out of the scored methods."""
    rng = np.random.default_rng(5)
    recorded = [_model("toy/a", (0, 1, 2), rng)]
    folder = tmp_path / scores.SENSITIVITY_FOLDER
    folder.mkdir()
    values = {"stage0": 2e-3, "stage1": 5e-3}
    _write(folder / "toy.json", [{"model": "toy/a", "set": "toy", "candidates": CANDIDATES,
                                  "base": dict(recorded[0]["base"]), "sensitivity": values}], (0, 1, 2))
    assert scores.scored_methods(scores.instances(recorded)) == tuple(m for m in scores.METHODS
                                                                       if m != scores.SENSITIVITY)
    insts = scores.instances(scores.attach_sensitivity(recorded, folder))
    assert scores.SENSITIVITY in scores.scored_methods(insts)
    for inst in insts:
        pred, p, pick, choice = scores._predictions(inst, scores.SENSITIVITY, None)
        assert pred == [-values[c] for c in CANDIDATES] and p is None and pick == choice == "stage1"
    row = scores.score(insts, {"toy": None}, scores.SENSITIVITY)  # a baseline reads no calibration
    assert row["harms_flagged"] == 0 and row["decision_gain"] == pytest.approx(
        np.mean([-i["rows"][1]["target"] / i["base_test"] for i in insts]), rel=1e-12)
    other = {"model": "toy/a", "set": "toy", "candidates": CANDIDATES,
             "base": {**recorded[0]["base"], "test": recorded[0]["base"]["test"] + 1e-9}, "sensitivity": values}
    _write(folder / "toy.json", [other], (0, 1, 2))
    with pytest.raises(SystemExit, match="is not the recorded one"):
        scores.attach_sensitivity(recorded, folder)


def _stop_case(base_train: float, decrease: float, best_target: float) -> dict:
    """One decision of two trialled candidates on a model of held-out loss 2: ``a`` lowers the held-out loss by
    ``decrease`` at every checkpoint (flat curve, standard error 1e-4: P(decrease) 0.99 under the shipped
    calibration, whose trend weight is 0, so the prediction is ``-decrease``, and a 95% half-width of 0.0002 that
    resolves the stops below: they are no held-out data's), ``b`` raises it by 0.01; seed noise 0.01 on each
    candidate's realized change."""
    from satcore._decisions.trials import TrialCurve

    def row(name, change, target):
        curve = TrialCurve((18, 37, 75), (change,) * 3, (2 * change,) * 3, 1e-4)
        return {"candidate": name, "curve": curve, "may_choose": True, "screen": change, "target": target,
                "seed_sd": 0.01}

    return {"set": "toy", "steps": 300, "cost": 300, "base_heldout": 2.0, "base_train": base_train,
            "base_test": 2.0, "rows": [row("a", -decrease, best_target), row("b", 0.01, 0.02)]}


GAP_RULE = "shipped: a fraction of the generalization gap (held-out minus training loss before insertion)"


@pytest.mark.parametrize("rule, base_train, decrease, stops", [
    # the held-out fraction: 0.003 x 2 = 0.006 whatever the training loss
    ("a fraction of the held-out loss (shipped before)", 1.0, 0.004, True),
    ("a fraction of the held-out loss (shipped before)", 1.0, 0.007, False),
    # the generalization gap's: 0.003 x (2 - 1) = 0.003, 0.003 x (2 - 0.5) = 0.0045, 0 where training is above
    (GAP_RULE, 1.0, 0.004, False),
    (GAP_RULE, 0.5, 0.004, True),
    (GAP_RULE, 2.5, 0.004, False),
    # the held-out fraction where training < 0.9 x held-out (1.8): applied at 1.0, not at 1.9
    ("the held-out fraction where the model's training loss is below x times its held-out loss", 1.0, 0.004, True),
    ("the held-out fraction where the model's training loss is below x times its held-out loss", 1.9, 0.004, False),
])
def test_a_stop_rule_stops_below_its_tolerance_and_only_clear_gains_count(scores, rule, base_train, decrease, stops):
    from satcore._decisions.calibration import DEFAULT_CALIBRATION

    inst = _stop_case(base_train, decrease, -0.05)
    decider = scores._stop_rule_decider(rule, {"toy": (0.003, 0.9)})
    d = decider(inst, DEFAULT_CALIBRATION)
    assert (d.choice, d.stop_reason) == ((None, "gain_below_tolerance") if stops else ("a", None))
    # the best realized gain 0.05 exceeds 3 x 0.01: the decision counts, and stops or not as decided
    assert scores.stops_over_noise([inst], {"toy": DEFAULT_CALIBRATION}, decider) == (int(stops), 1)
    # 0.02 does not: no decision counts
    assert scores.stops_over_noise([_stop_case(base_train, decrease, -0.02)], {"toy": DEFAULT_CALIBRATION},
                                   decider) == (0, 0)
    if rule == GAP_RULE:  # the shipped rule is the shipped decision at the same fraction, its stop tolerance included
        shipped = scores._decide(inst, dataclasses.replace(DEFAULT_CALIBRATION, generalization_gap_fraction=0.003))
        assert (shipped.choice, shipped.stop_reason, shipped.stop_tolerance) == (d.choice, d.stop_reason,
                                                                                d.stop_tolerance)


@pytest.mark.parametrize("optimizer, family", [("sgd", "sgd"), ("adam", "adam"), ("adamw", "adam")])
def test_a_recipe_optimizer_falls_in_its_family_and_a_recorded_column_in_its_first_words(scores, optimizer, family,
                                                                                         tmp_path):
    assert scores.optimizer_family(optimizer) == family
    rng = np.random.default_rng(1)
    _parts(tmp_path, rng)
    insts = scores.instances(scores.load(tmp_path)[0])
    assert insts and {i["optimizer_family"] for i in insts} == {"adam"}  # the synthetic runs' column: adam_block


def _family_case(family: str, target: float) -> dict:
    """One decision of one trialled candidate ``a`` on a model that does not over-fit (training loss = held-out loss:
    stop tolerance 0 at every fraction): a flat held-out decrease of 0.0025 at standard error 0.01, so ``t = -0.25``
    and, under the shipped logistic (``a = 0.10143``, ``b = 1.20584``; trend weight 0, the error scale the standard
    error), ``P(decrease) = 1 / (1 + exp(a + b t)) = 0.5498``: credible at threshold 0.5, not at 0.6."""
    from satcore._decisions.trials import TrialCurve

    curve = TrialCurve((18, 37, 75), (-0.0025,) * 3, (-0.005,) * 3, 0.01)
    return {"set": "toy", "steps": 300, "cost": 300, "base_heldout": 2.0, "base_train": 2.0, "base_test": 2.0,
            "optimizer_family": family,
            "rows": [{"candidate": "a", "curve": curve, "may_choose": True, "screen": -0.0025, "target": target,
                      "seed_sd": 0.001}]}


@pytest.mark.parametrize("thresholds, sgd_threshold", [("P_THRESHOLDS", 0.5), ("LOW_P_THRESHOLDS", 0.1)])
def test_a_threshold_per_optimizer_family_is_fitted_on_that_familys_decisions(scores, thresholds, sgd_threshold):
    from satcore._decisions.calibration import DEFAULT_CALIBRATION

    # the candidate with P(decrease) 0.55 pays under SGD (realized -0.05) and harms under Adam (+0.02): the largest
    # mean gain inserts it under SGD (the lowest threshold, ties to the lower) and stops under Adam (0.6, the lowest
    # that stops); the stop tolerance is 0 at every fraction, so the fraction ties to 0
    sgd, adam = _family_case("sgd", -0.05), _family_case("adam", 0.02)
    a, b = DEFAULT_CALIBRATION.logit_intercept, DEFAULT_CALIBRATION.logit_slope
    p_decrease = 1 / (1 + math.exp(a + b * (-0.0025 / 0.01)))
    assert 0.5 < p_decrease < 0.6  # the case's premise, under the shipped logistic
    assert scores._decide(sgd, DEFAULT_CALIBRATION).candidates["a"].p_decrease == pytest.approx(p_decrease, rel=1e-12)
    fitted = scores.fit_thresholds_by_family([sgd, adam], DEFAULT_CALIBRATION, getattr(scores, thresholds))
    assert {f: (c.p_threshold, c.generalization_gap_fraction) for f, c in fitted.items()} == {
        "adam": (0.6, 0.0), "sgd": (sgd_threshold, 0.0)}
    decider = scores._family_decider({("toy", f): c for f, c in fitted.items()})
    assert decider(sgd, DEFAULT_CALIBRATION).choice == "a"
    # no credible decrease, and one the held-out data does not resolve either (-0.0025 +- 1.96 * 0.01 reaches past 0)
    assert decider(adam, DEFAULT_CALIBRATION).stop_reason == "heldout_too_small"
    # the shipped threshold (0.6) stops both: the family's own threshold, not the calibration passed, decides
    assert scores._decide(sgd, DEFAULT_CALIBRATION).choice is None


@pytest.mark.parametrize("values, labels, auc", [
    ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),  # 0.35 beats 0.1 not 0.4; 0.8 beats both: 3 of 4 pairs
    ([1.0, 1.0], [1, 0], 0.5),  # a tie counts half
    ([0.2, 0.3], [1, 1], None),  # no negative: undefined
])
def test_the_auc_is_the_share_of_positive_negative_pairs_ordered(scores, values, labels, auc):
    assert scores._auc(values, labels) == (auc if auc is None else pytest.approx(auc, abs=1e-15))


def test_readouts_measure_the_trial_after_its_first_checkpoint_and_price_a_decrease_by_the_training_curve():
    from satcore._decisions.trials import TrialCurve
    from studies import decision_readouts as readouts

    # an SGD trial whose held-out loss rose by 0.004 at T/4 then fell: after the shock it lowered it by 0.003
    rose = TrialCurve((25, 50, 100), (0.004, 0.002, 0.001), (0.01, 0.0, -0.01), 0.002)
    late = readouts.after_first_checkpoint(rose)
    assert late.heldout_change == pytest.approx((0.0, -0.002, -0.003), abs=1e-15)
    assert late.training_change == pytest.approx((0.0, -0.01, -0.02), abs=1e-15)
    assert late.heldout_se == 0.002
    # carried to 400 steps: log2(4 x 400 / 100) / 2 = 2 doublings' worth of the last two's change per doubling
    priced = readouts.late_priced(rose, 400)
    assert priced.heldout_change[-1] == pytest.approx(-0.006, abs=1e-15) and priced.heldout_se == 0.004
    assert readouts.after_a_rise(rose) == late
    fell = TrialCurve((25, 50, 100), (-0.001, -0.002, -0.001), (-0.01, -0.02, -0.03), 0.002)
    assert readouts.after_a_rise(fell) is fell
    # training falls by 0.01 per doubling at T = 100: at 800 steps -0.03 - 0.01 x 3 = -0.06, twice t(T), so d(T) x 2
    doubled = readouts.training_priced(fell, 800)
    assert doubled.heldout_change == pytest.approx((-0.002, -0.004, -0.002), abs=1e-15) and doubled.heldout_se == 0.004
    # the factor is capped (at 10^6 steps it would be 1 + log2(10^4) / 3 ~ 5.4) and a rise is never priced
    assert readouts.training_priced(fell, 10 ** 6).heldout_change[-1] == pytest.approx(
        -0.001 * readouts.TRAINING_PRICE_CAP, abs=1e-15)
    assert readouts.training_priced(rose, 800) is rose


def test_the_stop_ceiling_counts_short_stops_the_full_run_or_the_test_split_could_see(scores):
    from satcore._decisions.calibration import DEFAULT_CALIBRATION
    from studies import decision_readouts as readouts

    def case(own_a: float, target_se: float) -> dict:
        # both trials raise the held-out loss (no credible decrease: a stop) where the realized best gain, 0.05, is
        # beyond 3 seed SDs; ``own_a``: candidate a's own full-length held-out change
        inst = _stop_case(1.0, -0.005, -0.05)
        for r, own in zip(inst["rows"], (own_a, 0.02)):
            r.update(own_heldout=own, target_se=target_se)
        return {**inst, "model": "toy/a", "column": "sgd_block", "seed": 0}

    seen, unseen = case(-0.01, 0.01), case(0.003, 0.04)
    setting = {"columns": {"bench, 300 steps": [seen, unseen], "transfer sets, 300": [unseen]},
               "cals": {"toy": DEFAULT_CALIBRATION}, "transfer_sets": ["toy"]}
    # on the larger split the second decision's full run lowers the held-out loss at a
    res = readouts.stop_ceiling(setting, {"bench, 300 steps": [case(-0.01, 0.01)]})
    bench = res["bench, 300 steps"]
    assert bench["stops_over_noise"] == (2, 2) and bench["full_run_heldout_decrease"] == 1
    assert bench["larger_split"] == {"full_run_heldout_decrease": 2, "stops_over_noise": (1, 1)}
    # the gain is 5 test standard errors in the first decision, 1.25 in the second: only the first is resolved
    assert bench["best_gain_in_test_se"] == pytest.approx([5.0, 1.25]) and bench["test_resolved"] == (1, 1)
    assert res["transfer sets, 300"]["larger_split"] is None and res["transfer sets, 300"]["test_resolved"] == (0, 0)


def test_the_resolution_study_counts_unresolved_stops_and_reads_them_again_on_the_larger_split():
    from satcore._decisions.calibration import DEFAULT_CALIBRATION
    from studies import decision_resolution as resolution

    def case(se: float, best_target: float) -> dict:
        # both trials raise the held-out loss (a +0.005, b +0.01) on a model of gap 1: stop tolerance 0.01 x 1 = 0.01;
        # a's interval 0.005 +- 1.96 se reaches past -0.01 where se > 0.015 / 1.96, i.e. unresolved at se 0.01
        inst = _stop_case(1.0, -0.005, best_target)
        for r in inst["rows"]:
            r["curve"] = dataclasses.replace(r["curve"], heldout_se=se)
        return {**inst, "model": "toy/a", "column": "sgd_block", "seed": 0}

    cals = {"toy": DEFAULT_CALIBRATION}
    short, saturated, claimed = case(0.01, -0.05), case(0.01, 0.02), case(1e-4, -0.05)
    assert [resolution.outcome(i) for i in (short, saturated)] == ["short", "saturated"]
    column = resolution.resolution_column([short, saturated, claimed], cals)
    assert column["stops_over_noise"] == (2, 2) and (column["claimed_over_noise"], column["unresolved_over_noise"]) == (1, 1)
    assert {k: v for k, v in column["outcomes"]["saturated"].items() if k != "samples_factors"} == {
        "decisions": 1, "stops": 1, "unresolved": 1}
    # a's factor (1.96 x 0.01 / |0.005 + 0.01|)^2 = 1.71 is within 4 times the split; read there at half the standard
    # error (0.005 + 0.0098 clears -0.01) the stop is resolved: a claimed saturation, not an insertion
    factor = (Z95 * 0.01 / 0.015) ** 2
    assert resolution.read_stop(short, DEFAULT_CALIBRATION)["samples_factor"] == pytest.approx(factor, rel=1e-12)
    valid = resolution.factor_validity([short], [case(0.005, -0.05)], cals)
    assert valid["beyond"]["stops"] == 0 and {k: v for k, v in valid["within"].items() if k != "samples_factors"} == {
        "stops": 1, "resolved_there": 1, "inserts_there": 0, "short": 1, "short_inserts_there": 0}


def test_following_the_advice_decides_again_on_the_smallest_recorded_split_that_holds_the_samples_named():
    """The two-step protocol, by hand.  Both trials raise the held-out loss (a +0.005, b +0.01; stop tolerance 0.01 on
    a gap of 1); a's distance from -0.01 is 0.015.  With se 0.01 the distance is beyond one standard error: the
    count ``(1.96 x 0.01 / 0.015)^2 = 1.71`` times the split is named, and the user decides again on the 4x split
    (not the 16x: the smallest holding it), where a trial showing the gain (-0.05, se 0.001) inserts: the short stop
    is gone.  With se 0.02 the distance is within one (factor 6.8): nothing named, the stop stays under the named
    counts; every count (6.8) goes to the 16x split, and the z^2 first step (3.84) to the 4x one."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION
    from studies import decision_resolution as resolution

    def case(se: float, a_change: float = 0.005, seed: int = 0) -> dict:
        inst = _stop_case(1.0, -a_change, -0.05)  # the realized best gain 0.05: 5 seed SDs, a short stop
        for r in inst["rows"]:
            r["curve"] = dataclasses.replace(r["curve"], heldout_se=se if r["candidate"] == "a" else 1e-4)
        return {**inst, "model": "toy/a", "column": "sgd_block", "seed": seed}

    cals = {"toy": DEFAULT_CALIBRATION}
    gain = case(0.001, a_change=-0.05)  # the larger split's twin: a credible gain of 0.05, beyond the tolerance
    assert resolution.read_stop(gain, DEFAULT_CALIBRATION) is None
    named, at_tolerance = case(0.01), case(0.02, seed=1)
    assert resolution.read_stop(named, DEFAULT_CALIBRATION)["samples_factor"] == pytest.approx((Z95 * 0.01 / 0.015) ** 2)
    assert resolution.read_stop(at_tolerance, DEFAULT_CALIBRATION)["at_tolerance"]
    twin = {"seed": 1}
    larger = {4: [gain, {**gain, **twin}], 16: [{**case(0.01), "seed": 1}]}  # 16x: seed 1's twin still stops
    follow = {name: resolution.follow_advice([named, at_tolerance], larger, cals, advice)
              for name, advice in resolution.ADVICE.items()}
    assert follow["named counts"]["stops_over_noise"] == (1, 2) and follow["named counts"]["followed"]["short"] == 1
    # every count: seed 1's 6.8 goes to the 16x twin, which stops again; the first step goes to the 4x one
    assert follow["every count (none withheld)"]["stops_over_noise"] == (1, 2)
    assert follow["named counts, at the tolerance z^2 times"]["stops_over_noise"] == (0, 2)


def test_the_larger_split_scores_read_only_the_decisions_read_again_on_both_splits():
    """``larger_split_scores``: the decisions recorded on the larger split (model, column, seed, length) scored on
    the bench's split and on the larger one with the same targets; a decision without a twin there is left out of
    both.  Seed 0 stops on the bench's split (a raises the held-out loss by 0.005) and inserts on the larger one
    (a lowers it by 0.05); the realized best gain, 0.05, is 5 seed SDs: a short stop on the bench's split only."""
    from satcore._decisions.calibration import DEFAULT_CALIBRATION
    from studies import decision_resolution as resolution

    def case(decrease: float, model: str = "toy/a", seed: int = 0) -> dict:
        inst = _stop_case(1.0, decrease, -0.05)
        for r in inst["rows"]:
            r["spread"] = 0.02  # the seeds' range (score counts a clear sign beyond it)
        return {**inst, "model": model, "column": "sgd_block_1000", "seed": seed}

    cals = {"toy": DEFAULT_CALIBRATION}
    chosen = [case(-0.005), case(0.05, seed=1), case(-0.005, model="toy/b")]  # toy/b: not read on the larger split
    res = resolution.larger_split_scores(chosen, [case(0.05), case(0.05, seed=1)], cals)
    bench, larger = res["bench's held-out split"], res[f"held-out x{resolution.LARGE_HELDOUT}"]
    assert (bench["n_decisions"], bench["stops_over_noise"]) == (2, (1, 2))
    assert (larger["n_decisions"], larger["stops_over_noise"]) == (2, (0, 2))
    # a, the realized best, has the lower prediction on both splits (+0.005 against b's +0.01 where it stops)
    assert bench["best_picked"] == larger["best_picked"] == 1.0
    assert bench["spearman_within"] is None  # two candidates: no rank correlation


def test_a_model_set_part_records_only_the_models_named_each_trained_alone_from_its_seed(monkeypatch):
    """``--models``: ``image_tasks(..., only=...)`` trains only the models named, and a model is the one the whole
    part trains whatever ran before it (its seed set at its start), so a part's file of some models holds the same
    runs as the whole part's; a tag the part does not have is refused before any training."""
    import torch

    from studies import decision_validity as validity

    assert validity.model_tags("digits") == ["digits/e150", "digits/e2", "digits/e15"]
    assert validity.model_tags("llama-pydoc") == ["llama-pydoc/s1000", "llama-pydoc/s40", "llama-pydoc/s300"]
    alone = list(validity.image_tasks("digits", only=("digits/e2",)))
    torch.rand(1000)  # the global generator moved on, as by an earlier model's training
    again = list(validity.image_tasks("digits", only=("digits/e2",)))
    assert [t["tag"] for t in alone] == [t["tag"] for t in again] == ["digits/e2"]
    for a, b in zip(alone[0]["model"].state_dict().values(), again[0]["model"].state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(SystemExit, match="digits/e150, digits/e2, digits/e15"):
        validity.record("digits", only=("digits/e3",))
    with pytest.raises(SystemExit, match="none here"):
        validity.record("sweeps", only=("digits/e2",))


def test_larger_split_recordings_of_1000_step_columns_go_beside_their_own_recordings(monkeypatch, tmp_path):
    """``--large-heldout`` with a 1000-step column: the bench's to ``decision_validity_1000_large_heldout``, the
    transfer sets' to ``decision_validity_transfer_1000_large_heldout`` (apart from their 300-step larger splits,
    which the readouts and the transfer tables read at 300 steps); the 300-step columns where they were."""
    from studies import decision_validity as validity

    for name in ("OUT", "OUT_1000", "OUT_TRANSFER", "OUT_TRANSFER_1000"):
        monkeypatch.setattr(validity, name, tmp_path / getattr(validity, name).name)
    monkeypatch.setattr(validity, "COLUMNS", dict(validity.COLUMNS))  # record replaces them by the column given
    # no model trained: one stub model, so that the file is written where the recording would be
    monkeypatch.setattr(validity, "image_tasks", lambda *args: iter([{"tag": "toy"}]))
    monkeypatch.setattr(validity, "record_model", lambda task, *args: {"model": task["tag"]})
    places = {("digits", "sgd_block_1000"): "decision_validity_1000_large_heldout/digits-sgd_block_1000.json",
              ("digits", "sgd_block"): "decision_validity_large_heldout/digits-sgd_block.json",
              ("resmlp-fashion", "sgd_block_1000"):
                  "decision_validity_transfer_1000_large_heldout/resmlp-fashion-sgd_block_1000.json",
              ("resmlp-fashion", "sgd_block"): "decision_validity_transfer_large_heldout/resmlp-fashion-sgd_block.json"}
    for part, column in places:
        validity.record(part, log=lambda _: None, column=column, large_heldout=4)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")) == sorted(places.values())
