"""paddle_ipu._tensors.views: zero-copy views of dygraph and scope tensors."""

from __future__ import annotations

import gc
import importlib
from collections.abc import Iterator

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from paddle_ipu._internals.paddle_api import probe_mode
from paddle_ipu._tensors.views import DenseTensor, as_numpy, view
from paddle_ipu.errors import TensorViewError

_core = importlib.import_module("paddle_ipu._core")

PLACES = ["cpu"]
if "ipu" in paddle.device.get_all_custom_device_type():
    PLACES.append("ipu")


@pytest.fixture
def eager() -> Iterator[None]:
    with probe_mode(static=False):
        yield


@pytest.fixture(params=PLACES)
def device(request: pytest.FixtureRequest, eager: None) -> Iterator[str]:
    previous = paddle.get_device()
    paddle.set_device(request.param)
    try:
        yield request.param
    finally:
        paddle.set_device(previous)


def test_dygraph_view_exposes_the_tensor(device: str) -> None:
    x = paddle.arange(24, dtype="float32").reshape([2, 3, 4])
    v = view(x)
    assert v.owner is x
    assert v.data_ptr == x.data_ptr()
    assert (v.dtype, v.shape, v.rank, v.ndim, v.numel) == ("float32", (2, 3, 4), 3, 3, 24)
    assert (v.itemsize, v.nbytes, v.dim(0), v.dim(-1), v.readonly) == (4, 96, 2, 4, False)
    with pytest.raises(IndexError):
        v.dim(3)
    a = np.asarray(v)
    assert a.ctypes.data == x.data_ptr()
    np.testing.assert_array_equal(a, np.arange(24, dtype=np.float32).reshape(2, 3, 4))


def test_writes_through_the_view_reach_the_tensor(device: str) -> None:
    x = paddle.zeros([3, 5], dtype="float32")
    a = as_numpy(x)
    a[1, :] = 7.0
    memoryview(view(x)).cast("B")[0:4] = np.float32(-2.0).tobytes()
    expected = np.zeros((3, 5), dtype=np.float32)
    expected[1, :] = 7.0
    expected[0, 0] = -2.0
    np.testing.assert_array_equal(x.numpy(), expected)


def test_paddle_inplace_ops_are_seen_through_the_view(eager: None) -> None:
    # (.cpu() rather than device="cpu": the creation ops take device= from Paddle 3.2 on)
    # CPU only: on the ipu place an in-place op without an ipu kernel updates a CPU
    # copy and the tensor itself keeps its old values (a plugin limitation).
    x = paddle.zeros([3, 5], dtype="float32").cpu()
    a = as_numpy(x)
    x.add_(paddle.ones([3, 5]).cpu())
    np.testing.assert_array_equal(a, np.ones((3, 5), np.float32))


def test_view_outlives_the_tensor_reference(device: str) -> None:
    x = paddle.arange(1000, dtype="float32")
    ptr = x.data_ptr()
    v = view(x)
    del x
    gc.collect()
    # Allocations made now must not land on the viewed memory.
    others = [paddle.full([1000], 5.0) for _ in range(8)]
    a = np.asarray(v)
    assert v.data_ptr == ptr and a.ctypes.data == ptr
    np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float32))
    a[:] = 1.0
    assert all(float(o.sum()) == 5000.0 for o in others)


def test_readonly_view(device: str) -> None:
    x = paddle.ones([4], dtype="float32")
    v = view(x, readonly=True)
    assert v.readonly
    a = np.asarray(v)
    assert not a.flags.writeable
    with pytest.raises(TypeError):
        memoryview(v)[0] = 2.0


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        st.sampled_from(
            ["float32", "float16", "float64", "int8", "uint8", "int32", "int64", "bool"]
        ),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    ),
    st.sampled_from(PLACES),
)
def test_property_any_shape_and_dtype(arr: np.ndarray, place: str) -> None:
    p = paddle.CPUPlace() if place == "cpu" else paddle.CustomPlace("ipu", 0)
    with probe_mode(static=False):
        t = paddle.to_tensor(arr, place=p)
    v = view(t)
    assert v.dtype == str(arr.dtype) and v.shape == arr.shape and v.numel == arr.size
    a = np.asarray(v)
    assert a.dtype == arr.dtype and a.shape == arr.shape
    np.testing.assert_array_equal(a, arr)
    if arr.size:
        assert a.ctypes.data == t.data_ptr()  # shared, not copied


def test_non_contiguous_is_refused(device: str) -> None:
    x = paddle.arange(12, dtype="float32").reshape([3, 4])
    with pytest.raises(TensorViewError, match="non-contiguous"):
        view(x[:, 1:3])
    # A row slice is contiguous and views at the right offset.
    a = as_numpy(x[1:])
    np.testing.assert_array_equal(a, np.arange(4, 12, dtype=np.float32).reshape(2, 4))


def test_non_contiguous_dense_tensor_is_refused_on_cpu(eager: None) -> None:
    x = paddle.arange(12, dtype="float32").cpu().reshape([3, 4])
    with pytest.raises(TensorViewError, match="non-contiguous"):
        view(x[:, 1:3].get_tensor())


def test_unsupported_inputs_are_refused(device: str) -> None:
    with pytest.raises(TensorViewError, match="bfloat16"):
        view(paddle.zeros([2], dtype="bfloat16"))
    with pytest.raises(TensorViewError, match=r"paddle\.Tensor"):
        view(np.zeros(3))  # type: ignore[arg-type]
    with pytest.raises(TensorViewError, match="no memory"):
        view(DenseTensor())
    assert issubclass(TensorViewError, TypeError)


def test_low_level_constructor_checks() -> None:
    keep = np.zeros(4, dtype=np.float32)
    with pytest.raises(TypeError, match="dtype 'float8'"):
        _core.TensorView(keep, keep.ctypes.data, "float8", [4])
    with pytest.raises(ValueError, match="negative"):
        _core.TensorView(keep, keep.ctypes.data, "float32", [-1, 4])
    with pytest.raises(ValueError, match="no memory"):
        _core.TensorView(keep, 0, "float32", [4])
    empty = _core.TensorView(keep, 0, "float32", [0, 3])
    assert np.asarray(empty).shape == (0, 3) and empty.data_ptr == 0
    v = _core.TensorView(keep, keep.ctypes.data, "float32", [2, 2])
    np.asarray(v)[1, 1] = 3.0
    assert keep[3] == 3.0
    with pytest.raises(TypeError, match="DLPack"):
        _core.TensorView._from_dlpack(object(), keep)


@pytest.mark.parametrize("place_name", PLACES)
def test_scope_tensor_view_is_the_weight(place_name: str) -> None:
    with probe_mode(static=True):
        check_scope_tensor_view(place_name)


def check_scope_tensor_view(place_name: str) -> None:
    place = paddle.CPUPlace() if place_name == "cpu" else paddle.CustomPlace("ipu", 0)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [2, 3], "float32")
        y = paddle.nn.Linear(3, 4)(x)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        exe = paddle.static.Executor(place)
        exe.run(startup)
        names = list(main.get_all_parameter_values())
        weight = next(n for n in names if n.endswith(".w_0"))
        bias = next(n for n in names if n.endswith(".b_0"))
        tensor = scope.find_var(weight).get_tensor()
        v = view(tensor)
        assert v.shape == (3, 4) and v.dtype == "float32" and v.data_ptr == tensor._ptr()
        np.asarray(v)[...] = 0.5
        np.asarray(view(scope.find_var(bias).get_tensor()))[...] = 1.0
        (out,) = exe.run(main, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[y])
        np.testing.assert_allclose(out, np.full((2, 4), 2.5, np.float32))
    del tensor, scope, exe
    gc.collect()
    # The scope is gone; the view still holds the weight's memory.
    np.testing.assert_array_equal(np.asarray(v), np.full((3, 4), 0.5, np.float32))


def test_onnxruntime_reads_and_writes_through_views(eager: None) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = paddle.arange(6, dtype="float32").cpu().reshape([2, 3])
    b = paddle.full([2, 3], 10.0).cpu()
    c = paddle.zeros([2, 3]).cpu()
    io = sess.io_binding()
    # Input: an OrtValue over the numpy array that shares the tensor's memory.
    a_val = ort.OrtValue.ortvalue_from_numpy(as_numpy(a, readonly=True))
    assert a_val.data_ptr() == a.data_ptr()
    io.bind_ortvalue_input("a", a_val)
    bv, cv = view(b, readonly=True), view(c)
    io.bind_input("b", "cpu", 0, np.float32, list(bv.shape), bv.data_ptr)
    # Output: ORT writes straight into the Paddle tensor.
    io.bind_output("c", "cpu", 0, np.float32, list(cv.shape), cv.data_ptr)
    sess.run_with_iobinding(io)
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) + 10)


def test_exported_capsule_shares_a_read_only_array_and_lets_it_go() -> None:
    """paddle_api.dense_from_array: the compiled core's DLPack capsule (every Paddle
    3.x takes it) shares a read-only array, and Paddle freeing the tensor releases it."""
    import gc
    import sys

    from paddle_ipu._internals import paddle_api

    arr = np.arange(6, dtype=np.float32)
    arr.flags.writeable = False
    before = sys.getrefcount(arr)
    dense = paddle_api.dense_from_array(arr)
    assert paddle_api.data_ptr(dense) == arr.ctypes.data
    assert np.asarray(dense).tolist() == arr.tolist()
    assert sys.getrefcount(arr) == before + 1
    del dense
    gc.collect()
    assert sys.getrefcount(arr) == before


def test_dlpack_capsule_shares_read_only_buffers_until_released() -> None:
    import sys

    from paddle_ipu._internals import paddle_api

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.flags.writeable = False  # numpy before 2.1 exports no read-only array itself
    refs = sys.getrefcount(a)
    capsule = _core.export_dlpack(a)
    assert sys.getrefcount(a) == refs + 1  # the capsule holds the buffer
    dense = paddle_api.dense_from_dlpack(capsule)
    assert paddle_api.data_ptr(dense) == a.ctypes.data
    np.testing.assert_array_equal(np.array(dense), a)
    del dense, capsule
    assert sys.getrefcount(a) == refs  # Paddle's release ran the deleter
    # an unconsumed capsule releases the buffer when it goes
    unused = _core.export_dlpack(a)
    del unused
    assert sys.getrefcount(a) == refs
    for dtype in ("float16", "float64", "int32", "int64", "uint8", "bool"):
        b = np.ones((2, 3), dtype=dtype)
        np.testing.assert_array_equal(
            np.array(paddle_api.dense_from_dlpack(_core.export_dlpack(b))), b
        )


def test_dlpack_capsule_refuses_what_dlpack_cannot_carry() -> None:
    with pytest.raises(ValueError, match="not C-contiguous"):
        _core.export_dlpack(np.arange(6.0)[::2])
    with pytest.raises(TypeError, match="format"):
        _core.export_dlpack(np.zeros(2, dtype=np.complex64))
