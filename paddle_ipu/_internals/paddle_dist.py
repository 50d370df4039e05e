"""PaddlePaddle's collective engine as the host backend's replicas use it (checked on 3.3.1).

The replicas of a data-parallel job on the host backend live in the processes Paddle's
launcher starts; their gradients meet in ``paddle.distributed``'s gloo process group on
the CPU.  The public collectives (``dist.all_reduce``, ``dist.broadcast``) take eager
Tensors in dygraph mode; the host backend runs in static mode and reduces one flat numpy
buffer per step.  The private interfaces, each with its probe:

- ``Group.process_group`` and its ``all_reduce(tensor, op, sync_op)`` /
  ``broadcast(tensor, src, sync_op)`` bindings (what ``dist.all_reduce`` calls), on one
  eager Tensor made once over a numpy buffer: no mode switch per step.  Fallback:
  ``dist.all_reduce`` / ``dist.broadcast`` under a dygraph guard.
- ``paddle.base.dygraph.guard``: dygraph mode for the moment ``init_parallel_env`` and
  ``paddle.utils.dlpack.from_dlpack`` need it.  Fallback: ``paddle.disable_static()``
  then ``paddle.enable_static()``.
- ``paddle.base.core.TCPStore``: clients of the job's own store (the one the process
  group met through; rank 0's process serves it) for heartbeats, barriers and the
  diagnosis of a failed collective.  No fallback.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from paddle_ipu._internals import broken, fallback_used, interface, signature_of

CHECKED_ON = "3.3.1"
_DEP = "paddlepaddle"

#: the bindings as checked (the first line of their pybind11 docstrings)
_ALL_REDUCE = (
    "all_reduce(self: paddle.base.libpaddle.ProcessGroup, tensor: object, op: "
    "paddle.base.libpaddle.ReduceOp, sync_op: bool) -> phi::distributed::ProcessGroup::Task"
)
_TCP_STORE = (
    "__init__(self: paddle.base.libpaddle.TCPStore, hostname: str, port: int, is_master: "
    "bool, world_size: int, timeout: int = 900) -> None"
)


@contextlib.contextmanager
def dygraph_mode() -> Iterator[None]:
    """Dygraph mode inside the block, whatever the caller's mode (restored after)."""
    import paddle

    if paddle.in_dynamic_mode():
        yield
        return
    guard = getattr(getattr(getattr(paddle, "base", None), "dygraph", None), "guard", None)
    if guard is not None:
        with guard():
            yield
        return
    paddle.disable_static()
    try:
        yield
    finally:
        paddle.enable_static()


@contextlib.contextmanager
def _gloo_backend() -> Iterator[None]:
    """``init_parallel_env`` picks its backend from ``PADDLE_DISTRI_BACKEND``; a
    launcher that saw the ipu device (``PADDLE_IPU_DEFAULT_DEVICE=1``) sets ``xccl``,
    which the emulated IPU's plugin has no collectives for: gloo, for that call."""
    name = "PADDLE_DISTRI_BACKEND"
    before = os.environ.get(name)
    if before not in (None, "", "gloo"):
        os.environ[name] = "gloo"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """``init_parallel_env`` writes Paddle's modified flags to stderr: Paddle's own
    lines, kept from the user unless asked for (``PADDLE_IPU_PADDLE_LOGS=1``); shown
    when it fails."""
    from paddle_ipu._internals.paddle_logs import asked_for_paddle_logs

    if asked_for_paddle_logs():
        yield
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            yield
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


def gloo_group(world: int) -> Any:
    """The job's gloo process group over all ``world`` ranks: the default group
    (``dist.init_parallel_env()``, made here when the script did not call it), or a
    gloo group beside it when the script's default group uses another backend."""
    import paddle.distributed as dist

    with dygraph_mode():
        if not dist.is_initialized():
            with _gloo_backend(), _quiet():
                dist.init_parallel_env()
        group = dist.get_group()
        if not _is_gloo(group):
            # (Paddle's stub types backend as "nccl" only; gloo is accepted)
            group = dist.new_group(list(range(world)), backend="gloo")  # type: ignore[arg-type]
    return group


def _is_gloo(group: Any) -> bool:
    pg = getattr(group, "process_group", None)
    return pg is not None and "Gloo" in type(pg).__name__


def tensor_over(array: np.ndarray) -> Any:
    """An eager CPU Tensor sharing ``array``'s memory (``paddle.utils.dlpack.from_dlpack``,
    public): a collective on it reads and writes the array.  Export each array once
    (Paddle 3.3 never frees an array ``from_dlpack`` took twice)."""
    import paddle

    with dygraph_mode():
        return paddle.utils.dlpack.from_dlpack(array)


class Collectives:
    """All-reduce (sum) and broadcast on a group, in place on eager Tensors made by
    :func:`tensor_over`, in static and dygraph mode alike."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self._pg: Any = None
        self._sum: Any = None
        pg = getattr(group, "process_group", None)
        try:
            from paddle.base import core

            ok = pg is not None and signature_of(type(pg).all_reduce) == _ALL_REDUCE
            self._sum = core.ReduceOp.SUM
        except (AttributeError, ImportError):
            ok = False
        if ok:
            self._pg = pg
        else:
            fallback_used(
                _DEP,
                "ProcessGroup.all_reduce/broadcast",
                "its binding differs from the one checked",
                "paddle.distributed.all_reduce/broadcast under a dygraph guard",
            )

    def all_reduce_sum(self, tensor: Any) -> None:
        if self._pg is not None:
            self._pg.all_reduce(tensor, self._sum, True)
            return
        import paddle.distributed as dist

        with dygraph_mode():
            dist.all_reduce(tensor, group=self.group)

    def broadcast(self, tensor: Any, src: int) -> None:
        if self._pg is not None:
            self._pg.broadcast(tensor, src, True)
            return
        import paddle.distributed as dist

        with dygraph_mode():
            dist.broadcast(tensor, src, group=self.group)


def store_endpoint() -> tuple[str, int]:
    """The job's store, where ``init_parallel_env`` finds it: ``MASTER_ADDR`` and
    ``MASTER_PORT``, else ``PADDLE_MASTER``, else the first of
    ``PADDLE_TRAINER_ENDPOINTS`` (Paddle's launcher sets ``PADDLE_MASTER``)."""
    env = os.environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        endpoint = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    else:
        endpoint = env.get("PADDLE_MASTER") or env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        from paddle_ipu.errors import DistributedError

        raise DistributedError(
            f"cannot find the job's store: expected MASTER_ADDR/MASTER_PORT, PADDLE_MASTER or "
            f"PADDLE_TRAINER_ENDPOINTS as host:port, received {endpoint!r} (start the "
            "script with python -m paddle.distributed.launch)"
        )
    return host, int(port)


def store_client(world: int, timeout_s: int = 900) -> Any:
    """A new client connection to the job's store (``core.TCPStore``): its own socket,
    so that a thread can use it beside Paddle's and the other clients.  ``add(key, n)``
    returns the counter after adding (``add(key, 0)`` reads it without waiting)."""
    import paddle

    try:
        cls = paddle.base.core.TCPStore
    except AttributeError as exc:
        raise broken(_DEP, "paddle.base.core.TCPStore", CHECKED_ON, f"is missing ({exc})") from None
    if signature_of(cls.__init__) != _TCP_STORE:
        raise broken(
            _DEP,
            "paddle.base.core.TCPStore",
            CHECKED_ON,
            f"has the signature {signature_of(cls.__init__)!r}, not the one checked",
        )
    host, port = store_endpoint()
    return cls(host, port, False, int(world), int(timeout_s))


@interface(
    _DEP,
    "ProcessGroup.all_reduce/broadcast (Group.process_group), core.ReduceOp.SUM",
    "the host backend's gradient all-reduce and weight broadcast across processes",
    "paddle.distributed.all_reduce/broadcast under a dygraph guard",
)
def _probe_collectives() -> str:
    from paddle.base import core

    assert signature_of(core.ProcessGroup.all_reduce) == _ALL_REDUCE, signature_of(
        core.ProcessGroup.all_reduce
    )
    doc = core.ProcessGroup.broadcast.__doc__ or ""
    assert "broadcast(self: paddle.base.libpaddle.ProcessGroup, tensor: object, src: int, " in doc
    assert core.ReduceOp.SUM is not None
    assert "Gloo" in core.ProcessGroupGloo.__name__
    return "the all_reduce and broadcast bindings as checked"


@interface(
    _DEP,
    "paddle.base.dygraph.guard, paddle.utils.dlpack.from_dlpack",
    "a Tensor over a numpy buffer from static mode, for the collectives",
    "paddle.disable_static() / enable_static()",
)
def _probe_tensor_over() -> str:
    import paddle

    array = np.arange(4, dtype=np.float32)
    was_dynamic = paddle.in_dynamic_mode()
    tensor = tensor_over(array)
    assert paddle.in_dynamic_mode() == was_dynamic
    with dygraph_mode():
        tensor.scale_(2.0)
    assert array.tolist() == [0.0, 2.0, 4.0, 6.0], array
    return "a Tensor sharing a numpy array's memory, made from either mode"


@interface(_DEP, "paddle.base.core.TCPStore", "heartbeats and barriers of the job's ranks")
def _probe_store() -> str:
    import socket

    import paddle

    cls = paddle.base.core.TCPStore
    assert signature_of(cls.__init__) == _TCP_STORE, signature_of(cls.__init__)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = cls("127.0.0.1", port, True, 1, 30)
    assert store.add("paddle_ipu/probe", 2) == 2
    assert store.add("paddle_ipu/probe", 0) == 2
    return "a store serves, and add() counts and reads"
