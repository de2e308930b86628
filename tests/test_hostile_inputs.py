"""Hostile inputs by failure class, through every command: one line naming file and key, exit 2, bounded memory.

Classes and cases are in ``tests/malformed/hostile.py``.  Each refusal is checked in process (every
command x every case, fast) and, for the peak-memory bound, in a fresh process whose ``ru_maxrss``
is read with ``os.wait4``: the cases that declare gigabytes (in the ``.npy`` header or the zip
directory) must be refused without allocating them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from malformed.hostile import container_cases, cyclic_model, dump_cases, evil_name_dump, write_data
from satcore.cli.main import main
from satcore._io.dump import DumpError, read_dump

SATCORE = [str(Path(sys.executable).parent / "satcore")]
RSS_LIMIT_BYTES = 200 * 2**20
# the satcore of this checkout in child processes (the console script may import another install's)
THIS_CHECKOUT = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\x80-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    cases = {case_id: (str(path), expect, scope) for case_id, path, expect, scope in container_cases(tmp) + dump_cases(tmp)}
    good = tmp / "good.npz"
    rng = np.random.default_rng(3)
    from satcore import write_dump

    write_dump(good, raw={"blk": (rng.standard_normal((20, 4)), rng.standard_normal((20, 3)))})
    return cases, str(good), tmp


def _case_scopes() -> dict[str, str]:
    """``{case_id: scope}``, built once in a scratch folder (the ids parametrise the tests)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return {c: s for c, _, _, s in container_cases(Path(tmp)) + dump_cases(Path(tmp))}


SCOPES = _case_scopes()
ALL_CASES = list(SCOPES)
CONTAINER_CASES = [c for c, s in SCOPES.items() if s == "container"]
READ_CASES = [c for c, s in SCOPES.items() if s != "scoring"]


def assert_one_line(text: str, expect):
    lines = text.splitlines()
    assert len(lines) == 1, text
    line = lines[0]
    assert line.startswith("satcore: error: "), line
    assert "Traceback" not in text and not CONTROL.search(line), repr(line)
    for part in expect:
        assert part in line, (part, line)


@pytest.mark.parametrize("case_id", READ_CASES)
def test_reader_refuses_naming_file_and_key(hostile, case_id):
    cases, _, _ = hostile
    path, expect, _ = cases[case_id]
    with pytest.raises(DumpError) as info:
        read_dump(path).statistics(chunk_samples=4)
    message = str(info.value)
    assert "\n" not in message and not CONTROL.search(message), repr(message)
    for part in expect:
        assert part in message, (part, message)


def command_args(command, path, good, out):
    return {
        "score": ["score", path],
        "inspect": ["inspect", path],
        "merge": ["merge", path, good, "-o", out],
        "sweep": ["sweep", good, path],
        "probe": ["probe", str(good) + ".onnx", "--data", path, "-o", out],
    }[command]


@pytest.mark.parametrize("command", ["score", "inspect", "merge", "sweep", "probe"])
@pytest.mark.parametrize("case_id", ALL_CASES)
def test_every_command_refuses_with_one_line(hostile, case_id, command, tmp_path):
    cases, good, _ = hostile
    path, expect, scope = cases[case_id]
    if (command == "probe" and scope != "container") or (scope == "scoring" and command not in ("score", "sweep")):
        pytest.skip(f"a {scope} case is valid input to {command}")
    out = str(tmp_path / "out.npz")
    result = CliRunner().invoke(main, command_args(command, path, good, out))
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stdout == ""
    assert_one_line(result.stderr, expect)
    assert not os.path.exists(out)


# The child's ru_maxrss would include the (large) pytest process it was forked from: Linux carries the
# memory high-water mark across fork and exec.  A small launcher process starts it instead and reports it.
LAUNCHER = ("import os, subprocess, sys; child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "_, status, usage = os.wait4(child.pid, 0); print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)")


def peak_rss(args, env=None) -> tuple[int, str, int]:
    """``(exit status, stderr, peak RSS in bytes)`` of one fresh ``satcore`` process."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER] + SATCORE + args, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)
    code, rss_kb = proc.stdout.split()
    return int(code), proc.stderr, int(rss_kb) * 1024  # ru_maxrss is in kB on Linux


@pytest.mark.parametrize("case_id", CONTAINER_CASES + ["meta_huge_integer", "gram_overflows_when_scaled"])
def test_refusal_peak_memory_is_bounded(hostile, case_id, tmp_path):
    cases, good, _ = hostile
    path, expect, _ = cases[case_id]
    code, err, rss = peak_rss(["score", path])
    assert code == 2, err
    assert_one_line(err, expect)
    assert rss < RSS_LIMIT_BYTES, f"{case_id}: peak RSS {rss / 2**20:.0f} MiB"


@pytest.mark.parametrize("case_id", ["zip_declares_2gib", "header_declares_1tib", "deflate_bomb", "fifo", "dev_zero"])
def test_probe_data_refusal_peak_memory_is_bounded(hostile, case_id, tmp_path):
    cases, good, _ = hostile
    path, expect, _ = cases[case_id]
    code, err, rss = peak_rss(["probe", good + ".onnx", "--data", path, "-o", str(tmp_path / "o.npz")])
    assert code == 2, err
    assert_one_line(err, expect)
    assert rss < RSS_LIMIT_BYTES, f"{case_id}: peak RSS {rss / 2**20:.0f} MiB"


def test_limits_are_overridable(hostile, monkeypatch):
    """The ratio cap refuses the bomb by default and lets it through when raised; the memory budget is enforced."""
    cases, good, _ = hostile
    bomb = cases["deflate_bomb"][0]
    monkeypatch.setenv("SATCORE_MAX_INFLATE_RATIO", "5000")
    with pytest.raises(DumpError, match="psi/blk: has 20 samples but q/blk has 524288"):
        read_dump(bomb)  # past the cap, the dump's own checks run
    monkeypatch.setenv("SATCORE_MAX_INFLATE_RATIO", "100")
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", "100")
    with pytest.raises(DumpError, match=r"good.npz: q/blk: a chunk of 20 rows of 640 bytes is over the memory budget"
                       ) as refused:
        read_dump(good).statistics()
    # the budget's own line, not wrapped as an unreadable member (whose reason is cut at 120 characters)
    assert "unreadable" not in str(refused.value) and str(refused.value).count("good.npz") == 1
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", "lots")
    result = CliRunner().invoke(main, ["score", good])
    assert result.exit_code == 2
    assert_one_line(result.stderr, ["SATCORE_MEMORY_BUDGET=lots", "not a number"])


def test_huge_batch_size_streams_in_chunks(tmp_path):
    """meta batch_size 1e9 (one batch over the whole dump) is summed over chunks: same sums, memory one chunk."""
    from satcore import CandidateStatistics, write_dump

    rng = np.random.default_rng(5)
    q, p = rng.standard_normal((20_000, 8, 16)), rng.standard_normal((20_000, 8, 48))  # 82 MB of float64
    path = tmp_path / "big_batch.npz"
    write_dump(path, raw={"blk": (q, p)}, meta={"batch_size": 10**9})
    got = read_dump(path).statistics(chunk_samples=1000)["blk"]
    ref = CandidateStatistics.from_samples(q, p)  # one batch
    assert got.n_batches == 1
    np.testing.assert_allclose(got.sum_batch_grad_norm, np.sqrt(np.sum(q**2)) / len(q), rtol=1e-12)
    np.testing.assert_allclose(got.sum_gram, ref.sum_gram, rtol=1e-10)
    np.testing.assert_allclose(got.sum_xtx, ref.sum_xtx, rtol=1e-10)
    del q, p
    code, err, rss = peak_rss(["score", str(path), "--chunk-samples", "500", "--json"])
    assert code == 0, err
    assert rss < RSS_LIMIT_BYTES, f"peak RSS {rss / 2**20:.0f} MiB for an 82 MB dump read in chunks of 500"


# -- names from files ----------------------------------------------------------------------------

EVIL = ("blk\x1b]0;PWNED\x07", "two\nline\ndepth-wide maximum: growth_value 9 at FORGED", "cr\rOVERWRITE",
        "bidi\u202eevil", "math $\\frac{1}{0}$ name")


def test_names_are_escaped_in_tables_and_exact_in_json(tmp_path):
    path = str(evil_name_dump(tmp_path, EVIL))
    for args in (["score", path], ["inspect", path], ["sweep", path]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert not CONTROL.search(result.stdout.replace("\n", "")), repr(result.stdout)
        assert "FORGED\n" not in result.stdout
        assert not any(line.startswith("depth-wide maximum: growth_value 9") for line in result.stdout.splitlines())
        assert "\\x1b]0;PWNED\\x07" in result.stdout or args[0] == "sweep"
    table = CliRunner().invoke(main, ["score", path]).stdout
    assert "two\\nline\\ndepth-wide maximum" in table and "cr\\rOVERWRITE" in table and "bidi\\u202eevil" in table
    assert "probe split: val\\x1b]0;TITLE\\x07" in table
    inspect = CliRunner().invoke(main, ["inspect", path]).stdout
    assert "meta x\\x1b[1m: " in inspect and '"y\\nFORGED"' in inspect  # the JSON value's own escape
    report = json.loads(CliRunner().invoke(main, ["score", path, "--json"]).stdout)
    assert [c["name"] for c in report["candidates"]] == list(EVIL)
    assert report["split"] == "val\x1b]0;TITLE\x07"


def test_names_are_escaped_in_plots(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(evil_name_dump(tmp_path, EVIL))
    png = tmp_path / "names.png"
    result = CliRunner().invoke(main, ["score", path, "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from satcore.cli.plot import label

    assert label(EVIL[0]) == "blk\\x1b]0;PWNED\\x07" and label(EVIL[4]) == "math \\$\\frac{1}{0}\\$ name"


# -- models ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def probe_inputs(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from test_onnx_cli import residual_mlp, weights

    tmp = tmp_path_factory.mktemp("probe_inputs")
    model = residual_mlp(tmp / "model.onnx", weights())
    rng = np.random.default_rng(0)
    data = write_data(tmp / "data.npz", inputs=rng.standard_normal((16, 5)).astype(np.float32),
                      targets=rng.integers(0, 4, 16))
    return tmp, str(model), str(data)


def test_cyclic_graph_is_refused_not_walked_forever(probe_inputs, tmp_path):
    _, _, data = probe_inputs
    model = cyclic_model(tmp_path / "cycle.onnx")
    proc = subprocess.run(SATCORE + ["probe", str(model), "--data", data, "-o", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr, ["cycle.onnx", "cycle", "tensor"])


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "empty", "garbage", "directory"])
def test_bad_model_files_are_one_line(probe_inputs, tmp_path, kind):
    _, _, data = probe_inputs
    model = tmp_path / "m.onnx"
    if kind == "fifo":
        os.mkfifo(model)
    elif kind == "dev_zero":
        model = "/dev/zero"
    elif kind == "empty":
        model.write_bytes(b"")
    elif kind == "garbage":
        model.write_bytes(os.urandom(4096))
    else:
        model.mkdir()
    proc = subprocess.run(SATCORE + ["probe", str(model), "--data", data, "-o", str(tmp_path / "o.npz")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    # an empty file parses as an empty model: it read 'the ONNX graph has no nodes', hiding that it is empty
    assert_one_line(proc.stderr, ["m.onnx: the file is empty (0 bytes), not an ONNX model"] if kind == "empty" else [])
    assert not (tmp_path / "o.npz").exists()


def test_probe_data_nan_names_key_and_batch(probe_inputs, tmp_path):
    _, model, _ = probe_inputs
    x = np.ones((16, 5), dtype=np.float32)
    x[11, 2] = np.nan
    data = write_data(tmp_path / "nan.npz", inputs=x, targets=np.zeros(16, dtype=np.int64))
    result = CliRunner().invoke(main, ["probe", model, "--data", str(data), "--batch-size", "4", "-o",
                                       str(tmp_path / "o.npz")])
    assert result.exit_code == 2
    assert_one_line(result.stderr, ["nan.npz", "'inputs'", "NaN or Inf", "batch 2"])


def edited_model(model: str, path, edit):
    """A copy of the ONNX file ``model`` at ``path``, ``edit(proto)`` applied to it."""
    import onnx

    proto = onnx.load(model)
    edit(proto)
    onnx.save(proto, str(path))
    return path


def input_axis(axis: int, size: int):
    """The model input's ``axis`` declared of ``size``."""
    def edit(proto):
        proto.graph.input[0].type.tensor_type.shape.dim[axis].dim_value = size
    return edit


def typed_values(dims, values):
    """Store the first weight in ``float_data``: ``values`` of them under the shape ``dims``."""
    def edit(proto):
        tensor = proto.graph.initializer[0]
        tensor.ClearField("raw_data")
        tensor.ClearField("dims")
        tensor.dims.extend(dims)
        tensor.float_data.extend([1.0] * values)
    return edit


def retyped(op_type: str, domain: str = ""):
    """The block's ``Tanh`` (output ``b1``) as ``op_type`` of ``domain``: an op onnx has no schema for."""
    def edit(proto):
        from onnx import helper

        node = next(n for n in proto.graph.node if n.output[0] == "b1")
        node.op_type, node.domain = op_type, domain
        if domain:
            proto.opset_import.append(helper.make_opsetid(domain, 1))
    return edit


def loop_node(proto, source: str, output: str, *, trips: int, op: str, shape):
    """A ``Loop`` node of ``trips`` trips applying ``op`` to ``source`` (its one carried value) into ``output``, its
    body's values declared of ``shape`` (``None``: no shape); its trip count and condition added as weights."""
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["go"], ["go_on"]), helper.make_node(op, ["v"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("go", TensorProto.BOOL, []), helper.make_tensor_value_info("v", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("go_on", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, shape)])
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(trips, np.int64), "trips"),
                                    numpy_helper.from_array(np.array(True), "go")])
    return helper.make_node("Loop", ["trips", "go", source], [output], body=body)


def loop_block(proto):
    """The block's ``Tanh`` inside a ``Loop`` whose body declares no shapes."""
    node = next(n for n in proto.graph.node if n.output[0] == "b1")
    node.CopyFrom(loop_node(proto, "a1", "b1", trips=3, op="Tanh", shape=None))


def renamed(old: str, new: str):
    """The tensor ``old`` named ``new`` wherever the graph makes, reads or lists it."""
    def edit(proto):
        for node in proto.graph.node:
            node.input[:] = [new if name == old else name for name in node.input]
            node.output[:] = [new if name == old else name for name in node.output]
        for value in itertools.chain(proto.graph.input, proto.graph.output):
            value.name = new if value.name == old else value.name
    return edit


HOSTILE_MODELS = {  # case: (edit of the residual MLP, parts of the line)
    # a batch axis no batch fits: it was a ZeroDivisionError traceback (the hint's sample count modulo the size)
    "batch_axis_zero": (input_axis(0, 0), ["batch 0", "fixed batch size of 0: export the model with a dynamic batch"]),
    # weights in typed fields with fewer values than their shape: the line named the loss's tensor (its rank unknown
    # after shape inference gave up at the weight), not the weight
    "typed_values_none": (typed_values([10**6, 10**6], 0), ["tensor name: W0", "one and only one value field"]),
    "typed_values_short": (typed_values([10**6, 10**6], 4), [
        "tensor name: W0", "float_data size (4) is too small for the declared shape (1000000000000 float values"]),
    "typed_values_one_short": (typed_values([5, 8], 39), ["tensor name: W0", "float_data size (39) is too small"]),
    # shape inference gives up at a node, and every tensor after it has no shape: the refusal of the loss's tensor
    # says where inference gave up and why (before: only that the file declares no value_info for the loss's tensor)
    "op_without_schema": (retyped("FooBar"), ["it first found none at FooBar node 'b1', an op onnx has no schema for "
                                              "(domain 'ai.onnx')"]),
    "custom_domain": (retyped("Pwn", "com.evil"), ["Pwn node 'b1', an op onnx has no schema for (domain 'com.evil')"]),
    "loop_without_shapes": (loop_block, ["it first found none at Loop node 'b1' (inputs trips [], go [], a1 "]),
    "feature_axis_zero": (input_axis(1, 0), ["it first found none at MatMul node 'h0' (inputs x ['batch', 0], W0 [5, "]),
    # a tensor named as one the probe adds: refused as a cycle through the probe's tensor, or by ONNX Runtime as a
    # duplicate definition, before
    "name_of_the_probes_loss": (renamed("logits", "satcore_loss"), [
        "tensor 'satcore_loss': the probe adds tensors of this name to the graph", "rename it in the model"]),
    "name_of_the_probes_tensor": (renamed("a1", "satcore_picked"), ["tensor 'satcore_picked': the probe adds"]),
    "name_of_a_candidates_gradient": (renamed("h1", "h0_grad"), ["tensor 'h0_grad': the probe adds tensors of this",
                                                                 "each candidate's name + '_grad'"]),
    # ONNX Runtime's refusal without its C++ source location and signature (they led the line, which was cut
    # mid-word from the front to fit)
    "opset_future": (lambda proto: setattr(proto.opset_import[0], "version", 999), [
        "ONNX Runtime refused the gradient graph: ... opset versions. Opset 999 is under development"]),
    "ir_version_future": (lambda proto: setattr(proto, "ir_version", 999), [
        "refused the gradient graph: Unsupported model IR version: 999, max supported IR version"]),
}


@pytest.mark.parametrize("case", list(HOSTILE_MODELS))
def test_hostile_onnx_models_are_one_line(probe_inputs, tmp_path, case):
    _, model, data = probe_inputs
    edit, expect = HOSTILE_MODELS[case]
    path = edited_model(model, tmp_path / f"{case}.onnx", edit)
    result = CliRunner().invoke(main, ["probe", str(path), "--data", data, "-o", str(tmp_path / "o.npz")])
    assert result.exit_code == 2, result.output
    assert_one_line(result.stderr, [f"{case}.onnx", *expect])
    assert "onnxruntime::" not in result.stderr and "onnxruntime_src" not in result.stderr
    assert not (tmp_path / "o.npz").exists()


def endless_loop_beside_the_loss(proto):
    """A ``Loop`` of 10^15 trips reading ``h0``, whose output is a second graph output that the loss never reads."""
    from onnx import TensorProto, helper

    proto.graph.node.append(loop_node(proto, "h0", "aux", trips=10**15, op="Identity", shape=["batch", 6]))
    proto.graph.output.append(helper.make_tensor_value_info("aux", TensorProto.FLOAT, ["batch", 6]))


@pytest.mark.parametrize("kind, make", [("a FIFO", os.mkfifo), ("a directory", os.mkdir)])
def test_external_data_that_is_no_regular_file_is_named_as_what_it_is(tmp_path, kind, make):
    """External data inside the model's folder that is a FIFO or a directory is never opened and is named as what
    it is; before, it was 'not found' while the user could see it."""
    from test_onnx_errors import with_external_weight

    from satcore.adapters.onnx import OnnxProbeError, load_model

    def location(folder):
        make(folder / "special.bin")
        return "special.bin"

    path = with_external_weight(tmp_path / "m", location)
    with pytest.raises(OnnxProbeError, match=f"external data file of tensor 'W', 'special.bin', is {kind}, not a "
                                             "regular file; refused"):
        load_model(path)


def test_a_file_larger_than_onnx_allows_is_refused_unread(probe_inputs, tmp_path):
    """A file past protobuf's 2 GiB (a sparse file: declared, not on disk) is no ONNX model: refused from its size,
    where onnx.load read all of it (a peak of 3.2 GB for 3 GiB) before its parser refused it."""
    _, _, data = probe_inputs
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as stream:
        stream.truncate(3 * 2**30)
    code, err, rss = peak_rss(["probe", str(path), "--data", data, "-o", str(tmp_path / "o.npz")], env=THIS_CHECKOUT)
    assert code == 2, err
    assert_one_line(err, ["huge.onnx: 3,221,225,472 bytes, more than an ONNX file holds (2,147,483,647"])
    assert rss < RSS_LIMIT_BYTES, f"peak RSS {rss / 2**20:.0f} MiB"


def test_nodes_no_fetched_output_reads_are_not_run(probe_inputs, tmp_path):
    """ONNX Runtime runs every node of its graph: the probe's graph keeps only what the loss and the candidates
    read, so an endless Loop on another output (it hung the probe before) costs nothing and the dump is the one of
    the model without it."""
    _, model, data = probe_inputs
    path = edited_model(model, tmp_path / "loop.onnx", endless_loop_beside_the_loss)
    proc = subprocess.run(SATCORE + ["probe", str(path), "--data", data, "-o", str(tmp_path / "loop.npz")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **THIS_CHECKOUT})
    assert proc.returncode == 0, proc.stderr
    result = CliRunner().invoke(main, ["probe", model, "--data", data, "-o", str(tmp_path / "plain.npz")])
    assert result.exit_code == 0, result.output
    looped, plain = (np.load(tmp_path / f"{name}.npz") for name in ("loop", "plain"))
    assert sorted(looped.files) == sorted(plain.files) and "stats/h0/sum_gram" in plain.files
    for key in set(plain.files) - {"meta"}:  # meta names the model file
        np.testing.assert_array_equal(looped[key], plain[key], err_msg=key)


# -- outputs --------------------------------------------------------------------------------------


def test_outputs_never_replace_inputs_or_devices(hostile, probe_inputs, tmp_path):
    _, good, _ = hostile
    _, model, data = probe_inputs
    before = {p: open(p, "rb").read() for p in (good, model, data)}
    fifo = tmp_path / "fifo.out"
    os.mkfifo(fifo)
    os.symlink("/dev/null", tmp_path / "null_link.npz")
    os.link(good, tmp_path / "hardlink.npz")
    refused = [
        (["score", good, "--plot", good], ["good.npz", "is also an input"]),
        (["sweep", good, "--plot", good], ["good.npz", "is also an input"]),
        (["probe", model, "--data", data, "-o", data], ["data.npz", "is also an input"]),
        (["probe", model, "--data", data, "-o", model], ["model.onnx", "is also an input"]),
        (["merge", good, "-o", str(fifo)], ["fifo.out", "a FIFO", "refusing to replace"]),
        (["merge", good, "-o", str(tmp_path / "null_link.npz")], ["null_link.npz", "a character device"]),
        (["merge", good, "-o", str(tmp_path / "hardlink.npz")], ["hardlink.npz", "is also an input"]),
        (["merge", good, "-o", str(tmp_path)], ["a directory"]),
    ]
    for args, expect in refused:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert_one_line(result.stderr, expect)
    assert {p: open(p, "rb").read() for p in (good, model, data)} == before
    assert os.path.islink(tmp_path / "null_link.npz") and os.path.exists("/dev/null")
    import stat

    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# -- the handler itself ------------------------------------------------------------------------------


def test_a_bug_shows_as_a_bug_and_debug_prints_tracebacks(hostile, monkeypatch):
    cases, good, _ = hostile
    from satcore.cli import inspect_dump

    def broken(*args, **kwargs):
        raise TypeError("a programming error")

    monkeypatch.setattr(inspect_dump, "read_dump", broken)
    result = CliRunner().invoke(main, ["inspect", good])
    assert isinstance(result.exception, TypeError)  # not turned into an input error
    monkeypatch.undo()
    path, expect, _ = cases["bad_crc"]
    result = CliRunner().invoke(main, ["--debug", "score", path])
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and result.stderr.splitlines()[-1].startswith("satcore: error: ")


@pytest.mark.parametrize("existing", [False, True])
def test_a_probe_whose_sums_overflow_writes_no_dump(probe_inputs, tmp_path, existing):
    """--init-std 1e300: the mlp family's features overflow and the sums hold Inf/NaN, a dump every reader refuses;
    the probe says so in one line naming the output and the member, and writes nothing (an earlier file stays)."""
    _, model, data = probe_inputs
    out = tmp_path / "o.npz"
    if existing:
        out.write_bytes(b"earlier")
    result = CliRunner().invoke(main, ["probe", model, "--data", data, "--init-std", "1e300", "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert_one_line(result.stderr, [f"{out}: not written: stats/h0/", "non-finite value(s)"])
    assert (out.read_bytes() == b"earlier") if existing else not out.exists()


def test_probe_batch_refusal_names_the_data_file(probe_inputs, tmp_path):
    _, model, _ = probe_inputs
    data = write_data(tmp_path / "labels.npz", inputs=np.ones((8, 5), dtype=np.float32),
                      targets=np.full(8, 10**8, dtype=np.int64))
    result = CliRunner().invoke(main, ["probe", model, "--data", str(data), "-o", str(tmp_path / "o.npz")])
    assert result.exit_code == 2
    assert_one_line(result.stderr, ["labels.npz", "batch 0"])
    assert not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("form", ["stats", "raw", "jac"])
def test_write_dump_refuses_a_candidate_without_samples(form, tmp_path):
    """A dump with a candidate of no samples was written (a CandidateStatistics no batch reached, an empty array)
    and then refused by every reader, satcore score among them ('empty candidate'); it is refused when written,
    naming the member, and no file is left."""
    import satcore

    path = tmp_path / "empty.npz"
    empty = {"stats": dict(stats={"a": satcore.CandidateStatistics(3, 2)}),
             "raw": dict(raw={"a": (np.zeros((0, 3)), np.zeros((0, 2)))}),
             "jac": dict(jac={"a": (np.zeros((4, 3)), np.zeros((4, 0)))})}[form]
    member = {"stats": "stats/a/n_samples", "raw": "q/a", "jac": "jac/a"}[form]
    with pytest.raises(satcore.InputError) as caught:
        satcore.write_dump(path, **empty)
    assert str(caught.value) == (f"{path}: not written: {member} is empty (no samples, or an axis of extent 0): "
                                 "probe some data first")
    assert not path.exists()


@pytest.mark.parametrize("Q, expect", [
    ("gradients.npy", "Q: takes a real floating-point array of shape (M, N) or (M, T, N), got a str"),
    (np.ones((6, 3), dtype=np.int64), "Q: takes a real floating-point array of shape (M, N) or (M, T, N), got "
                                      "integers (dtype int64)"),
    ([[1, 2, 3]] * 6, "Q: takes a real floating-point array of shape (M, N) or (M, T, N), got integers (dtype int64)"),
    ([[1.0, 2.0], [3.0]], "Q: takes a real floating-point array of shape (M, N) or (M, T, N), got a list that is "
                          "no array"),
])
def test_score_refuses_what_is_no_real_array_naming_the_argument(Q, expect):
    """satcore.score given a str, integers or a ragged list where Q goes is refused with an InputError naming Q and
    what it takes (a TypeError still): before, a bare TypeError (or NumPy's ValueError for the ragged list).  Integers are refused, not
    converted (docs/core.md, Conventions): gradients and features are real numbers, and a cast would hide labels or
    indices handed over by mistake."""
    import satcore

    with pytest.raises(satcore.InputError) as info:
        satcore.score(Q, np.ones((6, 4)))
    assert str(info.value).startswith(expect) and "\n" not in str(info.value), str(info.value)
    assert isinstance(info.value, TypeError)  # as the refusal was before it named the argument
    with pytest.raises(satcore.InputError, match=r"^Psi: takes a real floating-point array .* got booleans"):
        satcore.score(np.ones((6, 3)), np.ones((6, 4), dtype=bool))


def test_score_calls_a_candidate_given_no_name_candidate():
    """satcore.score on arrays without name= calls the candidate "candidate" (docs/api.md), in its result and in its
    refusals, as CandidateStatistics.score() does too: before, both said '', and a refusal read "candidate '': ..."."""
    import satcore

    rng = np.random.default_rng(0)
    Q, Psi = rng.standard_normal((8, 3)), rng.standard_normal((8, 4))
    assert satcore.score(Q, Psi).name == "candidate" and satcore.score(Q, Psi).to_dict()["name"] == "candidate"
    assert satcore.score(Q, Psi, name="layer3").name == "layer3"
    stats = satcore.CandidateStatistics(3, 4).update(Q, Psi)
    assert stats.score().name == "candidate"
    with pytest.raises(satcore.InputError, match=r"^candidate 'candidate' has no samples$"):
        satcore.CandidateStatistics(3, 4).score()


@pytest.mark.parametrize("scale_q, scale_psi, expect", [
    (1e200, 1.0, r"^Q: its squared norm \(inf; largest entry 2\.\d+e\+200 in size\) is over 1\.34e\+154, the square "
                 r"root of float64's range"),
    (1.0, 1e100, r"^Psi: its squared norm \(\d\.\d+e\+201; largest entry 1\.\d+e\+100 in size\) is over 1\.34e\+154"),
    (1e50, 1e50, r"^Q and Psi: the product of their squared norms \(.*e\+101 x .*e\+101\) is over 1\.34e\+154"),
    (np.nan, 1.0, r"^Q: 1 of 24 entries are NaN or infinite$"),
    (1.0, np.inf, r"^Psi: 1 of 32 entries are NaN or infinite$"),
])
def test_score_refuses_overflowing_arrays_before_any_arithmetic_warns(scale_q, scale_psi, expect):
    """satcore.score on arrays whose sums would pass float64's range is refused naming the array, and the refusal is
    all it says: before, NumPy's 'overflow encountered' / 'invalid value' RuntimeWarning printed first, then a refusal
    naming the sums (of a candidate called '').  NaN and infinite entries keep their count.  Warnings are errors
    here, so one raised before the refusal fails the test."""
    import warnings

    import satcore

    rng = np.random.default_rng(0)
    Q, Psi = rng.standard_normal((8, 3)), rng.standard_normal((8, 4))
    if np.isfinite(scale_q) and np.isfinite(scale_psi):  # every entry too large
        Q, Psi = Q * scale_q, Psi * scale_psi
    else:  # one entry NaN or infinite
        Q[2, 1] *= scale_q
        Psi[5, 3] *= scale_psi
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(satcore.InputError, match=expect):
            satcore.score(Q, Psi)
        # just inside the range: scored, its fold test too, finite and without a warning
        big = np.finfo(float).max ** 0.25 / 1e3
        inside = satcore.score(rng.standard_normal((8, 3)) * big, rng.standard_normal((8, 4)))
        assert np.isfinite(inside.growth_value) and np.isfinite(inside.fold_test.p_value)



# the public functions of sample arrays besides score(): (call on (Q, Psi, J), the arrays it reads)
ARRAY_FUNCTIONS = {
    "ag": (lambda Q, Psi, J: satcore_api().ag(Q), "Q"),
    "ag_normalized": (lambda Q, Psi, J: satcore_api().ag_normalized(Q), "Q"),
    "ag_batch": (lambda Q, Psi, J: satcore_api().ag_batch(Q, 4), "Q"),
    "cross_gradient": (lambda Q, Psi, J: satcore_api().cross_gradient(Q, Psi), "Q Psi"),
    "feature_gram": (lambda Q, Psi, J: satcore_api().feature_gram(Psi), "Psi"),
    "growth_value": (lambda Q, Psi, J: satcore_api().growth_value(Q, Psi), "Q Psi"),
    "growth_value_jacobian": (lambda Q, Psi, J: satcore_api().growth_value_jacobian(Q, J), "Q J"),
    "projector": (lambda Q, Psi, J: satcore_api().projector(Psi), "Psi"),
    "projected_growth_value": (lambda Q, Psi, J: satcore_api().projected_growth_value(Q, Psi), "Q Psi"),
    "feature_rank": (lambda Q, Psi, J: satcore_api().feature_rank(Psi), "Psi"),
    "tangent_complete": (lambda Q, Psi, J: satcore_api().tangent_complete(Psi), "Psi"),
    "CandidateStatistics.from_samples": (lambda Q, Psi, J: satcore_api().CandidateStatistics.from_samples(Q, Psi),
                                         "Q Psi"),
}


def satcore_api():
    import satcore

    return satcore


@pytest.mark.parametrize("function, scaled", [(f, name) for f, (_, reads) in sorted(ARRAY_FUNCTIONS.items())
                                              for name in reads.split()])
def test_array_functions_refuse_overflowing_arrays_before_any_arithmetic_warns(function, scaled):
    """Every public function of sample arrays, given one whose squared norm passes float64's range (x 1e200), is
    refused naming that array, and the refusal is all it says: before, ag_batch, growth_value, projector and
    projected_growth_value printed NumPy's 'overflow encountered' RuntimeWarning, and ag, feature_gram, feature_rank
    and growth_value_jacobian returned inf, NaN or 0 without a word.  Well inside the range (x 1e70, a squared
    norm near 1e141) the value is the unscaled arrays', scaled.  Warnings are errors here."""
    import warnings

    rng = np.random.default_rng(0)
    arrays = {"Q": rng.standard_normal((8, 3)), "Psi": rng.standard_normal((8, 4)), "J": rng.standard_normal((8, 3, 4))}
    call = ARRAY_FUNCTIONS[function][0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(satcore_api().InputError, match=rf"^{scaled}: its squared norm \(inf; largest entry "
                                                           r"\d\.\d+e\+200 in size\) is over 1\.34e\+154, the square "
                                                           "root of float64's range"):
            call(**{**arrays, scaled: arrays[scaled] * 1e200})
        if function.startswith("ag") or (scaled == "Q" and "growth" in function):  # homogeneous of degree 1 in Q
            assert call(**{**arrays, "Q": arrays["Q"] * 1e70}) == pytest.approx(call(**arrays) * 1e70, rel=1e-12)
