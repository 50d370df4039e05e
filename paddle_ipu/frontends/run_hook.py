"""The one patch of a Paddle entry point: ``paddle.static.Executor.run``.

``import paddle_ipu`` installs it; :func:`uninstall` puts Paddle's own method back.
It changes what ``exe.run`` does in two cases only, and passes every other call to
Paddle unchanged:

- a program returned by ``IpuCompiledProgram.compile`` runs straight on its IPU
  executor (``PADDLE_IPU_DIRECT_RUN=0`` sends it through Paddle's executor, which
  adds about 0.3 ms a call and turns the op's exceptions into a bare
  ``SystemError``: the op's own exception is raised instead); its 0-d results also
  answer ``len()`` and ``[0]``, as the ``[1]``-shaped scalars of Paddle 2.x's IPU
  backend did (see :func:`_sized`);
- a plain static program run on the ``ipu`` place is compiled implicitly as one
  whole graph (see :mod:`paddle_ipu.frontends.implicit`; ``PADDLE_IPU_IMPLICIT_COMPILE=0``
  turns that off).

Before Paddle 3.3 a compiled program holds no op Paddle's executor could run (see
:mod:`paddle_ipu.frontends.graph_op`): every compiled program then runs directly.

Checked on Paddle 3.0.0, 3.1.1, 3.2.2, 3.3.0 and 3.3.1, whose ``Executor.run`` has the
signature
``run(program, feed, fetch_list, feed_var_name, fetch_var_name, scope,
return_numpy, use_program_cache, use_prune)``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from paddle_ipu._internals import paddle_logs
from paddle_ipu._util.arrays import sized_scalar
from paddle_ipu._util.env import env_flag

_lock = threading.Lock()
_original: Any = None

# Executor.run's parameters after fetch_list, in order.
_RUN_PARAMS = (
    "feed_var_name",
    "fetch_var_name",
    "scope",
    "return_numpy",
    "use_program_cache",
    "use_prune",
)


#: Executor.run's options a compiled program runs directly with (the others go through
#: Paddle's executor)
_DIRECT_OPTIONS = frozenset(
    {"return_numpy", "use_program_cache", "feed_var_name", "fetch_var_name"}
)


def installed() -> bool:
    return _original is not None


def install() -> None:
    """Route ``paddle.static.Executor.run`` through paddle_ipu (idempotent)."""
    global _original
    with _lock:
        if _original is not None:
            return
        import paddle

        original = paddle.static.Executor.run

        @functools.wraps(original)
        def run(
            self: Any,
            program: Any = None,
            feed: Any = None,
            fetch_list: Any = None,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            compiled = (
                getattr(program, "ipu_compiled_program", None) if program is not None else None
            )
            if compiled is not None:
                paddle_logs.quiet_paddle()
                return _run_compiled(original, self, program, feed, fetch_list, args, kwargs)
            options = dict(zip(_RUN_PARAMS, args))
            options.update(kwargs)
            from paddle_ipu.frontends import fetch_names, implicit

            if fetch_names.resolve_on_run():
                # 2.x scripts fetch by names Paddle's PIR executor refuses
                # (paddle_ipu.frontends.fetch_names).
                fetch_list = fetch_names.resolve_fetches(
                    program if program is not None else _default_main(), fetch_list
                )
            if implicit.targets(self, program):
                paddle_logs.quiet_paddle()
                return implicit.run(
                    original, self, program, feed, fetch_list, options, args, kwargs
                )
            return original(self, program, feed, fetch_list, *args, **kwargs)

        run.__paddle_ipu_original__ = original  # type: ignore[attr-defined]
        paddle.static.Executor.run = run  # type: ignore[method-assign]
        _original = original


def _ir_of(compiled: Any) -> Any:
    """The runnable program is PIR: Paddle's executor runs it in PIR mode only (a
    legacy-IR program's compiled form, run from legacy mode)."""
    if getattr(compiled, "_legacy", False):
        from paddle_ipu.compiler.legacy_reader import pir_mode

        return pir_mode()
    import contextlib

    return contextlib.nullcontext()


def _default_main() -> Any:
    import paddle

    return paddle.static.default_main_program()


def uninstall() -> None:
    """Give ``paddle.static.Executor.run`` back its own method."""
    global _original
    with _lock:
        if _original is None:
            return
        import paddle

        paddle.static.Executor.run = _original  # type: ignore[method-assign]
        _original = None


def _sized(value: Any) -> Any:
    """A 0-d result that 2.x code can also use as the ``[1]``-shaped array Paddle 2.x's
    IPU backend returned for a scalar (a mean, a loss, the dot product of two vectors):
    ``len()`` is 1 and ``[0]`` is the value, while it stays 0-d for Paddle 3 code
    (``float(x)``, ``x.shape == ()``).  See :class:`paddle_ipu._util.arrays.SizedScalar`;
    only the results of a program compiled by ``IpuCompiledProgram.compile`` (the 2.x
    API) are given this view."""
    return sized_scalar(value)


def _run_compiled(
    original: Any,
    exe: Any,
    program: Any,
    feed: Any,
    fetch_list: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    compiled = program.ipu_compiled_program
    # Every fetch is resolved before anything runs: an item that was not compiled
    # raises FetchError listing what can be fetched (Paddle would return another
    # tensor, or fail with a message about fetch ops).
    index = compiled.fetch_index(fetch_list)
    if args or kwargs:
        options = dict(zip(_RUN_PARAMS, args))
        options.update(kwargs)
        simple = set(options) <= _DIRECT_OPTIONS and options.get("return_numpy", True)
    else:  # exe.run(prog, feed, fetch_list): the common call, checked for nothing more
        options, simple = {}, True
    if simple and env_flag("PADDLE_IPU_DIRECT_RUN", True):
        outs = compiled.run(dict(feed or {}))
        return [_sized(outs[i]) for i in index]
    from paddle_ipu._internals import paddle_api

    if paddle_api.python_ops() is None:
        return _run_without_paddle(compiled, feed, index, options)
    executor = compiled.require_executor()
    # Paddle's executor fails on unknown or missing feeds with its own errors
    # before the op runs: check the names first.
    executor.check_feed_names(feed or {})
    names = compiled.fetch_names_for(index)
    try:
        # Paddle's executor crashes when threads run one program at once: one at a time.
        with compiled.paddle_run_lock, _ir_of(compiled):
            return [_sized(v) for v in original(exe, program, feed, names, *args, **kwargs)]
    except SystemError as exc:
        error = getattr(executor, "last_error", None)
        if error is not None:
            executor.last_error = None
            raise error from exc
        raise


def _run_without_paddle(
    compiled: Any, feed: Any, index: list[int], options: dict[str, Any]
) -> list[Any]:
    """Paddle before 3.3 has no PIR Python op, so a compiled program cannot run through
    Paddle's executor: it runs directly whatever the options (a scope or use_prune
    changes nothing for a compiled program), and ``return_numpy=False`` gets CPU
    DenseTensors as Paddle's executor returns them."""
    outs = compiled.run(dict(feed or {}))
    picked = [outs[i] for i in index]
    if options.get("return_numpy", True):
        return [_sized(v) for v in picked]
    import paddle
    from paddle.base import core

    tensors = []
    for array in picked:
        tensor = core.DenseTensor()
        tensor.set(array, paddle.CPUPlace())
        tensors.append(tensor)
    return tensors
