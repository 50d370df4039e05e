"""Checkpoints: a program's weights and optimizer state in one safetensors file.

``save(compiled_or_program, path)`` writes every persistable variable of the program
that has a value in the scope -- parameters, optimizer moments, beta powers, the
learning-rate variable, BatchNorm statistics -- and ``load(program, path)`` puts them
back.  Unlike ``paddle.static.save`` / ``load``:

- the write is atomic: a temporary file in the same folder, fsync, rename, fsync of
  the folder.  A process killed at any point leaves the previous checkpoint or the
  new one at ``path``, never a mixture (nor a file half written);
- the format is safetensors (a JSON header and raw little-endian arrays): loading
  runs no code from the file, unlike the pickle inside Paddle's format;
- ``load`` checks the file against the program before it changes anything: every
  name, shape and dtype, with a :class:`CheckpointError` naming the variable, what the
  program expects and what the file holds;
- the file reads back into any program with the same variables: the IPU-compiled one,
  or the plain program on Paddle's CPU executor.

Given an :class:`IpuCompiledProgram` (or the program its ``compile()`` returned),
``save`` first copies the device's weights and optimizer state into the scope
(``weights_to_host``) and ``load`` sends the loaded values to the device
(``weights_from_host``).

A program compiled with ``enable_distribution`` is one instance of a data-parallel job
(:mod:`paddle_ipu.distributed`): every instance calls ``save``, instance 0 alone writes
the file; under Paddle's launcher the instances first check that their parameters are
bitwise the same, and return once the file is written.  Every instance calls ``load``
with a path it can read (a shared folder, or a copy on each host); the device then holds
instance 0's values on every instance.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu._util import dtypes as _dtypes
from paddle_ipu._util.files import write_atomically
from paddle_ipu._version import __version__
from paddle_ipu.errors import CheckpointError

FORMAT = "paddle_ipu.checkpoint"
FORMAT_VERSION = "1"


@dataclass(frozen=True)
class _Var:
    name: str
    shape: tuple[int, ...]  # -1: any size
    dtype: str  # Paddle's name: float32, int64, bfloat16, ...


def _is_compiled(target: Any) -> bool:
    """An IpuCompiledProgram (or anything that keeps weights on a device the same way)."""
    return all(hasattr(target, a) for a in ("source_program", "scope", "weights_to_host"))


def _resolve(target: Any, scope: Any) -> tuple[Any, Any, Any]:
    """(program, scope, compiled program or None) from what the caller passed."""
    import paddle

    compiled = None
    if _is_compiled(target):
        compiled = target
    elif _is_compiled(getattr(target, "ipu_compiled_program", None)):
        compiled = target.ipu_compiled_program
    if compiled is not None:
        program = compiled.source_program
        scope = scope if scope is not None else compiled.scope
    else:
        program = target
        if not isinstance(program, paddle.static.Program):
            raise CheckpointError(
                "expected a paddle.static.Program or an IpuCompiledProgram, got "
                f"{type(target).__name__}"
            )
        scope = scope if scope is not None else paddle.static.global_scope()
    return program, scope, compiled


def _persistables(program: Any) -> dict[str, _Var]:
    out: dict[str, _Var] = {}
    for value in program.list_vars():
        if not getattr(value, "persistable", False):
            continue
        try:
            name = str(value.name)
        except Exception:  # a value without a name cannot be checkpointed by name
            continue
        shape = tuple(int(d) for d in value.shape)
        out[name] = _Var(name, shape, _dtypes.name_of(value.dtype))
    return out


def _tensor(scope: Any, name: str) -> Any:
    var = scope.find_var(name)
    if var is None:
        return None
    try:
        tensor = var.get_tensor()
    except Exception:  # not a dense tensor (readers, tensor arrays)
        return None
    return tensor if paddle_api.is_initialized(tensor) else None


def _contiguous(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns a 0-D array (the lr variable) into 1-D.
    return array if array.flags.c_contiguous else array.copy()


def _host_array(tensor: Any) -> np.ndarray:
    return _contiguous(np.array(tensor))


def save(compiled_or_program: Any, path: str | os.PathLike[str], scope: Any = None) -> str:
    """Write the program's persistable variables that have a value in ``scope``
    (default: the compiled program's scope, else the global scope) to ``path``,
    atomically.  Returns the path written."""
    program, scope, compiled = _resolve(compiled_or_program, scope)
    if compiled is not None:
        compiled.weights_to_host()
    target = os.fspath(path)
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name in sorted(_persistables(program)):
        tensor = _tensor(scope, name)
        if tensor is None:
            continue
        arrays[name] = _host_array(tensor)
        dtypes[name] = _dtypes.name_of(paddle_api.dtype_of(tensor))
    if not arrays:
        raise CheckpointError(
            f"nothing to save to {target!r}: no persistable variable of the program has a "
            "value in the scope (run the startup program first)"
        )
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "paddle_ipu_version": __version__,
        "dtypes": json.dumps(dtypes, sort_keys=True),
    }
    job = _distributed_job(compiled)
    if job is None:
        _write_atomically(target, arrays, metadata)
        return target
    from paddle_ipu import distributed

    waits = job.launcher == distributed.PADDLE
    if waits:
        # The one file stands for every instance: their parameters must agree (BatchNorm
        # statistics are per replica, as PopART keeps them, and are instance 0's).
        params = sorted(p.name for p in program.global_block().all_parameters())
        distributed.check_same(
            _digest({n: arrays[n] for n in params if n in arrays}),
            f"the parameters checkpointed to {target!r}",
        )
    if job.is_first:
        _write_atomically(target, arrays, metadata)
    if waits:
        distributed.barrier(f"the checkpoint {target!r} written by rank 0")
    return target


def _distributed_job(compiled: Any) -> Any:
    """The job of a program compiled with ``enable_distribution`` (None otherwise, or
    for a job of one)."""
    strategy = getattr(compiled, "strategy", None)
    if strategy is None or not strategy.get("enable_distribution"):
        return None
    from paddle_ipu import distributed

    job = distributed.job()
    return job if job.count > 1 else None


def _digest(arrays: dict[str, np.ndarray]) -> bytes:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        h.update(value.reshape(-1).view(np.uint8).data)
    return h.digest()


def _write_atomically(path: str, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save as st_save

    try:
        data = st_save(arrays, metadata=metadata)
    except Exception as exc:
        raise CheckpointError(f"cannot encode the checkpoint for {path!r}: {exc}") from exc
    # Like paddle.static.save, a missing folder is created.
    write_atomically(path, data, error=CheckpointError, what="checkpoint", make_dirs=True)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[Any]:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="numpy") as f:
            yield f
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path!r} does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r}: {exc.strerror or exc}") from None
    except Exception as exc:  # SafetensorError and friends: a damaged file
        raise CheckpointError(
            f"checkpoint {path!r} is not a readable safetensors file ({exc}); it may be "
            "truncated or corrupt"
        ) from None


def read(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays of a checkpoint and their Paddle dtypes, without a program."""
    target = os.fspath(path)
    with _reading(target) as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise CheckpointError(
                f"{target!r} is a safetensors file but not a paddle-ipu checkpoint "
                f"(format {meta.get('format')!r}, expected {FORMAT!r})"
            )
        try:
            dtypes = dict(json.loads(meta.get("dtypes", "{}")))
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {target!r} has a damaged header: {exc}") from None
        try:
            names = list(f.keys())  # a safetensors handle, not a dict
            arrays = {name: f.get_tensor(name) for name in names}
        except Exception as exc:
            raise CheckpointError(f"checkpoint {target!r} is truncated or corrupt: {exc}") from None
    if set(dtypes) != set(arrays):
        raise CheckpointError(
            f"checkpoint {target!r} is inconsistent: its header lists dtypes for "
            f"{sorted(set(dtypes) ^ set(arrays))} but not their values (or the reverse)"
        )
    return arrays, dtypes


def load(
    compiled_or_program: Any,
    path: str | os.PathLike[str],
    scope: Any = None,
    *,
    strict: bool = True,
) -> list[str]:
    """Load a checkpoint written by :func:`save` into ``scope`` (default: the compiled
    program's scope, else the global scope).  Returns the names loaded.

    Every variable in the file must be a persistable of the program with the same
    shape and dtype, and (``strict``) every persistable of the program that already
    has a value in the scope must be in the file; nothing is written unless all of
    them check out.  Each tensor keeps its place (CPU or ipu)."""
    program, scope, compiled = _resolve(compiled_or_program, scope)
    target = os.fspath(path)
    arrays, dtypes = read(target)
    expected = _persistables(program)
    for name in sorted(arrays):
        var = expected.get(name)
        if var is None:
            if strict:
                raise CheckpointError(
                    f"checkpoint {target!r}: variable {name!r} is not a persistable variable "
                    "of the program (load with strict=False to skip such variables)"
                )
            continue
        got = tuple(arrays[name].shape)
        if len(got) != len(var.shape) or any(e >= 0 and e != g for e, g in zip(var.shape, got)):
            raise CheckpointError(
                f"checkpoint {target!r}: variable {name!r} has shape {list(got)}, the "
                f"program expects {list(var.shape)}"
            )
        if dtypes[name] != var.dtype:
            raise CheckpointError(
                f"checkpoint {target!r}: variable {name!r} has dtype {dtypes[name]}, the "
                f"program expects {var.dtype}"
            )
        numpy_dtype = _dtypes.numpy_of(var.dtype)
        if arrays[name].dtype != numpy_dtype:
            raise CheckpointError(
                f"checkpoint {target!r}: variable {name!r} holds {arrays[name].dtype} data "
                f"for dtype {dtypes[name]}"
            )
    if strict:
        missing = sorted(
            name for name in expected if name not in arrays and _tensor(scope, name) is not None
        )
        if missing:
            raise CheckpointError(
                f"checkpoint {target!r} lacks variables of the program: {missing} (load "
                "with strict=False to keep their current values)"
            )
    loaded = [name for name in sorted(arrays) if name in expected]
    for name in loaded:
        _set(scope, name, arrays[name])
    if compiled is not None:
        compiled.weights_from_host()
    return loaded


def _set(scope: Any, name: str, array: np.ndarray) -> None:
    import paddle

    tensor = _tensor(scope, name)
    place: Any = paddle.CPUPlace()
    if tensor is not None:
        current = paddle_api.place_of(tensor)
        if current.is_custom_place():
            place = paddle.CustomPlace(current.custom_device_type(), current.custom_device_id())
        elif not current.is_cpu_place():
            place = current
    else:
        tensor = scope.var(name).get_tensor()
    tensor.set(_contiguous(array), place)
