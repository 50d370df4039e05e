"""The conformance table: one entry per operator and attribute setting.

Every operator ``paddle_ipu.compiler.supported_ops()`` lists is either covered
here (through its public Paddle API) or named in NOT_COVERED with the reason.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from support.runner import Case

X = {"x": "f:3x4"}
X3 = {"x": "f:2x3x4"}
P = {"x": "p:3x4"}
U = {"x": "u:3x4"}
XY = {"x": "f:3x4", "y": "f:3x4"}
IMG = {"x": "f:1x2x5x5"}
VOL = {"x": "f:1x2x3x4x4"}


CASES: list[Case] = []


def add(id: str, op: str, inputs: dict[str, str], fn: object, **kw: object) -> None:
    CASES.append(Case(id, op, inputs, fn, **kw))  # type: ignore[arg-type]


# -- activations: x -> op(x), each non-default attribute set -------------------
for name, inputs in [
    ("abs", X), ("acos", U), ("asin", U), ("atan", X), ("ceil", X), ("cos", X), ("cosh", X),
    ("erf", X), ("exp", X), ("floor", X), ("log", P), ("log10", P), ("log1p", P), ("log2", P),
    ("reciprocal", P), ("round", X), ("rsqrt", P), ("sigmoid", X), ("sign", X), ("sin", X),
    ("sinh", X), ("sqrt", P), ("square", X), ("tan", U), ("tanh", X),
]:  # fmt: skip
    # paddle.sigmoid is top-level from Paddle 3.2 on (paddle.nn.functional before)
    add(name, name, inputs, getattr(paddle, name, None) or getattr(F, name))
add("abs.rank3", "abs", X3, paddle.abs)
# small arguments: log(1 + x) would lose them (a relative error near 1e-3 here)
add("log1p.small", "log1p", X, lambda x: paddle.log1p(x * 1e-4), fp16=False)
add("relu", "relu", X3, F.relu)
add("relu6", "relu6", {"x": "f:3x4"}, lambda x: F.relu6(x * 4))
add("selu", "selu", X, F.selu)
add("selu.attrs", "selu", X, lambda x: F.selu(x, scale=1.2, alpha=1.5))
add("silu", "silu", X, F.silu)
add("swish", "swish", X, F.swish)
add("mish", "mish", X, F.mish)
add("elu", "elu", X, F.elu)
add("elu.alpha", "elu", X, lambda x: F.elu(x, alpha=0.4))
add("gelu", "gelu", X, F.gelu)
add("gelu.approximate", "gelu", X3, lambda x: F.gelu(x, approximate=True))
add("hardshrink", "hardshrink", X, F.hardshrink)
add("hardshrink.threshold", "hardshrink", X, lambda x: F.hardshrink(x, threshold=0.8))
add("softshrink", "softshrink", X, F.softshrink)
add("softshrink.threshold", "softshrink", X, lambda x: F.softshrink(x, threshold=0.8))
add("hardsigmoid", "hardsigmoid", X, lambda x: F.hardsigmoid(x * 4))
add("hardsigmoid.attrs", "hardsigmoid", X, lambda x: F.hardsigmoid(x, slope=0.3, offset=0.4))
add("hardswish", "hardswish", X, lambda x: F.hardswish(x * 4))
add("hardtanh", "hardtanh", X, F.hardtanh)
add("hardtanh.min_max", "hardtanh", X, lambda x: F.hardtanh(x * 5, min=0.1, max=10.0))
add("leaky_relu", "leaky_relu", X, F.leaky_relu)
add("leaky_relu.slope", "leaky_relu", X3, lambda x: F.leaky_relu(x, 0.3))
add("logsigmoid", "logsigmoid", X, F.log_sigmoid)
add("tanh_shrink", "tanh_shrink", X, F.tanhshrink)
add("thresholded_relu", "thresholded_relu", X, F.thresholded_relu)
add(
    "thresholded_relu.attrs",
    "thresholded_relu",
    X,
    lambda x: F.thresholded_relu(x, threshold=0.5, value=0.25),
)
add("softsign", "softsign", X, F.softsign)
add("softplus", "softplus", X, lambda x: F.softplus(x * 10))
add("softplus.beta_threshold", "softplus", X3, lambda x: F.softplus(x * 4, beta=2.0, threshold=3.0))
add("prelu", "prelu", {"x": "f:2x3x4", "w": "p:3"}, lambda x, w: F.prelu(x, w))
add("prelu.single", "prelu", {"x": "f:2x3x4", "w": "p:1"}, lambda x, w: F.prelu(x, w))
add("softmax", "softmax", X3, F.softmax)
add("softmax.axis", "softmax", X3, lambda x: F.softmax(x, axis=1))
add("log_softmax", "log_softmax", X3, F.log_softmax)
add("log_softmax.axis", "log_softmax", X3, lambda x: F.log_softmax(x, axis=0))
add("logsumexp", "logsumexp", X3, lambda x: paddle.logsumexp(x, axis=1))
add("logsumexp.keepdim", "logsumexp", X3, lambda x: paddle.logsumexp(x, axis=[0, 2], keepdim=True))
add("scale", "scale", X, lambda x: paddle.scale(x, scale=2.0, bias=0.5))
add("scale.bias_only", "scale", X, lambda x: paddle.scale(x, scale=1.0, bias=0.5))
add(
    "scale.bias_before",
    "scale",
    X3,
    lambda x: paddle.scale(x, scale=3.0, bias=0.5, bias_after_scale=False),
)
add("scale.int", "scale", {"x": "i9:3x4"}, lambda x: paddle.scale(x, scale=2.0, bias=1.0))
add("clip", "clip", X, lambda x: paddle.clip(x, -0.5, 0.7))
add("pow", "pow", P, lambda x: paddle.pow(x, 2.5))
add("isfinite", "isfinite", X, lambda x: paddle.isfinite(paddle.log(x)))
add("isinf", "isinf", X, lambda x: paddle.isinf(1.0 / paddle.floor(x)))
add("isnan", "isnan", X, lambda x: paddle.isnan(paddle.sqrt(x)))

# -- binary elementwise, with broadcasting ------------------------------------
for name in ["add", "subtract", "multiply", "divide", "maximum", "minimum", "atan2"]:
    add(name, name, XY, getattr(paddle, name))
add("add.broadcast", "add", {"x": "f:2x3x4", "y": "f:4"}, paddle.add)
add("add.int", "add", {"x": "i9:3x4", "y": "i9:3x4"}, paddle.add)
add("elementwise_pow", "elementwise_pow", {"x": "p:3x4", "y": "f:3x4"}, paddle.pow)
add("remainder", "remainder", {"x": "f:3x4", "y": "p:3x4"}, paddle.remainder)
add(
    "remainder.int",
    "remainder",
    {"x": "i20:3x4", "y": "i5:3x4"},
    lambda x, y: paddle.remainder(x, y + 1),
)
add(
    "floor_divide",
    "floor_divide",
    {"x": "i20:3x4", "y": "i5:3x4"},
    lambda x, y: paddle.floor_divide(x, y + 1),
)
for name in ["equal", "not_equal", "greater_than", "greater_equal", "less_than", "less_equal"]:
    add(name, name, {"x": "i3:3x4", "y": "i3:3x4"}, getattr(paddle, name))
for name in ["logical_and", "logical_or", "logical_xor"]:
    add(name, name, {"x": "b:3x4", "y": "b:3x4"}, getattr(paddle, name))
add("logical_not", "logical_not", {"x": "b:3x4"}, paddle.logical_not)
for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
    add(name, name, {"x": "i99:3x4", "y": "i99:3x4"}, getattr(paddle, name))
add("bitwise_not", "bitwise_not", {"x": "i99:3x4"}, paddle.bitwise_not)
add("where", "where", {"c": "b:3x4", "x": "f:3x4", "y": "f:3x4"}, paddle.where)

# -- reductions ----------------------------------------------------------------
for name in ["sum", "mean", "max", "min", "prod"]:
    fn = getattr(paddle, name)
    add(name, name, X3, fn)
    add(f"{name}.axis", name, X3, lambda x, fn=fn: fn(x, axis=1))
    add(f"{name}.axes_keepdim", name, X3, lambda x, fn=fn: fn(x, axis=[0, 2], keepdim=True))
add("all", "all", {"x": "b:3x4"}, lambda x: paddle.all(x, axis=1))
add("any", "any", {"x": "b:3x4"}, lambda x: paddle.any(x, axis=0, keepdim=True))
add("argmax", "argmax", X3, lambda x: paddle.argmax(x, axis=1))
add("argmax.keepdim", "argmax", X3, lambda x: paddle.argmax(x, axis=-1, keepdim=True))
add("argmin", "arg_min", X3, lambda x: paddle.argmin(x, axis=1))
add("p_norm", "p_norm", X3, lambda x: paddle.linalg.norm(x, p=2, axis=1))
add("p_norm.p1_keepdim", "p_norm", X3, lambda x: paddle.linalg.norm(x, p=1, axis=-1, keepdim=True))
add("p_norm.p3", "p_norm", X3, lambda x: paddle.linalg.norm(x, p=3, axis=0))
add("dist", "dist", XY, paddle.dist)
add("dist.p1", "dist", XY, lambda x, y: paddle.dist(x, y, p=1))
add("cumsum", "cumsum", X3, lambda x: paddle.cumsum(x, axis=1))
add("cumsum.flatten", "cumsum", X, paddle.cumsum)
add("numel", "numel", X3, paddle.numel)
add("shape", "shape64", X3, lambda x: x * paddle.cast(paddle.shape(x)[1], "float32"))

# -- linear algebra ------------------------------------------------------------
add("matmul", "matmul", {"x": "f:3x4", "y": "f:4x5"}, paddle.matmul)
add(
    "matmul.transpose",
    "matmul",
    {"x": "f:4x3", "y": "f:5x4"},
    lambda x, y: paddle.matmul(x, y, transpose_x=True, transpose_y=True),
)
add("matmul.batched", "matmul", {"x": "f:2x3x4", "y": "f:4x5"}, paddle.matmul)
add("bmm", "bmm", {"x": "f:2x3x4", "y": "f:2x4x5"}, paddle.bmm)
add("dot", "dot", {"x": "f:4", "y": "f:4"}, paddle.dot)
add("mv", "mv", {"x": "f:3x4", "y": "f:4"}, paddle.mv)
add("einsum", "einsum", {"x": "f:3x4", "y": "f:5x4"}, lambda x, y: paddle.einsum("ij,kj->ik", x, y))
add(
    "einsum.three",
    "einsum",
    {"x": "f:3x4", "y": "f:4x5", "z": "f:5x2"},
    lambda x, y, z: paddle.einsum("ij,jk,kl->il", x, y, z),
)

# -- shapes and indexing ---------------------------------------------------------
add("reshape", "reshape", X3, lambda x: paddle.reshape(x, [4, -1]))
add("transpose", "transpose", X3, lambda x: paddle.transpose(x, [2, 0, 1]))
add("flatten", "flatten", X3, lambda x: paddle.flatten(x, 1))
add("flatten.range", "flatten", {"x": "f:2x3x4x2"}, lambda x: paddle.flatten(x, 1, 2))
add("squeeze", "squeeze", {"x": "f:3x1x4"}, lambda x: paddle.squeeze(x, 1))
add("unsqueeze", "unsqueeze", X, lambda x: paddle.unsqueeze(x, [0, 2]))
add("concat", "concat", XY, lambda x, y: paddle.concat([x, y]))
add(
    "concat.axis",
    "concat",
    {"x": "f:2x3x4", "y": "f:2x2x4"},
    lambda x, y: paddle.concat([x, y, x], axis=1),
)
add("stack", "stack", XY, lambda x, y: paddle.stack([x, y]))
add("stack.axis", "stack", XY, lambda x, y: paddle.stack([x, y, x], axis=-1))
add("add_n", "add_n", XY, lambda x, y: paddle.add_n([x, y, x]))
add("split", "split", {"x": "f:3x6"}, lambda x: paddle.split(x, [1, 2, 3], axis=1))
add("split_with_num", "split_with_num", {"x": "f:3x6"}, lambda x: paddle.split(x, 3, axis=1))
add("unbind", "unbind", X3, lambda x: paddle.unbind(x, axis=1))
add("unstack", "unstack", X3, lambda x: paddle.unstack(x, axis=2))
add("expand", "expand", {"x": "f:3x1"}, lambda x: paddle.expand(x, [2, 3, 4]))
add("expand_as", "expand_as", {"x": "f:3x1", "y": "f:2x3x4"}, paddle.expand_as)
add("tile", "tile", X, lambda x: paddle.tile(x, [2, 1, 3]))
add("tile.same_rank", "tile", X3, lambda x: paddle.tile(x, [1, 3, 2]))
add("tile.from_shape", "tile", X, lambda x: paddle.tile(x, paddle.shape(x)[:1]))
add("tile.bool", "tile", {"x": "b:3x4"}, lambda x: paddle.tile(x, [2, 1]))
add("flip", "flip", X3, lambda x: paddle.flip(x, [0, 2]))
add("roll", "roll", X3, lambda x: paddle.roll(x, 2, axis=2))
add("roll.flat", "roll", X, lambda x: paddle.roll(x, -3))
add("slice", "slice", X3, lambda x: x[:, 1:3, ::1])
add("slice.negative", "slice", X3, lambda x: paddle.slice(x, [1, 2], [-2, 1], [100, -1]))
add(
    "strided_slice",
    "strided_slice",
    X3,
    lambda x: paddle.strided_slice(x, [0, 2], [0, 0], [3, 4], [2, 3]),
)
add("gather", "gather", {"x": "f:5x4", "i": "i5:3"}, paddle.gather)
add("gather.axis", "gather", {"x": "f:5x4", "i": "i4:3"}, lambda x, i: paddle.gather(x, i, axis=1))
add("gather_nd", "gather_nd", {"x": "f:3x4x2", "i": "i3:5x2"}, paddle.gather_nd)
add(
    "index_select",
    "index_select",
    {"x": "f:5x4", "i": "i4:3"},
    lambda x, i: paddle.index_select(x, i, axis=1),
)
add("index_sample", "index_sample", {"x": "f:3x5", "i": "i5:3x2"}, paddle.index_sample)
add(
    "take_along_axis",
    "take_along_axis",
    {"x": "f:3x5", "i": "i5:3x2"},
    lambda x, i: paddle.take_along_axis(x, i, axis=1),
)
add(
    "put_along_axis",
    "put_along_axis",
    {"x": "f:3x5", "i": "i5:3x1", "v": "f:3x1"},
    lambda x, i, v: paddle.put_along_axis(x, i, v, axis=1),
)
add(
    "put_along_axis.add",
    "put_along_axis",
    {"x": "f:3x5", "i": "i5:3x1", "v": "f:3x1"},
    lambda x, i, v: paddle.put_along_axis(x, i, v, axis=1, reduce="add"),
)
add(
    "scatter",
    "scatter",
    {"x": "f:5x4", "i": "i5:3", "u": "f:3x4"},
    lambda x, i, u: paddle.scatter(x, paddle.to_tensor(np.array([4, 0, 2])), u),
)
add(
    "scatter.accumulate",
    "scatter",
    {"x": "f:5x4", "u": "f:3x4"},
    lambda x, u: paddle.scatter(x, paddle.to_tensor(np.array([1, 1, 3])), u, overwrite=False),
)
add(
    "scatter_nd_add",
    "scatter_nd_add",
    {"x": "f:5x4", "i": "i5:3x1", "u": "f:3x4"},
    paddle.scatter_nd_add,
)
add(
    "index_put",
    "index_put",
    {"x": "f:5x4", "i": "i5:3", "v": "f:4"},
    lambda x, i, v: paddle.index_put(x, (i,), v),
)
add(
    "index_put.accumulate",
    "index_put",
    {"x": "f:5x4", "i": "i5:3", "v": "f:4"},
    lambda x, i, v: paddle.index_put(x, (i,), v, accumulate=True),
)
add("tril", "tril", X, paddle.tril)
add("tril.diagonal", "tril", X, lambda x: paddle.tril(x, diagonal=-1))
add("triu", "triu", X, lambda x: paddle.triu(x, diagonal=1))
add("one_hot", "one_hot", {"x": "i6:3x2"}, lambda x: F.one_hot(x, 6))
add("cast", "cast", X, lambda x: paddle.cast(x * 5, "int32"))
add("cast.to_float", "cast", {"x": "i9:3x4"}, lambda x: paddle.cast(x, "float32"))
add("pad", "pad", X, lambda x: F.pad(x, [1, 2, 0, 1], value=0.5))
add("pad3d", "pad3d", IMG, lambda x: F.pad(x, [1, 2, 0, 1]))
add("pad3d.value", "pad3d", IMG, lambda x: F.pad(x, [1, 2, 0, 1], value=0.5))
add("pad3d.value_negative", "pad3d", IMG, lambda x: F.pad(x, [0, 1, 2, 0], value=-3.25))
add("pad3d.reflect", "pad3d", IMG, lambda x: F.pad(x, [1, 2, 0, 1], mode="reflect"))
add("pad3d.replicate", "pad3d", IMG, lambda x: F.pad(x, [1, 0, 2, 1], mode="replicate"))
add(
    "pad3d.nhwc",
    "pad3d",
    {"x": "f:1x5x5x2"},
    lambda x: F.pad(x, [1, 2, 0, 1], value=-1.5, data_format="NHWC"),
)
add("pad3d.5d", "pad3d", VOL, lambda x: F.pad(x, [1, 2, 0, 1, 2, 1], value=2.0))
add(
    "pad3d.5d_ndhwc_reflect",
    "pad3d",
    {"x": "f:1x3x4x4x2"},
    lambda x: F.pad(x, [1, 0, 2, 1, 1, 1], mode="reflect", data_format="NDHWC"),
)
add(
    "refused.pad3d_circular",
    "pad3d",
    IMG,
    lambda x: F.pad(x, [1, 2, 0, 1], mode="circular"),
)
add("meshgrid", "meshgrid", {"x": "f:3", "y": "f:4"}, lambda x, y: paddle.meshgrid(x, y))
add("topk", "topk", X3, lambda x: paddle.topk(x, 2))
add("topk.attrs", "topk", X3, lambda x: paddle.topk(x, 2, axis=1, largest=False))
add("argsort", "argsort", X3, lambda x: paddle.argsort(x, axis=1))
add("argsort.descending", "argsort", X3, lambda x: paddle.argsort(x, axis=-1, descending=True))
add(
    "repeat_interleave",
    "repeat_interleave_with_tensor_index",
    {"x": "f:3x4"},
    lambda x: paddle.repeat_interleave(x, paddle.to_tensor(np.array([1, 2, 0, 3])), axis=1),
)
add("repeat_interleave.int", "repeat_interleave", X3, lambda x: paddle.repeat_interleave(x, 2, -1))
add("repeat_interleave.axis", "repeat_interleave", X3, lambda x: paddle.repeat_interleave(x, 3, 1))
add("repeat_interleave.flat", "repeat_interleave", X, lambda x: paddle.repeat_interleave(x, 2))
add("assign", "assign", X, lambda x: paddle.assign(x) * 2)
add("full", "full", X, lambda x: x + paddle.full([3, 4], 1.5))
add("full_like", "full_like", X, lambda x: x + paddle.full_like(x, 2.5))
add("arange", "arange", X, lambda x: x + paddle.arange(1, 9, 2, dtype="float32"))
add("linspace", "linspace", X, lambda x: x + paddle.linspace(-1, 2, 4))
add("eye", "eye", X, lambda x: x + paddle.eye(3, 4))
add("embedding", "embedding", {"i": "i6:3x2", "w": "f:6x4"}, lambda i, w: F.embedding(i, w))
add(
    "embedding.padding_idx",
    "embedding",
    {"i": "i6:3x2", "w": "f:6x4"},
    lambda i, w: F.embedding(i, w, padding_idx=2),
)
add("set_value", "set_value", X, lambda x: paddle.static.setitem(x, (slice(0, 2), 1), 7.0))
add(
    "set_value.step_negative_bounds",
    "set_value",
    X3,
    lambda x: paddle.static.setitem(x, (slice(None), slice(-2, None), slice(0, None, 2)), -1.5),
)
add(
    "set_value.negative_step",
    "set_value",
    X,
    lambda x: paddle.static.setitem(x, (slice(None), slice(3, 0, -2)), 0.25),
)
add("set_value.int", "set_value", {"x": "i9:3x4"}, lambda x: paddle.static.setitem(x, 1, 5))
add(
    "set_value.bool",
    "set_value",
    {"x": "b:4x6"},
    lambda x: paddle.static.setitem(x, (slice(1, None, 2), slice(-3, None)), True),
)
add(
    "set_value.bool_false",
    "set_value",
    {"x": "b:4x6"},
    lambda x: paddle.static.setitem(x, (slice(None), slice(0, 5, 2)), False),
)
add(
    "set_value_with_tensor",
    "set_value_with_tensor",
    {"x": "f:3x4", "v": "f:2"},
    lambda x, v: paddle.static.setitem(x, (slice(0, 2), 1), v),
)
add(
    "set_value_with_tensor.region",
    "set_value_with_tensor",
    {"x": "f:2x5x4", "v": "f:2x4x4"},
    lambda x, v: paddle.static.setitem(x, (slice(None), slice(1, None)), v),
)
add(
    "set_value_with_tensor.broadcast",
    "set_value_with_tensor",
    {"x": "f:2x5x4", "v": "f:4"},
    lambda x, v: paddle.static.setitem(x, (slice(0, 1), slice(-3, -1)), v),
)
add(
    "set_value_with_tensor.int",
    "set_value_with_tensor",
    {"x": "i9:3x4", "v": "i9:3"},
    lambda x, v: paddle.static.setitem(x, (slice(None), 2), v),
)
add(
    "refused.set_value_with_tensor_step",
    "set_value_with_tensor",
    {"x": "f:3x4", "v": "f:3x2"},
    lambda x, v: paddle.static.setitem(x, (slice(None), slice(0, 4, 2)), v),
)

# -- nn ------------------------------------------------------------------------
add("conv2d", "conv2d", {"x": "f:1x2x5x5", "w": "f:3x2x3x3"}, F.conv2d)
add(
    "conv2d.attrs",
    "conv2d",
    {"x": "f:2x4x6x6", "w": "f:4x2x3x3", "b": "f:4"},
    lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=[1, 2], dilation=1, groups=2),
)
add(
    "conv2d.valid_dilation",
    "conv2d",
    {"x": "f:1x2x6x6", "w": "f:3x2x2x2"},
    lambda x, w: F.conv2d(x, w, padding="VALID", dilation=2),
)
add(
    "depthwise_conv2d",
    "depthwise_conv2d",
    {"x": "f:1x3x5x5", "w": "f:3x1x3x3"},
    lambda x, w: F.conv2d(x, w, padding=1, groups=3),
)
add(
    "conv2d_transpose",
    "conv2d_transpose",
    {"x": "f:1x2x4x4", "w": "f:2x3x3x3"},
    lambda x, w: F.conv2d_transpose(x, w, stride=2, padding=1, output_padding=1),
)
add(
    "depthwise_conv2d_transpose",
    "depthwise_conv2d_transpose",
    {"x": "f:1x2x4x4", "w": "f:2x1x3x3"},
    lambda x, w: F.conv2d_transpose(x, w, groups=2),
)
add(
    "conv3d",
    "conv3d",
    {"x": "f:1x2x4x4x4", "w": "f:2x2x3x3x3"},
    lambda x, w: F.conv3d(x, w, padding=1, stride=[1, 2, 1]),
)
add(
    "conv3d_transpose",
    "conv3d_transpose",
    {"x": "f:1x2x3x3x3", "w": "f:2x2x2x2x2"},
    lambda x, w: F.conv3d_transpose(x, w, stride=2),
)
add("pool2d.max", "pool2d", IMG, lambda x: F.max_pool2d(x, 2))
add(
    "pool2d.max_attrs",
    "pool2d",
    IMG,
    lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
)
add("pool2d.avg", "pool2d", IMG, lambda x: F.avg_pool2d(x, 3, stride=2, padding=1))
add(
    "pool2d.avg_inclusive",
    "pool2d",
    IMG,
    lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, exclusive=False),
)
add("pool2d.adaptive_avg", "pool2d", {"x": "f:1x2x6x6"}, lambda x: F.adaptive_avg_pool2d(x, 3))
add("pool2d.adaptive_max", "pool2d", {"x": "f:1x2x6x6"}, lambda x: F.adaptive_max_pool2d(x, 2))
# Output sizes that do not divide the input: overlapping bins, and more bins than inputs.
add(
    "pool2d.adaptive_avg_uneven",
    "pool2d",
    {"x": "f:2x3x5x7"},
    lambda x: F.adaptive_avg_pool2d(x, [3, 4]),
)
add(
    "pool2d.adaptive_avg_upsample",
    "pool2d",
    {"x": "f:1x2x2x3"},
    lambda x: F.adaptive_avg_pool2d(x, [7, 7]),
)
add(
    "max_pool2d_with_index.adaptive_uneven",
    "max_pool2d_with_index",
    {"x": "f:1x2x5x7"},
    lambda x: F.adaptive_max_pool2d(x, [3, 4]),
)
add(
    "max_pool2d_with_index.adaptive_upsample",
    "max_pool2d_with_index",
    {"x": "f:2x3x2x3"},
    lambda x: F.adaptive_max_pool2d(x, [5, 4]),
)
add(
    "refused.pool2d_adaptive_avg_nhwc_uneven",
    "pool2d",
    {"x": "f:1x5x7x2"},
    lambda x: F.adaptive_avg_pool2d(x, [3, 4], data_format="NHWC"),
)
add("pool3d.adaptive_max", "pool3d", VOL, lambda x: F.adaptive_max_pool3d(x, 2))
add("pool3d", "pool3d", VOL, lambda x: F.max_pool3d(x, 2))
add("pool3d.avg", "pool3d", VOL, lambda x: F.avg_pool3d(x, 2, stride=1, padding=1))
add(
    "max_pool2d_with_index",
    "max_pool2d_with_index",
    {"x": "f:1x2x4x4"},
    lambda x: F.max_pool2d(x, 2, return_mask=True),
)
add(
    "max_pool3d_with_index",
    "max_pool3d_with_index",
    {"x": "f:1x2x4x4x4"},
    lambda x: F.max_pool3d(x, 2, return_mask=True),
)
add(
    "batch_norm",
    "batch_norm_",
    {"x": "f:2x3x4x4", "m": "f:3", "v": "p:3", "w": "f:3", "b": "f:3"},
    lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False, epsilon=1e-3),
)
add(
    "layer_norm",
    "layer_norm",
    {"x": "f:2x3x4", "w": "f:4", "b": "f:4"},
    lambda x, w, b: F.layer_norm(x, 4, w, b, epsilon=1e-3),
)
add("layer_norm.two_axes", "layer_norm", {"x": "f:2x3x4"}, lambda x: F.layer_norm(x, [3, 4]))
add("group_norm.default", "group_norm", {"x": "f:2x4x3x3"}, lambda x: F.group_norm(x, 4))
add(
    "group_norm",
    "group_norm",
    {"x": "f:2x4x3x3", "w": "f:4", "b": "f:4"},
    lambda x, w, b: F.group_norm(x, 2, epsilon=1e-3, weight=w, bias=b),
)
add(
    "instance_norm",
    "instance_norm",
    {"x": "f:2x3x4x4", "w": "f:3", "b": "f:3"},
    lambda x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-3),
)
add("dropout", "dropout", X, lambda x: F.dropout(x, 0.3, training=False))
add(
    "dropout.downscale",
    "dropout",
    X,
    lambda x: F.dropout(x, 0.3, training=False, mode="downscale_in_infer"),
)
for mode, op in [
    ("nearest", "nearest_interp"),
    ("bilinear", "bilinear_interp"),
    ("bicubic", "bicubic_interp"),
]:
    add(f"{op}", op, IMG, lambda x, mode=mode: F.interpolate(x, size=[7, 8], mode=mode))
    if mode != "nearest":
        add(
            f"{op}.align_corners",
            op,
            IMG,
            lambda x, mode=mode: F.interpolate(x, size=[7, 8], mode=mode, align_corners=True),
        )
add(
    "nearest_interp.scale_factor",
    "nearest_interp",
    IMG,
    lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
)
add(
    "bilinear_interp.scale_factor",
    "bilinear_interp",
    IMG,
    lambda x: F.interpolate(x, scale_factor=[1.4, 3.0], mode="bilinear"),
)
add(
    "bicubic_interp.scale_factor_align_corners",
    "bicubic_interp",
    IMG,
    lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", align_corners=True),
)
add(
    "refused.bilinear_interp_fractional_scale",
    "bilinear_interp",
    IMG,
    lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear"),
)
add(
    "bilinear_interp.align_mode",
    "bilinear_interp",
    IMG,
    lambda x: F.interpolate(x, size=[7, 8], mode="bilinear", align_mode=1),
)
add(
    "linear_interp",
    "linear_interp",
    {"x": "f:1x2x5"},
    lambda x: F.interpolate(x, size=[8], mode="linear", data_format="NCW"),
)
add(
    "trilinear_interp",
    "trilinear_interp",
    VOL,
    lambda x: F.interpolate(x, size=[4, 5, 6], mode="trilinear"),
)
add("pixel_shuffle", "pixel_shuffle", {"x": "f:1x8x2x3"}, lambda x: F.pixel_shuffle(x, 2))
add("unfold", "unfold", IMG, lambda x: F.unfold(x, 2, strides=1, paddings=1))
add(
    "unfold.attrs",
    "unfold",
    {"x": "f:2x3x7x8"},
    lambda x: F.unfold(x, [2, 3], strides=[1, 2], paddings=[1, 0, 2, 1], dilations=[2, 1]),
)
add("unfold.no_padding", "unfold", IMG, lambda x: F.unfold(x, 3, strides=2))
add(
    "grid_sample",
    "grid_sample",
    {"x": "f:1x2x4x4", "g": "u:1x3x3x2"},
    lambda x, g: F.grid_sample(x, g, align_corners=False),
)
add(
    "grid_sample.nearest",
    "grid_sample",
    {"x": "f:1x2x4x4", "g": "u:1x3x3x2"},
    lambda x, g: F.grid_sample(x, g, mode="nearest", padding_mode="border"),
)
add(
    "temporal_shift",
    "temporal_shift",
    {"x": "f:4x4x3x3"},
    lambda x: F.temporal_shift(x, seg_num=2, shift_ratio=0.25),
)
add(
    "cross_entropy",
    "cross_entropy_with_softmax",
    {"x": "f:4x5", "l": "i5:4x1"},
    lambda x, lab: F.cross_entropy(x, lab, reduction="none"),
)
add(
    "cross_entropy.no_softmax",
    "cross_entropy_with_softmax",
    {"x": "p:4x5", "l": "i5:4x1"},
    lambda x, lab: F.cross_entropy(F.softmax(x), lab, use_softmax=False, reduction="none"),
)
add(
    "cross_entropy.no_softmax_mean",
    "cross_entropy_with_softmax",
    {"x": "p:4x5", "l": "i5:4x1"},
    lambda x, lab: F.cross_entropy(F.softmax(x), lab, use_softmax=False),
)
add(
    "cross_entropy.ignore_index",
    "cross_entropy_with_softmax",
    {"x": "f:4x5", "l": "i5:4x1"},
    lambda x, lab: F.cross_entropy(x, lab, ignore_index=2, reduction="sum"),
)
add(
    "cross_entropy.soft_label",
    "cross_entropy_with_softmax",
    {"x": "f:4x5", "l": "p:4x5"},
    lambda x, lab: F.cross_entropy(
        x, lab / paddle.sum(lab, -1, keepdim=True), soft_label=True, reduction="none"
    ),
)
add(
    "cross_entropy.axis",
    "cross_entropy_with_softmax",
    {"x": "f:4x5x3", "l": "i5:4x1x3"},
    lambda x, lab: F.cross_entropy(x, lab, axis=1, reduction="none"),
)
add(
    "softmax_with_cross_entropy",
    "cross_entropy_with_softmax",
    {"x": "f:4x5", "l": "i5:4x1"},
    lambda x, lab: F.softmax_with_cross_entropy(x, lab, return_softmax=True),
)
add(
    "softmax_with_cross_entropy.no_softmax",
    "cross_entropy_with_softmax",
    {"x": "p:4x5", "l": "i5:4x1"},
    lambda x, lab: paddle._C_ops.cross_entropy_with_softmax(
        F.softmax(x), lab, False, False, True, -100, -1
    ),
)
add("fft_r2c", "fft_r2c", {"x": "f:3x8"}, lambda x: paddle.abs(paddle.fft.rfft(x)))

# -- rewritten before conversion (paddle2onnx has no converter for these) ------------
_MASK = np.array([[True, False, True, False], [False, True, True, False], [True] * 4])
add(
    "assign_value.bool",
    "assign_value_",
    X,
    lambda x: paddle.logical_and(x > 0, paddle.assign(_MASK)),
    fp16=False,
)
add(
    "full.float16",
    "full",
    X,
    lambda x: x + paddle.full([3, 4], 1.5, "float16").astype("float32"),
)
add(
    "accuracy",
    "accuracy",
    {"x": "f:6x5", "l": "i5:6x1"},
    lambda x, lab: paddle.metric.accuracy(F.softmax(x), lab),
    fp16=False,  # a count: the same graph either way
)
add(
    "accuracy.k",
    "accuracy",
    {"x": "f:6x5", "l": "i5:6x1"},
    lambda x, lab: paddle.metric.accuracy(F.softmax(x), lab, k=3),
    fp16=False,
)
for _reduction in (0, 1, 2):
    add(
        f"identity_loss.{_reduction}",
        "identity_loss",
        X3,
        lambda x, r=_reduction: paddle.incubate.identity_loss(x, r),
    )
add("mean_all", "mean_all", X3, lambda x: paddle._C_ops.mean_all(x))
add(
    "bce_loss",
    "bce_loss",
    {"x": "f:3x4", "l": "u:3x4"},
    lambda x, lab: F.binary_cross_entropy(F.sigmoid(x), paddle.abs(lab), reduction="none"),
)
add(
    "bce_loss.mean",
    "bce_loss",
    {"x": "f:3x4", "l": "u:3x4"},
    lambda x, lab: F.binary_cross_entropy(F.sigmoid(x), paddle.abs(lab)),
)
add(
    "bce_loss.saturated",  # log(0) is floored at -100, as in Paddle's kernel
    "bce_loss",
    {"x": "f:3x4", "l": "u:3x4"},
    lambda x, lab: F.binary_cross_entropy(
        paddle.clip(F.sigmoid(x * 20), 0.0, 1.0).round(), paddle.abs(lab), reduction="none"
    ),
    fp16=False,  # 100 * label in float16 is past the fp16 tolerance's reach
)
for _reduction in ("none", "mean", "sum", "batchmean"):
    add(
        f"kldiv_loss.{_reduction}",
        "kldiv_loss",
        {"x": "f:4x5", "l": "f:4x5"},
        lambda x, lab, r=_reduction: F.kl_div(x, F.relu(lab), reduction=r),
    )
add(
    "kldiv_loss.log_target",
    "kldiv_loss",
    {"x": "f:4x5", "l": "f:4x5"},
    lambda x, lab: F.kl_div(x, lab, reduction="none", log_target=True),
)
add(
    "kldiv_loss.legacy_reduction",  # the 2.x operator's own reduction attribute
    "kldiv_loss",
    {"x": "f:4x5", "l": "p:4x5"},
    lambda x, lab: paddle._C_ops.kldiv_loss(x, lab, "batchmean", False),
)

# Paddle 1.x's sequence operators (fluid.layers.dynamic_gru, crf_decoding): Paddle 3
# has no public builder; a legacy program translated to PIR holds them, as these build
# them.  Paddle's kernels read a LoD; the compiled graph takes the rows as one sequence
# (several, padded into a batch, are the predictor's: tests/conformance/test_old_format.py).
_GRU = {"x": "f:6x12", "w": "u:4x12", "b": "u:1x12"}
_ONE = {"x": [6]}
for _name, (_act, _gate, _reverse, _origin) in {
    "gru": ("tanh", "sigmoid", False, False),
    "gru.reverse": ("tanh", "sigmoid", True, False),
    "gru.origin_mode": ("tanh", "sigmoid", False, True),
    "gru.origin_mode_reverse": ("tanh", "sigmoid", True, True),
    "gru.relu": ("relu", "sigmoid", False, False),
    "gru.identity": ("identity", "sigmoid", True, False),
    "gru.sigmoid": ("sigmoid", "sigmoid", False, False),
    "gru.tanh_gate": ("tanh", "tanh", False, True),  # a tanh update gate: origin mode only
    "gru.relu_gate": ("tanh", "relu", True, True),
}.items():
    add(
        _name,
        "gru",
        _GRU,
        lambda x, w, b, a=(_act, _gate, _reverse, _origin): paddle._C_ops.gru(
            x, None, w, b, a[0], a[1], a[2], a[3], True
        ),
        lod=_ONE,
    )
add(
    "gru.h0",
    "gru",
    {**_GRU, "h": "f:1x4"},
    lambda x, w, b, h: paddle._C_ops.gru(x, h, w, b, "tanh", "sigmoid", False, False, True),
    lod=_ONE,
)
add(
    "gru.no_bias",
    "gru",
    {"x": "f:6x12", "w": "u:4x12"},
    lambda x, w: paddle._C_ops.gru(x, None, w, None, "tanh", "sigmoid", True, False, True),
    lod=_ONE,
)
add(
    "gru.projected",  # dynamic_gru's input as its users wrote it: a fully connected layer
    "gru",
    {"x": "f:6x5", "p": "u:5x12", "q": "u:12", "w": "u:4x12", "b": "u:1x12"},
    lambda x, p, q, w, b: paddle._C_ops.gru(
        paddle.matmul(x, p) + q, None, w, b, "tanh", "sigmoid", False, False, True
    ),
    lod=_ONE,
)
_CRF = {"e": "f:7x5", "w": "f:7x5"}
add(
    "crf_decoding",
    "crf_decoding",
    _CRF,
    lambda e, w: paddle._C_ops.crf_decoding(e * 3.0, w, None, None),
    lod={"e": [7]},
)
add(
    "crf_decoding.label",
    "crf_decoding",
    {**_CRF, "l": "i5:7x1"},
    lambda e, w, lab: paddle._C_ops.crf_decoding(e * 3.0, w, lab, None),
    lod={"e": [7], "l": [7]},
)
add(
    "crf_decoding.length",  # padded rows and their lengths (0 to 6 of 6)
    "crf_decoding",
    {"e": "f:4x6x5", "w": "f:7x5", "n": "i7:4"},
    lambda e, w, n: paddle._C_ops.crf_decoding(e * 3.0, w, None, n),
)
add(
    "crf_decoding.length_label",
    "crf_decoding",
    {"e": "f:4x6x5", "w": "f:7x5", "l": "i5:4x6", "n": "i7:4"},
    lambda e, w, lab, n: paddle._C_ops.crf_decoding(e * 3.0, w, lab, n),
)
add(
    "crf_decoding.long",  # past UNROLL_STEPS: the decode's forward pass is a loop
    "crf_decoding",
    {"e": "f:300x5", "w": "f:7x5"},
    lambda e, w: paddle._C_ops.crf_decoding(e * 3.0, w, None, None),
    lod={"e": [300]},
)

# Refused at compile time with UnsupportedOpError naming the operator (and the
# attribute value, where only some values are refused).
add("refused.unique", "unique", X, paddle.unique)
add("refused.nonzero", "nonzero", X, lambda x: paddle.nonzero(x > 0))
add("refused.masked_select", "masked_select", X, lambda x: paddle.masked_select(x, x > 0))
add(
    "refused.conv2d_nhwc",
    "conv2d",
    {"x": "f:1x6x6x2", "w": "f:3x2x2x2"},
    lambda x, w: F.conv2d(x, w, data_format="NHWC"),
)
add(
    "refused.conv2d_same_dilation",
    "conv2d",
    {"x": "f:1x2x6x6", "w": "f:3x2x2x2"},
    lambda x, w: F.conv2d(x, w, padding="SAME", dilation=2),
)
add(
    "refused.multiclass_nms3",
    "multiclass_nms3",
    {"boxes": "f:1x6x4", "scores": "f:1x2x6"},
    # PaddleDetection's exported tail (ppdet/modeling/ops.py), as its exporter writes it
    lambda boxes, scores: paddle._C_ops.multiclass_nms3(
        boxes, scores, None, 0.1, 100, 5, 0.5, True, 1.0, -1, True
    )[0],
)
add(
    "refused.gru_tanh_update",  # 1 - u for a tanh gate: not ONNX's GRU
    "gru",
    _GRU,
    lambda x, w, b: paddle._C_ops.gru(x, None, w, b, "tanh", "tanh", False, False, True),
    lod=_ONE,
)
REFUSED: dict[str, str] = {
    "refused.multiclass_nms3": "exclude_nms=True",
    "refused.unique": "pd_op.unique",
    "refused.nonzero": "pd_op.nonzero",
    "refused.masked_select": "pd_op.masked_select",
    "refused.conv2d_nhwc": "data_format='NHWC'",
    "refused.conv2d_same_dilation": "dilations=[2, 2]",
    "refused.pad3d_circular": "mode='circular'",
    "repeat_interleave": "pd_op.repeat_interleave_with_tensor_index",
    "refused.set_value_with_tensor_step": "steps [2]",
    "max_pool2d_with_index": "return_mask=True",
    "max_pool3d_with_index": "return_mask=True",
    "refused.bilinear_interp_fractional_scale": "scale_factor=[1.5, 1.5]",
    "refused.pool2d_adaptive_avg_nhwc_uneven": "data_format='NHWC'",
    "refused.gru_tanh_update": "gate_activation='tanh' with origin_mode=False",
}

# Cases whose fp32 graph matches but that the host backend cannot run in fp16 (a
# BackendError, never a wrong number; the fp16 test expects exactly these to fail).
# None: the host computes every operator in float32 and rounds its result.
FP16_HOST_FAILS: dict[str, str] = {}

# Cases where float16 arithmetic, as the IPU computes it, is not within the case's
# fp16 tolerance of Paddle's float32 result, and why; the fp16 test checks that the
# emulated IPU differs only there (tests/conformance/test_ops.py).
FP16_OVERFLOWS: dict[str, str] = {
    "softplus": "exp(10 x) exceeds 65504 for x > 1.109: the IPU saturates it, and the "
    "log of the saturated value is 11.09 where softplus is 10 x (paddle2onnx computes "
    "softplus as log(1 + exp(x)) below its threshold)",
}

# Listed operators with no case here, and why.
_ARRAYS = "tensor arrays exist only inside control flow (while and if compile); no own case"
NOT_COVERED: dict[str, str] = {
    "array_length": _ARRAYS,
    "array_read": _ARRAYS,
    "array_to_tensor": _ARRAYS,
    "array_write_": _ARRAYS,
    "create_array": _ARRAYS,
    "select_input": "made by the legacy IR's conditional_block; no case of its own",
    "builtin.combine": "structural: the list operand of concat, stack, add_n, meshgrid (covered)",
    "builtin.split": "structural: the list result of split, unbind, unstack (covered)",
    "builtin.slice": "structural: one element of a list result (covered through split)",
    "share_data": "no public API builds it in a forward program",
    "share_data_": "no public API builds it in a forward program",
    "assign_out": "no public API builds it in a forward program",
    "assign_out_": "no public API builds it in a forward program",
    "assign_value_": "a constant; covered through paddle.to_tensor (scatter cases)",
    "full_int_array": "a shape constant; covered through reshape, slice, sum",
    "full_with_tensor": "a constant whose shape is a tensor; the IPU needs static shapes",
    "set_value": "the out-of-place form of set_value_ (covered: paddle.static.setitem builds it)",
    "set_value_with_tensor": (
        "the out-of-place form of set_value_with_tensor_ (covered: paddle.static.setitem builds it)"
    ),
    "shape": "the public API (paddle.shape) builds shape64 in Paddle 3.3 (covered)",
    "empty": "its values are undefined: nothing to compare",
    "gaussian": "random: the values differ from Paddle's generator by design",
    "uniform": "random: the values differ from Paddle's generator by design",
    "multinomial": "random: the values differ from Paddle's generator by design",
    "print": "prints on the host; no result to compare",
    "quantize_linear": "made only by Paddle's quantization passes, not by a public API",
    "dequantize_linear": "made only by Paddle's quantization passes, not by a public API",
    "partial_concat": "no public API in Paddle 3.3 (incubate only under the legacy IR)",
    "partial_sum": "no public API in Paddle 3.3 (incubate only under the legacy IR)",
    "deformable_conv": "needs offset and mask inputs sized to the kernel; covered by no case yet",
    "roi_align": "its boxes come as a variable-length tensor with a count",
    "yolo_box": "a detection post-processing op; covered by no case yet",
    "rnn": "needs weight lists and a dropout state the startup program leaves empty",
}
