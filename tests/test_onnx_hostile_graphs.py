"""Valid but unusual ONNX graphs: gradients equal torch autograd's, or one refusal line; bounded memory.

Built here with ``onnx.helper`` from the torch-exported token model of ``test_onnx_gradients``:
the same graph with its nodes listed out of order (ONNX Runtime sorts them itself), without
``value_info``, and with an ``If`` whose branches read an outer-scope tensor, on the gradient
path (refused: its subgraph is not differentiated) and off it (probed as usual).  Then the
sizes: external data of a 256-byte tensor pointing at a 6 GiB sparse file (refused from
``stat`` alone), a raw tensor shorter than its shape, 3000 residual blocks (found by walking
each block once), 20000 branches summed by a chain of ``Add`` nodes (refused by the search's
step budget), and feature counts whose running sums exceed the memory budget.  Every refusal
is measured in a fresh interpreter: its peak RSS must stay under ``MAX_REFUSAL_RSS``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from roundoff import float32_sensitivity  # noqa: E402
from test_onnx_gradients import EXPORT_BATCH, TokenModel, assert_close, ce_tokens, export, torch_gradients  # noqa: E402

from satcore.adapters.onnx import OnnxProbeError, load_model, per_sample_gradients, residual_candidates  # noqa: E402
from satcore.adapters.onnx.locate import residual_blocks  # noqa: E402

MAX_REFUSAL_RSS = 200 * 2**20  # bytes; importing numpy, onnx and satcore takes ~115 MB of it here
SPARSE_BYTES = 6 * 2**30


@pytest.fixture(scope="module")
def token(tmp_path_factory):
    torch.manual_seed(0)
    model = TokenModel().eval()
    path = export(model, torch.randn(EXPORT_BATCH, 6, 5), tmp_path_factory.mktemp("tok") / "tok.onnx")
    return model, onnx.load(str(path))


def token_batch(seed=3, batch=5):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 6, 5)).astype(np.float32), rng.integers(0, 3, (batch, 6))


def reference(model, x, y):
    """torch's per-sample gradients at the two blocks' inputs (embed output, block 0 output), in float64, and
    their float32 sensitivity (tests/roundoff.py: the tolerance of a float32 graph)."""
    exact, loss64 = copy.deepcopy(model).double(), ce_tokens(torch.tensor(y))

    def gradients(m, xx):
        return torch_gradients(m, xx, loss64, [m.embed, m.blocks[0]])

    x64 = torch.tensor(x, dtype=torch.float64)
    return gradients(exact, x64), float32_sensitivity(exact, x64, gradients)


def reordered(proto, order):
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = [out.graph.node[k] for k in order(len(out.graph.node))]
    nodes = [copy_of(n) for n in nodes]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def copy_of(node):
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def onnxruntime_logits(proto, x):
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


ORDERS = {
    "reversed": lambda n: list(reversed(range(n))),
    "last node first": lambda n: [n - 1, *range(n - 1)],
    "shuffled": lambda n: list(np.random.default_rng(7).permutation(n)),
}


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("value_info", [True, False], ids=["value_info", "no_value_info"])
def test_any_node_order_gives_autograds_gradients(token, order, value_info):
    """Nodes listed before their inputs' producers: ONNX Runtime runs the graph, and so does the probe,
    with torch's gradients (the reverse walk once summed a tensor's gradient at its first reader)."""
    model, proto = token
    shuffled = reordered(proto, ORDERS[order])
    if not value_info:
        del shuffled.graph.value_info[:]
    x, y = token_batch()
    np.testing.assert_allclose(onnxruntime_logits(shuffled, x), onnxruntime_logits(proto, x), rtol=1e-6, atol=1e-6)
    assert residual_candidates(load_model(shuffled)) == residual_candidates(load_model(proto))
    session = per_sample_gradients(shuffled)
    assert session.candidates == ("blocks.0", "blocks.1", "head")
    _, grads = session((x, y))
    assert_close([grads["blocks.0"], grads["blocks.1"]], *reference(model, x, y))


def with_if(proto, *, on_path: bool):
    """``proto`` with an ``If`` (condition a constant true) whose two branches read an outer tensor.

    On the path: the ``If`` replaces block 0's first MatMul (``fc1``), its branches computing
    it from the outer-scope LayerNorm output and weight.  Off the path: the ``If`` makes a
    zero bias from a constant (nothing a candidate feeds) that is added to the logits.
    """
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    nodes = [copy_of(n) for n in graph.node]
    cond = helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    if on_path:
        k = next(i for i, n in enumerate(nodes) if n.op_type == "MatMul" and "blocks.0" in n.name)
        target = nodes[k]

        def branch(tag):
            inner = helper.make_node("MatMul", list(target.input), [f"{tag}_out"])
            return helper.make_graph([inner], tag, [], [helper.make_tensor_value_info(f"{tag}_out", 1, None)])

        nodes[k] = helper.make_node("If", ["cond"], list(target.output), name="on_path_if",
                                    then_branch=branch("then"), else_branch=branch("else"))
        nodes.insert(k, cond)
    else:
        zeros = numpy_helper.from_array(np.zeros(3, np.float32), "zeros3")
        graph.initializer.append(zeros)

        def branch(tag):
            inner = helper.make_node("Identity", ["zeros3"], [f"{tag}_out"])
            return helper.make_graph([inner], tag, [], [helper.make_tensor_value_info(f"{tag}_out", 1, [3])])

        logits = graph.output[0].name
        last = next(n for n in nodes if logits in n.output)
        last.output[0] = "logits_before"
        nodes += [cond, helper.make_node("If", ["cond"], ["bias"], name="off_path_if", then_branch=branch("then"),
                                         else_branch=branch("else")),
                  helper.make_node("Add", ["logits_before", "bias"], [logits])]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(out)
    return out


def test_if_on_the_gradient_path_is_refused_in_one_line(token):
    """The If's subgraph reads the LayerNorm output from the outer scope: its gradient path is
    refused, not dropped (it was dropped: a probe of a different function, exit 0)."""
    _, proto = token
    model = with_if(proto, on_path=True)
    x, y = token_batch()
    np.testing.assert_allclose(onnxruntime_logits(model, x), onnxruntime_logits(proto, x), rtol=1e-6, atol=1e-6)
    with pytest.raises(OnnxProbeError, match="If node 'on_path_if': the gradient path runs through its subgraph") as e:
        per_sample_gradients(model, candidates=["blocks.0"])
    assert "\n" not in str(e.value)
    for order in ORDERS.values():  # listed in any order: still found, still refused
        with pytest.raises(OnnxProbeError, match="on_path_if"):
            per_sample_gradients(reordered(model, order), candidates=["blocks.0"])


def test_if_off_the_gradient_path_is_probed(token):
    """An If reading only constants from the outer scope carries no candidate's gradient: torch's gradients."""
    torch_model, proto = token
    model = with_if(proto, on_path=False)
    x, y = token_batch(4)
    _, grads = per_sample_gradients(reordered(model, ORDERS["reversed"]))((x, y))
    assert_close([grads["blocks.0"], grads["blocks.1"]], *reference(torch_model, x, y))


def test_candidate_names_map_back_to_tensors(token):
    """Blocks are named after their scope like the torch adapter's modules; head is the last block's
    output; the raw tensor names of earlier releases still work and give the same gradients."""
    _, proto = token
    blocks = residual_blocks(load_model(proto))
    assert [b.name for b in blocks] == ["blocks.0", "blocks.1"]
    assert [b.skip for b in blocks] == ["/embed/Add_output_0", "/blocks.0/Add_1_output_0"]
    assert blocks[-1].output == "/blocks.1/Add_1_output_0"  # (Add: the exact GELU's; Add_1: the block's)
    x, y = token_batch(5)
    named = per_sample_gradients(proto)
    raw = per_sample_gradients(proto, candidates=["/embed/Add_output_0", "/blocks.1/Add_1_output_0"])
    by_name, by_tensor = named((x, y))[1], raw((x, y))[1]
    np.testing.assert_array_equal(by_name["blocks.0"], by_tensor["/embed/Add_output_0"])
    np.testing.assert_array_equal(by_name["head"], by_tensor["/blocks.1/Add_1_output_0"])
    assert per_sample_gradients(proto, head=False).candidates == ("blocks.0", "blocks.1")
    # named candidates are exactly those, the head only where named (docs/onnx.md; the torch probe adds its head)
    assert per_sample_gradients(proto, candidates=["blocks.1"]).candidates == ("blocks.1",)
    assert per_sample_gradients(proto, candidates=["blocks.1", "head"]).candidates == ("blocks.1", "head")
    with pytest.raises(OnnxProbeError, match=r"the residual blocks are \['blocks.0', 'blocks.1'\] \(or 'head'\)"):
        per_sample_gradients(proto, candidates=["block.0"])
    with pytest.raises(OnnxProbeError, match="one tensor twice"):
        per_sample_gradients(proto, candidates=["blocks.0", "/embed/Add_output_0"])


def stacked_model(n_blocks, width=4):
    """``h_k = h_{k-1} + tanh(h_{k-1} W_k)``, one shared ``W`` (a 1 MB-sized file even at 3000 blocks)."""
    w = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32) / width
    nodes, h = [], "x"
    for k in range(n_blocks):
        nodes += [helper.make_node("MatMul", [h, "W"], [f"a{k}"], name=f"/b{k}/MatMul"),
                  helper.make_node("Tanh", [f"a{k}"], [f"t{k}"], name=f"/b{k}/Tanh"),
                  helper.make_node("Add", [h, f"t{k}"], [f"h{k}"], name=f"/b{k}/Add")]
        h = f"h{k}"
    nodes.append(helper.make_node("MatMul", [h, "W"], ["logits"]))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", 1, ["batch", width])],
                              [helper.make_tensor_value_info("logits", 1, ["batch", width])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fan_in_model(n_branches, width=4):
    """``x`` read by ``n`` branches ``relu(x W_k)``, summed by a chain of ``Add`` nodes."""
    w = np.ones((width, width), np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["s0"])]
    for k in range(1, n_branches):
        nodes += [helper.make_node("MatMul", ["x", "W"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"r{k}"]),
                  helper.make_node("Add", [f"s{k - 1}", f"r{k}"], [f"s{k}"], name=f"sum{k}")]
    graph = helper.make_graph(nodes, "fan", [helper.make_tensor_value_info("x", 1, ["batch", width])],
                              [helper.make_tensor_value_info(f"s{n_branches - 1}", 1, ["batch", width])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run_measured(code: str, tmp_path, env=None) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON; adds its peak RSS in bytes.

    The peak is the kernel's ``VmHWM`` of the new process image (``getrusage``'s ``ru_maxrss``
    would carry over the forking pytest process's peak, torch included).
    """
    if not os.path.exists("/proc/self/status"):
        pytest.skip("the peak RSS is read from /proc (Linux)")
    script = textwrap.dedent(code) + textwrap.dedent("""
        hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(json.dumps({**result, "rss": int(hwm.split()[1]) * 1024}))
    """)
    done = subprocess.run([sys.executable, "-c", "import json\n" + script], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, **(env or {})}, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# a script whose result is the refusal's message, or None when the call went through
REFUSE = """
    from satcore._shared.errors import InputError
    try:
        {call}
        result = {{"refused": None}}
    except InputError as exc:
        result = {{"refused": str(exc)}}
"""


@pytest.mark.slow  # ~20 s on two busy cores: 9000 nodes, a fresh interpreter
def test_three_thousand_blocks_are_found_in_bounded_memory(tmp_path):
    model = stacked_model(3000)
    onnx.save(model, tmp_path / "stack.onnx")
    out = run_measured("""
        from satcore.adapters.onnx import load_model
        from satcore.adapters.onnx.locate import residual_blocks
        blocks = residual_blocks(load_model("stack.onnx"))
        result = {"names": [b.name for b in blocks[:2]], "skips": [b.skip for b in blocks[-2:]], "n": len(blocks)}
    """, tmp_path)
    assert out["n"] == 3000 and out["names"] == ["b0", "b1"] and out["skips"] == ["h2997", "h2998"]
    assert out["rss"] < MAX_REFUSAL_RSS  # the quadratic search held every tensor's ancestors: 2.6 GB


@pytest.mark.slow  # ~35 s on two busy cores: 60000 nodes, a fresh interpreter
def test_wide_fan_in_is_refused_in_one_line_and_bounded_memory(tmp_path):
    onnx.save(fan_in_model(20000), tmp_path / "fan.onnx")
    out = run_measured(REFUSE.format(call="""
        from satcore.adapters.onnx import load_model, residual_candidates
        residual_candidates(load_model("fan.onnx"))"""), tmp_path)
    assert out["refused"] is not None and "\n" not in out["refused"]
    assert "the residual search stopped after" in out["refused"] and "pass candidates=" in out["refused"]
    assert out["rss"] < MAX_REFUSAL_RSS


def external_model(folder, *, offset=None, length=None):
    """``small``'s 8x8 float32 ``W`` (256 bytes) stored in ``big.bin``, a 6 GiB sparse file (no disk used)."""
    from onnx.external_data_helper import set_external_data

    folder.mkdir(parents=True, exist_ok=True)
    w = np.ones((8, 8), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", 1, ["batch", 8])],
                              [helper.make_tensor_value_info("y", 1, ["batch", 8])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    tensor = model.graph.initializer[0]
    set_external_data(tensor, "big.bin", offset=offset, length=length)
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    onnx.save(model, folder / "m.onnx")
    with open(folder / "big.bin", "wb") as f:
        f.truncate(SPARSE_BYTES)
    return folder / "m.onnx"


EXTERNAL_CASES = [  # (offset, length, the refusal's reason)
    (None, None, f"holds {SPARSE_BYTES} bytes in 'big.bin' but its shape \\[8, 8\\] and type declare 256"),
    (0, 512, "holds 512 bytes in 'big.bin' but its shape"),
    (SPARSE_BYTES - 100, 256, "lies outside its file 'big.bin' of 6442450944 bytes"),
]


def test_external_data_is_sized_before_it_is_read(tmp_path):
    """Whole file, a length unlike the shape's, a range past the end: refused from stat, nothing read."""
    paths = [str(external_model(tmp_path / f"m{k}", offset=o, length=n)) for k, (o, n, _) in enumerate(EXTERNAL_CASES)]
    out = run_measured(f"""
        from satcore.adapters.onnx import OnnxProbeError, load_model
        refused = []
        for path in {paths!r}:
            try:
                load_model(path)
                refused.append(None)
            except OnnxProbeError as exc:
                refused.append(str(exc))
        result = {{"refused": refused}}
    """, tmp_path)
    for path, message, (_, _, reason) in zip(paths, out["refused"], EXTERNAL_CASES):
        assert message is not None and "\n" not in message and message.startswith(path)
        assert re.search(reason, message), message
    assert out["rss"] < MAX_REFUSAL_RSS  # the whole 6 GiB was read (6.3 GB, then SIGSEGV)


def test_external_data_of_the_declared_size_is_read(tmp_path):
    """The positive control: 256 bytes at an offset inside the sparse file (zeros) are read."""
    path = external_model(tmp_path / "m", offset=4096, length=256)
    proto = load_model(path)
    np.testing.assert_array_equal(numpy_helper.to_array(proto.graph.initializer[0]), np.zeros((8, 8), np.float32))


def test_raw_tensor_shorter_than_its_shape_is_refused():
    model = stacked_model(1)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(OnnxProbeError, match="tensor 'W' holds 60 bytes but its shape \\[4, 4\\] and type declare 64"):
        load_model(model)


def test_sums_over_the_memory_budget_are_refused_before_allocating(tmp_path):
    """The probe's n_features (r^2 float64 for the Gram alone is 12.8 GB at r = 40000) and the array
    API's statistics of a large r: one line naming the option and the size, before allocating."""
    onnx.save(stacked_model(2), tmp_path / "stack.onnx")
    out = run_measured("""
        import numpy as np
        from satcore import CandidateStatistics
        from satcore.adapters.onnx import probe
        from satcore._shared.errors import InputError
        refused = []
        for call in (lambda: probe("stack.onnx", [(np.ones((2, 4), np.float32), np.zeros(2, np.int64))],
                                   family="mlp", n_features=40000),
                     lambda: CandidateStatistics(64, 10**6)):
            try:
                call()
                refused.append(None)
            except InputError as exc:
                refused.append(str(exc))
        result = {"refused": refused}
    """, tmp_path, env={"SATCORE_MEMORY_BUDGET": str(2**30)})
    for message, what in zip(out["refused"], ("the Gram of r = 40000 features needs 12,800,000,000 bytes",  # before ONNX Runtime starts
                                              "N = 64 with r = 1000000 features needs 8,008,704,000,128 bytes")):
        assert message is not None and "\n" not in message and what in message, message
        assert "over the memory budget of 1,073,741,824 bytes (set SATCORE_MEMORY_BUDGET to raise it)" in message
    assert out["rss"] < MAX_REFUSAL_RSS


def test_the_budget_governs_the_sums(monkeypatch):
    """Just under the budget is allowed, just over refused (16 folds of N r, N r and r^2, 8 bytes each, and the
    16 folds' int64 sample counts)."""
    from satcore import CandidateStatistics
    from satcore._shared.errors import InputError

    need = 8 * (4 * 8 * 17 + 8 * 8 + 16)
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", str(need))
    CandidateStatistics(4, 8)
    monkeypatch.setenv("SATCORE_MEMORY_BUDGET", str(need - 1))
    with pytest.raises(InputError, match=f"needs {need:,} bytes"):
        CandidateStatistics(4, 8)


def test_cli_n_features_over_the_budget_is_one_line_exit_2(tmp_path):
    """``satcore probe --n-features 40000``: the default 2 GiB budget refuses its 12.8 GB of sums."""
    from click.testing import CliRunner

    from satcore.cli.main import main

    onnx.save(stacked_model(2), tmp_path / "stack.onnx")
    np.savez(tmp_path / "data.npz", inputs=np.ones((8, 4), np.float32), targets=np.zeros(8, np.int64))
    res = CliRunner().invoke(main, ["probe", str(tmp_path / "stack.onnx"), "--data", str(tmp_path / "data.npz"),
                                    "--family", "mlp", "--n-features", "40000", "-o", str(tmp_path / "out.npz")])
    assert res.exit_code == 2, res.output
    assert len(res.output.strip().splitlines()) == 1
    assert "r = 40000 features needs" in res.output and "SATCORE_MEMORY_BUDGET" in res.output
    assert not (tmp_path / "out.npz").exists()
