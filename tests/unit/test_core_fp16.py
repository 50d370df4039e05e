"""paddle_ipu._tensors.fp16 and the _core kernels behind it: bit-exact against numpy, every
kernel."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from paddle_ipu._tensors import fp16
from paddle_ipu._tensors.views import as_numpy
from paddle_ipu.errors import ConversionError, IpuError, TensorViewError

_core = importlib.import_module("paddle_ipu._core")

ISAS = _core.fp16_isas()
ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    previous = _core.fp16_set_isa(request.param)
    try:
        yield request.param
    finally:
        _core.fp16_set_isa(previous)


def f32(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, dtype=np.uint32).view(np.float32)


def numpy_f16_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).view(np.uint16)


def rounding_cases() -> np.ndarray:
    """Every half value, the float32 midpoints between neighbouring halves (the ties), and
    one float32 ulp either side of each: where round-to-nearest-even is decided."""
    values = ALL_HALVES.view(np.float16).astype(np.float32)
    finite = np.sort(np.unique(values[np.isfinite(values)]))
    mid_bits = (
        ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32).view(np.uint32)
    )
    bits = np.concatenate([values.view(np.uint32), mid_bits, mid_bits - 1, mid_bits + 1])
    specials = [
        0x00000000, 0x80000000, 0x00000001, 0x807FFFFF,  # zeros, float32 subnormals
        0x33000000, 0x33000001, 0xB3000000,  # 2^-25: ties to zero; just above rounds up
        0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, 0x7F7FFFFF,  # around half's max
        0x7F800000, 0xFF800000,  # inf
        0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F801FFF, 0x7FA00000, 0xFF802000,  # NaNs
    ]  # fmt: skip
    return f32(np.concatenate([bits, np.array(specials, dtype=np.uint32)]))


def test_all_halves_to_float32_bit_identical(isa: str) -> None:
    got = fp16.to_fp32(ALL_HALVES.view(np.float16))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(
        got.view(np.uint32), ALL_HALVES.view(np.float16).astype(np.float32).view(np.uint32)
    )


def test_rounding_cases_to_float16_bit_identical(isa: str) -> None:
    x = rounding_cases()
    got = fp16.to_fp16(x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got.view(np.uint16), numpy_f16_bits(x))


def test_random_bit_patterns_bit_identical(isa: str) -> None:
    bits = np.random.default_rng(7).integers(0, 1 << 32, size=200_003, dtype=np.uint64)
    x = f32(bits.astype(np.uint32))
    np.testing.assert_array_equal(fp16.to_fp16(x).view(np.uint16), numpy_f16_bits(x))
    h = bits.astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(
        fp16.to_fp32(h).view(np.uint32), h.astype(np.float32).view(np.uint32)
    )


def test_nan_stays_nan_and_signs_survive(isa: str) -> None:
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e6, -1e6], dtype=np.float32)
    h = fp16.to_fp16(x)
    assert np.isnan(h[:2]).all()
    assert list(h[2:].astype(np.float64)) == [np.inf, -np.inf, 0.0, -0.0, np.inf, -np.inf]
    assert list(np.signbit(h)) == list(np.signbit(x))


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_every_length_and_alignment(isa: str, offset: int) -> None:
    # Lengths around the 8- and 16-lane blocks exercise the scalar tails; the offset
    # makes the buffers start off the vector alignment.
    rng = np.random.default_rng(offset)
    base = rng.standard_normal(100 + offset).astype(np.float32) * 1000
    base[5] = np.float32(f32(np.array([0x7F800001]))[0])  # a signalling NaN mid-block
    for n in range(70):
        x = base[offset : offset + n]
        np.testing.assert_array_equal(fp16.to_fp16(x).view(np.uint16), numpy_f16_bits(x))
        h = x.astype(np.float16)
        np.testing.assert_array_equal(
            fp16.to_fp32(h).view(np.uint32), h.astype(np.float32).view(np.uint32)
        )


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.uint32,
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9),
        elements=st.integers(0, (1 << 32) - 1),
    )
)
def test_property_any_shape_any_bits(bits: np.ndarray) -> None:
    x = bits.view(np.float32)
    h = fp16.to_fp16(x)
    assert h.shape == x.shape
    np.testing.assert_array_equal(h.view(np.uint16), numpy_f16_bits(x))
    back = fp16.to_fp32(h)
    assert back.shape == x.shape
    np.testing.assert_array_equal(back.view(np.uint32), h.astype(np.float32).view(np.uint32))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 5000),
    threads=st.sampled_from([None, 1, 2, 3]),
    seed=st.integers(0, 2**31),
)
def test_property_inplace_round_trip(n: int, threads: int | None, seed: int) -> None:
    x = (np.random.default_rng(seed).standard_normal(n) * 100).astype(np.float32)
    buf = x.copy()
    halves = fp16.to_fp16_inplace(buf, threads=threads)
    assert halves.dtype == np.float16 and halves.shape == x.shape
    assert halves.ctypes.data == buf.ctypes.data  # a view of the same bytes, not a copy
    np.testing.assert_array_equal(halves.view(np.uint16), numpy_f16_bits(x))
    back = fp16.to_fp32_inplace(buf, threads=threads)
    assert back is buf
    np.testing.assert_array_equal(buf, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_threads_split_large_buffers_identically(isa: str, threads: int) -> None:
    # Large enough that each of up to 4 threads gets several blocks, in both the
    # out-of-place and the staged in-place schedules.
    x = np.random.default_rng(3).standard_normal(300_001).astype(np.float32)
    ref = numpy_f16_bits(x)
    np.testing.assert_array_equal(fp16.to_fp16(x, threads=threads).view(np.uint16), ref)
    buf = x.copy()
    np.testing.assert_array_equal(fp16.to_fp16_inplace(buf, threads=threads).view(np.uint16), ref)
    np.testing.assert_array_equal(
        fp16.to_fp32_inplace(buf, threads=threads), x.astype(np.float16).astype(np.float32)
    )


def test_out_is_written_and_returned() -> None:
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    out16 = np.empty(24, dtype=np.float16)
    res = fp16.to_fp16(x, out=out16)
    assert res is out16
    np.testing.assert_array_equal(out16, x.ravel().astype(np.float16))
    bits = np.empty((4, 6), dtype=np.uint16)  # uint16 half-bits are accepted as fp16
    fp16.to_fp16(x, out=bits)
    np.testing.assert_array_equal(bits.ravel(), out16.view(np.uint16))
    out32 = np.empty_like(x)
    assert fp16.to_fp32(bits, out=out32) is out32
    np.testing.assert_array_equal(out32, x.astype(np.float16).astype(np.float32))


def test_paddle_tensors_are_read_and_written_in_place() -> None:
    was_static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    try:
        check_paddle_tensors_in_place()
    finally:
        if was_static:
            paddle.enable_static()


def check_paddle_tensors_in_place() -> None:
    x = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    t = paddle.to_tensor(x, place=paddle.CPUPlace())
    np.testing.assert_array_equal(fp16.to_fp16(t), x.astype(np.float16))
    # The seed's ConvertWeights: the weight's own memory is reused for its halves.
    halves = fp16.to_fp16_inplace(t)
    np.testing.assert_array_equal(halves, x.astype(np.float16))
    assert as_numpy(t).ravel().view(np.uint16)[: x.size].tobytes() == halves.tobytes()
    fp16.to_fp32_inplace(t)
    np.testing.assert_array_equal(t.numpy(), x.astype(np.float16).astype(np.float32))
    out = paddle.zeros([5, 7], dtype="float16")
    fp16.to_fp16(x, out=out)
    np.testing.assert_array_equal(out.numpy(), x.astype(np.float16))


def test_bad_inputs_raise_package_errors() -> None:
    x = np.ones(8, dtype=np.float32)
    with pytest.raises(TensorViewError, match="float32"):
        fp16.to_fp16(np.ones(8))  # float64: no hidden conversion
    with pytest.raises(TensorViewError, match="C-contiguous"):
        fp16.to_fp16(np.ones(16, dtype=np.float32)[::2])
    with pytest.raises(TensorViewError, match="float16"):
        fp16.to_fp16(x, out=np.empty(8, dtype=np.float32))
    with pytest.raises(TensorViewError, match="writable"):
        ro = np.empty(8, dtype=np.float16)
        ro.flags.writeable = False
        fp16.to_fp16(x, out=ro)
    with pytest.raises(TensorViewError):
        fp16.to_fp16([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(ConversionError, match="7 elements"):
        fp16.to_fp16(x, out=np.empty(7, dtype=np.float16))
    with pytest.raises(ConversionError, match="overlaps"):
        fp16.to_fp16(x, out=x.view(np.float16)[:8])
    with pytest.raises(ConversionError, match="room"):
        fp16.to_fp32_inplace(np.ones(8, dtype=np.float16))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConversionError, match="threads"):
            fp16.to_fp16(x, threads=bad)  # type: ignore[arg-type]
    # Callers catching the built-in exceptions keep working.
    assert issubclass(TensorViewError, TypeError) and issubclass(TensorViewError, IpuError)
    assert issubclass(ConversionError, ValueError) and issubclass(ConversionError, IpuError)


def test_kernel_selection() -> None:
    assert _core.fp16_isa() in ISAS
    assert ISAS[0] == "scalar"
    with pytest.raises(ValueError, match="unknown fp16 kernel"):
        _core.fp16_set_isa("sse9")
    previous = _core.fp16_set_isa("scalar")
    try:
        assert _core.fp16_isa() == "scalar"
    finally:
        _core.fp16_set_isa(previous)
    assert _core.fp16_auto_threads(1024) == 1
