"""Malformed and hostile ONNX inputs: one clear error line, exit 2 from the CLI, nothing read.

Cases: a candidate name not in the graph, a constant as candidate, an op without an ONNX
Runtime gradient between a candidate and the loss, external data whose location escapes the
model's folder (absolute path, ``..``, a symlink pointing out), a file that is not ONNX, and
data files the CLI must refuse (pickled object arrays, wrong input names).  A model with
external data INSIDE its folder is the positive control.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from click.testing import CliRunner  # noqa: E402

from satcore import ModelOnDataError  # noqa: E402
from satcore.adapters.onnx import OnnxProbeError, load_model, probe  # noqa: E402
from satcore.cli.main import main  # noqa: E402

D = 4


def small_model(op="Tanh"):
    """``c = x + op(x W)``, ``logits = c W``: one residual candidate, ``x``."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((D, D)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"]),
        helper.make_node(op, ["a"], ["b"]),
        helper.make_node("Add", ["x", "b"], ["c"]),
        helper.make_node("MatMul", ["c", "W"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", D])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", D])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def batch():
    rng = np.random.default_rng(2)
    return rng.standard_normal((5, D)).astype(np.float32), rng.integers(0, D, 5)


def with_external_weight(folder, location_for):
    """Save ``small_model`` with W as external data, then point its location elsewhere."""
    from onnx.external_data_helper import convert_model_to_external_data

    folder.mkdir(parents=True, exist_ok=True)
    model = small_model()
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    onnx.save(model, str(folder / "model.onnx"))  # writes weights.bin next to it
    location = location_for(folder)
    if location is not None:
        proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        for entry in proto.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save(proto, str(folder / "model.onnx"))
    return folder / "model.onnx"


def run_cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    return result.exit_code, lines


def assert_one_line_exit_2(args, *words):
    code, lines = run_cli(*args)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("satcore: error: "), lines
    assert "Traceback" not in lines[0]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture
def data_npz(tmp_path):
    x, y = batch()
    path = tmp_path / "data.npz"
    np.savez(path, inputs=x, targets=y)
    return path


def test_external_data_inside_the_folder_is_read(tmp_path):
    path = with_external_weight(tmp_path / "ok", lambda folder: None)
    model = load_model(path)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(w, onnx.numpy_helper.to_array(small_model().graph.initializer[0]))
    result = probe(path, [batch()], family="linear")
    assert list(result.statistics) == ["x", "head"]


@pytest.mark.parametrize(
    "case, location_for",
    [
        ("absolute", lambda folder: str(folder / "weights.bin")),  # absolute, even if it exists
        ("absolute-etc", lambda folder: "/etc/passwd"),
        ("dotdot", lambda folder: "../outside.bin"),
        ("dotdot-nested", lambda folder: "sub/../../outside.bin"),
        ("symlink", lambda folder: (os.symlink(folder.parent / "outside.bin", folder / "link.bin"), "link.bin")[1]),
    ],
)
def test_external_data_outside_the_folder_is_refused(tmp_path, data_npz, case, location_for):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(np.arange(D * D, dtype=np.float32).tobytes())
    path = with_external_weight(tmp_path / "model", location_for)
    with pytest.raises(OnnxProbeError, match="outside the model folder"):
        load_model(path)
    assert_one_line_exit_2(["probe", path, "--data", data_npz, "-o", tmp_path / "d.npz"], "outside the model folder")
    assert not (tmp_path / "d.npz").exists()


def test_model_proto_with_pending_external_data_is_refused(tmp_path):
    path = with_external_weight(tmp_path / "m", lambda folder: None)
    proto = onnx.load(str(path), load_external_data=False)
    with pytest.raises(OnnxProbeError, match="pass the .onnx path"):
        probe(proto, [batch()])


def test_missing_tensor_name(tmp_path, data_npz):
    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    with pytest.raises(OnnxProbeError, match="'nope' is not in the ONNX graph"):
        probe(tmp_path / "m.onnx", [batch()], candidates=["nope"])
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data_npz, "--candidates", "x,nope",
                            "-o", tmp_path / "d.npz"], "'nope'")


def test_constant_candidate(tmp_path):
    with pytest.raises(OnnxProbeError, match="'W' is a constant"):
        probe(small_model(), [batch()], candidates=["W"])


@pytest.mark.parametrize("op", ["Softplus", "Hardmax"])
def test_op_without_gradient_in_the_path(tmp_path, data_npz, op):
    onnx.save(small_model(op), str(tmp_path / "m.onnx"))
    with pytest.raises(OnnxProbeError, match=f"no gradient for op {op} \\(node 'b'\\)"):
        probe(tmp_path / "m.onnx", [batch()])
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data_npz, "-o", tmp_path / "d.npz"], op)


def test_not_an_onnx_file(tmp_path, data_npz):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf model" * 10)
    assert_one_line_exit_2(["probe", bad, "--data", data_npz, "-o", tmp_path / "d.npz"], "bad.onnx")


def test_unknown_loss_output(tmp_path, data_npz):
    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data_npz, "--loss", "hinge",
                            "-o", tmp_path / "d.npz"], "'hinge'")


def test_pickled_data_is_refused_without_unpickling(tmp_path):
    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    data = tmp_path / "evil.npz"
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    np.savez(data, inputs=np.array([Payload()], dtype=object), targets=np.zeros(1, np.int64))
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data, "-o", tmp_path / "d.npz"], "inputs")
    assert not marker.exists()


def test_data_with_wrong_input_names(tmp_path):
    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    x, y = batch()
    data = tmp_path / "d.npz"
    np.savez(data, pixels=x, targets=y)
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data, "-o", tmp_path / "o.npz"], "pixels")


@pytest.mark.parametrize("label", [D, -1, 10**8])  # one past the classes, negative (not -100), huge
def test_cross_entropy_label_outside_the_classes(tmp_path, label):
    """ONNX Runtime would read past the logits (wrong scores, or a crash at 10**8): refused before it runs."""
    x, y = batch()
    bad = y.copy()
    bad[3] = label
    words = ("batch 1", f"target {label} ", f"[0, {D})")
    with pytest.raises(OnnxProbeError) as info:
        probe(small_model(), [(x, y), (x, bad)])
    assert all(w in str(info.value) for w in words), str(info.value)
    assert isinstance(info.value, ModelOnDataError)  # the model on the data: the command line names both files
    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    data = tmp_path / "data.npz"
    np.savez(data, inputs=np.concatenate([x, x]), targets=np.concatenate([y, bad]))
    assert_one_line_exit_2(["probe", tmp_path / "m.onnx", "--data", data, "--batch-size", len(x),
                            "-o", tmp_path / "d.npz"], f"{tmp_path / 'm.onnx'} on {data}: batch 1", *words)
    assert not (tmp_path / "d.npz").exists()


def test_cross_entropy_needs_a_fixed_class_count():
    """Labels are checked against the class count before a batch runs, so it must be known then."""
    from onnx import helper

    model = small_model()
    # Reshape(h, Shape(h)): shape inference cannot see through it, the logits' width is symbolic
    model.graph.node[3].output[0] = "h"
    model.graph.node.extend(
        [helper.make_node("Shape", ["h"], ["s"]), helper.make_node("Reshape", ["h", "s"], ["logits"])]
    )
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "classes"
    with pytest.raises(OnnxProbeError, match="fixed class count on output 'logits'"):
        probe(model, [batch()])


def test_a_batch_onnx_runtime_refuses_is_one_line_on_the_console(tmp_path):
    """ONNX Runtime logs its own error to the process's stderr (below Python) before satcore's
    one-line error; the console script must still print exactly one line."""
    import subprocess
    import sys
    from pathlib import Path

    onnx.save(small_model(), str(tmp_path / "m.onnx"))
    x, y = batch()
    np.savez(tmp_path / "d.npz", inputs=x, targets=np.stack([y, y], 1))  # (B, 2) labels for (B, classes) logits
    satcore_cli = Path(sys.executable).parent / "satcore"
    run = subprocess.run([str(satcore_cli), "probe", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                          "-o", str(tmp_path / "o.npz")], capture_output=True, text=True)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("satcore: error: "), run.stderr
