"""Paddle 2.x's IPU names after ``import paddle_ipu`` (paddle_ipu.compat).

Import-time state matters here, so each check runs in a fresh interpreter: stock
Paddle first (the oracle for "raises"), then the same names after the import,
then after ``paddle_ipu.compat.disable()``.
"""

from __future__ import annotations

import json

import pytest
from support.helpers import run_python

# Every name the compat layer replaces, probed the way a 2.x script uses it.
_PROBE = r"""
import json, paddle
def probe():
    out = {}
    def attempt(key, fn):
        try:
            value = fn()
            out[key] = ["ok", repr(value)[:80]]
        except Exception as exc:
            out[key] = ["raises", type(exc).__name__, str(exc)[:200]]
    attempt("IpuStrategy", lambda: paddle.static.IpuStrategy())
    attempt("base.IpuStrategy", lambda: paddle.base.IpuStrategy())
    attempt("IpuCompiledProgram", lambda: paddle.static.IpuCompiledProgram())
    def guard():
        with paddle.static.ipu_shard_guard(index=0):
            pass
    attempt("ipu_shard_guard", guard)
    attempt("set_ipu_shard", lambda: paddle.static.set_ipu_shard(lambda: 1, index=0)())
    def place(key, cls):
        # Paddle 3.0's own IPUPlace (a CPU build) exits the process instead of raising
        if paddle.__version__.startswith("3.0.") and not cls.__module__.startswith("paddle_ipu"):
            out[key] = ["raises", "SystemExit", "Paddle 3.0 exits in IPUPlace()"]
        else:
            attempt(key, cls)
    place("IPUPlace", paddle.IPUPlace)
    place("device.IPUPlace", paddle.device.IPUPlace)
    place("framework.IPUPlace", paddle.framework.IPUPlace)
    attempt("is_compiled_with_ipu", lambda: paddle.is_compiled_with_ipu())
    attempt("device.is_compiled_with_ipu", lambda: paddle.device.is_compiled_with_ipu())
    attempt("core.is_compiled_with_ipu", lambda: paddle.base.core.is_compiled_with_ipu())
    attempt("IpuBackend", lambda: paddle.framework.core.IpuBackend.get_instance())
    main = paddle.static.Program()
    with paddle.static.program_guard(main, paddle.static.Program()):
        x = paddle.static.data("x", [2], "float32")
        y = paddle.nn.functional.relu(x)
        attempt("value.name", lambda: y.name)
    return out
paddle.enable_static()
"""


def _run(code: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    base = {"PADDLE_IPU_AUTOLOAD": "0"}
    base.update(env or {})
    result = run_python(_PROBE + code, env=base)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


REPLACED = [
    "IpuStrategy",
    "base.IpuStrategy",
    "IpuCompiledProgram",
    "ipu_shard_guard",
    "set_ipu_shard",
    "IPUPlace",
    "device.IPUPlace",
    "framework.IPUPlace",
    "IpuBackend",
    "value.name",
]


@pytest.mark.slow
def test_stock_raises_import_replaces_disable_restores() -> None:
    out = _run(
        "stock = probe()\n"
        "import paddle_ipu\n"
        "after = probe()\n"
        "import paddle_ipu.compat\n"
        "paddle_ipu.compat.disable()\n"
        "restored = probe()\n"
        "print(json.dumps({'stock': stock, 'after': after, 'restored': restored}))\n"
    )
    stock, after, restored = out["stock"], out["after"], out["restored"]  # type: ignore[call-overload]
    # The oracle: stock Paddle 3 raises for every replaced name...
    for key in REPLACED:
        assert stock[key][0] == "raises", (key, stock[key])
    assert stock["is_compiled_with_ipu"] == ["ok", "False"]
    # ...after the import each one works,
    for key in REPLACED:
        assert after[key][0] == "ok", (key, after[key])
    assert after["is_compiled_with_ipu"] == ["ok", "True"]
    assert after["device.is_compiled_with_ipu"] == ["ok", "True"]
    assert "Place(ipu:0)" in after["IPUPlace"][1]
    # ...Paddle's internal flag is left alone (its C++ IPU branches must stay off),
    assert after["core.is_compiled_with_ipu"] == ["ok", "False"]
    # ...and disable() gives back exactly what stock Paddle did.
    assert restored == stock


def test_compat_off_by_env() -> None:
    out = _run("import paddle_ipu\nprint(json.dumps(probe()))\n", env={"PADDLE_IPU_COMPAT": "0"})
    assert out["IpuStrategy"][0] == "raises"
    assert out["is_compiled_with_ipu"] == ["ok", "False"]
    assert out["value.name"][0] == "raises"


def test_disable_restores_identity() -> None:
    result = run_python(
        "import paddle\n"
        "before = (paddle.static.IpuStrategy, paddle.IPUPlace, paddle.is_compiled_with_ipu,\n"
        "          paddle.static.ipu_shard_guard, paddle.pir.Value.__dict__['name'])\n"
        "import paddle_ipu, paddle_ipu.compat as c\n"
        "assert paddle.static.IpuStrategy is c.IpuStrategy\n"
        "c.disable()\n"
        "after = (paddle.static.IpuStrategy, paddle.IPUPlace, paddle.is_compiled_with_ipu,\n"
        "         paddle.static.ipu_shard_guard, paddle.pir.Value.__dict__['name'])\n"
        "assert all(a is b for a, b in zip(before, after)), (before, after)\n"
        "assert not hasattr(paddle.base.core, 'IpuBackend')\n"
        "c.install(); assert paddle.static.IpuStrategy is c.IpuStrategy\n"
        "print('ok')\n",
        env={"PADDLE_IPU_AUTOLOAD": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
