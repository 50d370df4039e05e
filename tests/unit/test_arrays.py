"""paddle_ipu._util.arrays.same_bytes: bitwise equality, at every size and word width."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_ipu._util.arrays import same_bytes


@pytest.mark.parametrize("n", [0, 1, 3, 1023, 1024, 1025, 4097, 100_001])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8", "bool"])
def test_same_bytes_finds_any_one_changed_byte(n: int, dtype: str) -> None:
    rng = np.random.default_rng(n)
    a = rng.integers(0, 2, n).astype(dtype) if dtype == "bool" else rng.random(n).astype(dtype)
    assert same_bytes(a, a.copy())
    if n:
        for position in {0, n // 2, n - 1}:
            b = a.copy()
            b.view(np.uint8)[position * a.itemsize] ^= 1
            assert not same_bytes(a, b), position


def test_same_bytes_is_bitwise_not_by_value() -> None:
    assert not same_bytes(np.zeros(3, np.float32), -np.zeros(3, np.float32))
    nan = np.full(5000, np.nan, np.float32)
    assert same_bytes(nan, nan.copy())
    assert not same_bytes(np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32))
    assert not same_bytes(np.zeros(4, np.float32), np.zeros(4, np.int32))
    strided = np.arange(20, dtype=np.float32)[::2]
    assert same_bytes(strided, np.ascontiguousarray(strided))


def test_sized_scalar_is_0d_and_reads_as_a_1_element_array() -> None:
    """A 0-d result for Paddle 3 code (float(), shape ()) that Paddle 2.x code can also
    index and measure as the [1]-shaped scalar 2.x's IPU backend returned."""
    from paddle_ipu._util.arrays import sized_scalar

    x = sized_scalar(np.array(2.5, np.float32))
    assert x.shape == () and float(x) == 2.5 and float(x + 1) == 3.5
    assert len(x) == 1 and x[0] == 2.5 and x[-1] == 2.5 and list(x) == [2.5]
    with pytest.raises(IndexError):
        x[1]
    assert np.array([x]).shape == (1,)  # a list of results stacks as 0-d ones do
    np.testing.assert_allclose(np.asarray(x).reshape(1), [2.5])
    vector = np.arange(3.0)
    assert sized_scalar(vector) is vector
