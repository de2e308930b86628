"""The shipped JSON Schemas accept what satcore writes (a torch probe's report, `satcore score --json`,
a sweep, the meta of torch and TF dumps and of a checkpoint) and reject broken copies of it."""

import copy
import json

import numpy as np
import pytest
import torch

from zoo import models_torch as mt
from satcore._io.schemas import json_schema
from satcore._decisions.sweep import depth_sweep, sweep_point

jsonschema = pytest.importorskip("jsonschema")


def validator(name):
    schema = json_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def torch_result():
    from satcore.adapters.torch import probe

    torch.set_num_threads(1)
    return probe(mt.digits_transformer(), mt.digits_batches(6, 2), mt.per_sample_ce, variance=True, split="heldout")


def meta_of(path):
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["meta"]))


def test_report_schema_accepts_reports_and_rejects_broken_ones(torch_result, tmp_path):
    from click.testing import CliRunner

    from satcore.cli.main import main

    check = validator("report")
    report = torch_result.report(t=0.01).to_dict()
    check.validate(report)
    torch_result.save(tmp_path / "d.npz")
    out = CliRunner().invoke(main, ["score", str(tmp_path / "d.npz"), "--json"])
    assert out.exit_code == 0, out.output
    check.validate(json.loads(out.output))
    for breakage in (lambda r: r["candidates"][0].pop("growth_value"),
                     lambda r: r.update(schema="satcore-report/0"),
                     lambda r: r["candidates"][0].update(ag=-1.0),
                     lambda r: r["depth"].update(argmax=3),
                     lambda r: r.pop("best_candidate"),
                     lambda r: r["verdict"].update(best_candidate=None),
                     lambda r: r["candidates"][0].pop("growth_noise_floor"),
                     lambda r: r["candidates"][0].update(growth_noise_floor=-0.5)):
        broken = copy.deepcopy(report)
        breakage(broken)
        assert not check.is_valid(broken)


def test_sweep_schema_accepts_a_sweep(torch_result):
    check = validator("sweep")
    report = torch_result.report()
    sweep = depth_sweep([sweep_point(d, f"depth{d}", report) for d in (1, 2, 3)]).to_dict()
    check.validate(sweep)
    broken = copy.deepcopy(sweep)
    broken["points"][0]["n_samples"] = 0
    assert not check.is_valid(broken)


def test_dump_meta_schema_accepts_torch_tf_and_checkpoint_meta(torch_result, tmp_path):
    from satcore.adapters.torch import probe

    check = validator("dump-meta")
    torch_result.save(tmp_path / "torch.npz")
    check.validate(meta_of(tmp_path / "torch.npz"))
    probe(mt.digits_resnet(), mt.digits_batches(4, 1), mt.per_sample_ce, checkpoint=tmp_path / "c.npz")
    check.validate(meta_of(tmp_path / "c.npz"))
    tf = pytest.importorskip("tensorflow")
    from test_tensorflow_callbacks import residual_classifier

    from satcore.adapters.tensorflow import probe as tf_probe

    model = residual_classifier()
    x = np.random.default_rng(0).random((8, 64)).astype(np.float32)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    tf_probe(model, [(x, np.arange(8) % 10)], loss).save(tmp_path / "tf.npz")
    check.validate(meta_of(tmp_path / "tf.npz"))
    for broken in ({"candidates": []}, {"candidates": ["a", "a"]}, {"candidates": ["a"], "batch_size": 0},
                   {"split": "x"}):
        assert not check.is_valid(broken)


def test_score_formats_jsonl_and_csv_hold_the_report_rows(torch_result, tmp_path):
    import csv
    import io

    from click.testing import CliRunner

    from satcore.cli.main import main

    torch_result.save(tmp_path / "d.npz")
    report = torch_result.report()
    run = CliRunner()
    lines = run.invoke(main, ["score", str(tmp_path / "d.npz"), "--format", "jsonl"]).output.splitlines()
    assert [json.loads(line) for line in lines] == report.to_records()  # flat: the test's fields as test.<key>
    assert all("test.verdict" in json.loads(line) for line in lines)
    rows = list(csv.DictReader(io.StringIO(run.invoke(main, ["score", str(tmp_path / "d.npz"), "--format", "csv"]).output)))
    assert [r["name"] for r in rows] == [c.name for c in report.candidates]
    assert [float(r["growth_value"]) for r in rows] == [c.growth_value for c in report.candidates]
    assert list(rows[0])[0] == "name"
    table = run.invoke(main, ["score", str(tmp_path / "d.npz"), "--format", "table"]).output
    assert table == run.invoke(main, ["score", str(tmp_path / "d.npz")]).output
    both = run.invoke(main, ["score", str(tmp_path / "d.npz"), "--json", "--format", "csv"])
    assert both.exit_code == 2 and "disagree" in both.output


def test_to_pandas_one_row_per_candidate_name_first(torch_result):
    pandas = pytest.importorskip("pandas")
    report = torch_result.report(t=0.01)
    frame = report.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns)[0] == "name" and list(frame["name"]) == [c.name for c in report.candidates]
    assert frame["growth_value"].tolist() == [c.growth_value for c in report.candidates]
    assert frame.loc[frame["growth_value"].idxmax(), "name"] == report.argmax


def test_scalars_keys_and_values(torch_result):
    report = torch_result.report(t=0.01)
    scalars = report.scalars()
    assert all(k.startswith("satcore/") for k in scalars)
    assert scalars["satcore/growth_value_max"] == report.growth_value_max
    assert report.candidates[int(scalars["satcore/argmax_index"])].name == report.argmax
    assert report.candidates[int(scalars["satcore/best_candidate_index"])].name == report.best_candidate
    assert scalars["satcore/improvable"] == float(report.verdict.verdict == "improvable")
    assert scalars["satcore/saturated"] == float(report.verdict.verdict == "saturated")
    assert scalars["satcore/n_improvable"] == sum(t.verdict == "improvable" for t in report.tests)
    name = report.candidates[0].name
    assert scalars[f"satcore/{name}/ag"] == report.candidates[0].ag
    # the depth-wide summary a training loop prints: exactly the keys naming no candidate, the same values
    depth_wide = {k: v for k, v in scalars.items() if not any(k.startswith(f"satcore/{c.name}/") for c in report.candidates)}
    assert len(depth_wide) == 7 and report.scalars(per_candidate=False) == depth_wide
