from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import paddle
import pytest


@pytest.fixture
def static_mode() -> Iterator[None]:
    """Run the test in static-graph mode with fresh programs and scope."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        yield
    paddle.disable_static()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _static_graph_mode() -> Iterator[None]:
    """Every test starts in static-graph mode (what IPU programs are built in),
    whatever the test before it left; use the ``dygraph`` fixture to leave it."""
    paddle.enable_static()
    yield
    paddle.enable_static()


@pytest.fixture(autouse=True)
def _no_dy2static_patch_left() -> Iterator[None]:
    """An IpuStrategy made in dygraph mode registers Paddle 2.x's dy2static patch (as
    in 2.x); no test hands it on to the next."""
    yield
    from paddle_ipu.frontends import dy2static as dygraph

    if dygraph.patch_registered():
        dygraph.release_patch()


@pytest.fixture
def dygraph() -> Iterator[None]:
    """Run the test in dygraph mode."""
    paddle.disable_static()
    yield
    paddle.enable_static()
