"""Reports lead with predicted gains when a training split is given: the torch two-split probe, the
Python report and `satcore score --train` all carry satcore.predict_gains of the same statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from zoo import models_torch as mt
import satcore
from satcore.adapters.torch import probe_splits
from satcore.cli.main import main


HELDOUT = {"batch_size": 10, "n_batches": 16, "start": 1000}  # 16 batches: one per fold


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return mt.digits_resnet(steps=40)


@pytest.fixture(scope="module")
def splits(model):
    train = mt.digits_batches(10, 16, start=0)  # the samples it trained on
    return probe_splits(model, train, mt.digits_batches(**HELDOUT), mt.per_sample_ce)


def test_two_split_report_carries_predict_gains_of_the_two_probes(splits):
    report = splits.report(optimizer="sgd", lr=0.05, steps=3)
    direct = satcore.predict_gains(splits.train.statistics, splits.heldout.statistics, satcore.Recipe("sgd", 0.05, 3, 1))
    assert report.predictions == direct
    assert report.split == "heldout" and splits.train.meta["split"] == "train"
    assert [t.name for t in report.tests] == [c.name for c in direct.candidates]
    d = report.to_dict()
    assert d["predictions"]["splits"]["predicted_heldout_gain"].startswith("held-out")
    json.dumps(d, allow_nan=False)
    text = str(report)
    # first that the statistics make no insertion decision, then the predictions, then the first-order table
    assert text.splitlines()[1].startswith("insertion decision: none from statistics alone")
    assert text.splitlines()[2].startswith("predicted gains of one inserted block trained by sgd")
    best = max(direct.candidates, key=lambda c: c.heldout.value)
    assert f"largest predicted held-out gain: {best.heldout.value:.4g} at {best.name}" in text


def test_score_train_option_equals_the_python_report(splits, tmp_path):
    splits.train.save(tmp_path / "train.npz")
    splits.heldout.save(tmp_path / "heldout.npz")
    run = CliRunner()
    result = run.invoke(main, ["score", str(tmp_path / "heldout.npz"), "--train", str(tmp_path / "train.npz"),
                               "--lr", "0.05", "--steps", "3", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)["predictions"]
    want = splits.report(optimizer="sgd", lr=0.05, steps=3).to_dict()["predictions"]
    for a, b in zip(got["candidates"], want["candidates"]):
        assert a["name"] == b["name"]
        np.testing.assert_allclose(a["predicted_heldout_gain"]["value"], b["predicted_heldout_gain"]["value"],
                                   rtol=1e-9)
    missing = run.invoke(main, ["score", str(tmp_path / "heldout.npz"), "--train", str(tmp_path / "train.npz")])
    assert missing.exit_code == 2 and "--lr" in missing.output


def _fold_test_reference(train, heldout, lr, steps):
    """Per candidate ``(held-out gain, fold test's P(gain > 0))`` of ``steps`` SGD steps at ``lr`` fitted on
    ``train``, from the held-out fold sums by scipy's Student t (module docstring of the predictors)."""
    from scipy import stats

    out = {}
    for name, tr in train.items():
        ho = heldout[name]
        V = -steps * lr * tr.sum_cross / tr.n_samples
        keep = ho.fold_samples > 0
        counts = ho.fold_samples[keep].astype(float)
        y = np.array([np.sum(fold / n * V) for fold, n in zip(ho.fold_cross[keep], counts)])
        w = counts / counts.sum()
        m = len(y)
        se = np.sqrt(m / (m - 1) * np.sum(w**2 * (y - w @ y) ** 2))
        gain = -float(w @ y)
        out[name] = (gain, float(stats.t.cdf(gain / se, df=m - 1)))
    return out


def test_score_train_rows_are_not_verified_and_carry_no_probability(splits, tmp_path):
    """``satcore score HELDOUT --train TRAIN``: no trial verified the screen's rows, so the table reads "not
    verified" where a probability would stand and the JSON's ``p_decrease`` is null; the fold test's number stays
    in the JSON under its own name, equal to scipy's Student t of the fold values computed here."""
    splits.train.save(tmp_path / "train.npz")
    splits.heldout.save(tmp_path / "heldout.npz")
    args = ["score", str(tmp_path / "heldout.npz"), "--train", str(tmp_path / "train.npz"), "--optimizer", "sgd",
            "--lr", "0.05", "--steps", "30"]
    want = _fold_test_reference(splits.train.statistics, splits.heldout.statistics, 0.05, 30)
    run = CliRunner()
    printed = run.invoke(main, args)
    assert printed.exit_code == 0, printed.output
    lines = printed.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("predicted gains of one inserted block"))
    assert lines[head + 1].split()[-1] == "P(decrease)"
    rows = {line.split()[0]: line for line in lines[head + 2:head + 2 + len(want)]}
    assert set(rows) == set(want)
    for name, (gain, _) in want.items():  # interval "-", and "not verified" where the probability stood
        assert rows[name].split()[-5:] == [f"{gain:.4g}", "(screen)", "-", "not", "verified"]
    data = run.invoke(main, [*args, "--json"])
    assert data.exit_code == 0, data.output
    for c in json.loads(data.output)["predictions"]["candidates"]:
        gain, p = want[c["name"]]
        assert c["evidence"] == "not verified" and c["predicted_heldout_gain"]["p_decrease"] is None
        assert c["predicted_heldout_gain"]["value"] == pytest.approx(gain, rel=1e-9)
        assert c["predicted_heldout_gain"]["fold_test_p_positive"] == pytest.approx(p, rel=1e-9, abs=1e-12)
    # the note under the table names where the fold interval and probability are: the keys read just above
    note = next(line for line in lines if line.startswith("note: not verified: first-order extrapolations"))
    assert ("in the JSON only (predictions.candidates[].predicted_heldout_gain: interval, fold_test_p_positive; "
            "Python: report.predictions.candidates[i].heldout)") in note


def test_score_train_note_says_the_screens_gains_can_exceed_the_held_out_loss(model, splits, tmp_path):
    """A real case: three SGD steps at lr 0.05 on the digits ResNet predict held-out gains of several nats where the
    model's held-out cross-entropy (computed here from the model, independently of the probe) is below 1, a decrease
    no loss bounded below by 0 allows.  The probe records no loss, so the note under the rows says always that
    their size can exceed the held-out loss and that they read as a direction and a ranking."""
    with torch.no_grad():
        loss = torch.cat([mt.per_sample_ce(model(x), y) for x, y in mt.digits_batches(**HELDOUT)]).mean().item()
    splits.train.save(tmp_path / "train.npz")
    splits.heldout.save(tmp_path / "heldout.npz")
    printed = CliRunner().invoke(main, ["score", str(tmp_path / "heldout.npz"), "--train", str(tmp_path / "train.npz"),
                                       "--optimizer", "sgd", "--lr", "0.05", "--steps", "3"])
    assert printed.exit_code == 0, printed.output
    gains = [c.heldout.value for c in splits.report(optimizer="sgd", lr=0.05, steps=3).predictions.candidates]
    assert 0 < loss < 1 and sum(abs(g) > loss for g in gains) >= 3  # the case the clause is for
    note = next(line for line in printed.output.splitlines() if line.startswith("note: not verified:"))
    assert ("first-order extrapolations of the step, no trial of the recipe ran (decide verifies by short trials); "
            "their size can exceed the held-out loss itself (the probe records no loss to compare them with): read "
            "them as a direction and a ranking, not an amount;") in note


def test_plot_leads_with_the_predicted_gains(splits, tmp_path):
    """``satcore score --train ... --plot``: a panel of the predicted gains above the growth values; the
    drawn points are the report's predictions (training gain, held-out gain), with no interval or probability."""
    matplotlib = pytest.importorskip("matplotlib")  # the plot extra
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from satcore.cli.plot import draw_predictions

    report = splits.report(optimizer="sgd", lr=0.05, steps=3)
    names = [c.name for c in report.candidates]
    fig, ax = plt.subplots()
    draw_predictions(ax, report.predictions, names)
    train_line, held_line = ax.get_lines()[:2]
    by_name = {c.name: c for c in report.predictions.candidates}
    want_train = [by_name[n].training_gain for n in names]  # no Fisher given: first order
    np.testing.assert_allclose(train_line.get_ydata(), want_train, rtol=1e-12)
    held = np.asarray(held_line.get_ydata(), dtype=float)
    np.testing.assert_allclose(held, [by_name[n].heldout.value for n in names], rtol=1e-12)
    # no trial verified them: no interval bars, no probability, and the panel says so
    assert not ax.collections and not ax.texts
    assert ax.get_title().endswith(": not verified, no trial ran")
    plt.close(fig)
    # with the curvature sums the training gain drawn is the second-order one
    curved = probe_splits(mt.digits_resnet(steps=40), mt.digits_batches(10, 16, start=0),
                          mt.digits_batches(10, 16, start=1000), mt.per_sample_ce, curvature=True)
    second = curved.report(optimizer="sgd", lr=0.05, steps=3).predictions
    assert all(c.training_gain_second_order is not None for c in second.candidates)
    assert all(c.training_gain_second_order != pytest.approx(c.training_gain, rel=1e-3) for c in second.candidates)
    fig, ax = plt.subplots()
    draw_predictions(ax, second, [c.name for c in second.candidates])
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(),
                               [c.training_gain_second_order for c in second.candidates], rtol=1e-12)
    plt.close(fig)
    splits.train.save(tmp_path / "train.npz")
    splits.heldout.save(tmp_path / "heldout.npz")
    png = tmp_path / "report.png"
    result = CliRunner().invoke(main, ["score", str(tmp_path / "heldout.npz"), "--train", str(tmp_path / "train.npz"),
                                       "--lr", "0.05", "--steps", "3", "--plot", str(png), "--quiet"])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_torch_curvature_sums_equal_the_per_sample_reference():
    """probe(curvature=True) accumulates sum_i Q_i^T Q_i: against the per-sample autograd loop's Q."""
    from test_torch_probe_reference import reference_statistics

    from satcore.adapters.torch import probe

    torch.manual_seed(0)
    model = mt.digits_resnet(steps=20).double()
    batches = mt.digits_batches(6, 3, dtype=torch.float64)
    result = probe(model, batches, mt.per_sample_ce, curvature=True, variance=True, candidates=["layer2.0"],
                   head=False)
    got = result.statistics["layer2.0"]
    ref = reference_statistics(model, batches, mt.per_sample_ce, ("layer2.0", "input"), None)
    assert got.curvature and got.sum_qq.shape == (got.n_hidden, got.n_hidden)
    want = np.zeros_like(got.sum_qq)
    for x, y in batches:  # activation gradients of the summed per-sample losses (eval mode: samples apart)
        store = {}
        block = model.get_submodule("layer2.0")
        handle = block.register_forward_pre_hook(lambda _m, inputs: store.update(z=inputs[0]) or inputs[0].retain_grad())
        mt.per_sample_ce(model(x), y).sum().backward()
        handle.remove()
        q = store["z"].grad.permute(0, 2, 3, 1).reshape(-1, store["z"].shape[1]).numpy()
        want += q.T @ q
    np.testing.assert_allclose(got.sum_qq, want, rtol=0, atol=1e-10 * np.abs(want).max())
    assert np.trace(got.sum_qq) == pytest.approx(ref.sum_q_sq, rel=1e-10)
    np.testing.assert_allclose(got.sum_cross, ref.sum_cross, rtol=0, atol=1e-10 * np.abs(ref.sum_cross).max())
    report = result.report(train=result.statistics, optimizer="sgd", lr=0.01)  # the Fisher from sum_qq
    assert report.predictions["layer2.0"].training_gain_second_order is not None


def test_float32_storage_of_float64_sums_round_trips_within_its_rounding(splits, tmp_path):
    """Sums added up in float64 on the device, stored as float32 on the host: half the bytes, the scores
    within float32 rounding of the float64 dump's, and the same verdicts."""
    import os

    splits.heldout.save(tmp_path / "f64.npz")
    splits.heldout.save(tmp_path / "f32.npz", stats_dtype=np.float32)
    a = satcore.read_dump(tmp_path / "f64.npz").statistics()
    b = satcore.read_dump(tmp_path / "f32.npz").statistics()
    assert os.path.getsize(tmp_path / "f32.npz") < 0.6 * os.path.getsize(tmp_path / "f64.npz")
    ra, rb = a.report(split="heldout"), b.report(split="heldout")
    for ca, cb in zip(ra.candidates, rb.candidates):
        assert cb.growth_value == pytest.approx(ca.growth_value, rel=1e-5)
        assert cb.ag == ca.ag  # scalars stay float64
    assert [t.verdict for t in ra.tests] == [t.verdict for t in rb.tests]
    assert b[next(iter(b))].sum_gram.dtype == np.float64  # read back as float64
