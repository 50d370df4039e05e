"""Shape buckets (paddle_ipu.executor.shapes): their declaration, the bucket a request
fits in, the padding, the seeds from declared shapes and ranges, and the policy's
round trip through a package's JSON -- against numpy and the declarations themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paddle_ipu.errors import OptionError
from paddle_ipu.executor.shapes import ShapeBuckets, ShapePolicy

DECLARED = {"x": (-1, 3, -1, -1)}


def test_a_request_fits_the_smallest_bucket_that_holds_it_or_keeps_its_size() -> None:
    buckets = ShapeBuckets.parse({"x": {"2": [8, 16], 3: {"min": 8, "max": 24, "step": 8}}})
    assert buckets.grids == {"x": {2: (8, 16), 3: (8, 16, 24)}}
    assert buckets.fit({"x": (2, 3, 5, 9)}) == {"x": (2, 3, 8, 16)}
    assert buckets.fit({"x": (1, 3, 16, 24)}) == {"x": (1, 3, 16, 24)}
    assert buckets.fit({"x": (1, 3, 17, 30)}) == {"x": (1, 3, 17, 30)}  # past the grids
    policy = ShapePolicy(DECLARED).with_buckets(buckets)
    assert policy.route({"x": (4, 3, 7, 17)}) == ("x=3x8x24", {"x": (4, 3, 8, 24)})


def test_padding_is_the_pad_value_or_the_edge_at_the_end_of_each_axis() -> None:
    x = np.arange(2 * 3 * 2 * 3, dtype=np.float32).reshape(2, 3, 2, 3)
    target = {"x": (2, 3, 4, 5)}
    constant = ShapeBuckets.parse({"x": {2: [4], 3: [5]}}, {"x": -2.0}).pad({"x": x}, target)
    want = np.full((2, 3, 4, 5), -2.0, np.float32)
    want[:, :, :2, :3] = x
    np.testing.assert_array_equal(constant["x"], want)
    edge = ShapeBuckets.parse({"x": {2: [4], 3: [5]}}, {"x": "edge"}).pad({"x": x}, target)
    np.testing.assert_array_equal(edge["x"], np.pad(x, [(0, 0), (0, 0), (0, 2), (0, 2)], "edge"))


def test_bad_declarations_are_refused_by_name() -> None:
    with pytest.raises(OptionError, match=r"of 'x', axis 2: expected ascending sizes"):
        ShapeBuckets.parse({"x": {2: [16, 8]}})
    with pytest.raises(OptionError, match=r"\{'min', 'max', 'step'\}"):
        ShapeBuckets.parse({"x": {2: {"min": 8}}})
    with pytest.raises(OptionError, match=r"pad value of 'x' must be a number or 'edge'"):
        ShapeBuckets.parse({"x": {2: [8]}}, {"x": "white"})
    policy = ShapePolicy(DECLARED)
    with pytest.raises(OptionError, match=r"axis 1 is not an open dimension"):
        policy.with_buckets(ShapeBuckets.parse({"x": {1: [3]}}))
    with pytest.raises(OptionError, match=r"no feed 'y'"):
        policy.with_buckets(ShapeBuckets.parse({"y": {2: [8]}}))
    bounded = policy.with_ranges({"x": [[1, 3, 4, 4], [8, 3, 32, 32]]})
    with pytest.raises(OptionError, match=r"sizes \[64\] are outside the declared range 4..32"):
        bounded.with_buckets(ShapeBuckets.parse({"x": {2: [8, 64]}}))


def test_buckets_are_seeded_from_declared_shapes_and_ranges() -> None:
    shapes = [{"x": (1, 3, 736, 1280)}, {"x": (1, 3, 960, 736)}]
    seeded = ShapeBuckets.seed(DECLARED, shapes=shapes)
    assert seeded is not None and seeded.grids == {"x": {2: (736, 960), 3: (736, 1280)}}
    ranges = ShapePolicy(DECLARED).with_ranges({"x": [[1, 3, 32, 32], [1, 3, 736, 736]]}).ranges
    ladder = ShapeBuckets.seed(DECLARED, ranges=ranges)
    assert ladder is not None
    sizes = ladder.grids["x"][2]
    assert sizes[0] == 32 and sizes[-1] == 736 and all(s % 32 == 0 for s in sizes)
    assert all(b / a <= 1.25 + 32 / a for a, b in zip(sizes, sizes[1:]))
    assert ShapeBuckets.seed(DECLARED) is None


def test_the_policy_keeps_its_bounds_and_buckets_in_a_package() -> None:
    policy = ShapePolicy(DECLARED, max_specialisations=4, memory_mb=256.0).with_buckets(
        ShapeBuckets.parse({"x": {2: [8, 16]}}, {"x": "edge"})
    )
    again = ShapePolicy.from_json(policy.to_json())
    assert again == policy
    assert again.memory_bytes == 256 << 20
    with pytest.raises(OptionError, match=r"max_specialisations must be an int >= 1"):
        ShapePolicy(DECLARED, max_specialisations=0)


def test_a_repository_config_declares_the_shapes_of_a_model(tmp_path: Path) -> None:
    from paddle_ipu.serving.repository import read_config

    model = tmp_path / "det"
    model.mkdir()

    def config(doc: dict[str, Any]) -> Any:
        (model / "config.json").write_text(json.dumps(doc))
        return read_config(model)

    got = config(
        {
            "shape_buckets": {"x": {"2": [736, 1024]}},
            "pad_values": {"x": "edge"},
            "specialisation_memory_mb": 512,
            "max_specialisations": 8,
            "input_shapes": [{"x": [1, 3, 736, 736]}],
            "warmup": True,
        }
    )
    assert got.warmup and got.shapes["memory_mb"] == 512.0
    assert got.shapes["shape_buckets"].grids == {"x": {2: (736, 1024)}}
    assert got.shapes["pad_values"] == {"x": "edge"} and got.shapes["max_specialisations"] == 8
    for bad, match in (
        ({"shape_buckets": {"x": {"2": [9, 3]}}}, r"'shape_buckets' of 'x', axis 2"),
        ({"pad_values": {"x": 1}}, r"'pad_values' pads 'shape_buckets'"),
        ({"shape_buckets": "auto", "pad_values": {"x": "white"}}, r"must be a number or 'edge'"),
        ({"specialisation_memory_mb": 0}, r"'specialisation_memory_mb' must be a number >= 1"),
        ({"warmup": 1}, r"'warmup' must be true or false"),
        ({"input_shapes": {"x": [1]}}, r"'input_shapes' must be a list"),
    ):
        with pytest.raises(OptionError, match=match):
            config(bad)
