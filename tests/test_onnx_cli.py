"""``satcore probe MODEL.onnx --data DATA.npz -o DUMP`` end to end, against a NumPy reference.

The model is a small residual MLP written with ``onnx.helper`` (no exporter):
``h0 = x W0``, ``h1 = h0 + tanh(h0 W1)``, ``h2 = h1 + tanh(h1 W2)``, ``logits = h2 W3``, so the
per-sample gradients at ``h0`` and ``h1`` have a closed form (chain rule in float64 NumPy).
The dump the CLI writes must score like that reference (1e-5 relative: ORT runs in float32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from click.testing import CliRunner  # noqa: E402

from satcore import CandidateStatistics, make_family  # noqa: E402
from satcore.cli.main import main  # noqa: E402

D, CLASSES, IN = 6, 4, 5


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) * 0.7 for shape in ((IN, D), (D, D), (D, D), (D, CLASSES))]


def residual_mlp(path, ws, batch="batch"):
    from onnx import TensorProto, helper, numpy_helper

    names = ["W0", "W1", "W2", "W3"]
    nodes = [
        helper.make_node("MatMul", ["x", "W0"], ["h0"]),
        helper.make_node("MatMul", ["h0", "W1"], ["a1"]),
        helper.make_node("Tanh", ["a1"], ["b1"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("MatMul", ["h1", "W2"], ["a2"]),
        helper.make_node("Tanh", ["a2"], ["b2"]),
        helper.make_node("Add", ["b2", "h1"], ["h2"]),  # skip on the right: order must not matter
        helper.make_node("MatMul", ["h2", "W3"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "residual_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
        [numpy_helper.from_array(w, n) for w, n in zip(ws, names)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def closed_form(ws, x, y):
    """``(z, q)`` at h0, h1 and the head h2: the stream and its closed-form per-sample gradients (float64)."""
    W0, W1, W2, W3 = (w.astype(np.float64) for w in ws)
    h0 = x.astype(np.float64) @ W0
    b1 = np.tanh(h0 @ W1)
    h1 = h0 + b1
    b2 = np.tanh(h1 @ W2)
    logits = (h1 + b2) @ W3
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g_logits = p - np.eye(CLASSES)[y]  # d CE_i / d logits_i
    g_h2 = g_logits @ W3.T
    g_h1 = g_h2 + (g_h2 * (1 - b2**2)) @ W2.T
    g_h0 = g_h1 + (g_h1 * (1 - b1**2)) @ W1.T
    return [(h0, g_h0), (h1, g_h1), (h1 + b2, g_h2)]


def reference(ws, x, y, kind, seed, n_features=None):
    """The closed-form gradients scored by the core with the family ``make_family(kind, D, seed, n_features)``."""
    family = make_family(kind, D, seed=seed, n_features=n_features)
    return [CandidateStatistics.from_samples(q, family.features(z)).score() for z, q in closed_form(ws, x, y)]


@pytest.fixture
def files(tmp_path):
    ws = weights()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, IN)).astype(np.float32)
    y = rng.integers(0, CLASSES, 50)
    model = residual_mlp(tmp_path / "mlp.onnx", ws)
    data = tmp_path / "data.npz"
    np.savez(data, inputs=x, targets=y)
    return ws, x, y, model, data


@pytest.mark.parametrize("kind", ["mlp", "linear"])
def test_cli_dump_scores_like_the_closed_form(files, tmp_path, kind):
    ws, x, y, model, data = files
    out = tmp_path / "dump.npz"
    runner = CliRunner()
    res = runner.invoke(main, ["probe", str(model), "--data", str(data), "--family", kind, "--seed", "5",
                               "--batch-size", "16", "--split", "heldout", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["score", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert [c["name"] for c in report["candidates"]] == ["h0", "h1", "head"]  # head: the last block's output
    for got, ref in zip(report["candidates"], reference(ws, x, y, kind, seed=5), strict=True):
        assert got["n_samples"] == 50
        for field in ("ag", "growth_value", "cross_gradient_norm"):
            assert got[field] == pytest.approx(getattr(ref, field), rel=1e-5), field
        assert got["feature_rank"] == ref.feature_rank
        assert 0.01 < got["realizability"] < 0.999  # not a trivial projection


def test_named_inputs_npz(files, tmp_path):
    ws, x, y, model, _ = files
    data = tmp_path / "named.npz"
    np.savez(data, x=x, targets=y)
    out = tmp_path / "dump.npz"
    res = CliRunner().invoke(main, ["probe", str(model), "--data", str(data), "--candidates", "h1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["score", str(out), "--json"])
    got = json.loads(res.output)["candidates"]
    assert [c["name"] for c in got] == ["h1"]
    assert got[0]["growth_value"] == pytest.approx(reference(ws, x, y, "mlp", 0)[1].growth_value, rel=1e-5)


def test_user_feature_map_and_per_candidate_families(files):
    """A callable ``psi = z A`` (invertible ``A``) reparameterises ``linear``: same growth value (docs/core.md, identity 3)."""
    from satcore.adapters.onnx import probe

    ws, x, y, model, _ = files
    A = np.random.default_rng(4).standard_normal((D, D)) + 3 * np.eye(D)
    data = [(x[:25], y[:25]), (x[25:], y[25:])]
    mapped = probe(model, data, family={"h0": lambda z: z @ A, "h1": "bias"})
    linear = probe(model, data, family="linear")
    a, b = mapped.statistics["h0"].score(), linear.statistics["h0"].score()
    assert mapped.meta["family"]["h0"]["kind"] == "user" and mapped.meta["family"]["h1"]["kind"] == "bias"
    assert a.growth_value == pytest.approx(b.growth_value, rel=1e-7)
    assert abs(a.cross_gradient_norm / b.cross_gradient_norm - 1) > 1e-2
    # bias family: psi = 1, so C is the mean gradient and the growth value its norm
    ref = reference(ws, x, y, "bias", 0)[1]
    assert mapped.statistics["h1"].score().growth_value == pytest.approx(ref.growth_value, rel=1e-5)


def test_cli_probe_runs_without_onnxruntime_training(files, tmp_path):
    """``satcore probe`` in a process where ``onnxruntime.training`` and ORT's private gradient builder
    cannot be imported: the backward graph is satcore's own, plain ``onnxruntime`` runs it."""
    import subprocess
    import sys

    _, _, _, model, data = files
    out = tmp_path / "dump.npz"
    code = (
        "import sys; sys.modules['onnxruntime.training'] = None\n"
        "import onnxruntime.capi._pybind_state as state\n"
        "if hasattr(state, 'GradientGraphBuilder'): del state.GradientGraphBuilder\n"
        "from satcore.cli.main import main\n"
        f"main(['probe', {str(model)!r}, '--data', {str(data)!r}, '-o', {str(out)!r}])\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and out.is_file()


def test_providers_option_runs_on_the_named_provider_and_refuses_unknown_ones(files, tmp_path):
    """--providers reaches ONNX Runtime (the same dump as the default CPU run); a provider this build lacks
    is one line, exit 2, before anything runs."""
    ws, x, y, model, data = files
    runner = CliRunner()
    outs = []
    for extra in ([], ["--providers", "CPUExecutionProvider"]):
        outs.append(tmp_path / f"d{len(outs)}.npz")
        res = runner.invoke(main, ["probe", str(model), "--data", str(data), *extra, "-o", str(outs[-1])])
        assert res.exit_code == 0, res.output
    a, b = (json.loads(runner.invoke(main, ["score", str(o), "--json"]).output)["candidates"] for o in outs)
    assert [c["growth_value"] for c in a] == [c["growth_value"] for c in b]
    res = runner.invoke(main, ["probe", str(model), "--data", str(data), "--providers", "NoSuchExecutionProvider",
                               "-o", str(tmp_path / "x.npz")])
    assert res.exit_code == 2 and "NoSuchExecutionProvider is not available" in res.output
    assert not (tmp_path / "x.npz").exists()


def _probe_with(model, data, tmp_path, *options):
    """``satcore probe MODEL --data DATA OPTIONS -o dump.npz``: the result and the dump's path."""
    out = tmp_path / "dump.npz"
    return CliRunner().invoke(main, ["probe", str(model), "--data", str(data), *options, "-o", str(out)]), out


def test_n_features_sets_the_family_width(files, tmp_path):
    """``--n-features 10`` gives the mlp family r = 10 (not 4 * D = 24), scored like the closed form at r = 10."""
    ws, x, y, model, data = files
    res, out = _probe_with(model, data, tmp_path, "--family", "mlp", "--n-features", "10")
    assert res.exit_code == 0, res.output
    report = json.loads(CliRunner().invoke(main, ["score", str(out), "--json"]).output)
    at_10, at_24 = reference(ws, x, y, "mlp", 0, n_features=10), reference(ws, x, y, "mlp", 0)
    for got, ref, default in zip(report["candidates"], at_10, at_24):
        assert got["n_features"] == 10
        assert got["growth_value"] == pytest.approx(ref.growth_value, rel=1e-5)
        assert got["growth_value"] != pytest.approx(default.growth_value, rel=1e-3)  # the option acts


def residual_conv(path):
    """``h0 = Conv1x1(x)``, ``h1 = h0 + relu(Conv1x1(h0))``, logits from h1's channel means: 4-d streams, so
    ``--family auto`` draws ``conv`` for them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"W0": rng.standard_normal((2, 2, 1, 1)), "W1": rng.standard_normal((2, 2, 1, 1)),
               "W2": rng.standard_normal((2, CLASSES)), "flat": np.array([0, -1], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "W0"], ["h0"]), helper.make_node("Conv", ["h0", "W1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["b1"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("GlobalAveragePool", ["h1"], ["m"]), helper.make_node("Reshape", ["m", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "W2"], ["logits"])]
    graph = helper.make_graph(
        nodes, "residual_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 3, 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(w if w.dtype == np.int64 else w.astype(np.float32), n) for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


# (model, --family, --n-features): what the refusal says after the file and the candidate, with the option it
# refuses ({n}: the feature count, {family}: the family) named by its flag (the command line's) and by its keyword
# (the Python probe's)
FEATURE_REFUSALS = [
    ("mlp", "linear", 3, "{n} for family 'linear': does not apply (its number of features is fixed, 6 for a stream "
                         "of width 6)"),
    ("conv", "auto", 10, "{n} for family 'conv': a positive multiple of 9 (9 per middle channel)"),
    ("mlp", "conv", 9, "{family} needs a (M, C, H, W) stream, got shape (16, 6)"),
]


@pytest.mark.parametrize("model_kind, family, n_features, expected", FEATURE_REFUSALS)
def test_a_family_or_feature_count_the_stream_cannot_take_is_one_line_exit_2(files, tmp_path, model_kind, family,
                                                                           n_features, expected):
    """The refusal names the model file and the candidate, and the feature count or family as the user gave it:
    ``--n-features 3`` on the command line, ``n_features=3`` to :func:`satcore.adapters.onnx.probe` (the command
    line used to say ``n_features``, the keyword it passes the flag on as, and ``family 'conv'`` for
    ``--family conv``); no dump is written."""
    from satcore.adapters.onnx import OnnxProbeError, probe

    _, x, y, model, data = files
    if model_kind == "conv":
        model, data = residual_conv(tmp_path / "conv.onnx"), tmp_path / "images.npz"
        x = np.random.default_rng(2).standard_normal((50, 2, 3, 3)).astype(np.float32)
        np.savez(data, inputs=x, targets=y)
    res, out = _probe_with(model, data, tmp_path, "--family", family, "--n-features", str(n_features),
                           "--batch-size", "16")
    assert res.exit_code == 2, res.output
    flags = expected.format(n=f"--n-features {n_features}", family=f"--family {family!r}")
    assert res.stderr == f"satcore: error: {model}: candidate 'h0': {flags}\n"
    assert not out.exists()
    with pytest.raises(OnnxProbeError) as refused:
        probe(str(model), [(x[:16], y[:16])], family=family, n_features=n_features)
    keywords = expected.format(n=f"n_features={n_features}", family=f"family={family!r}")
    assert str(refused.value) == f"candidate 'h0': {keywords}"


@pytest.mark.parametrize("names", ["", " , ", "blocks.0,,head"])
@pytest.mark.parametrize("model_kind", ["onnx", "checkpoint folder"])
def test_an_empty_candidate_name_is_refused_for_either_model(files, tmp_path, names, model_kind):
    """``--candidates`` with an empty name is one line naming the option, exit 2, no dump: for an ONNX file and,
    before the folder is read, for a checkpoint folder (an empty one, refused otherwise for its missing
    config.json).  ``--candidates ""`` used to probe every block, and a folder took ``a,,b``'s empty name to the
    probe."""
    _, _, _, model, data = files
    if model_kind == "checkpoint folder":
        model = tmp_path / "checkpoint"
        model.mkdir()
    res, out = _probe_with(model, data, tmp_path, "--candidates", names)
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == ["satcore: error: Invalid value for --candidates: empty candidate name "
                                               "(see 'main probe --help')"]
    assert not out.exists()


def plain_linear(path):
    """``logits = x W``: a model without a residual ``Add``."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["logits"])], "plain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        [numpy_helper.from_array(np.ones((IN, CLASSES), np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("case", ["no residual Add", "--loss", "--output", "--candidates"])
def test_a_refusal_of_the_model_names_the_model_file(files, tmp_path, case):
    """What the probe refuses about the model (no block found, a loss, output or candidate it does not have) is one
    line that leads with the model's file, exit 2, no dump; for a model without blocks it says what to pass on the
    command line (it used to say only ``candidates=[tensor names]``, without the file)."""
    _, _, _, model, data = files
    options = {"no residual Add": [], "--loss": ["--loss", "nope"], "--output": ["--output", "nope"],
               "--candidates": ["--candidates", "nope"]}[case]
    if case == "no residual Add":
        model = plain_linear(tmp_path / "plain.onnx")
    res, out = _probe_with(model, data, tmp_path, *options)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"satcore: error: {model}: "), res.output
    assert ("'nope'" in lines[0]) != (case == "no residual Add")
    if case == "no residual Add":
        assert lines[0].endswith("no residual Add found in the graph; pass candidates=[tensor names] "
                                 "(satcore probe: --candidates NAME,...)")
    assert not out.exists()


def test_a_model_that_is_not_a_regular_file_is_named_for_what_it_is(files, tmp_path):
    """``satcore probe /dev/null``: one line saying what the path is (it said 'no ONNX file at', which it is not), and
    a path that is not there is still 'no ONNX file'."""
    _, _, _, _, data = files
    res, out = _probe_with("/dev/null", data, tmp_path)
    assert res.exit_code == 2 and not out.exists(), res.output
    assert res.output.strip().splitlines() == ["satcore: error: /dev/null: is a character device, not a regular "
                                               "file; refused"]
    res, _ = _probe_with(tmp_path / "absent.onnx", data, tmp_path)
    assert res.exit_code == 2 and f"no ONNX file at '{tmp_path / 'absent.onnx'}'" in res.output


@pytest.mark.parametrize("name, says", [("digits.keras", "a Keras model: probe it in Python with "
                                                        "satcore.adapters.tensorflow.probe"),
                                        ("weights.pt", "torch weights: export the model to ONNX"),
                                        ("model.onnx", None)])
def test_a_file_of_another_format_is_refused_with_where_it_goes(files, tmp_path, name, says):
    """``satcore probe model.keras``: a Keras or torch save (a zip archive, as both are) is refused in one line that
    says, from the name, how such a model is probed (it said only 'not a readable ONNX model (DecodeError)'); a
    ``.onnx`` name that does not hold ONNX is refused without a guess."""
    import zipfile

    _, _, _, _, data = files
    with zipfile.ZipFile(tmp_path / name, "w") as archive:
        archive.writestr("config.json", "{}")
    res, out = _probe_with(tmp_path / name, data, tmp_path)
    assert res.exit_code == 2 and not out.exists(), res.output
    lines = res.output.strip().splitlines()
    lead = f"satcore: error: {tmp_path / name}: not a readable ONNX model (DecodeError)"
    assert len(lines) == 1 and lines[0].startswith(lead), res.output
    assert lines[0] == lead if says is None else lines[0].startswith(f"{lead}; the name says {says}")


def test_rho_scores_an_onnx_dump_and_a_merge_of_its_shards(files, tmp_path):
    """ONNX dumps carry the stream sums: ``--rho`` turns the tolerance into loss units with
    ``||z||_S = sqrt(mean_i ||z_i||^2)`` of the closed-form stream, on one dump and on a merge of
    two shards (whose meta records neither shard's norm alone)."""
    ws, x, y, model, _ = files
    runner = CliRunner()
    shards = []
    for k, rows in enumerate((slice(0, 30), slice(30, 50))):
        data, out = tmp_path / f"part{k}.npz", tmp_path / f"part{k}_dump.npz"
        np.savez(data, inputs=x[rows], targets=y[rows])
        res = runner.invoke(main, ["probe", str(model), "--data", str(data), "--batch-size", "10",
                                   "--split", "heldout", "-o", str(out)])
        assert res.exit_code == 0, res.output
        shards.append(out)
    merged = tmp_path / "merged.npz"
    res = runner.invoke(main, ["merge", *map(str, shards), "-o", str(merged)])
    assert res.exit_code == 0, res.output
    rms = [np.sqrt(np.mean(np.sum(z**2, axis=1))) for z, _ in closed_form(ws, x, y)]
    shard_rms = [np.sqrt(np.mean(np.sum(z**2, axis=1))) for z, _ in closed_form(ws, x[:30], y[:30])]
    assert min(abs(a / b - 1) for a, b in zip(rms, shard_rms)) > 1e-3  # a shard's norm would be seen
    for path, expected in ((shards[0], shard_rms), (merged, rms)):
        res = runner.invoke(main, ["score", str(path), "--json", "--tolerance", "1e-3", "--rho", "0.01"])
        assert res.exit_code == 0, res.output
        for cand, value in zip(json.loads(res.output)["candidates"], expected):
            # float32 activations from ONNX Runtime, summed in float64
            assert cand["test"]["tolerance"] == pytest.approx(1e-3 / (0.01 * value), rel=1e-5)


def test_default_batch_size_makes_one_batch_per_fold_so_256_samples_decide(tmp_path):
    """256 samples at the old default (64 a batch) filled 4 of the fold test's 16 folds, where no p-value can
    pass Holm's alpha/k: never improvable. The default now gives 16 batches of 16 and says so; the untrained
    model's mean gradient is far from 0, so the probe decides."""
    ws = weights()
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((256, IN)).astype(np.float32), rng.integers(0, CLASSES, 256)
    model, data = residual_mlp(tmp_path / "mlp.onnx", ws), tmp_path / "data.npz"
    np.savez(data, inputs=x, targets=y)
    runner = CliRunner()
    verdicts = {}
    for batch_size in (None, "64"):
        out = tmp_path / f"dump-{batch_size}.npz"
        res = runner.invoke(main, ["probe", str(model), "--data", str(data), "-o", str(out)]
                            + (["--batch-size", batch_size] if batch_size else []))
        assert res.exit_code == 0, res.output
        if batch_size is None:
            assert "256 samples in 16 batch(es) of 16 (the default --batch-size: one batch per fold" in res.output
            assert "note:" not in res.output
        else:
            assert "note: 4 batch(es) fill only 4 of the fold test's 16 folds (folds are made of batches, not " \
                   "samples); a smaller --batch-size" in res.output
        res = runner.invoke(main, ["score", str(out), "--json"])
        assert res.exit_code == 0, res.output
        verdicts[batch_size] = json.loads(res.output)["verdict"]
    assert verdicts[None]["verdict"] == "improvable"
    assert verdicts["64"]["verdict"] == "inconclusive"
    assert "the limit is the number of batches, not samples: probe at least 7 batches (satcore probe: a smaller " \
           "--batch-size)" in verdicts["64"]["reason"]


@pytest.mark.parametrize("samples", [1, 15, 16, 17, 31, 47, 50, 113, 256, 400, 1023, 1025, 5000])
def test_the_default_batch_size_fills_every_fold_where_the_samples_allow(samples):
    """The largest batch, at most one fold's share ceil(samples / 16) and at most 64, that makes at least 16 batches
    (every fold of the fold test gets one), found by counting: ceil(113 / 16) = 8 made 15 batches of the 113 windows
    of a checkpoint folder, leaving a fold empty, where 7 makes 17; fewer samples than folds go one a batch."""
    from satcore.cli.probe import default_batch_size

    share = -(-samples // 16)
    fills = [size for size in range(1, share + 1) if -(-samples // size) >= 16]
    expected = min(64, max(fills)) if fills else 1
    assert default_batch_size(samples) == expected
    assert -(-samples // expected) >= min(16, samples)


@pytest.mark.parametrize("error, expected", [
    ("ModelOnDataError", "m.onnx on d.npz: the model's own loss is NaN"),  # no 'batch ' prefix: led by its type
    ("OnnxProbeError", "m.onnx: batch has several target keys"),  # a 'batch ' prefix alone: MODEL's, as any other
])
def test_a_probe_refusal_names_both_files_for_the_model_on_the_data_only(error, expected):
    """Which refusals are the model on the data is the error's type (:class:`satcore.ModelOnDataError`), not its
    message's first word: only those lead with MODEL and DATA, any other with MODEL."""
    import satcore
    from satcore.adapters import onnx as sat_onnx
    from satcore.cli.probe import named_refusal

    kind = getattr(satcore, error, None) or getattr(sat_onnx, error)
    said = expected.split(": ", 1)[1]
    refusal = named_refusal(kind(said), "m.onnx", "d.npz")
    assert type(refusal) is kind
    assert str(refusal) == expected


@pytest.mark.parametrize("samples, options, expected", [
    (50, [], "pass --batch-size 2, or export"),  # the default --batch-size: 3
    (49, ["--batch-size", "2"], "pass --batch-size 2 and a sample count that is a multiple of 2 (DATA holds 49)"),
    (50, ["--batch-size", "5"], "pass --batch-size 2, or export"),
])
def test_a_fixed_batch_size_the_batches_do_not_match_is_refused_with_what_to_pass(files, tmp_path, samples, options,
                                                                                    expected):
    """A model exported with its example's batch size (2) refuses the CLI's batches of another size (or the last,
    shorter one) in ONNX Runtime's words, which name the dimension but not the way out (a newcomer's exported ResNet);
    the line says which --batch-size to pass or how to export a dynamic batch axis.  Batches of 2 run."""
    ws, x, y, _, _ = files
    model = residual_mlp(tmp_path / "fixed.onnx", ws, batch=2)
    data = tmp_path / "fixed.npz"
    np.savez(data, inputs=x[:samples], targets=y[:samples])
    res, out = _probe_with(model, data, tmp_path, *options)
    assert res.exit_code == 2 and not out.exists(), res.output
    (line,) = res.output.strip().splitlines()
    assert "the model's input 'x' has a fixed batch size of 2 (an export's example batch): " + expected in line
    assert ".;" not in line
    assert ("export the model with a dynamic batch axis (torch.onnx.export(..., dynamic_shapes={'x': "
            "{0: torch.export.Dim('batch')}}), or with dynamo=False dynamic_axes={'x': {0: 'batch'}}))") in line
    if samples % 2 == 0:
        res, out = _probe_with(model, data, tmp_path, "--batch-size", "2")
        assert res.exit_code == 0 and out.exists(), res.output


def test_a_fixed_batch_refused_on_the_probes_own_targets_input_says_what_that_input_is(files, tmp_path):
    """A legacy torch export names its input ``input.1``; with a fixed batch size ONNX Runtime then refuses the
    batch on ``satcore_targets`` (it checks the feeds in its own order), a name in neither the model nor DATA.  The
    line says it is DATA's targets, and the hint still names the model's input and the --batch-size to pass."""
    onnx = pytest.importorskip("onnx")
    ws, x, y, _, _ = files
    model = onnx.load(residual_mlp(tmp_path / "fixed.onnx", ws, batch=2))
    model.graph.input[0].name = "input.1"
    for node in model.graph.node:
        node.input[:] = ["input.1" if name == "x" else name for name in node.input]
    path = tmp_path / "legacy.onnx"
    onnx.save(model, path)
    data = tmp_path / "fixed.npz"
    np.savez(data, inputs=x[:48], targets=y[:48])
    res, out = _probe_with(path, data, tmp_path)
    assert res.exit_code == 2 and not out.exists(), res.output
    (line,) = res.output.strip().splitlines()
    assert ("Got invalid dimensions for input: satcore_targets (DATA's targets, as the probe feeds them to its loss) "
            "for the following indices") in line
    assert "the model's input 'input.1' has a fixed batch size of 2 (an export's example batch): pass --batch-size 2" \
        in line
