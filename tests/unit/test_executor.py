"""Executor pieces that need no compiled program: weight conversion and the layout."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_ipu.backends.layout import StepLayout
from paddle_ipu.errors import FeedError, IpuError, OptionError
from paddle_ipu.executor.feeds import to_step_buffer
from paddle_ipu.executor.ipu_executor import _convert


def test_convert_weights_table() -> None:
    """The seed's ConvertWeights table, plus fp16 Paddle <-> fp32 device (which
    Paddle 2.x refused as Unimplemented)."""
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal(1000).astype(np.float32)
    f16 = f32.astype(np.float16)
    assert _convert(f32, np.dtype(np.float32), "w", "w") is f32
    np.testing.assert_array_equal(_convert(f32, np.dtype(np.float16), "w", "w"), f16)
    np.testing.assert_array_equal(
        _convert(f16, np.dtype(np.float32), "w", "w"), f16.astype(np.float32)
    )
    with pytest.raises(IpuError, match=r"weight 'p' .*int32 to float16"):
        _convert(np.zeros(3, np.int32), np.dtype(np.float16), "d", "p")


def test_layout_shapes_follow_popart_order() -> None:
    layout = StepLayout(3, 4, 2)
    assert layout.input_shape((5, 7)) == (3, 4, 2, 5, 7)
    assert layout.anchor_shape((5,), "ALL") == (3, 4, 2, 5)
    assert StepLayout(6, 4, 2).anchor_shape((5,), "EVERYN", 3) == (2, 4, 2, 5)
    assert layout.anchor_shape((5,), "FINAL") == (2, 5)
    assert layout.anchor_shape((5,), "SUM") == (2, 5)
    assert StepLayout(3, 1, 1).anchor_shape((5,), "FINAL") == (5,)
    with pytest.raises(OptionError):
        layout.anchor_shape((5,), "EVERYN", 2)
    with pytest.raises(OptionError):
        StepLayout(0, 1, 1)


def test_step_buffer_is_a_view_in_both_forms() -> None:
    layout = StepLayout(2, 3, 1)
    flat = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(24, 5)
    stepped = to_step_buffer(layout, "x", flat, (4, 5))
    assert stepped.shape == (2, 3, 1, 4, 5)
    assert np.shares_memory(stepped, flat)
    # micro-batch (b=1, a=2) holds rows 20..23 of the flattened feed
    np.testing.assert_array_equal(stepped[1, 2, 0], flat[20:24])
    with pytest.raises(FeedError, match=r"feed 'x': dimension 1 must be 5, received 6"):
        to_step_buffer(layout, "x", np.zeros((24, 6), np.float32), (4, 5))
