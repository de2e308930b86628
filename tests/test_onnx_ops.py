"""Every op of the ONNX backward graph against central finite differences in float64.

Problem settings: one small graph per op (and per attribute variant), input ``x`` of shape
``(B, ...)`` with a symbolic batch axis, ``loss="mse"`` against fixed random targets.
Reference: ``d (sum_i loss_i) / d x`` by central differences of the same graph in float64,
evaluated by ``onnx.reference.ReferenceEvaluator`` (NumPy; a second implementation of every
forward op, not ONNX Runtime).  Our gradient graph runs on ONNX Runtime in float64 where its CPU
provider has float64 kernels for the op and its gradient, else in float32 (``FLOAT32_ONLY``:
ORT's CPU Conv, ConvTranspose, AveragePool, GlobalAveragePool and Erf, hence exact Gelu, are
float-only) with a float32 tolerance.
Opsets 17 and 21 (ReduceMean reads its axes from an attribute before 18, from an input after).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx.reference.op_run import OpRun  # noqa: E402

from satcore.adapters.onnx import OnnxProbeError, per_sample_gradients, supported_ops  # noqa: E402

F64_TOL = 1e-7  # central differences with step 1e-5 are good to ~1e-10 here; a wrong rule is off by O(1)
F32_TOL = 2e-5  # float32 round-off of the graph's own gradient
STEP = 1e-5
BATCH = 2


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, **attrs)


def reduce_mean(opset, x, y, axes, keepdims=1):
    if opset >= 18:
        return [node("Constant", [], [y + "_axes"], value=numpy_helper.from_array(np.array(axes, np.int64))),
                node("ReduceMean", [x, y + "_axes"], [y], keepdims=keepdims)]
    return [node("ReduceMean", [x], [y], axes=axes, keepdims=keepdims)]


def ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


RNG = np.random.default_rng(0)
W34, W45, W54, C5 = (RNG.standard_normal(s) for s in ((3, 4), (4, 5), (5, 4), (5,)))
CONV_W, CONV_WG, BN = RNG.standard_normal((4, 3, 3, 3)), RNG.standard_normal((6, 1, 2, 2)), RNG.random((4, 3)) + 0.5


def cases():
    """``name -> (input shape without batch, builder(opset, elem) -> (nodes, initializers as float64 arrays))``."""
    def simple(nodes, **inits):
        return lambda opset, elem: (nodes, inits)

    out = {
        "MatMul-weight": ((3, 4), simple([node("MatMul", ["x", "W"], ["y"])], W=W45)),
        "MatMul-activations": ((3, 4), simple([node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
                                               node("MatMul", ["x", "xt"], ["y"])])),
        "Gemm-transB": ((4,), simple([node("Gemm", ["x", "W", "C"], ["y"], transB=1, alpha=0.7, beta=1.3)],
                                     W=W54, C=C5)),
        "Gemm-transA": ((4,), simple([node("Transpose", ["x"], ["xt"]), node("Gemm", ["xt", "W"], ["y"], transA=1)],
                                     W=W45)),
        "Gemm-activations": ((4,), simple([node("Transpose", ["x"], ["xt"]), node("Gemm", ["x", "xt"], ["y"])])),
        "Add-broadcast": ((3, 4), simple([node("Add", ["x", "c"], ["y"])], c=W34[:1])),
        "Sub-both-active": ((3, 4), lambda o, el: (reduce_mean(o, "x", "m", [1]) + [node("Sub", ["m", "x"], ["y"])],
                                                   {})),
        "Mul-broadcast-active": ((3, 4), lambda o, el: (reduce_mean(o, "x", "m", [1]) +
                                                        [node("Mul", ["x", "m"], ["y"])], {})),
        "Div-both-active": ((3, 4), simple([node("Mul", ["x", "x"], ["x2"]), node("Add", ["x2", "one"], ["d"]),
                                            node("Div", ["x", "d"], ["y"])], one=np.ones(4))),
        "Relu": ((3, 4), simple([node("Relu", ["x"], ["y"])])),
        "Tanh": ((3, 4), simple([node("Tanh", ["x"], ["y"])])),
        "Sigmoid": ((3, 4), simple([node("Sigmoid", ["x"], ["y"])])),
        "Erf": ((3, 4), simple([node("Erf", ["x"], ["y"])])),
        "Exp-Log-Neg-Reciprocal": ((3, 4), simple([node("Mul", ["x", "x"], ["x2"]), node("Add", ["x2", "one"], ["p"]),
                                                   node("Log", ["p"], ["l"]), node("Exp", ["x"], ["ex"]),
                                                   node("Reciprocal", ["p"], ["r"]), node("Neg", ["r"], ["n"]),
                                                   node("Add", ["l", "ex"], ["le"]),
                                                   node("Add", ["le", "n"], ["y"])], one=np.ones(1))),
        "Pow-Sqrt": ((3, 4), simple([node("Pow", ["x", "three"], ["c"]), node("Mul", ["x", "x"], ["x2"]),
                                     node("Add", ["x2", "one"], ["p"]), node("Sqrt", ["p"], ["s"]),
                                     node("Add", ["c", "s"], ["y"])], three=np.array(3.0), one=np.ones(1))),
        "Pow-active-exponent": ((3, 4), simple([node("Mul", ["x", "x"], ["x2"]), node("Add", ["x2", "one"], ["p"]),
                                                node("Pow", ["p", "x"], ["y"])], one=np.ones(1))),
        "Softmax-last": ((3, 4), simple([node("Softmax", ["x"], ["y"], axis=-1)])),
        "Softmax-axis1": ((3, 4), simple([node("Softmax", ["x"], ["y"], axis=1)])),
        "LogSoftmax": ((3, 4), simple([node("LogSoftmax", ["x"], ["y"], axis=-1)])),
        "LayerNormalization-last": ((3, 4), simple([node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-3)],
                                                   g=W34[0] + 2, b=W34[1])),
        "LayerNormalization-two-axes": ((3, 4), simple([node("LayerNormalization", ["x", "g"], ["y"], axis=1)],
                                                       g=W34 + 2)),
        "LayerNorm-decomposed": ((3, 4), lambda o, el: (
            reduce_mean(o, "x", "mu", [-1]) + [node("Sub", ["x", "mu"], ["xc"]), node("Pow", ["xc", "two"], ["sq"])]
            + reduce_mean(o, "sq", "var", [-1]) + [node("Add", ["var", "eps"], ["ve"]), node("Sqrt", ["ve"], ["sd"]),
                                                   node("Div", ["xc", "sd"], ["xh"]), node("Mul", ["xh", "g"], ["y"])],
            {"two": np.array(2.0), "eps": np.array(1e-5), "g": W34[2]})),
        "BatchNormalization": ((3, 4, 4), simple([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                                                 s=BN[:3, 0], b=BN[:3, 1], m=BN[:3, 2] - 1, v=BN[:3, 0] ** 2)),
        "Conv-pad1": ((3, 5, 5), simple([node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])],
                                        W=CONV_W, B=C5[:4])),
        "Conv-stride2": ((3, 6, 5), simple([node("Conv", ["x", "W"], ["y"], pads=[1, 0, 1, 1], strides=[2, 2])],
                                           W=CONV_W)),
        "Conv-group-dilation": ((3, 6, 6), simple([node("Conv", ["x", "W"], ["y"], group=3, dilations=[2, 1])],
                                                  W=CONV_WG)),
        "Conv-same-upper": ((3, 5, 4), simple([node("Conv", ["x", "W"], ["y"], auto_pad="SAME_UPPER",
                                                    strides=[2, 2])], W=CONV_W)),
        "MaxPool-2x2": ((2, 4, 4), simple([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])])),
        "MaxPool-overlapping": ((2, 5, 5), simple([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                                                        pads=[1, 1, 1, 1])])),
        "AveragePool-2x2": ((2, 4, 4), simple([node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2],
                                                    strides=[2, 2])])),
        "AveragePool-pad-excluded": ((2, 5, 5), simple([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3],
                                                             strides=[2, 2], pads=[1, 1, 1, 1])])),
        "AveragePool-pad-included": ((2, 5, 5), simple([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2],
                                                             strides=[2, 1], pads=[1, 0, 1, 1],
                                                             count_include_pad=1)])),
        "GlobalAveragePool": ((2, 3, 4), simple([node("GlobalAveragePool", ["x"], ["y"])])),
        "Reshape-Flatten": ((3, 4), simple([node("Reshape", ["x", "shape"], ["r"]), node("Tanh", ["r"], ["t"]),
                                            node("Flatten", ["t"], ["y"])], shape=ints("shape", [0, 2, -1]))),
        "Transpose": ((3, 4), simple([node("Transpose", ["x"], ["t"], perm=[2, 0, 1]), node("Tanh", ["t"], ["y"])])),
        "Squeeze-Unsqueeze": ((3, 1), simple([node("Squeeze", ["x", "a2"], ["s"]), node("Tanh", ["s"], ["t"]),
                                              node("Unsqueeze", ["t", "a0"], ["y"])],
                                             a2=ints("a2", [2]), a0=ints("a0", [0]))),
        "Concat": ((3, 4), simple([node("Tanh", ["x"], ["t"]), node("Concat", ["x", "t", "c"], ["y"], axis=1)],
                                  c=np.tile(W34[None, :1], (BATCH, 1, 1)))),
        "Split-unused-output": ((5, 4), simple([node("Split", ["x", "sizes"], ["a", "b", "c"], axis=1),
                                                node("Mul", ["a", "c"], ["y"])], sizes=ints("sizes", [2, 1, 2]))),
        "Slice-steps": ((5, 4), simple([node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                                       st=ints("st", [4, 0]), en=ints("en", [0, 4]), ax=ints("ax", [1, 2]),
                                       sp=ints("sp", [-2, 3]))),
        "Gather-repeated": ((5, 4), simple([node("Gather", ["x", "idx"], ["y"], axis=1)],
                                           idx=ints("idx", [[0, 3], [3, 3]]))),
        "GatherElements": ((3, 4), simple([node("GatherElements", ["x", "idx"], ["y"], axis=2)],
                                          idx=ints("idx", np.tile([[0, 3], [3, 3], [1, 1]], (BATCH, 1, 1))))),
        "Expand": ((1, 4), simple([node("Expand", ["x", "shape"], ["y"])], shape=ints("shape", [3, 1]))),
        "Where": ((3, 4), simple([node("Greater", ["x", "zero"], ["pos"]), node("Mul", ["x", "x"], ["sq"]),
                                  node("Where", ["pos", "sq", "x"], ["y"])], zero=np.zeros(1))),
        "Cast-round-trip": ((3, 4), lambda o, el: ([node("Cast", ["x"], ["x64"], to=TensorProto.DOUBLE),
                                                    node("Tanh", ["x64"], ["t"]), node("Cast", ["t"], ["y"], to=el)],
                                                   {})),
        "ReduceSum-keepdims0": ((3, 4), simple([node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)],
                                               ax=ints("ax", [1]))),
        "ReduceSum-all": ((3, 4), simple([node("ReduceSum", ["x"], ["s"], keepdims=1), node("Mul", ["x", "s"], ["y"])])),
        "ReduceMean-keepdims0": ((3, 4), lambda o, el: (reduce_mean(o, "x", "y", [-1, 1], keepdims=0), {})),
        "Shape-Constant": ((3, 4), simple([node("Shape", ["x"], ["sh"], end=1), node("Constant", [], ["rest"],
                                           value=numpy_helper.from_array(np.array([-1], np.int64))),
                                           node("Concat", ["sh", "rest"], ["shape"], axis=0),
                                           node("Reshape", ["x", "shape"], ["f"]), node("Tanh", ["f"], ["y"])])),
        "Identity-Dropout": ((3, 4), simple([node("Identity", ["x"], ["i"]), node("Dropout", ["i"], ["y"])])),
        "SoftmaxCrossEntropyLoss": ((5,), simple([node("SoftmaxCrossEntropyLoss", ["x", "labels", "w"], ["y"],
                                                       reduction="none", ignore_index=1)],
                                                 labels=ints("labels", [4, 1]), w=C5 ** 2 + 0.5)),
        "SoftmaxCrossEntropyLoss-mean": ((5, 3), simple([node("SoftmaxCrossEntropyLoss", ["x", "labels"], ["l"],
                                                              ignore_index=2), node("Unsqueeze", ["l", "a0"], ["y"])],
                                                        labels=ints("labels", [[4, 2, 0], [2, 1, 3]]),
                                                        a0=ints("a0", [0]))),
        "Gelu-none": ((3, 4), simple([node("Gelu", ["x"], ["y"])])),
        "Gelu-tanh": ((3, 4), simple([node("Gelu", ["x"], ["y"], approximate="tanh")])),
    }
    return out


CASES = cases()
MIN_OPSET = {"Gelu": 20}
# ORT's CPU provider has float kernels only for these (checked: building the float64 session fails)
FLOAT32_ONLY = {"Conv-pad1", "Conv-stride2", "Conv-group-dilation", "Conv-same-upper", "AveragePool-2x2",
                "AveragePool-pad-excluded", "AveragePool-pad-included", "GlobalAveragePool", "Erf", "Gelu-none",
                "Cast-round-trip"}


def model_of(name, opset, elem):
    shape, build = CASES[name]
    nodes, inits = build(opset, elem)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    tensors = [v if isinstance(v, onnx.TensorProto) else numpy_helper.from_array(np.asarray(v, dtype), k)
               for k, v in inits.items()]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", elem, ["B", *shape])],
                              [helper.make_tensor_value_info("y", elem, None)], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def with_output_shape(model, shape):
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    for d in shape:
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    return model


class Erf(OpRun):
    """``erf`` in float64: the reference evaluator's own rounds through float32 (errors ~3e-8)."""

    op_domain = ""

    def _run(self, x):
        return (np.vectorize(math.erf, otypes=["d"])(x).astype(x.dtype),)


class Gelu(OpRun):
    """``x Phi(x)`` (or its tanh form) in float64; the evaluator would expand it through its own Erf."""

    op_domain = ""

    def _run(self, x, approximate="none"):
        if approximate == "tanh":
            return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),)
        return (0.5 * x * (1 + Erf._run(self, x / math.sqrt(2))[0]),)


def evaluator(name, opset):
    return ReferenceEvaluator(model_of(name, opset, TensorProto.DOUBLE), new_ops=[Erf, Gelu])


def finite_difference_gradient(name, opset, x, targets):
    """Central differences of ``sum_i mean_j (y_ij - t_ij)^2`` in float64 (NumPy reference evaluator)."""
    reference = evaluator(name, opset)

    def loss(v):
        y = reference.run(None, {"x": v})[0]
        per_element = (y - targets) ** 2
        return (per_element.reshape(y.shape[0], -1).mean(1) if y.ndim else per_element).sum()

    grad = np.zeros_like(x)
    for k in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[k] += STEP
        down[k] -= STEP
        grad[k] = (loss(up) - loss(down)) / (2 * STEP)
    return grad


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_of_each_op_equals_finite_differences(name, opset):
    if opset < MIN_OPSET.get(name.split("-")[0], 0):
        pytest.skip(f"{name} exists from opset {MIN_OPSET[name.split('-')[0]]}")
    shape, _ = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.standard_normal((BATCH, *shape))
    y = evaluator(name, opset).run(None, {"x": x})[0]
    targets = rng.standard_normal(y.shape)
    elem, tol = (TensorProto.FLOAT, F32_TOL) if name in FLOAT32_ONLY else (TensorProto.DOUBLE, F64_TOL)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    model = with_output_shape(model_of(name, opset, elem), y.shape)
    session = per_sample_gradients(model, loss="mse", candidates=["x"])
    _, grads = session((x.astype(dtype), targets.astype(dtype)))
    got = grads["x"]
    assert got.dtype == dtype
    ref = finite_difference_gradient(name, opset, x, targets)
    assert np.linalg.norm(ref) > 1e-3  # the loss depends on x
    assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref)


def test_every_supported_op_has_a_case():
    covered = {n.op_type for name in CASES for n in CASES[name][1](21, TensorProto.DOUBLE)[0]}
    assert set(supported_ops()) <= covered


def test_float32_only_cases_are_refused_in_float64_by_onnx_runtime():
    """``FLOAT32_ONLY`` is ORT's limit, not ours: a float64 session of each such graph is refused."""
    import onnxruntime as ort

    for name in sorted(FLOAT32_ONLY - {"Cast-round-trip"}):
        model = model_of(name, 21, TensorProto.DOUBLE)
        with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_unsupported_op_is_one_line_naming_op_and_node():
    model = model_of("Tanh", 17, TensorProto.FLOAT)
    model.graph.node[0].op_type = "Softplus"
    model.graph.node[0].name = "act"
    with pytest.raises(OnnxProbeError, match=r"^no gradient for op Softplus \(node 'act'\)[^\n]*$"):
        per_sample_gradients(with_output_shape(model, (BATCH, 3, 4)), loss="mse", candidates=["x"])
