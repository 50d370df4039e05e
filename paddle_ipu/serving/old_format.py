"""The oldest saved inference format: a ``__model__`` file and one file per parameter.

Paddle 1.x and 2.x's ``save_inference_model(dirname, ...)`` wrote a directory: the
program as ``__model__`` (a ProgramDesc protobuf) and each parameter in a file named
after it, or with ``params_filename`` every parameter in one file (``params``,
``__params__``, any name); ``model_filename`` could rename ``__model__`` too.  Stock
Paddle 3.3.1 still runs such a model: ``paddle.inference.Config(model_dir)`` (or
``Config(prog_file, params_file)`` for the combined form), and
``paddle.static.load_inference_model(dirname, exe, model_filename=...,
params_filename=...)`` in the legacy IR (its PIR mode only reads ``.json``).

:func:`saved_prefix` loads such a model that way -- Paddle's own loader, in the legacy IR
and a scope of its own -- and saves it again with ``save_inference_model`` as the
``prefix.pdmodel`` + ``prefix.pdiparams`` pair every other route of paddle-ipu reads
(compiled through its PIR translation, as any legacy ``.pdmodel``).  The copy is made
once per model content in this process, in a private temporary directory removed at
exit; the variables keep their names, shapes and LoD levels.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from paddle_ipu.errors import CompileError

__all__ = ["MODEL_FILE", "find_model", "is_old_format", "resolve", "saved_prefix"]

#: the program file's name in a model directory of the oldest format
MODEL_FILE = "__model__"

_lock = threading.Lock()
_copies: dict[str, str] = {}
_root: str | None = None


def find_model(directory: str | os.PathLike[str]) -> Path | None:
    """The ``__model__`` file of a model directory of the oldest format, or None."""
    candidate = Path(directory) / MODEL_FILE
    return candidate if candidate.is_file() else None


def is_old_format(model_file: str | os.PathLike[str]) -> bool:
    """Whether ``model_file`` is a program file of the oldest format: not ``.json`` or
    ``.pdmodel`` (``__model__``, or a name ``model_filename`` gave it) and a protobuf,
    not JSON."""
    path = Path(model_file)
    if path.suffix in (".json", ".pdmodel") or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(1)[:1] not in (b"{", b"")


def _directory() -> str:
    global _root
    if _root is None:
        _root = tempfile.mkdtemp(prefix="paddle_ipu_old_format_")
        atexit.register(shutil.rmtree, _root, True)
    return _root


def _digest(model_file: Path, params: Path | None) -> str:
    h = hashlib.sha256()
    files = [model_file]
    if params is not None:
        files.append(params)
    else:  # one file per parameter, beside the program
        files += sorted(p for p in model_file.parent.iterdir() if p.is_file() and p != model_file)
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:32]


def saved_prefix(model_file: str | os.PathLike[str], params_file: str | None = None) -> str:
    """The model of ``model_file`` (``__model__`` or another name of the oldest format)
    and its parameters (``params_file``: one combined file; None: one file per parameter
    beside the program), saved again as ``prefix.pdmodel`` + ``prefix.pdiparams``; returns
    the prefix (see the module docstring)."""
    import paddle

    from paddle_ipu.compiler.compile import static_mode

    program_file = Path(model_file)
    params = Path(params_file) if params_file else None
    if params is not None and params.parent != program_file.parent:
        raise CompileError(
            f"the model file {str(program_file)!r} and the parameters file {str(params)!r} "
            "of a model in the oldest format must be in one directory (Paddle's loader "
            "reads both from it)"
        )
    key = _digest(program_file, params)
    with _lock:
        found = _copies.get(key)
        if found is not None:
            return found
        prefix = os.path.join(_directory(), key, "inference")
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        try:
            with static_mode(), paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(scope):
                program, feeds, fetches = paddle.static.load_inference_model(
                    str(program_file.parent),
                    exe,
                    model_filename=program_file.name,
                    params_filename=params.name if params is not None else None,
                )
                block = program.global_block()
                paddle.static.save_inference_model(
                    prefix,
                    [block.var(name) for name in feeds],
                    list(fetches),
                    exe,
                    program=program,
                )
        except Exception as exc:
            where = f"the parameters file {str(params)!r}" if params else "a file per parameter"
            raise CompileError(
                f"cannot load the model {str(program_file)!r} (the oldest saved format: a "
                f"program file and {where}) with Paddle's loader: {type(exc).__name__}: "
                f"{str(exc).strip()[:600]}"
            ) from exc
        finally:
            scope.erase(scope.local_var_names())
        _copies[key] = prefix
        return prefix


def resolve(path: str) -> str:
    """``path`` as a saved model prefix: a model directory of the oldest format saved
    again (:func:`saved_prefix`), anything else as it is."""
    found = find_model(path) if os.path.isdir(path) else None
    return saved_prefix(found) if found is not None else path
