"""The host tail of a package: the data-dependent operators after the compiled graph.

A saved model whose outputs have data-dependent sizes (a detector ending in
``multiclass_nms3``) is compiled up to its first data-dependent operator; the rest
(:mod:`paddle_ipu.compiler.tail`) is a small PIR program the package keeps
(``tail.json``).  :class:`HostTail` runs it with Paddle's CPU kernels (a CPU
``paddle.static.Executor``) on the compiled graph's outputs and the request's feeds,
in a scope of its own: the process's dynamic or static mode, default place and global
scope are the same afterwards.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu._util import dtypes
from paddle_ipu.compiler.tail import COMPILED_PREFIX
from paddle_ipu.errors import PackageError
from paddle_ipu.executor import feeds

__all__ = ["HostTail"]


class HostTail:
    """The tail program (``program``: a saved PIR ``.json``), its feeds
    (``paddle_ipu_compiled_<i>``: the compiled graph's output ``i``; any other name: the
    model's feed) and the model's outputs (name, dtype, declared shape)."""

    def __init__(
        self,
        program: bytes,
        feeds: Sequence[str],
        outputs: Sequence[tuple[str, str, Sequence[int]]],
        ops: Sequence[str] = (),
        note: str = "",
    ) -> None:
        self.program = bytes(program)
        self.feeds = list(feeds)
        self.outputs = [(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in outputs]
        self.ops = list(ops)
        #: which operators run on the host and why (the compile log's line)
        self.note = note
        self._loaded: tuple[Any, dict[str, np.dtype], dict[str, tuple[int, ...]]] | None = None
        self._lock = threading.Lock()
        #: seconds spent in the tail's runs, and how many (for the docs' measurement)
        self.seconds = 0.0
        self.runs = 0

    @property
    def output_names(self) -> list[str]:
        return [name for name, _, _ in self.outputs]

    def to_json(self) -> dict[str, Any]:
        return {
            "feeds": self.feeds,
            "outputs": [[n, d, list(s)] for n, d, s in self.outputs],
            "ops": self.ops,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, meta: Mapping[str, Any], program: bytes) -> HostTail:
        try:
            outputs = [(str(n), str(d), tuple(s)) for n, d, s in meta["outputs"]]
            feeds = [str(f) for f in meta["feeds"]]
            return cls(program, feeds, outputs, meta.get("ops", []), str(meta.get("note", "")))
        except (KeyError, TypeError, ValueError) as exc:
            raise PackageError(f"the package's host tail is not readable: {exc}") from exc

    def _load(self) -> tuple[Any, dict[str, np.dtype], dict[str, tuple[int, ...]]]:
        if self._loaded is not None:
            return self._loaded
        import paddle

        from paddle_ipu._internals import paddle_api
        from paddle_ipu.compiler.compile import static_mode

        scope = paddle.static.Scope()
        with tempfile.TemporaryDirectory(prefix="paddle_ipu_tail_") as directory:
            prefix = os.path.join(directory, "tail")
            with open(prefix + ".json", "wb") as f:
                f.write(self.program)
            with static_mode(), paddle.static.scope_guard(scope):
                exe = paddle.static.Executor(paddle.CPUPlace())
                program, feeds, fetches = paddle.static.load_inference_model(prefix, exe)
        # one runner: it keeps the program's interpreter between runs
        runner = paddle_api.CachedProgramRunner(exe, program, list(fetches), scope)
        data = {
            str(op.attrs()["name"]): op.result(0)
            for op in program.global_block().ops
            if op.name() == "pd_op.data"
        }
        # the dtype each feed is declared with (the compiled graph may hand an integer
        # value over in another width, as the IPU computes it)
        wanted = {str(f): np.dtype(dtypes.name_of(data[str(f)].dtype)) for f in feeds}
        # and the shape (-1: open); Paddle's executor does not check a feed's shape,
        # and its kernels can crash on one they do not expect
        shapes = {str(f): tuple(int(d) for d in data[str(f)].shape) for f in feeds}
        self._loaded = (runner, wanted, shapes)
        return self._loaded

    def run(
        self, feed: Mapping[str, Any], compiled_outputs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The model's outputs: the tail run on ``compiled_outputs`` (the compiled
        graph's, in order) and ``feed`` (the request's)."""
        from paddle_ipu.compiler.compile import static_mode

        given: dict[str, np.ndarray] = {}
        for name in self.feeds:
            if name.startswith(COMPILED_PREFIX):
                given[name] = np.asarray(compiled_outputs[int(name[len(COMPILED_PREFIX) :])])
            elif name in feed:
                given[name] = np.asarray(feed[name])
            else:
                raise PackageError(
                    f"the package's host tail reads feed {name!r}, which the request does "
                    f"not give (it gives {sorted(feed)}) and the compiled graph does not take"
                )
        with self._lock:
            runner, names, shapes = self._load()
            start = time.perf_counter()
            # (np.ascontiguousarray would make a 0-d value [1])
            feed_ = {n: np.asarray(given[n], dtype, order="C") for n, dtype in names.items()}
            for name, value in feed_.items():
                feeds.check_tail_input(name, value.shape, shapes[name], COMPILED_PREFIX)
            if runner.fast:  # Paddle's cached interpreter: in either mode, as it is
                out = runner.run(feed_)
            else:  # Executor.run, which wants static mode
                with static_mode():
                    out = runner.run(feed_)
            self.seconds += time.perf_counter() - start
            self.runs += 1
        return [np.asarray(o) for o in out]
