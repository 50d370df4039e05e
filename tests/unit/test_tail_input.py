"""The shapes a package's host tail is handed (executor/feeds.check_tail_input): a value
the compiled graph computes once per run (a decoder's step count, without the batch
dimension) arrives as several when a request was split into micro-batches, and Paddle's
executor would run its kernels on it unchecked (a 0-d bound given as [2] crashed the
process in a slice)."""

from __future__ import annotations

import pytest

from paddle_ipu.errors import FeedError
from paddle_ipu.executor.feeds import check_tail_input


def test_the_declared_shapes_pass_with_open_dimensions() -> None:
    check_tail_input("paddle_ipu_compiled_0", (), (), "paddle_ipu_compiled_")
    check_tail_input("paddle_ipu_compiled_1", (3, 501, 50), (-1, 501, 50), "paddle_ipu_compiled_")
    check_tail_input("scale_factor", (2, 2), (-1, 2), "paddle_ipu_compiled_")


@pytest.mark.parametrize(
    ("name", "got", "declared", "what"),
    [
        ("paddle_ipu_compiled_0", (2,), (1,), "the compiled graph's output 0"),
        ("paddle_ipu_compiled_2", (1,), (), "the compiled graph's output 2"),
        ("scale_factor", (2, 3), (-1, 2), "feed 'scale_factor'"),
    ],
)
def test_another_shape_is_refused_naming_the_value(
    name: str, got: tuple[int, ...], declared: tuple[int, ...], what: str
) -> None:
    with pytest.raises(FeedError) as info:
        check_tail_input(name, got, declared, "paddle_ipu_compiled_")
    text = str(info.value)
    assert what in text and str(list(declared)) in text and str(list(got)) in text
    assert "exactly one run's rows" in text
