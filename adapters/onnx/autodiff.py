"""Reverse-mode differentiation of an ONNX graph into standard ONNX ops.

:func:`gradient_model` appends to a model whose scalar output ``loss`` is
``sum_i loss_i`` the nodes computing ``d loss / d z`` for chosen tensors ``z``
(outputs ``<z>_grad``).  The result is an ordinary inference model: plain
``onnxruntime`` (any execution provider) runs it at any batch size, and
because an inference graph does not mix samples, row ``i`` of ``d loss / d z``
is ``q_i = d loss_i / d z_i`` for every sample of the batch in one pass.

The walk visits the nodes in reverse topological order
(:func:`~.loading.topological_nodes`, whatever order the file lists them in;
a subgraph's reads of outer tensors are edges too), takes each tensor's
gradient as the sum of its readers' contributions once every reader has been
visited, and emits each op's vector-Jacobian product (:data:`RULES`) for the
inputs that depend on a ``z``.  A node with a subgraph (``If``, ``Loop``,
``Scan``) on the gradient path is refused, never skipped.  Tensors of
integer or boolean type, and ops that only read shapes, carry no gradient.
Nodes are built with :mod:`onnx.helper`; nothing is parsed from text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections import defaultdict

import numpy as np

from .errors import OnnxProbeError
from .loading import node_reads, subgraphs, topological_nodes

GRAD_SUFFIX = "_grad"
MIN_OPSET = 13  # reductions, Squeeze/Unsqueeze and Split take axes/sizes as inputs from 13 on
FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
NO_GRADIENT = ("Shape", "Size", "Constant", "ConstantOfShape", "Range", "NonZero", "OneHot", "EyeLike",
               "RandomNormalLike", "RandomUniformLike", "ArgMax", "ArgMin")


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


class Backward:
    """One backward pass being built: emitted nodes, new initializers, fresh names."""

    def __init__(self, model, infos, order):
        from onnx import numpy_helper

        self.graph = model.graph
        self.infos = infos
        self.opset = next(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
        self.nodes: list = []
        self.initializers: list = []
        self.count = 0
        self.consts: dict = {}
        values = {i.name: i for i in self.graph.initializer}
        self.constant_values = {n: (lambda t=t: numpy_helper.to_array(t)) for n, t in values.items()}
        for node in order:
            if node.op_type == "Constant":
                self.constant_values[node.output[0]] = lambda node=node: _constant_node_value(node)
            elif node.op_type == "Identity" and node.input[0] in self.constant_values:
                self.constant_values[node.output[0]] = self.constant_values[node.input[0]]

    # ---- emission helpers -------------------------------------------------------------------------------
    def fresh(self, tag: str) -> str:
        self.count += 1
        return f"satcore_grad/{self.count}/{tag}"

    def op(self, op_type: str, inputs, n_out: int = 1, **attrs):
        from onnx import helper

        outs = [self.fresh(op_type) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, elem: int) -> str:
        """A scalar (or array) constant of TensorProto type ``elem``, shared between uses."""
        from onnx import helper, numpy_helper

        array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem))
        key = (array.tobytes(), array.shape, elem)
        if key not in self.consts:
            name = self.fresh("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self.consts[key] = name
        return self.consts[key]

    def ints(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64), 7)

    def elem(self, name: str) -> int:
        info = self.infos.get(name)
        if info is None or not info.elem_type:
            raise OnnxProbeError(f"the type of tensor {name!r} is unknown ({self.missing(name)})")
        return info.elem_type

    def missing(self, name: str) -> str:
        """Why ``name`` has no type or shape (the shape inference's failure, when it failed)."""
        explain = getattr(self.infos, "missing", None)
        return explain(name) if explain is not None else "no type or shape was given for it"

    def shape(self, name: str):
        info = self.infos.get(name)
        return None if info is None else info.shape

    def rank(self, name: str, node) -> int:
        shape = self.shape(name)
        if shape is None:
            raise OnnxProbeError(f"{describe(node)}: the rank of {name!r} is unknown ({self.missing(name)}); "
                                 "give the model static ranks")
        return len(shape)

    def constant(self, name: str, node):
        if name not in self.constant_values:
            raise OnnxProbeError(f"{describe(node)}: input {name!r} must be a constant for its gradient")
        return self.constant_values[name]()

    def reduce_sum(self, x, axes, keepdims: int):
        if axes is None:
            return self.op("ReduceSum", [x], keepdims=keepdims)
        axes = axes if isinstance(axes, str) else self.ints(list(axes))
        return self.op("ReduceSum", [x, axes], keepdims=keepdims, noop_with_empty_axes=1)

    def reduce_mean(self, x, axes):
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.ints(list(axes))], keepdims=1)
        return self.op("ReduceMean", [x], axes=list(axes), keepdims=1)

    def zeros_like_flat(self, x, elem):
        return self.op("ConstantOfShape", [self.op("Reshape", [self.op("Size", [x]), self.ints([1])])],
                       value=_tensor(0, elem))

    def unbroadcast(self, g, x, g_shape):
        """``g`` summed down to ``x``'s shape (numpy broadcasting undone)."""
        xs = self.shape(x)
        if xs is not None and g_shape is not None and len(xs) == len(g_shape):
            if all(a == b and a is not None for a, b in zip(xs, g_shape)):
                return g
        if xs is not None and g_shape is not None and all(isinstance(d, int) for d in (*xs, *g_shape)):
            lead = len(g_shape) - len(xs)
            axes = list(range(lead)) + [lead + k for k, d in enumerate(xs) if d == 1 and g_shape[lead + k] != 1]
            if not axes:
                return g
            g = self.reduce_sum(g, axes, keepdims=1)
        else:  # sum over the leading axes and wherever x has extent 1 (harmless where g has it too)
            sg, sx = self.op("Shape", [g]), self.op("Shape", [x])
            lead = self.op("Sub", [self.op("Size", [sg]), self.op("Size", [sx])])
            ones = self.op("Expand", [self.ints([1]), self.op("Reshape", [lead, self.ints([1])])])
            padded = self.op("Concat", [ones, sx], axis=0)
            ones_at = self.op("Equal", [padded, self.ints(1)])
            axes = self.op("Reshape", [self.op("NonZero", [ones_at]), self.ints([-1])])
            g = self.reduce_sum(g, axes, keepdims=1)
        return self.op("Reshape", [g, self.op("Shape", [x])])


def _tensor(value, elem):
    from onnx import helper

    return helper.make_tensor("value", elem, [1], [value])


def _constant_node_value(node):
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_int", "value_float"):
            return np.asarray(a.i if a.name == "value_int" else a.f)
        if a.name in ("value_ints", "value_floats"):
            return np.asarray(list(a.ints) if a.name == "value_ints" else list(a.floats))
    raise OnnxProbeError(f"{describe(node)}: a Constant of this kind is not read")


def describe(node) -> str:
    return f"{node.op_type} node {node.name or node.output[0]!r}"


# ---- vector-Jacobian products: rule(b, node, grads of outputs, inputs needing a gradient) -> input grads ----

def _elementwise(b, node, g, need):
    x, y = node.input[0], node.output[0]
    op = node.op_type
    e = b.elem(y)
    if op in ("Identity", "Dropout"):
        return [g[0]]
    if op == "Cast":
        return [b.op("Cast", [g[0]], to=b.elem(x))]
    if op == "Neg":
        return [b.op("Neg", [g[0]])]
    if op == "Exp":
        return [b.op("Mul", [g[0], y])]
    if op == "Log":
        return [b.op("Div", [g[0], x])]
    if op == "Sqrt":
        return [b.op("Div", [b.op("Mul", [g[0], b.const(0.5, e)]), y])]
    if op == "Reciprocal":
        return [b.op("Neg", [b.op("Mul", [g[0], b.op("Mul", [y, y])])])]
    if op == "Relu":
        return [b.op("Where", [b.op("Greater", [x, b.const(0, e)]), g[0], b.const(0, e)])]
    if op == "Tanh":
        return [b.op("Mul", [g[0], b.op("Sub", [b.const(1, e), b.op("Mul", [y, y])])])]
    if op == "Sigmoid":
        return [b.op("Mul", [g[0], b.op("Mul", [y, b.op("Sub", [b.const(1, e), y])])])]
    if op == "Erf":  # d erf(x) = 2 / sqrt(pi) exp(-x^2)
        gauss = b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])
        return [b.op("Mul", [g[0], b.op("Mul", [gauss, b.const(2 / math.sqrt(math.pi), e)])])]
    if op == "Gelu":
        return [b.op("Mul", [g[0], _gelu_slope(b, x, e, _attr(node, "approximate", b"none"))])]
    raise AssertionError(op)


def _gelu_slope(b, x, e, approximate):
    """``d gelu / dx``: ``Phi(x) + x phi(x)`` exactly, or the derivative of the tanh form."""
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    x2 = b.op("Mul", [x, x])
    if approximate == "tanh":  # 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2), t = tanh(c (x + a x^3))
        c, a = math.sqrt(2 / math.pi), 0.044715
        inner = b.op("Mul", [b.const(c, e), b.op("Add", [x, b.op("Mul", [b.const(a, e), b.op("Mul", [x2, x])])])])
        t = b.op("Tanh", [inner])
        d_inner = b.op("Mul", [b.const(c, e), b.op("Add", [b.const(1, e), b.op("Mul", [b.const(3 * a, e), x2])])])
        left = b.op("Mul", [b.const(0.5, e), b.op("Add", [b.const(1, e), t])])
        sech2 = b.op("Sub", [b.const(1, e), b.op("Mul", [t, t])])
        right = b.op("Mul", [b.op("Mul", [b.const(0.5, e), x]), b.op("Mul", [sech2, d_inner])])
        return b.op("Add", [left, right])
    cdf = b.op("Mul", [b.const(0.5, e), b.op("Add", [b.const(1, e), b.op("Erf", [b.op("Mul", [x, b.const(
        1 / math.sqrt(2), e)])])])])
    pdf = b.op("Mul", [b.const(1 / math.sqrt(2 * math.pi), e), b.op("Exp", [b.op("Mul", [x2, b.const(-0.5, e)])])])
    return b.op("Add", [cdf, b.op("Mul", [x, pdf])])


def _binary(b, node, g, need):
    a, c = node.input[0], node.input[1]
    y = node.output[0]
    ys = b.shape(y)
    op, gy = node.op_type, g[0]
    if op == "Add":
        ga, gc = gy, gy
    elif op == "Sub":
        ga, gc = gy, (b.op("Neg", [gy]) if need[1] else None)
    elif op == "Mul":
        ga = b.op("Mul", [gy, c]) if need[0] else None
        gc = b.op("Mul", [gy, a]) if need[1] else None
    elif op == "Div":
        ga = b.op("Div", [gy, c]) if need[0] else None
        gc = b.op("Neg", [b.op("Div", [b.op("Mul", [gy, y]), c])]) if need[1] else None
    elif op == "Pow":  # y = a^c: dy/da = c a^(c-1), dy/dc = y log a
        if need[0]:
            exponent = b.op("Cast", [c], to=b.elem(a))
            slope = b.op("Mul", [exponent, b.op("Pow", [a, b.op("Sub", [exponent, b.const(1, b.elem(a))])])])
            ga = b.op("Mul", [gy, slope])
        else:
            ga = None
        gc = b.op("Mul", [gy, b.op("Mul", [y, b.op("Log", [a])])]) if need[1] else None
    else:
        raise AssertionError(op)
    return [b.unbroadcast(ga, a, ys) if need[0] else None, b.unbroadcast(gc, c, ys) if need[1] else None]


def _where(b, node, g, need):
    cond, a, c = node.input
    zero = b.const(0, b.elem(node.output[0]))
    ys = b.shape(node.output[0])
    ga = b.unbroadcast(b.op("Where", [cond, g[0], zero]), a, ys) if need[1] else None
    gc = b.unbroadcast(b.op("Where", [cond, zero, g[0]]), c, ys) if need[2] else None
    return [None, ga, gc]


def _expand(b, node, g, need):
    return [b.unbroadcast(g[0], node.input[0], b.shape(node.output[0])), None]


def _swap_last(b, x, node):
    r = b.rank(x, node)
    if r < 2:
        raise OnnxProbeError(f"{describe(node)}: a MatMul with a 1-d operand is not differentiated")
    return b.op("Transpose", [x], perm=[*range(r - 2), r - 1, r - 2])


def _matmul(b, node, g, need):
    a, c = node.input
    ys = b.shape(node.output[0])
    out = [None, None]
    for k, (mine, other) in enumerate(((a, c), (c, a))):
        if not need[k]:
            continue
        t = _swap_last(b, other, node)
        grad = b.op("MatMul", [g[0], t] if k == 0 else [t, g[0]])
        mine_shape = b.shape(mine)
        g_shape = None if ys is None or mine_shape is None else (*ys[:-2], *mine_shape[-2:])
        out[k] = b.unbroadcast(grad, mine, g_shape)
    return out


def _gemm(b, node, g, need):
    """``y = alpha op(A) op(B) + beta C``, ``op`` a transpose where ``transA``/``transB`` say."""
    a, c = node.input[0], node.input[1]
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    trans_a, trans_b = _attr(node, "transA", 0), _attr(node, "transB", 0)
    e = b.elem(node.output[0])
    gy = g[0] if alpha == 1.0 else b.op("Mul", [g[0], b.const(alpha, e)])
    out = [None] * len(node.input)
    if need[0]:  # dA' = g B'^T; A = A'^T when transA
        out[0] = (b.op("MatMul", [b.op("Transpose", [c]), b.op("Transpose", [gy])]) if trans_b else
                  b.op("MatMul", [c, b.op("Transpose", [gy])])) if trans_a else \
                 (b.op("MatMul", [gy, c]) if trans_b else b.op("MatMul", [gy, b.op("Transpose", [c])]))
    if need[1]:  # dB' = A'^T g; B = B'^T when transB
        out[1] = (b.op("MatMul", [b.op("Transpose", [gy]), b.op("Transpose", [a])]) if trans_a else
                  b.op("MatMul", [b.op("Transpose", [gy]), a])) if trans_b else \
                 (b.op("MatMul", [a, gy]) if trans_a else b.op("MatMul", [b.op("Transpose", [a]), gy]))
    if len(node.input) > 2 and need[2]:
        gc = g[0] if beta == 1.0 else b.op("Mul", [g[0], b.const(beta, e)])
        out[2] = b.unbroadcast(gc, node.input[2], b.shape(node.output[0]))
    return out


def _softmax(b, node, g, need):
    y, gy = node.output[0], g[0]
    axis = [_attr(node, "axis", -1)]
    if node.op_type == "Softmax":  # y (g - sum(g y))
        return [b.op("Mul", [y, b.op("Sub", [gy, b.reduce_sum(b.op("Mul", [gy, y]), axis, 1)])])]
    return [b.op("Sub", [gy, b.op("Mul", [b.op("Exp", [y]), b.reduce_sum(gy, axis, 1)])])]  # LogSoftmax


def _layer_norm(b, node, g, need):
    """``dx = rstd (gh - mean(gh) - xhat mean(gh xhat))`` with ``gh = g * scale`` over the normalized axes."""
    if any(need[1:]):
        raise OnnxProbeError(f"{describe(node)}: gradients of its scale and bias are not built")
    x, scale = node.input[0], node.input[1]
    axis, eps = _attr(node, "axis", -1), _attr(node, "epsilon", 1e-5)
    axes = list(range(axis, 0)) if axis < 0 else list(range(axis, b.rank(x, node)))
    e = b.elem(x)
    centred = b.op("Sub", [x, b.reduce_mean(x, axes)])
    var = b.reduce_mean(b.op("Mul", [centred, centred]), axes)
    rstd = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(eps, e)])])])
    xhat = b.op("Mul", [centred, rstd])
    gh = b.op("Mul", [g[0], scale])
    inner = b.op("Sub", [b.op("Sub", [gh, b.reduce_mean(gh, axes)]),
                         b.op("Mul", [xhat, b.reduce_mean(b.op("Mul", [gh, xhat]), axes)])])
    return [b.op("Mul", [rstd, inner])] + [None] * (len(node.input) - 1)


def _reduce(b, node, g, need):
    x, y = node.input[0], node.output[0]
    keepdims = _attr(node, "keepdims", 1)
    attr_axes = node.op_type == "ReduceMean" and b.opset < 18
    if attr_axes:
        axes = _attr(node, "axes")
    else:
        axes = b.constant(node.input[1], node) if len(node.input) > 1 and node.input[1] else None
    axes = None if axes is None or len(np.atleast_1d(axes)) == 0 else [int(a) for a in np.atleast_1d(axes)]
    if axes is None and not attr_axes and _attr(node, "noop_with_empty_axes", 0):
        return [g[0]] + [None] * (len(node.input) - 1)
    gy = g[0]
    if not keepdims and axes is not None:
        r = b.rank(x, node)
        gy = b.op("Unsqueeze", [gy, b.ints(sorted(a % r for a in axes))])
    gx = b.op("Expand", [gy, b.op("Shape", [x])])
    if node.op_type == "ReduceMean":
        count = b.op("Cast", [b.op("Div", [b.op("Size", [x]), b.op("Size", [y])])], to=b.elem(x))
        gx = b.op("Div", [gx, count])
    return [gx] + [None] * (len(node.input) - 1)


def _global_average_pool(b, node, g, need):
    x, y = node.input[0], node.output[0]
    count = b.op("Cast", [b.op("Div", [b.op("Size", [x]), b.op("Size", [y])])], to=b.elem(x))
    return [b.op("Div", [b.op("Expand", [g[0], b.op("Shape", [x])]), count])]


def _reshape(b, node, g, need):
    return [b.op("Reshape", [g[0], b.op("Shape", [node.input[0]])])] + [None] * (len(node.input) - 1)


def _transpose(b, node, g, need):
    perm = _attr(node, "perm")
    perm = list(perm) if perm is not None else list(reversed(range(b.rank(node.input[0], node))))
    return [b.op("Transpose", [g[0]], perm=[int(k) for k in np.argsort(perm)])]


def _concat(b, node, g, need):
    axis = _attr(node, "axis")
    sizes = b.op("Concat", [b.op("Gather", [b.op("Shape", [x]), b.ints([axis])]) for x in node.input], axis=0)
    parts = b.op("Split", [g[0], sizes], n_out=len(node.input), axis=axis)
    parts = parts if isinstance(parts, list) else [parts]
    return [p if n else None for p, n in zip(parts, need)]


def _split(b, node, g, need):
    e = b.elem(node.input[0])
    parts = [gk if gk is not None else b.op("Expand", [b.const(0, e), b.op("Shape", [out])])
             for gk, out in zip(g, node.output)]
    return [b.op("Concat", parts, axis=_attr(node, "axis", 0))] + [None] * (len(node.input) - 1)


def _index_trick(b, node, g, reduction):
    """Gradient of an op that only moves elements: run it on the flat index map of ``x``, scatter ``g`` back.

    ``reduction="add"`` where an element may be picked more than once (Gather).
    """
    x = node.input[0]
    flat = b.op("Range", [b.ints(0), b.op("Size", [x]), b.ints(1)])
    index = b.op("Reshape", [flat, b.op("Shape", [x])])
    moved = b.op(node.op_type, [index, *node.input[1:]], **{a.name: _attr(node, a.name) for a in node.attribute})
    extra = {} if reduction is None else {"reduction": reduction}
    if reduction is not None and b.opset < 16:
        raise OnnxProbeError(f"{describe(node)}: its gradient needs opset >= 16 (ScatterElements reduction)")
    scattered = b.op("ScatterElements", [b.zeros_like_flat(x, b.elem(x)), b.op("Reshape", [moved, b.ints([-1])]),
                                         b.op("Reshape", [g[0], b.ints([-1])])], axis=0, **extra)
    return [b.op("Reshape", [scattered, b.op("Shape", [x])])] + [None] * (len(node.input) - 1)


def _slice(b, node, g, need):
    return _index_trick(b, node, g, None)


def _gather(b, node, g, need):
    return _index_trick(b, node, g, "add")


def _max_pool(b, node, g, need):
    """``g`` scattered (summed) onto the argmax of each window; ``Indices`` index the flat ``x``."""
    if len(node.output) < 2 or not node.output[1]:
        raise AssertionError("MaxPool indices are added by gradient_model")
    x = node.input[0]
    if b.opset < 16:
        raise OnnxProbeError(f"{describe(node)}: its gradient needs opset >= 16 (ScatterElements reduction)")
    scattered = b.op("ScatterElements", [b.zeros_like_flat(x, b.elem(x)),
                                         b.op("Reshape", [node.output[1], b.ints([-1])]),
                                         b.op("Reshape", [g[0], b.ints([-1])])], axis=0, reduction="add")
    return [b.op("Reshape", [scattered, b.op("Shape", [x])])]


@dataclass(frozen=True)
class _Window:
    """The static geometry of a convolution or pool over its input's spatial axes: the input's sizes
    (``spatial``), the output's (``outs``), ``strides``, ``pads`` (begins then ends), ``dilations`` and the
    ``kernel``'s sizes."""

    spatial: list
    outs: list
    strides: list
    pads: list
    dilations: list
    kernel: list


def _spatial(b, node, x, kernel) -> _Window:
    """The static :class:`_Window` of a convolution or pool over ``x``'s spatial axes."""
    shape = b.shape(x)
    if shape is None or not all(isinstance(d, int) for d in shape[2:]):
        raise OnnxProbeError(f"{describe(node)}: its gradient needs static spatial dimensions, got {shape}")
    spatial = list(shape[2:])
    n = len(spatial)
    strides = list(_attr(node, "strides", [1] * n))
    dilations = list(_attr(node, "dilations", [1] * n))
    pads = list(_attr(node, "pads", [0] * (2 * n)))
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if _attr(node, "ceil_mode", 0):
        raise OnnxProbeError(f"{describe(node)}: ceil_mode=1 is not differentiated")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for k in range(n):
            out = -(-spatial[k] // strides[k])
            total = max(0, (out - 1) * strides[k] + dilations[k] * (kernel[k] - 1) + 1 - spatial[k])
            small, large = total // 2, total - total // 2
            pads[k], pads[k + n] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * n)
    outs = [(spatial[k] + pads[k] + pads[k + n] - dilations[k] * (kernel[k] - 1) - 1) // strides[k] + 1
            for k in range(n)]
    return _Window(spatial, outs, strides, pads, dilations, kernel)


def _transposed(b, g, weight, window: _Window, group):
    """``ConvTranspose`` of ``g`` with the forward ``weight`` over ``window``: the adjoint of the convolution."""
    w = window
    padding = [w.spatial[k] - (w.strides[k] * (w.outs[k] - 1) + w.dilations[k] * (w.kernel[k] - 1) + 1 - w.pads[k]
                               - w.pads[k + len(w.spatial)]) for k in range(len(w.spatial))]
    return b.op("ConvTranspose", [g, weight], strides=w.strides, pads=w.pads, dilations=w.dilations, group=group,
                kernel_shape=w.kernel, output_padding=padding)


def _conv(b, node, g, need):
    if need[1] or (len(need) > 2 and need[2]):
        raise OnnxProbeError(f"{describe(node)}: gradients of its weight and bias are not built")
    x, w = node.input[0], node.input[1]
    w_shape = b.shape(w)
    if w_shape is None or not all(isinstance(d, int) for d in w_shape):
        raise OnnxProbeError(f"{describe(node)}: its gradient needs a weight of static shape")
    kernel = list(_attr(node, "kernel_shape", w_shape[2:]))
    gx = _transposed(b, g[0], w, _spatial(b, node, x, kernel), _attr(node, "group", 1))
    return [gx] + [None] * (len(node.input) - 1)


def _average_pool(b, node, g, need):
    """Each window's ``g / count`` spread back over its window (a ConvTranspose with a ones kernel)."""
    x = node.input[0]
    kernel = list(_attr(node, "kernel_shape"))
    window = _spatial(b, node, x, kernel)
    spatial, outs, strides, pads, dilations = window.spatial, window.outs, window.strides, window.pads, window.dilations
    e = b.elem(x)
    n = len(spatial)
    if _attr(node, "count_include_pad", 0):
        counts = np.full(outs, float(np.prod(kernel)))
    else:  # the window's elements inside the image, per axis, multiplied
        counts = np.ones(outs)
        for k in range(n):
            starts = np.arange(outs[k]) * strides[k] - pads[k]
            reach = np.array([sum(0 <= s + dilations[k] * j < spatial[k] for j in range(kernel[k])) for s in starts])
            counts = counts * reach.reshape([-1 if a == k else 1 for a in range(n)])
    per_window = b.op("Div", [g[0], b.const(counts, e)])
    channels = b.op("Reshape", [per_window, b.ints([-1, 1, *outs])])
    ones = b.const(np.ones([1, 1, *kernel]), e)
    spread = _transposed(b, channels, ones, window, 1)
    return [b.op("Reshape", [spread, b.op("Shape", [x])])]


def _softmax_cross_entropy(b, node, g, need):
    """``d loss / d scores = (softmax(scores) - onehot(label)) * w_label`` on the class axis 1, per target.

    ``w_label`` is the class weight (1 without weights), 0 at ``ignore_index``;
    ``reduction="mean"`` divides by the sum of those weights.
    """
    if any(need[1:]):
        raise OnnxProbeError(f"{describe(node)}: gradients of its labels and weights are not built")
    scores, labels = node.input[0], node.input[1]
    e = b.elem(scores)
    reduction = _attr(node, "reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    ignore = _attr(node, "ignore_index")
    weight = b.const(1, e)
    if ignore is not None:
        valid = b.op("Not", [b.op("Equal", [labels, b.const(ignore, b.elem(labels))])])
        labels = b.op("Where", [valid, labels, b.const(0, b.elem(labels))])
        weight = b.op("Cast", [valid], to=e)
    if len(node.input) > 2 and node.input[2]:
        weight = b.op("Mul", [weight, b.op("Gather", [node.input[2], labels])])
    if reduction == "mean":
        total = b.op("Mul", [weight, b.op("Expand", [b.const(1, e), b.op("Shape", [labels])])])
        weight = b.op("Div", [weight, b.reduce_sum(total, None, 0)])
    per_target = b.op("Mul", [g[0], weight])
    classes = b.op("Gather", [b.op("Shape", [scores]), b.ints([1])])
    # ORT's OneHot has no float64 output: make it in int64 and cast
    one_hot = b.op("Cast", [b.op("OneHot", [labels, classes, b.ints([0, 1])], axis=1)], to=e)
    residual = b.op("Sub", [b.op("Softmax", [scores], axis=1), one_hot])
    return [b.op("Mul", [residual, b.op("Unsqueeze", [per_target, b.ints([1])])])] + [None] * (len(node.input) - 1)


RULES = {
    **dict.fromkeys(("Identity", "Dropout", "Cast", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Relu", "Tanh",
                     "Sigmoid", "Erf", "Gelu"), _elementwise),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Pow"), _binary),
    "Where": _where,
    "Expand": _expand,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "LayerNormalization": _layer_norm,
    "ReduceSum": _reduce,
    "ReduceMean": _reduce,
    "GlobalAveragePool": _global_average_pool,
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _reshape),
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Gather": _gather,
    "GatherElements": _gather,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "Conv": _conv,
    "SoftmaxCrossEntropyLoss": _softmax_cross_entropy,
}


def supported_ops() -> tuple[str, ...]:
    """Op types the backward graph differentiates (plus :data:`NO_GRADIENT`, which carry none)."""
    return tuple(sorted(RULES))


def gradient_model(model, loss: str, wrt, infos):
    """``model`` with outputs ``<z>_grad = d loss / d z`` for each ``z`` in ``wrt`` appended (in place).

    ``loss`` names a scalar tensor of ``model``; ``infos`` maps tensor names
    to :class:`~satcore.adapters.onnx.locate.TensorInfo` (types, shapes) of
    the model as given.  ``MaxPool`` nodes on the path gain their ``Indices``
    output.  Raises :class:`OnnxProbeError` with one line naming the op and
    node whose gradient is not built, or a ``z`` the loss does not depend on.
    """
    from onnx import helper

    graph = model.graph
    opset = next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise OnnxProbeError(f"the backward graph needs opset >= {MIN_OPSET}; the model imports opset {opset}")
    wrt = list(wrt)
    order = list(topological_nodes(graph))  # the one order of every graph walk (outer-scope reads included)
    floating = {n for n, info in infos.items() if info.elem_type in FLOAT_TYPES}
    active = set(wrt)
    readers: dict[str, int] = defaultdict(int)  # nodes reading each tensor, not yet visited by the reverse walk
    for node in order:  # tensors depending on a z through differentiable data edges
        reads = set(node_reads(node))
        for name in reads:
            readers[name] += 1
        if node.domain not in ("", "ai.onnx") or node.op_type in NO_GRADIENT:
            continue
        if reads & active:
            active.update(o for o in node.output if o in floating or o not in infos)
    if loss not in active:
        raise OnnxProbeError(f"the loss does not depend on the candidate(s) {wrt}")
    for node in order:
        if node.op_type == "MaxPool" and node.input[0] in active and len(node.output) < 2:
            node.output.append(f"satcore_maxpool_indices/{node.output[0]}")
    b = Backward(model, infos, order)
    contributions: dict[str, list] = defaultdict(list)
    contributions[loss].append(b.const(1, infos[loss].elem_type if loss in infos else 1))
    totals: dict[str, str] = {}

    def total(name):
        if readers[name]:  # a reader not yet visited would add to the sum after it was taken
            raise AssertionError(f"gradient of {name!r} summed before its {readers[name]} other reader(s)")
        if name not in totals and contributions.get(name):
            acc = contributions[name][0]
            for more in contributions[name][1:]:
                acc = b.op("Add", [acc, more])
            totals[name] = acc
        return totals.get(name)

    for node in reversed(order):
        reads = node_reads(node)
        outs = [total(o) if o in active else None for o in node.output]
        for name in set(reads):
            readers[name] -= 1
        need = [i in active and i != "" for i in node.input]
        if all(o is None for o in outs) or not any(i in active for i in reads):
            continue
        rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if any(True for _ in subgraphs(node)):
            raise OnnxProbeError(f"{describe(node)}: the gradient path runs through its subgraph, which is not "
                                 "differentiated; export the model without control flow on that path")
        if rule is None:
            raise OnnxProbeError(f"no gradient for op {node.op_type} (node {node.name or node.output[0]!r}); "
                                 "satcore.adapters.onnx.supported_ops() lists the ops it differentiates")
        if node.op_type not in ("Split",) and outs[0] is None:
            continue  # only a secondary output (MaxPool indices, Dropout mask) is read downstream
        grads = rule(b, node, outs, need)
        for name, grad, needed in zip(node.input, grads, need):
            if needed and grad is not None:
                contributions[name].append(grad)
    missing = [z for z in wrt if total(z) is None]
    if missing:
        raise OnnxProbeError(f"the loss does not depend on the candidate(s) {missing}")
    graph.node.extend(b.nodes)
    graph.initializer.extend(b.initializers)
    for z in wrt:
        graph.node.append(helper.make_node("Identity", [totals[z]], [z + GRAD_SUFFIX]))
        graph.output.append(helper.make_tensor_value_info(z + GRAD_SUFFIX, b.elem(z), None))
    return model
