#!/usr/bin/env python
# ruff: noqa: E501  (the case table is one case a line)
"""The eager-op sweep: a named table of Paddle eager (dygraph) ops, each run on
the CPU place and on the ipu place with the same inputs, and compared.

Paddle's CPU kernels are the oracle.  On the ipu place an op without an ipu
kernel falls back to the CPU kernel (Paddle copies in, runs, copies back); the
sweep proves that, and finds the paths that do not fall back.

    python tests/e2e/eager_sweep.py --json out.json [--only name,...]
        [--family f,...] [--preload-kernels /path/libkern.so] [--list]

Every case runs in one fresh interpreter (a worker subprocess; the parent only
restarts a worker after a case crashed the interpreter or passed --timeout, and
records that case as ``crash``/``timeout``).  Per case the result is one of:

- ``ok``: same dtypes, shapes and values (integer/bool exact; float32
  rtol=atol=1e-6 unless the case says otherwise; NaN positions must agree);
- ``mismatch``: with max abs and max rel error (or the shape/dtype difference);
- ``ipu_error``: the op raised on the ipu place (exception type + first line);
- ``cpu_error``: the op raised on the CPU: the case is broken (on an older Paddle than
  the table's 3.3, it may use an API or a dtype that release lacks; ``ipu_error_type``
  then records what the ipu place raised, None when it did not);
- ``random_differs``: a random op with a fixed ``paddle.seed`` gave other numbers
  on the ipu place than on the CPU (the detail says whether the ipu place is
  reproducible on its own);
- ``wrong_place``: the values agree but an output of the ipu run is not on the
  ipu place;
- ``crash`` / ``timeout``.

A case marked ``expect_error`` is one the oracle rejects (Paddle 3.3 does not
promote float32 + int64 tensors): it is ``ok`` when the ipu raises the same error.
The summary groups the non-ok cases by cause (for errors, the kernel lookup and
the Paddle source file that raised), and records the kernels registered for the
ipu when the sweep ran, so a result says which build it measured.

Cases in the ``autograd`` family also run ``loss = sum(out.sum()); loss.backward()``
and compare the inputs' gradients.  The runner measures which of Paddle's eager
ops the sample exercises (see ``eager_ops_unswept.py``) and prints the counts.

No pytest: this is a script (the tests may import ``CASES`` and ``run_case``).
``EAGER_SWEEP_SELFTEST=1`` adds three cases that crash, hang and pass, to check
the runner's own crash/timeout handling.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
import traceback
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# ``paddle`` and ``F`` are bound by _import_paddle() in the worker; the table's
# lambdas look them up when they run, so the parent never imports paddle.
paddle: Any = None
F: Any = None


def _import_paddle(preload: str | None = None) -> int | None:
    """Import paddle; with ``preload``, load that library and call its
    ``paddle_ipu_register_kernels()`` (returns how many kernels it added)."""
    global paddle, F
    import paddle as _paddle

    paddle = _paddle
    F = _paddle.nn.functional
    if preload:
        import ctypes

        added = int(ctypes.CDLL(preload).paddle_ipu_register_kernels())
        print(f"[sweep] preloaded {preload}: {added} kernels registered", file=sys.stderr)
        return added
    return None


def ipu_kernel_names() -> list[str]:
    """Names of the phi kernels usable on the ipu: those registered for the ipu itself
    (keys ``(ipu, ...)``: the plugin's) and, marked ``*``, those Paddle registers for
    every custom device (keys ``(CUSTOM, ...)``: its stride/view kernels)."""
    from paddle.base import core

    kernels = core._get_registered_phi_kernels("all")
    own = {n for n, keys in kernels.items() if any(k.startswith("(ipu,") for k in keys)}
    generic = {n for n, keys in kernels.items() if any(k.startswith("(CUSTOM,") for k in keys)}
    return sorted(own) + sorted(f"*{n}" for n in generic - own)


# ----------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------


@dataclass
class Case:
    """One op application.

    ``inputs``: specs of the numpy inputs (see ``make_input``), built once per
    case from a seed derived from the name; each becomes
    ``paddle.to_tensor(a, place=place)`` on each place.  ``fn`` takes those
    tensors (positionally) and returns a tensor, a Python value, or a
    (nested) list/tuple of them.
    """

    name: str
    family: str
    inputs: tuple = ()
    fn: Callable[..., Any] = lambda: None
    grad: bool = False  # also backward: compare the inputs' gradients
    rtol: float | None = None
    atol: float | None = None
    random: bool = False  # random op: a mismatch is recorded as random_differs
    seed: int = 2024
    place_ok: bool = False  # an output off the ipu place is expected (x.cpu())
    expect_error: bool = False  # Paddle rejects this on the CPU: the ipu must raise the same
    note: str = ""


CASES: list[Case] = []
_NAMES: set[str] = set()


def add(name: str, family: str, inputs: Any, fn: Callable[..., Any], **kw: Any) -> None:
    if name in _NAMES:
        raise ValueError(f"duplicate case name {name!r}")
    _NAMES.add(name)
    if isinstance(inputs, str) or callable(inputs) or isinstance(inputs, np.ndarray):
        inputs = (inputs,)
    CASES.append(Case(name, family, tuple(inputs), fn, **kw))


_DT = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "b": "bool",
    "c64": "complex64",
    "c128": "complex128",
}


def make_input(spec: Any, rng: np.random.Generator) -> np.ndarray:
    """``kind[:shape[:dtype]]``; shape like ``3x4`` (empty: 0-D); dtype an
    abbreviation of ``_DT``.  Kinds: ``n`` normal, ``p`` in (0.2, 3), ``u`` in
    (-0.9, 0.9), ``z`` in (0.05, 0.95), ``g`` in (1.1, 3), ``nan`` normal with NaN
    and +-inf, ``iN`` ints in [0, N), ``sN`` ints in [-N, N), ``b`` bool, ``c``
    complex, ``spd`` symmetric positive definite (last two dims square),
    ``ar`` arange, ``perm`` a permutation, ``sorted`` sorted along the last axis.
    A callable is called with the rng; an ndarray is used as is."""
    if callable(spec):
        return np.asarray(spec(rng))
    if isinstance(spec, np.ndarray):
        return spec
    parts = spec.split(":")
    kind = parts[0]
    shape = tuple(int(d) for d in parts[1].split("x")) if len(parts) > 1 and parts[1] else ()
    dt = _DT[parts[2]] if len(parts) > 2 else None
    if kind == "n":
        a = rng.standard_normal(shape)
    elif kind == "p":
        a = rng.uniform(0.2, 3.0, shape)
    elif kind == "u":
        a = rng.uniform(-0.9, 0.9, shape)
    elif kind == "z":
        a = rng.uniform(0.05, 0.95, shape)
    elif kind == "g":
        a = rng.uniform(1.1, 3.0, shape)
    elif kind == "nan":
        a = rng.standard_normal(shape)
        flat = a.reshape(-1)
        if flat.size >= 4:
            flat[0], flat[2], flat[3] = np.nan, np.inf, -np.inf
    elif kind == "b":
        a = rng.integers(0, 2, shape).astype(bool)
        dt = dt or "bool"
    elif kind == "c":
        a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        dt = dt or "complex64"
    elif kind == "spd":
        m = rng.standard_normal(shape)
        a = m @ np.swapaxes(m, -1, -2) + shape[-1] * np.eye(shape[-1])
    elif kind == "ar":
        a = np.arange(int(np.prod(shape))).reshape(shape)
        dt = dt or "float32"
    elif kind == "perm":
        a = rng.permutation(shape[0])
        dt = dt or "int64"
    elif kind == "sorted":
        a = np.sort(rng.standard_normal(shape), axis=-1)
    elif kind[0] in "is" and kind[1:].isdigit():
        n = int(kind[1:])
        a = rng.integers(0 if kind[0] == "i" else -n, n, shape)
        dt = dt or "int64"
    else:
        raise ValueError(f"unknown input spec {spec!r}")
    return np.asarray(a).astype(dt or "float32")


def T(data: Any, dtype: Any = None) -> Any:
    """A tensor on the current device (what paddle.set_device selected)."""
    return paddle.to_tensor(data, dtype=dtype)


def _amp(f: Callable[[], Any], dtype: str, level: str) -> Any:
    with paddle.amp.auto_cast(True, level=level, dtype=dtype):
        return f()


def setitem(x: Any, idx: Any, value: Any) -> Any:
    x[idx] = value
    return x


def inplace(method: str, *args: Any, **kw: Any) -> Callable[..., Any]:
    def fn(x: Any, *rest: Any) -> Any:
        r = getattr(x, method)(*rest, *args, **kw)
        return [x, r]

    return fn


def P(name: str) -> Callable[..., Any]:
    """paddle.<name>, looked up when the case runs (dotted names allowed)."""

    def fn(*a: Any, **kw: Any) -> Any:
        obj: Any = paddle
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj(*a, **kw)

    fn.__name__ = name
    return fn


def FN(name: str, **kw: Any) -> Callable[..., Any]:
    def fn(*a: Any) -> Any:
        return getattr(F, name)(*a, **kw)

    return fn


# The table is one case a line, as a table reads best.
# fmt: off
X = "n:3x4"
X3 = "n:2x3x4"
IMG = "n:2x3x6x6"

# -- elementwise math: unary ------------------------------------------------------
UNARY = [
    ("abs", "n"), ("acos", "u"), ("acosh", "g"), ("asin", "u"), ("asinh", "n"), ("atan", "n"),
    ("atanh", "u"), ("ceil", "n"), ("cos", "n"), ("cosh", "n"), ("digamma", "p"), ("erf", "n"),
    ("erfinv", "u"), ("exp", "n"), ("expm1", "n"), ("floor", "n"), ("frac", "n"), ("i0", "n"),
    ("i0e", "n"), ("i1", "n"), ("i1e", "n"), ("lgamma", "p"), ("log", "p"), ("log10", "p"),
    ("log1p", "p"), ("log2", "p"), ("logit", "z"), ("neg", "n"), ("reciprocal", "p"),
    ("round", "n"), ("rsqrt", "p"), ("sigmoid", "n"), ("sign", "n"), ("sin", "n"),
    ("sinh", "n"), ("sqrt", "p"), ("square", "n"), ("tan", "u"), ("tanh", "n"), ("trunc", "n"),
    ("deg2rad", "n"), ("rad2deg", "n"), ("sgn", "n"), ("sinc", "n"), ("signbit", "n"),
    ("isnan", "nan"), ("isinf", "nan"), ("isfinite", "nan"), ("nan_to_num", "nan"),
    ("isneginf", "nan"), ("isposinf", "nan"), ("angle", "n"), ("conj", "n"), ("gammaln", "p"),
    ("stanh", "n"), ("positive", "n"),
]
for _n, _k in UNARY:
    add(_n, "unary", f"{_k}:3x4", P(_n))
for _n, _k in [("abs", "n"), ("exp", "n"), ("log", "p"), ("sin", "n"), ("tanh", "n"),
               ("sqrt", "p"), ("sigmoid", "n"), ("erf", "n"), ("lgamma", "p")]:
    add(f"{_n}.f64", "unary", f"{_k}:2x3x4:f64", P(_n))
# float16/bfloat16: only where Paddle's CPU kernels take them (abs, sin, tanh, ... have no
# CPU float16 kernel in Paddle 3.3: the oracle would fail)
for _n, _k in [("exp", "n"), ("floor", "n"), ("ceil", "n")]:
    add(f"{_n}.f16", "unary", f"{_k}:3x4:f16", P(_n), rtol=1e-3, atol=1e-3)
for _n, _k in [("floor", "n"), ("scale", "n")]:
    add(f"{_n}.bf16", "unary", f"{_k}:3x4", lambda x, _n=_n: getattr(paddle, _n)(x.astype("bfloat16")))
for _n in ["abs", "neg", "sign", "square"]:
    add(f"{_n}.i64", "unary", "s5:3x4:i64", P(_n))
add("abs.i32", "unary", "s5:3x4:i32", P("abs"))
add("polygamma.n1", "unary", "p:3x4", lambda x: paddle.polygamma(x, 1))
add("round.decimals", "unary", X, lambda x: paddle.round(x * 100, decimals=1))
add("logit.eps", "unary", "z:3x4", lambda x: paddle.logit(x, eps=0.1))
add("nan_to_num.args", "unary", "nan:3x4", lambda x: paddle.nan_to_num(x, nan=1.0, posinf=9.0, neginf=-9.0))
add("scale", "unary", X, lambda x: paddle.scale(x, scale=2.0, bias=0.5))
add("scale.bias_before", "unary", X, lambda x: paddle.scale(x, 3.0, 1.0, bias_after_scale=False))
add("clip", "unary", X, lambda x: paddle.clip(x, -0.5, 0.5))
add("clip.int64", "unary", "s9:3x4", lambda x: paddle.clip(x, -3, 4))
add("pow.scalar", "unary", "p:3x4", lambda x: paddle.pow(x, 2.5))
add("increment", "unary", "n:1", lambda x: paddle.increment(x, 2.0))
add("rsqrt.f64", "unary", "p:4:f64", P("rsqrt"))
add("op.neg", "unary", X, lambda x: -x)
add("op.abs", "unary", X, lambda x: abs(x))
add("op.pos_scalar", "unary", X, lambda x: [x + 1, 3 - x, x * 2.5, x / 4, 2 / (x.abs() + 1), x**2, 2**x])

# -- elementwise math: binary -------------------------------------------------------
BINARY = [
    ("add", "n", "n"), ("subtract", "n", "n"), ("multiply", "n", "n"), ("divide", "n", "p"),
    ("pow", "p", "n"), ("maximum", "n", "n"), ("minimum", "n", "n"), ("fmax", "nan", "n"),
    ("fmin", "nan", "n"), ("remainder", "n", "p"), ("mod", "n", "p"), ("floor_mod", "n", "p"),
    ("atan2", "n", "n"), ("hypot", "n", "n"), ("logaddexp", "n", "n"), ("copysign", "n", "n"),
    ("heaviside", "n", "n"), ("nextafter", "n", "n"), ("ldexp", "n", "s3"),
]
for _n, _a, _b in BINARY:
    add(_n, "binary", (f"{_a}:3x4", f"{_b}:3x4"), P(_n))
for _n, _a, _b in [*BINARY[:8], ("atan2", "n", "n"), ("remainder", "n", "p")]:
    add(f"{_n}.bcast", "binary", (f"{_a}:2x3x4", f"{_b}:3x1"), P(_n))
for _n in ["add", "subtract", "multiply", "maximum"]:
    add(f"{_n}.i64", "binary", ("s9:3x4", "s9:4"), P(_n))
    add(f"{_n}.f64", "binary", ("n:3x4:f64", "n:3x4:f64"), P(_n))
    if _n != "add":
        add(f"{_n}.bf16", "binary", ("n:3x4", "n:3x4"), lambda x, y, _n=_n: getattr(paddle, _n)(x.astype("bfloat16"), y.astype("bfloat16")))
add("divide.i64", "binary", ("s9:3x4", "i4:3x4"), lambda x, y: paddle.divide(x, y + 1))
add("floor_divide.i64", "binary", ("s9:3x4", "i4:3x4"), lambda x, y: paddle.floor_divide(x, y + 1))
add("remainder.i64", "binary", ("s9:3x4", "i4:3x4"), lambda x, y: paddle.remainder(x, y + 1))
add("gcd", "binary", ("i20:3x4", "i20:3x4"), P("gcd"))
add("lcm", "binary", ("i20:3x4", "i20:3x4"), P("lcm"))
add("lerp", "binary", ("n:3x4", "n:3x4", "z:3x4"), P("lerp"))
add("lerp.scalar", "binary", ("n:3x4", "n:3x4"), lambda x, y: paddle.lerp(x, y, 0.3))
add("inner", "binary", ("n:3x4", "n:5x4"), P("inner"))
add("outer", "binary", ("n:3", "n:5"), P("outer"))
add("kron", "binary", ("n:2x3", "n:3x2"), P("kron"))
add("cross", "binary", ("n:4x3", "n:4x3"), lambda x, y: paddle.cross(x, y, axis=1))
add("dist", "binary", ("n:3x4", "n:3x4"), lambda x, y: paddle.dist(x, y, p=2))
add("add_n", "binary", ("n:3x4", "n:3x4", "n:3x4"), lambda *a: paddle.add_n(list(a)))
add("addmm", "binary", ("n:3x5", "n:3x4", "n:4x5"), lambda i, x, y: paddle.addmm(i, x, y, beta=0.5, alpha=2.0), rtol=1e-5)
add("multiplex", "binary", ("n:4x3", "n:4x3", "i2:4x1"), lambda a, b, i: paddle.multiplex([a, b], i.astype("int32")))
add("op.add", "binary", ("n:3x4", "n:4"), lambda x, y: x + y)
add("op.sub", "binary", ("n:3x4", "n:3x1"), lambda x, y: x - y)
add("op.mul", "binary", ("n:3x4", "n:3x4"), lambda x, y: x * y)
add("op.div", "binary", ("n:3x4", "p:3x4"), lambda x, y: x / y)
add("op.pow", "binary", ("p:3x4", "n:3x4"), lambda x, y: x**y)
add("op.mod", "binary", ("n:3x4", "p:3x4"), lambda x, y: x % y)
add("op.floordiv", "binary", ("s9:3x4", "i4:3x4"), lambda x, y: x // (y + 1))
add("op.matmul", "binary", ("n:3x4", "n:4x5"), lambda x, y: x @ y, rtol=1e-5)
add("op.radd_int", "binary", "s9:3x4", lambda x: [x + 2, 3 * x, x - 1, x // 2, x % 3])
# implicit promotion
# Paddle 3.3 promotes tensor+tensor only between floating types (and complex/real): the
# oracle raises for float32+int64 and int32+int64 tensors, and the ipu must raise the same
add("promote.f32+i64", "binary", ("n:3x4", "s5:3x4"), lambda x, y: x + y, expect_error=True)
add("promote.i64*f32scalar", "binary", "s5:3x4", lambda x: x * 2.5)
add("promote.i32/i32", "binary", ("s5:3x4:i32", "i4:3x4:i32"), lambda x, y: x / (y + 1))
add("promote.f16+f32", "binary", ("n:3x4:f16", "n:3x4"), lambda x, y: x + y, rtol=1e-3, atol=1e-3)
add("promote.f32+f64", "binary", ("n:3x4", "n:3x4:f64"), lambda x, y: x + y)
add("promote.bool+i64", "binary", ("b:3x4", "s5:3x4"), lambda x, y: x.astype("int64") + y)
add("promote.i32+i64", "binary", ("s5:3x4:i32", "s5:3x4"), lambda x, y: x + y, expect_error=True)
add("promote.f32+i64.scalar_tensor", "binary", ("n:3x4", "s5:"), lambda x, y: x + y)
add("promote.i64+f32.0d", "binary", ("s5:3x4", "n:"), lambda x, y: x * y)
add("promote.f32*c64", "binary", ("n:3x4", "c:3x4"), lambda x, y: x * y)
add("promote.i64+f32scalar_add", "binary", "s5:3x4", lambda x: paddle.add(x.astype("float32"), T(1.5)))
add("promote.u8+i8", "binary", ("i9:3x4:u8", "s9:3x4:i8"), lambda x, y: x.astype("int32") + y.astype("int32"))
add("promote.f32_pow_int", "binary", ("n:3x4", "i3:3x4"), lambda x, y: x ** y.astype("float32"))

# -- activations -----------------------------------------------------------------
ACT = [
    ("relu", {}), ("relu6", {}), ("elu", {}), ("elu", {"alpha": 0.4}), ("selu", {}), ("celu", {}),
    ("celu", {"alpha": 0.5}), ("gelu", {}), ("gelu", {"approximate": True}), ("silu", {}),
    ("swish", {}), ("mish", {}), ("softplus", {}), ("softplus", {"beta": 2, "threshold": 1}),
    ("softsign", {}), ("softshrink", {}), ("softshrink", {"threshold": 0.8}), ("hardshrink", {}),
    ("hardtanh", {}), ("hardtanh", {"min": -0.3, "max": 0.6}), ("hardsigmoid", {}),
    ("hardswish", {}), ("leaky_relu", {}), ("leaky_relu", {"negative_slope": 0.2}),
    ("log_sigmoid", {}), ("tanhshrink", {}), ("thresholded_relu", {}),
    ("thresholded_relu", {"threshold": 0.4}), ("sigmoid", {}), ("tanh", {}),
    ("softmax", {}), ("softmax", {"axis": 0}), ("log_softmax", {}), ("log_softmax", {"axis": 1}),
    ("glu", {}), ("rrelu", {"training": False}), ("normalize", {}), ("normalize", {"p": 1, "axis": 0}),
    ("softmax", {"dtype": "float64"}),
]
for _n, _kw in ACT:
    _sfx = "".join(f".{k}={v}" for k, v in _kw.items())
    add(f"F.{_n}{_sfx}", "activation", "n:3x4x2" if _n == "glu" else "n:3x4", FN(_n, **_kw))
add("F.relu.f64", "activation", "n:3x4:f64", FN("relu"))
add("F.prelu", "activation", ("n:2x3x4", "p:3"), lambda x, w: F.prelu(x, w))
add("F.prelu.single", "activation", ("n:2x3x4", "p:1"), lambda x, w: F.prelu(x, w))
add("F.maxout", "activation", "n:2x4x3x3", lambda x: F.maxout(x, groups=2))
add("F.relu_", "activation", X, lambda x: [F.relu_(x), x])
add("F.elu_", "activation", X, lambda x: [F.elu_(x), x])
add("F.softmax_", "activation", X, lambda x: [F.softmax_(x), x])

# -- comparison / logical / bitwise ---------------------------------------------
for _n in ["equal", "not_equal", "less_than", "less_equal", "greater_than", "greater_equal"]:
    add(f"{_n}", "compare", ("i3:3x4:f32", "i3:3x4:f32"), P(_n))
    add(f"{_n}.bcast.i64", "compare", ("i3:2x3x4", "i3:4"), P(_n))
add("op.compare", "compare", ("i3:3x4:f32", "i3:3x4:f32"), lambda x, y: [x == y, x != y, x < y, x <= y, x > y, x >= y])
add("op.compare_scalar", "compare", "n:3x4", lambda x: [x > 0, x == 0.5, x <= -0.1])
add("allclose", "compare", ("n:3x4", "n:3x4"), lambda x, y: [paddle.allclose(x, x + 1e-9), paddle.allclose(x, y)])
add("isclose", "compare", ("n:3x4", "n:3x4"), lambda x, y: paddle.isclose(x, x + y * 1e-6))
add("equal_all", "compare", ("i2:3x4", "i2:3x4"), lambda x, y: [paddle.equal_all(x, x), paddle.equal_all(x, y)])
for _n in ["logical_and", "logical_or", "logical_xor"]:
    add(_n, "compare", ("b:3x4", "b:3x4"), P(_n))
    add(f"{_n}.float", "compare", ("i2:3x4:f32", "i2:3x4:f32"), P(_n))
add("logical_not", "compare", "b:3x4", P("logical_not"))
add("logical_not.int", "compare", "i2:3x4", P("logical_not"))
for _n in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
    add(f"{_n}.i32", "compare", ("s50:3x4:i32", "s50:3x4:i32"), P(_n))
    add(f"{_n}.bool", "compare", ("b:3x4", "b:3x4"), P(_n))
add("bitwise_and.u8", "compare", ("i200:3x4:u8", "i200:3x4:u8"), P("bitwise_and"))
add("bitwise_not.i64", "compare", "s50:3x4", P("bitwise_not"))
add("bitwise_not.bool", "compare", "b:3x4", P("bitwise_not"))
add("bitwise_left_shift", "compare", ("s50:3x4:i32", "i4:3x4:i32"), P("bitwise_left_shift"))
add("bitwise_right_shift", "compare", ("s50:3x4:i32", "i4:3x4:i32"), P("bitwise_right_shift"))
add("op.bitwise", "compare", ("s50:3x4", "s50:3x4"), lambda x, y: [x & y, x | y, x ^ y, ~x])
add("op.bool_ops", "compare", ("b:3x4", "b:3x4"), lambda x, y: [x & y, x | y, x ^ y, ~x])
add("isin", "compare", ("i6:3x4", "i6:3"), P("isin"))
add("is_empty", "compare", X, P("is_empty"))

def _nan_spec(r: np.random.Generator) -> np.ndarray:
    """Normal values, a fifth of them NaN (no inf: nansum/nanmean of inf is inf - inf)."""
    return np.where(r.random((2, 3, 4)) < 0.2, np.nan, r.standard_normal((2, 3, 4))).astype("float32")


# -- reductions --------------------------------------------------------------------
_AXES = [("all", {}), ("ax1", {"axis": 1}), ("ax02", {"axis": [0, 2]}), ("axm1.keep", {"axis": -1, "keepdim": True})]
for _n in ["sum", "mean", "max", "min", "prod", "amax", "amin", "logsumexp", "std", "var",
           "nansum", "nanmean", "count_nonzero", "all", "any"]:
    for _tag, _kw in _AXES:
        _spec = {"nansum": "nan:2x3x4", "nanmean": "nan:2x3x4", "all": "b:2x3x4", "any": "b:2x3x4",
                 "count_nonzero": "i2:2x3x4:f32", "prod": "p:2x3x4"}.get(_n, "n:2x3x4")
        if _n in ("nansum", "nanmean"):  # inf in the data: keep to finite values
            _spec = _nan_spec
        add(f"{_n}.{_tag}", "reduce", (_spec,), P(_n) if not _kw else (lambda x, _n=_n, _kw=_kw: getattr(paddle, _n)(x, **_kw)), rtol=1e-5)
for _n in ["median", "nanmedian"]:
    _spec = "nan:3x5" if _n == "nanmedian" else "n:3x5"
    add(f"{_n}.all", "reduce", _spec, P(_n))
    add(f"{_n}.ax1", "reduce", _spec, lambda x, _n=_n: getattr(paddle, _n)(x, axis=1))
    add(f"{_n}.ax0.keep", "reduce", _spec, lambda x, _n=_n: getattr(paddle, _n)(x, axis=0, keepdim=True))
add("median.min_mode", "reduce", "n:3x4", lambda x: paddle.median(x, axis=1, mode="min"))
add("quantile.q", "reduce", "n:3x5", lambda x: paddle.quantile(x, 0.3))
add("quantile.ax1", "reduce", "n:3x5", lambda x: paddle.quantile(x, 0.5, axis=1))
add("quantile.list", "reduce", "n:3x5", lambda x: paddle.quantile(x, [0.25, 0.75], axis=0, keepdim=True))
add("quantile.interp_lower", "reduce", "n:3x5", lambda x: paddle.quantile(x, 0.4, axis=1, interpolation="lower"))
add("nanquantile", "reduce", "nan:3x5", lambda x: paddle.nanquantile(x, 0.5, axis=1))
add("std.biased", "reduce", X3, lambda x: paddle.std(x, axis=1, unbiased=False))
add("var.biased", "reduce", X3, lambda x: paddle.var(x, axis=[0, 1], unbiased=False))
add("sum.i64", "reduce", "s9:2x3x4", lambda x: [paddle.sum(x), paddle.sum(x, axis=1)])
add("sum.bool", "reduce", "b:2x3x4", lambda x: paddle.sum(x, axis=0))
add("sum.dtype", "reduce", "s9:2x3x4:i32", lambda x: paddle.sum(x, dtype="int64"))
add("sum.f16", "reduce", "n:2x3x4:f16", lambda x: paddle.sum(x, axis=-1), rtol=1e-3, atol=1e-3)
add("mean.f64", "reduce", "n:2x3x4:f64", lambda x: paddle.mean(x, axis=1))
add("max.i64", "reduce", "s9:2x3x4", lambda x: [paddle.max(x), paddle.max(x, axis=2)])
add("prod.i64", "reduce", "s3:2x3x4", lambda x: paddle.prod(x, axis=1))
add("min.f64", "reduce", "n:2x3x4:f64", lambda x: paddle.min(x, axis=[1, 2]))
add("mean.empty_axis_list", "reduce", X3, lambda x: paddle.mean(x, axis=[]))
add("reduce_as", "reduce", ("n:2x3x4", "n:3x1"), P("reduce_as"))
add("norm.fro", "reduce", X3, lambda x: paddle.norm(x))
add("norm.p1.ax", "reduce", X3, lambda x: paddle.norm(x, p=1, axis=1))
add("norm.inf", "reduce", X3, lambda x: paddle.norm(x, p=float("inf"), axis=-1))
add("trace", "reduce", "n:4x4", P("trace"))
add("numel", "reduce", X3, P("numel"))
add("Tensor.sum_method", "reduce", X3, lambda x: [x.sum(1), x.mean(), x.max(0), x.argmax(-1)])

# -- manipulation -------------------------------------------------------------------
M = "manip"
add("reshape", M, X, lambda x: paddle.reshape(x, [4, 3]))
add("reshape.-1", M, X3, lambda x: paddle.reshape(x, [-1, 4]))
add("reshape.0", M, X3, lambda x: paddle.reshape(x, [0, 12]))
add("reshape.tensor_shape", M, X3, lambda x: paddle.reshape(x, T([6, 4], "int32")))
add("reshape_", M, X, lambda x: [paddle.reshape_(x, [2, 6]), x])
add("transpose", M, X, lambda x: paddle.transpose(x, [1, 0]))
add("transpose.3d", M, X3, lambda x: paddle.transpose(x, [2, 0, 1]))
add("transpose.i64", M, "s9:2x3x4", lambda x: paddle.transpose(x, [1, 2, 0]))
add("t", M, X, P("t"))
add("Tensor.T", M, X3, lambda x: x.T)
add("swapaxes", M, X3, lambda x: paddle.swapaxes(x, 0, 2))
add("moveaxis", M, X3, lambda x: paddle.moveaxis(x, 0, -1))
add("moveaxis.list", M, X3, lambda x: paddle.moveaxis(x, [0, 1], [2, 0]))
add("concat.ax0", M, ("n:2x4", "n:3x4"), lambda a, b: paddle.concat([a, b]))
add("concat.ax1", M, ("n:3x2", "n:3x4", "n:3x1"), lambda a, b, c: paddle.concat([a, b, c], axis=1))
add("concat.i64", M, ("s9:2x3", "s9:2x3"), lambda a, b: paddle.concat([a, b], axis=-1))
add("concat.bool", M, ("b:2x3", "b:2x3"), lambda a, b: paddle.concat([a, b], axis=0))
add("stack.ax0", M, ("n:3x4", "n:3x4"), lambda a, b: paddle.stack([a, b]))
add("stack.ax-1", M, ("n:3x4", "n:3x4", "n:3x4"), lambda *a: paddle.stack(list(a), axis=-1))
add("hstack", M, ("n:3x2", "n:3x4"), lambda a, b: paddle.hstack([a, b]))
add("vstack", M, ("n:2x4", "n:3x4"), lambda a, b: paddle.vstack([a, b]))
add("dstack", M, ("n:2x4", "n:2x4"), lambda a, b: paddle.dstack([a, b]))
add("column_stack", M, ("n:3", "n:3x2"), lambda a, b: paddle.column_stack([a, b]))
add("split.num", M, "n:6x4", lambda x: paddle.split(x, 3))
add("split.sections", M, "n:3x7", lambda x: paddle.split(x, [2, 4, 1], axis=1))
add("split.minus1", M, "n:3x7", lambda x: paddle.split(x, [2, -1], axis=1))
add("tensor_split", M, "n:7x3", lambda x: paddle.tensor_split(x, 3))
add("hsplit", M, "n:3x6", lambda x: paddle.hsplit(x, 2))
add("vsplit", M, "n:4x3", lambda x: paddle.vsplit(x, 2))
add("chunk", M, "n:3x8", lambda x: paddle.chunk(x, 4, axis=1))
add("unbind", M, X3, lambda x: paddle.unbind(x, axis=1))
add("unstack", M, X3, lambda x: paddle.unstack(x, axis=0))
add("slice", M, X3, lambda x: paddle.slice(x, axes=[1, 2], starts=[1, 0], ends=[3, 3]))
add("slice.neg", M, X3, lambda x: paddle.slice(x, axes=[2], starts=[-3], ends=[-1]))
add("strided_slice", M, X3, lambda x: paddle.strided_slice(x, axes=[1, 2], starts=[0, 3], ends=[3, 0], strides=[2, -1]))
add("getitem.int", M, X3, lambda x: x[1])
add("getitem.slices", M, X3, lambda x: x[:, 1:3, ::2])
add("getitem.neg_step", M, X3, lambda x: x[:, ::-1])
add("getitem.ellipsis_none", M, X3, lambda x: x[..., None, 1])
add("getitem.tensor_idx", M, (X3, "i3:2"), lambda x, i: x[:, i])
add("getitem.bool_mask", M, ("n:3x4", "b:3x4"), lambda x, m: x[m])
add("getitem.list", M, X3, lambda x: x[[1, 0]])
add("getitem.adv2", M, (X3, "i2:3", "i4:3"), lambda x, i, j: x[i, :, j])
add("narrow", M, X3, lambda x: paddle.narrow(x, 2, 1, 2))
add("gather", M, ("n:5x3", "i5:4"), lambda x, i: paddle.gather(x, i))
add("gather.ax1", M, ("n:3x5", "i5:4"), lambda x, i: paddle.gather(x, i, axis=1))
add("gather_nd", M, ("n:3x4x5", "i3:2x2"), lambda x, i: paddle.gather_nd(x, i))
add("take_along_axis", M, ("n:3x4", "i4:3x2"), lambda x, i: paddle.take_along_axis(x, i, axis=1))
add("put_along_axis", M, ("n:3x4", "i4:3x1", "n:3x1"), lambda x, i, v: paddle.put_along_axis(x, i, v, axis=1))
add("put_along_axis.add", M, ("n:3x4", "i4:3x2", "n:3x2"), lambda x, i, v: paddle.put_along_axis(x, i, v, axis=1, reduce="add"))
add("take", M, ("n:3x4", "i12:5"), P("take"))
add("index_sample", M, ("n:3x5", "i5:3x2"), P("index_sample"))
add("scatter.overwrite", M, ("n:5x3", "perm:3", "n:3x3"), lambda x, i, u: paddle.scatter(x, i, u))
add("scatter.accumulate", M, ("n:5x3", "i5:4", "n:4x3"), lambda x, i, u: paddle.scatter(x, i, u, overwrite=False))
add("scatter_nd_add", M, ("n:4x5", "i4:3x1", "n:3x5"), P("scatter_nd_add"))
add("scatter_nd", M, ("i4:3x1", "n:3x5"), lambda i, u: paddle.scatter_nd(i, u, [4, 5]))
add("index_select", M, ("n:4x5", "i5:3"), lambda x, i: paddle.index_select(x, i, axis=1))
add("index_select.ax0.i64", M, ("s9:4x5", "i4:6"), lambda x, i: paddle.index_select(x, i))
add("index_put", M, ("n:4x5", "perm:4", "n:4"), lambda x, i, v: paddle.index_put(x, (i, i), v))
add("index_put.accumulate", M, ("n:4x5", "i4:3", "n:3"), lambda x, i, v: paddle.index_put(x, (i,), v[:, None], accumulate=True))
add("index_add", M, ("n:4x5", "i5:3", "n:4x3"), lambda x, i, v: paddle.index_add(x, i, 1, v))
add("index_fill", M, ("n:4x5", "i5:2"), lambda x, i: paddle.index_fill(x, i, 1, -1.0))
add("masked_fill", M, ("n:3x4", "b:3x4"), lambda x, m: paddle.masked_fill(x, m, 9.0))
add("masked_fill.bcast_tensor", M, ("n:3x4", "b:4", "n:1"), lambda x, m, v: paddle.masked_fill(x, m, v))
add("masked_select", M, ("n:3x4", "b:3x4"), P("masked_select"))
add("masked_scatter", M, ("n:3x4", "b:3x4", "n:12"), P("masked_scatter"))
add("where", M, ("b:3x4", "n:3x4", "n:3x4"), P("where"))
add("where.bcast_scalar", M, ("n:3x4",), lambda x: paddle.where(x > 0, x, T(0.0)))
add("where.cond_only", M, ("b:3x4",), lambda c: paddle.where(c))
add("tile", M, X, lambda x: paddle.tile(x, [2, 1, 3]))
add("tile.i64", M, "s9:2x3", lambda x: paddle.tile(x, [2, 2]))
add("expand", M, "n:3x1", lambda x: paddle.expand(x, [2, 3, 4]))
add("expand.-1", M, "n:1x4", lambda x: paddle.expand(x, [3, -1]))
add("expand_as", M, ("n:3x1", "n:3x4"), P("expand_as"))
add("broadcast_to", M, "n:4", lambda x: paddle.broadcast_to(x, [3, 4]))
add("broadcast_tensors", M, ("n:3x1", "n:1x4"), lambda a, b: paddle.broadcast_tensors([a, b]))
add("flip", M, X3, lambda x: paddle.flip(x, [0, 2]))
add("flip.bool", M, "b:3x4", lambda x: paddle.flip(x, 1))
add("rot90", M, X, lambda x: paddle.rot90(x, 1, [0, 1]))
add("roll", M, X3, lambda x: paddle.roll(x, shifts=2, axis=2))
add("roll.multi", M, X3, lambda x: paddle.roll(x, shifts=[1, -1], axis=[0, 1]))
add("roll.flat", M, X3, lambda x: paddle.roll(x, shifts=5))
add("repeat_interleave.int", M, X, lambda x: paddle.repeat_interleave(x, 2, axis=1))
add("repeat_interleave.tensor", M, ("n:3x4", "i3:3"), lambda x, r: paddle.repeat_interleave(x, r, axis=0))
add("repeat_interleave.flat", M, X, lambda x: paddle.repeat_interleave(x, 2))
add("squeeze", M, "n:3x1x4x1", P("squeeze"))
add("squeeze.axis", M, "n:3x1x4x1", lambda x: paddle.squeeze(x, axis=1))
add("unsqueeze", M, X, lambda x: paddle.unsqueeze(x, [0, 2]))
add("unsqueeze.i64", M, "s9:3x4", lambda x: paddle.unsqueeze(x, -1))
add("flatten", M, "n:2x3x4x5", P("flatten"))
add("flatten.range", M, "n:2x3x4x5", lambda x: paddle.flatten(x, 1, 2))
add("diagonal", M, X3, lambda x: paddle.diagonal(x, axis1=1, axis2=2))
add("diagonal.offset", M, "n:4x5", lambda x: paddle.diagonal(x, offset=1))
add("diag.vec", M, "n:4", P("diag"))
add("diag.mat", M, "n:4x5", lambda x: paddle.diag(x, offset=-1))
add("diag_embed", M, "n:2x3", P("diag_embed"))
add("diagflat", M, "n:2x2", P("diagflat"))
add("tril", M, "n:4x5", P("tril"))
add("triu", M, "n:4x5", P("triu"))
add("tril.offset", M, "n:2x4x5", lambda x: paddle.tril(x, diagonal=1))
add("triu.neg_offset.i64", M, "s9:4x5", lambda x: paddle.triu(x, diagonal=-1))
add("pad.constant", M, IMG, lambda x: F.pad(x, [1, 2, 0, 1], value=0.5))
add("pad.reflect", M, IMG, lambda x: F.pad(x, [1, 2, 2, 1], mode="reflect"))
add("pad.replicate", M, IMG, lambda x: F.pad(x, [1, 1, 2, 0], mode="replicate"))
add("pad.circular", M, IMG, lambda x: F.pad(x, [1, 1, 1, 1], mode="circular"))
add("pad.full_list", M, X, lambda x: F.pad(x, [1, 0, 0, 2]))
add("pad.3d", M, "n:1x2x3x4x4", lambda x: F.pad(x, [1, 1, 0, 1, 1, 0], mode="replicate"))
add("crop", M, "n:4x5", lambda x: paddle.crop(x, shape=[2, 3], offsets=[1, 1]))
add("meshgrid", M, ("n:3", "n:4"), lambda a, b: paddle.meshgrid(a, b))
add("tensordot", M, ("n:3x4x5", "n:4x5x2"), lambda a, b: paddle.tensordot(a, b, axes=2), rtol=1e-5)
add("atleast_2d", M, "n:3", P("atleast_2d"))
add("unique_consecutive", M, "i3:10", lambda x: paddle.unique_consecutive(x, return_inverse=True, return_counts=True))
add("flatten_.view", M, "n:2x3x4", lambda x: [paddle.flatten_(x), x])
add("unflatten", M, "n:2x12", lambda x: paddle.unflatten(x, 1, [3, 4]))
add("select_scatter", M, ("n:3x4", "n:4"), lambda x, v: paddle.select_scatter(x, v, 0, 1))
add("slice_scatter", M, ("n:4x6", "n:4x2"), lambda x, v: paddle.slice_scatter(x, v, axes=[1], starts=[1], ends=[5], strides=[2]))
add("diagonal_scatter", M, ("n:3x3", "n:3"), lambda x, v: paddle.diagonal_scatter(x, v))
add("shard_index", M, "i20:4x1", lambda x: paddle.shard_index(x, 20, 2, 0))
add("cast.via_paddle", M, X, lambda x: paddle.cast(x, "int32"))
add("view_as", M, ("n:3x4", "n:2x6"), lambda x, y: x.view_as(y))
add("repeat.Tensor", M, "n:2x3", lambda x: paddle.tile(x, [2, 2]).reshape([4, 6]))

# -- views and their interaction with non-view ops ---------------------------------
V = "view"
add("view.transpose_concat", V, ("n:3x4", "n:2x4"), lambda x, y: paddle.concat([x.T, y.T], axis=1))
add("view.slice_matmul", V, ("n:6x4", "n:4x3"), lambda x, y: paddle.matmul(x[1:4], y), rtol=1e-5)
add("view.step_slice_add", V, ("n:6x4", "n:3x4"), lambda x, y: x[::2] + y)
add("view.transpose_matmul", V, ("n:4x3", "n:4x5"), lambda x, y: paddle.matmul(x.T, y), rtol=1e-5)
add("view.transpose_sum", V, X3, lambda x: paddle.transpose(x, [2, 0, 1]).sum(axis=0))
add("view.transpose_reshape", V, X3, lambda x: paddle.transpose(x, [1, 0, 2]).reshape([3, 8]))
add("view.transpose_exp", V, X3, lambda x: paddle.exp(paddle.transpose(x, [2, 1, 0])))
add("view.slice_exp", V, X3, lambda x: x[:, 1:3].exp())
add("view.col_softmax", V, "n:4x6", lambda x: F.softmax(x[:, ::2], axis=0))
add("view.as_strided", V, "n:12", lambda x: paddle.as_strided(x, [3, 3], [3, 1], 1))
add("view.as_strided_overlap", V, "n:10", lambda x: paddle.as_strided(x, [4, 3], [2, 1]))
add("view.as_strided_then_add", V, ("n:12", "n:3x3"), lambda x, y: paddle.as_strided(x, [3, 3], [1, 3]) + y)
add("view.view_shape", V, "n:3x4", lambda x: x.view([6, 2]))
add("view.view_dtype", V, "n:3x4", lambda x: x.view("int32"))
add("view.view_then_mul", V, "n:3x4", lambda x: x.view([2, 6]) * 2)
add("view.unfold", V, "n:10", lambda x: x.unfold(0, 3, 2))
add("view.unfold_cover", V, "n:10", lambda x: x.unfold(0, 2, 2) * 2)
add("view.unfold_then_sum", V, "n:4x10", lambda x: x.unfold(1, 4, 3).sum(-1))
add("view.contiguous", V, X3, lambda x: paddle.transpose(x, [2, 1, 0]).contiguous())
add("view.is_contiguous", V, X3, lambda x: [paddle.transpose(x, [2, 1, 0]).is_contiguous(), x[:, 0].is_contiguous()])
add("view.split_then_add", V, "n:4x6", lambda x: [a + 1 for a in paddle.split(x, 3, axis=1)])
add("view.unbind_then_stack", V, X3, lambda x: paddle.stack(paddle.unbind(x, 2), axis=0))
add("view.chunk_then_concat", V, "n:4x6", lambda x: paddle.concat(paddle.chunk(x, 2, axis=1)[::-1], axis=1))
add("view.diagonal_then_add", V, "n:4x4", lambda x: paddle.diagonal(x) + 1)
add("view.squeeze_unsqueeze_chain", V, "n:3x1x4", lambda x: paddle.unsqueeze(paddle.squeeze(x, 1).T, 0) * 3)
add("view.expand_then_mul", V, ("n:3x1", "n:3x4"), lambda x, y: paddle.expand(x, [3, 4]) * y)
add("view.real_imag", V, "c:3x4", lambda x: [paddle.real(x), paddle.imag(x), paddle.real(x) + 1])
add("view.numpy_of_strided", V, X3, lambda x: paddle.transpose(x, [1, 2, 0])[:, ::2].numpy())
add("view.write.getitem_add_", V, "n:3x4", lambda x: (lambda v: [v.add_(T(1.0)), x])(x[1]))
add("view.write.column_mul_", V, "n:3x4", lambda x: (lambda v: [v.multiply_(T(2.0)), x])(x[:, 1]))
add("view.write.transpose_zero_", V, "n:3x4", lambda x: (lambda v: [v[0].zero_(), x])(x.T))
add("view.write.reshape_fill_", V, "n:3x4", lambda x: (lambda v: [v.fill_(2.0), x])(x.reshape([12])))
add("view.write.diagonal_scale_", V, "n:4x4", lambda x: (lambda v: [v.scale_(3.0), x])(paddle.diagonal(x)))
add("view.write.slice_exp_", V, "n:4x4", lambda x: (lambda v: [v.exp_(), x])(x[1:3, 1:]))
add("view.write.unsqueeze_clip_", V, "n:3x4", lambda x: (lambda v: [v.clip_(-0.1, 0.1), x])(x.unsqueeze(0)))
add("view.write.split_add_", V, "n:4x6", lambda x: (lambda vs: [vs[1].add_(T(5.0)), x])(paddle.split(x, 3, axis=1)))
add("view.write.setitem_on_view", V, "n:3x4", lambda x: (lambda v: [setitem(v, 0, 7.0), x])(x[:, 2:]))
add("view.write.as_strided_fill_", V, "n:12", lambda x: (lambda v: [v.fill_(1.0), x])(paddle.as_strided(x, [3], [4], 1)))
# contiguous views (an offset, or the whole storage) written in place
add("view.write.rows_slice_add_", V, "n:4x3", lambda x: (lambda v: [v.add_(T(1.0)), x])(x[1:]))
add("view.write.index3d_fill_", V, "n:2x3x4", lambda x: (lambda v: [v.fill_(1.0), x])(x[1]))
add("view.write.flatten_scale_", V, "n:3x4", lambda x: (lambda v: [v.scale_(2.0), x])(x.flatten()))
add("view.write.squeeze_add_", V, "n:3x1x4", lambda x: (lambda v: [v.add_(T(1.0)), x])(x.squeeze(1)))
add("view.write.split_axis0_add_", V, "n:4x3", lambda x: (lambda vs: [vs[1].add_(T(5.0)), x])(paddle.split(x, 2, axis=0)))
add("view.write.unbind_axis0_mul_", V, "n:3x4", lambda x: (lambda vs: [vs[2].multiply_(T(3.0)), x])(paddle.unbind(x, 0)))
add("view.write.view_zero_", V, "n:3x4", lambda x: (lambda v: [v.zero_(), x])(x.view([12])))
add("view.write.setitem_on_row_view", V, "n:3x4", lambda x: (lambda v: [setitem(v, 0, 7.0), x])(x[1:]))
add("view.write.detach_add_", V, "n:3x4", lambda x: (lambda v: [v.add_(T(1.0)), x])(x.detach()))
add("view.write.transpose_back_add_", V, "n:3x4", lambda x: (lambda v: [v.add_(T(1.0)), x])(x.T.T))
add("view.write.through_base", V, "n:3x4", lambda x: (lambda v: [x.add_(T(1.0)), v])(x[1]))

# -- in-place ----------------------------------------------------------------------
IP = "inplace"
add("add_", IP, ("n:3x4", "n:3x4"), inplace("add_"))
add("add_.bcast", IP, ("n:3x4", "n:4"), inplace("add_"))
add("subtract_", IP, ("n:3x4", "n:3x4"), inplace("subtract_"))
add("multiply_", IP, ("n:3x4", "n:3x4"), inplace("multiply_"))
add("divide_", IP, ("n:3x4", "p:3x4"), inplace("divide_"))
add("scale_", IP, "n:3x4", inplace("scale_", 2.0, 1.0))
add("clip_", IP, "n:3x4", inplace("clip_", -0.5, 0.5))
add("zero_", IP, "n:3x4", inplace("zero_"))
add("fill_", IP, "n:3x4", inplace("fill_", 3.5))
add("fill_.i64", IP, "s9:3x4", inplace("fill_", 7))
add("exp_", IP, "n:3x4", inplace("exp_"))
add("sqrt_", IP, "p:3x4", inplace("sqrt_"))
add("pow_", IP, "p:3x4", inplace("pow_", 2.0))
add("floor_", IP, "n:3x4", inplace("floor_"))
add("abs_", IP, "n:3x4", lambda x: [paddle.abs_(x), x])
add("tanh_", IP, "n:3x4", inplace("tanh_"))
add("sigmoid_", IP, "n:3x4", inplace("sigmoid_"))
# blocking given: Paddle 3.0 and 3.1 require it (without it they read an undefined bool, and crash)
add("copy_", IP, ("n:3x4", "n:3x4"), inplace("copy_", True))
add("set_value", IP, "n:3x4", lambda x: [x.set_value(np.ones((3, 4), "float32")), x][1])
add("masked_fill_", IP, ("n:3x4", "b:3x4"), inplace("masked_fill_", 0.5))
add("index_put_", IP, ("n:4x5", "i4:3", "n:3"), lambda x, i, v: [paddle.index_put_(x, (i,), v[:, None]), x])
add("scatter_", IP, ("n:5x3", "perm:3", "n:3x3"), lambda x, i, u: [paddle.scatter_(x, i, u), x])
add("where_", IP, ("b:3x4", "n:3x4", "n:3x4"), lambda c, x, y: [paddle.where_(c, x, y), y])
add("lerp_", IP, ("n:3x4", "n:3x4"), lambda x, y: [x.lerp_(y, 0.5), x])
add("fill_diagonal_", IP, "n:4x4", lambda x: [x.fill_diagonal_(2.0), x])
add("cast_", IP, "n:3x4", lambda x: [x.cast_("float64"), x])
add("setitem.int", IP, "n:3x4", lambda x: setitem(x, 1, 5.0))
add("setitem.neg_int", IP, "n:3x4", lambda x: setitem(x, -1, 5.0))
add("setitem.slice", IP, "n:3x4", lambda x: setitem(x, slice(0, 2), -1.0))
add("setitem.2d_slice", IP, "n:4x5", lambda x: setitem(x, (slice(1, 3), slice(None, None, 2)), 0.0))
add("setitem.ellipsis", IP, X3, lambda x: setitem(x, (Ellipsis, 0), 1.0))
add("setitem.tensor_value", IP, ("n:3x4", "n:4"), lambda x, v: setitem(x, 1, v))
add("setitem.tensor_value_bcast", IP, ("n:3x4", "n:3x1"), lambda x, v: setitem(x, slice(None), v))
add("setitem.tensor_index", IP, ("n:5x4", "perm:3"), lambda x, i: setitem(x, i, 0.0))
add("setitem.bool_mask", IP, ("n:3x4", "b:3x4"), lambda x, m: setitem(x, m, 0.0))
add("setitem.bool_mask_expr", IP, "n:3x4", lambda x: setitem(x, x > 0, 1.0))
add("setitem.bool_mask_tensor_value", IP, ("n:3x4", "n:3x4"), lambda x, v: setitem(x, x > 0, v[x > 0]))
add("setitem.i64", IP, "s9:3x4", lambda x: setitem(x, (0, 1), 42))
add("setitem.bool_tensor", IP, "b:3x4", lambda x: setitem(x, 0, True))
add("setitem.f16", IP, "n:3x4:f16", lambda x: setitem(x, 1, 2.0))
add("setitem.float_into_int", IP, "s9:3x4", lambda x: setitem(x, 1, T(2.7)))
add("setitem.step", IP, "n:8", lambda x: setitem(x, slice(None, None, 3), 9.0))
add("setitem.none_axis", IP, "n:3x4", lambda x: setitem(x, (None, 1), 4.0))

# -- creation on the place ------------------------------------------------------------
CR = "creation"
add("zeros", CR, (), lambda: paddle.zeros([2, 3]))
add("ones.i64", CR, (), lambda: paddle.ones([2, 3], "int64"))
add("full", CR, (), lambda: paddle.full([2, 3], 1.5))
add("full.bool", CR, (), lambda: paddle.full([3], True, "bool"))
add("full.f16", CR, (), lambda: paddle.full([3], 0.1, "float16"))
add("arange.int", CR, (), lambda: paddle.arange(10))
add("arange.float", CR, (), lambda: paddle.arange(0.0, 1.0, 0.125))
add("arange.tensor_args", CR, (), lambda: paddle.arange(T(2), T(11), T(3)))
add("linspace", CR, (), lambda: paddle.linspace(0, 1, 7))
add("logspace", CR, (), lambda: paddle.logspace(0, 2, 5))
add("eye", CR, (), lambda: paddle.eye(3, 4))
add("empty.shape", CR, (), lambda: [list(paddle.empty([2, 3]).shape), str(paddle.empty([2, 3]).dtype)])
add("empty_like.shape", CR, X, lambda x: [list(paddle.empty_like(x).shape), paddle.empty_like(x).place.is_cpu_place() == x.place.is_cpu_place()])
add("zeros_like", CR, X, P("zeros_like"))
add("ones_like.dtype", CR, X, lambda x: paddle.ones_like(x, dtype="int32"))
add("full_like", CR, "s9:3x4", lambda x: paddle.full_like(x, 4))
add("to_tensor.list", CR, (), lambda: T([[1, 2], [3, 4]]))
add("to_tensor.scalar", CR, (), lambda: [T(3.0), T(2), T(True)])
add("to_tensor.from_tensor", CR, X, lambda x: T(x))
add("to_tensor.complex", CR, (), lambda: T([1 + 2j, 3 - 1j]))
add("assign.numpy", CR, (), lambda: paddle.assign(np.arange(6, dtype="float32").reshape(2, 3)))
add("assign.tensor", CR, X, P("assign"))
add("clone", CR, X, lambda x: x.clone())
add("tril_indices", CR, (), lambda: paddle.tril_indices(4, 4, 0))
add("triu_indices", CR, (), lambda: paddle.triu_indices(3, 4, 1))
add("complex", CR, ("n:3", "n:3"), P("complex"))
add("polar", CR, ("p:3", "n:3"), P("polar"))
add("Tensor.cpu", CR, X, lambda x: x.cpu(), place_ok=True)
add("Tensor.to_cpu_and_back", CR, X, lambda x: (x.cpu() * 2)._to(x.place) if hasattr(x, "_to") else x)
add("Tensor.to_cpu", CR, X, lambda x: x.to("cpu"), place_ok=True)
add("to_tensor.ipu_to_cpu", CR, X, lambda x: paddle.to_tensor(x, place=paddle.CPUPlace()), place_ok=True)
add("Tensor.cpu_op_back", CR, X, lambda x: paddle.to_tensor((x.cpu() + 1).numpy()))
add("Tensor.item", CR, X, lambda x: [x[1, 2].item(), x.sum().item(), x.tolist()])
add("cartesian_prod", CR, ("n:2", "n:3"), lambda a, b: paddle.cartesian_prod([a, b]))
add("vander", CR, "n:4", lambda x: paddle.vander(x, 3))

# -- casts (explicit: every pair; implicit promotion is under "binary") ------------------
_CAST_DT = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool", "uint8", "int8", "complex64"]


def _small_ints(r: np.random.Generator, dtype: str) -> np.ndarray:
    return r.integers(0, 6, (3, 4)).astype(dtype)


def _cast_src(x: Any, src: str) -> Any:
    # the input array is float32 0..5 (exact in every dtype); bfloat16 sources are made by a cast
    return x.astype("bfloat16") if src == "bfloat16" else x


for _src in _CAST_DT:
    for _dst in _CAST_DT:
        _npsrc = "float32" if _src == "bfloat16" else _src
        add(f"cast.{_src}->{_dst}", "cast", (functools.partial(_small_ints, dtype=_npsrc),), lambda x, _s=_src, _d=_dst: _cast_src(x, _s).astype(_d))

# -- linear algebra ----------------------------------------------------------------------
LA = "linalg"
R5 = {"rtol": 1e-5, "atol": 1e-5}
add("matmul", LA, ("n:3x4", "n:4x5"), P("matmul"), **R5)
add("matmul.batched", LA, ("n:2x3x4", "n:2x4x5"), P("matmul"), **R5)
add("matmul.bcast", LA, ("n:2x3x4", "n:4x5"), P("matmul"), **R5)
add("matmul.trans", LA, ("n:4x3", "n:5x4"), lambda a, b: paddle.matmul(a, b, transpose_x=True, transpose_y=True), **R5)
add("matmul.vec", LA, ("n:3x4", "n:4"), P("matmul"), **R5)
add("matmul.f64", LA, ("n:3x4:f64", "n:4x5:f64"), P("matmul"))
add("matmul.i64", LA, ("s5:3x4", "s5:4x2"), P("matmul"))
add("bmm", LA, ("n:2x3x4", "n:2x4x5"), P("bmm"), **R5)
add("mm", LA, ("n:3x4", "n:4x5"), P("mm"), **R5)
add("mv", LA, ("n:3x4", "n:4"), P("mv"), **R5)
add("dot", LA, ("n:5", "n:5"), P("dot"), **R5)
add("dot.batched", LA, ("n:3x5", "n:3x5"), P("dot"), **R5)
add("baddbmm", LA, ("n:2x3x5", "n:2x3x4", "n:2x4x5"), P("baddbmm"), **R5)
add("einsum.mm", LA, ("n:3x4", "n:4x5"), lambda a, b: paddle.einsum("ij,jk->ik", a, b), **R5)
add("einsum.bmm", LA, ("n:2x3x4", "n:2x4x5"), lambda a, b: paddle.einsum("bij,bjk->bik", a, b), **R5)
add("einsum.diag", LA, "n:4x4", lambda a: paddle.einsum("ii->i", a))
add("einsum.transpose", LA, "n:3x4", lambda a: paddle.einsum("ij->ji", a))
add("einsum.outer", LA, ("n:3", "n:4"), lambda a, b: paddle.einsum("i,j->ij", a, b))
add("einsum.sum", LA, "n:2x3x4", lambda a: paddle.einsum("ijk->j", a), **R5)
add("linalg.norm.fro", LA, "n:3x4", lambda x: paddle.linalg.norm(x), **R5)
add("linalg.norm.vec2", LA, "n:3x4", lambda x: paddle.linalg.norm(x, p=2, axis=1), **R5)
add("linalg.norm.nuc", LA, "n:3x4", lambda x: paddle.linalg.norm(x, p="nuc", axis=[0, 1]), **R5)
add("linalg.vector_norm", LA, "n:3x4", lambda x: paddle.linalg.vector_norm(x, p=3), **R5)
add("linalg.matrix_norm", LA, "n:3x4", lambda x: paddle.linalg.matrix_norm(x, p=1), **R5)
add("linalg.inv", LA, "spd:4x4", P("linalg.inv"), **R5)
add("linalg.inv.batched", LA, "spd:2x3x3:f64", P("linalg.inv"))
add("linalg.det", LA, "spd:3x3", P("linalg.det"), **R5)
add("linalg.slogdet", LA, "spd:3x3", P("linalg.slogdet"), **R5)
add("linalg.solve", LA, ("spd:3x3", "n:3x2"), P("linalg.solve"), **R5)
add("linalg.cholesky", LA, "spd:4x4", P("linalg.cholesky"), **R5)
add("linalg.cholesky_solve", LA, ("n:3x2", "spd:3x3"), lambda b, a: paddle.linalg.cholesky_solve(b, paddle.linalg.cholesky(a)), **R5)
add("linalg.triangular_solve", LA, ("spd:3x3", "n:3x2"), lambda a, b: paddle.linalg.triangular_solve(paddle.triu(a), b), **R5)
add("linalg.qr", LA, "n:4x3", P("linalg.qr"), **R5)
add("linalg.svd", LA, "n:4x3", lambda x: paddle.linalg.svd(x, full_matrices=False), **R5)
add("linalg.svdvals", LA, "n:4x3", P("linalg.svdvals"), **R5)
add("linalg.eigh", LA, "spd:4x4", P("linalg.eigh"), **R5)
add("linalg.eigvalsh", LA, "spd:4x4", P("linalg.eigvalsh"), **R5)
add("linalg.eig", LA, "spd:3x3", P("linalg.eig"), **R5)
add("linalg.eigvals", LA, "n:3x3", P("linalg.eigvals"), **R5)
add("linalg.lu", LA, "n:3x3", P("linalg.lu"), **R5)
add("linalg.lu_unpack", LA, "n:3x3", lambda x: paddle.linalg.lu_unpack(*paddle.linalg.lu(x)), **R5)
add("linalg.pinv", LA, "n:4x3", P("linalg.pinv"), **R5)
add("linalg.lstsq", LA, ("n:5x3", "n:5x2"), lambda a, b: paddle.linalg.lstsq(a, b)[0], **R5)
add("linalg.matrix_power", LA, "n:3x3", lambda x: paddle.linalg.matrix_power(x, 3), **R5)
add("linalg.matrix_rank", LA, "n:4x3", P("linalg.matrix_rank"))
add("linalg.cond", LA, "spd:3x3", P("linalg.cond"), **R5)
add("linalg.multi_dot", LA, ("n:3x4", "n:4x5", "n:5x2"), lambda *a: paddle.linalg.multi_dot(list(a)), **R5)
add("linalg.cov", LA, "n:3x6", P("linalg.cov"), **R5)
add("linalg.corrcoef", LA, "n:3x6", P("linalg.corrcoef"), **R5)
add("linalg.householder_product", LA, ("n:4x3", "n:3"), P("linalg.householder_product"), **R5)
add("linalg.matrix_exp", LA, "n:3x3", P("linalg.matrix_exp"), **R5)
add("histogram", LA, "n:20", lambda x: paddle.histogram(x, bins=5, min=-2, max=2))
add("bincount", LA, "i6:20", P("bincount"))
add("bincount.weights", LA, ("i6:20", "p:20"), lambda x, w: paddle.bincount(x, weights=w), **R5)

# -- nn.functional layers ------------------------------------------------------------------
NN = "nn"
add("F.conv1d", NN, ("n:2x3x10", "n:4x3x3", "n:4"), lambda x, w, b: F.conv1d(x, w, b, padding=1), **R5)
add("F.conv2d", NN, ("n:2x3x6x6", "n:4x3x3x3", "n:4"), lambda x, w, b: F.conv2d(x, w, b), **R5)
add("F.conv2d.stride_pad_dil", NN, ("n:2x3x7x7", "n:4x3x3x3"), lambda x, w: F.conv2d(x, w, stride=2, padding=2, dilation=2), **R5)
add("F.conv2d.groups", NN, ("n:1x4x5x5", "n:6x2x3x3"), lambda x, w: F.conv2d(x, w, groups=2, padding="SAME"), **R5)
add("F.conv2d.depthwise", NN, ("n:1x4x5x5", "n:4x1x3x3"), lambda x, w: F.conv2d(x, w, groups=4), **R5)
add("F.conv2d.nhwc", NN, ("n:1x5x5x3", "n:4x3x3x3"), lambda x, w: F.conv2d(x, w, data_format="NHWC"), **R5)
add("F.conv3d", NN, ("n:1x2x4x5x5", "n:3x2x3x3x3"), lambda x, w: F.conv3d(x, w, padding=1), **R5)
add("F.conv2d_transpose", NN, ("n:1x4x4x4", "n:4x2x3x3"), lambda x, w: F.conv2d_transpose(x, w, stride=2), **R5)
add("F.conv1d_transpose", NN, ("n:1x4x6", "n:4x2x3"), lambda x, w: F.conv1d_transpose(x, w), **R5)
add("F.conv3d_transpose", NN, ("n:1x2x3x3x3", "n:2x2x2x2x2"), lambda x, w: F.conv3d_transpose(x, w), **R5)
add("F.max_pool1d", NN, "n:2x3x9", lambda x: F.max_pool1d(x, 3, 2))
add("F.max_pool2d", NN, IMG, lambda x: F.max_pool2d(x, 2))
add("F.max_pool2d.mask", NN, IMG, lambda x: F.max_pool2d(x, 3, 2, padding=1, return_mask=True))
add("F.max_pool2d.ceil", NN, "n:1x2x7x7", lambda x: F.max_pool2d(x, 2, ceil_mode=True))
add("F.max_pool3d", NN, "n:1x2x4x4x4", lambda x: F.max_pool3d(x, 2))
add("F.avg_pool1d", NN, "n:2x3x9", lambda x: F.avg_pool1d(x, 3, 2))
add("F.avg_pool2d", NN, IMG, lambda x: F.avg_pool2d(x, 3, 1, padding=1))
add("F.avg_pool2d.exclusive_false", NN, IMG, lambda x: F.avg_pool2d(x, 3, 2, padding=1, exclusive=False))
add("F.avg_pool3d", NN, "n:1x2x4x4x4", lambda x: F.avg_pool3d(x, 2))
add("F.adaptive_avg_pool1d", NN, "n:2x3x9", lambda x: F.adaptive_avg_pool1d(x, 4))
add("F.adaptive_avg_pool2d", NN, IMG, lambda x: F.adaptive_avg_pool2d(x, [4, 3]))
add("F.adaptive_avg_pool2d.1", NN, IMG, lambda x: F.adaptive_avg_pool2d(x, 1))
add("F.adaptive_avg_pool3d", NN, "n:1x2x4x4x4", lambda x: F.adaptive_avg_pool3d(x, 2))
add("F.adaptive_max_pool1d", NN, "n:2x3x9", lambda x: F.adaptive_max_pool1d(x, 4))
add("F.adaptive_max_pool2d", NN, IMG, lambda x: F.adaptive_max_pool2d(x, 3, return_mask=True))
add("F.lp_pool2d", NN, IMG, lambda x: F.lp_pool2d(x, 2, 2), **R5)
add("F.batch_norm.eval", NN, ("n:2x3x4x4", "n:3", "p:3", "p:3", "n:3"), lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False), **R5)
add("F.batch_norm.train", NN, ("n:2x3x4x4", "n:3", "p:3", "p:3", "n:3"), lambda x, m, v, w, b: [F.batch_norm(x, m, v, w, b, training=True), m, v], **R5)
add("F.layer_norm", NN, ("n:2x3x4", "p:4", "n:4"), lambda x, w, b: F.layer_norm(x, 4, w, b), **R5)
add("F.layer_norm.2d", NN, "n:2x3x4", lambda x: F.layer_norm(x, [3, 4]), **R5)
add("F.group_norm", NN, ("n:2x4x3x3", "p:4", "n:4"), lambda x, w, b: F.group_norm(x, 2, weight=w, bias=b), **R5)
add("F.instance_norm", NN, "n:2x3x4x4", lambda x: F.instance_norm(x), **R5)
add("F.local_response_norm", NN, "n:1x5x3x3", lambda x: F.local_response_norm(x, 3), **R5)
add("F.dropout.eval", NN, X, lambda x: F.dropout(x, 0.5, training=False))
add("F.dropout.p0", NN, X, lambda x: F.dropout(x, 0.0, training=True))
add("F.dropout2d.eval", NN, IMG, lambda x: F.dropout2d(x, 0.5, training=False))
add("F.alpha_dropout.eval", NN, X, lambda x: F.alpha_dropout(x, 0.5, training=False))
add("F.embedding", NN, ("i10:3x4", "n:10x5"), lambda i, w: F.embedding(i, w))
add("F.embedding.padding_idx", NN, ("i10:3x4", "n:10x5"), lambda i, w: F.embedding(i, w, padding_idx=0))
add("F.linear", NN, ("n:3x4", "n:4x5", "n:5"), lambda x, w, b: F.linear(x, w, b), **R5)
add("F.linear.nobias", NN, ("n:2x3x4", "n:4x5"), lambda x, w: F.linear(x, w), **R5)
add("F.bilinear", NN, ("n:3x4", "n:3x5", "n:2x4x5", "n:1x2"), lambda a, b, w, bias: F.bilinear(a, b, w, bias), **R5)
for _mode in ["nearest", "bilinear", "bicubic", "area"]:
    add(f"F.interpolate.{_mode}", NN, IMG, lambda x, _m=_mode: F.interpolate(x, size=[9, 4], mode=_m), **R5)
add("F.interpolate.bilinear_ac", NN, IMG, lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True), **R5)
add("F.interpolate.linear", NN, "n:2x3x6", lambda x: F.interpolate(x, size=[10], mode="linear", data_format="NCW"), **R5)
add("F.interpolate.trilinear", NN, "n:1x2x3x4x4", lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), **R5)
add("F.upsample", NN, IMG, lambda x: F.upsample(x, scale_factor=2, mode="nearest"))
add("F.cross_entropy", NN, ("n:4x5", "i5:4"), lambda x, y: F.cross_entropy(x, y), **R5)
add("F.cross_entropy.soft", NN, ("n:4x5", "n:4x5"), lambda x, y: F.cross_entropy(x, F.softmax(y), soft_label=True), **R5)
add("F.cross_entropy.ignore_none", NN, ("n:4x5", "i5:4"), lambda x, y: F.cross_entropy(x, y, ignore_index=1, reduction="none"), **R5)
add("F.cross_entropy.weight", NN, ("n:4x5", "i5:4", "p:5"), lambda x, y, w: F.cross_entropy(x, y, weight=w), **R5)
add("F.cross_entropy.smoothing", NN, ("n:4x5", "i5:4"), lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1), **R5)
add("F.softmax_with_cross_entropy", NN, ("n:4x5", "i5:4x1"), lambda x, y: F.softmax_with_cross_entropy(x, y), **R5)
add("F.mse_loss", NN, ("n:3x4", "n:3x4"), FN("mse_loss"), **R5)
add("F.l1_loss", NN, ("n:3x4", "n:3x4"), lambda x, y: F.l1_loss(x, y, reduction="sum"), **R5)
add("F.nll_loss", NN, ("n:4x5", "i5:4"), lambda x, y: F.nll_loss(F.log_softmax(x), y), **R5)
add("F.binary_cross_entropy", NN, ("z:3x4", "i2:3x4:f32"), FN("binary_cross_entropy"), **R5)
add("F.binary_cross_entropy_with_logits", NN, ("n:3x4", "i2:3x4:f32"), FN("binary_cross_entropy_with_logits"), **R5)
add("F.kl_div", NN, ("n:3x4", "z:3x4"), lambda x, y: F.kl_div(F.log_softmax(x), y, reduction="batchmean"), **R5)
add("F.smooth_l1_loss", NN, ("n:3x4", "n:3x4"), FN("smooth_l1_loss"), **R5)
add("F.huber_loss.none", NN, ("n:3x4", "n:3x4"), lambda x, y: F.smooth_l1_loss(x, y, reduction="none", delta=0.5), **R5)
add("F.margin_ranking_loss", NN, ("n:5", "n:5", "i2:5:f32"), lambda a, b, y: F.margin_ranking_loss(a, b, y * 2 - 1), **R5)
add("F.hinge_embedding_loss", NN, ("n:5", "i2:5:f32"), lambda a, y: F.hinge_embedding_loss(a, y * 2 - 1), **R5)
add("F.cosine_similarity", NN, ("n:3x4", "n:3x4"), FN("cosine_similarity"), **R5)
add("F.cosine_embedding_loss", NN, ("n:3x4", "n:3x4", "i2:3"), lambda a, b, y: F.cosine_embedding_loss(a, b, y * 2 - 1), **R5)
add("F.triplet_margin_loss", NN, ("n:3x4", "n:3x4", "n:3x4"), FN("triplet_margin_loss"), **R5)
add("F.pairwise_distance", NN, ("n:3x4", "n:3x4"), FN("pairwise_distance"), **R5)
add("F.square_error_cost", NN, ("n:3x4", "n:3x4"), FN("square_error_cost"), **R5)
add("F.log_loss", NN, ("z:4x1", "i2:4x1:f32"), FN("log_loss"), **R5)
add("F.sigmoid_focal_loss", NN, ("n:3x4", "i2:3x4:f32"), FN("sigmoid_focal_loss"), **R5)
add("F.multi_label_soft_margin_loss", NN, ("n:3x4", "i2:3x4:f32"), FN("multi_label_soft_margin_loss"), **R5)
add("F.soft_margin_loss", NN, ("n:3x4", "i2:3x4:f32"), lambda x, y: F.soft_margin_loss(x, y * 2 - 1), **R5)
add("F.poisson_nll_loss", NN, ("n:3x4", "p:3x4"), FN("poisson_nll_loss"), **R5)
add("F.gaussian_nll_loss", NN, ("n:3x4", "n:3x4", "p:3x4"), FN("gaussian_nll_loss"), **R5)
add("F.ctc_loss", NN, ("n:6x2x5", "i4:2x3"), lambda lp, lab: F.ctc_loss(F.log_softmax(lp), (lab + 1).astype("int32"), T([6, 6], "int64"), T([3, 2], "int64")), **R5)
add("F.one_hot", NN, "i5:6", lambda x: F.one_hot(x, 5))
add("F.one_hot.2d", NN, "i4:2x3", lambda x: F.one_hot(x, 4))
add("F.label_smooth", NN, "i2:3x4:f32", lambda x: F.label_smooth(x, epsilon=0.1), **R5)
add("F.pixel_shuffle", NN, "n:1x8x3x3", lambda x: F.pixel_shuffle(x, 2))
add("F.pixel_unshuffle", NN, "n:1x2x4x4", lambda x: F.pixel_unshuffle(x, 2))
add("F.channel_shuffle", NN, "n:1x6x2x2", lambda x: F.channel_shuffle(x, 3))
add("F.unfold", NN, "n:1x2x5x5", lambda x: F.unfold(x, 3, strides=1, paddings=1))
add("F.fold", NN, "n:1x12x9", lambda x: F.fold(x, [4, 4], 2, strides=1), **R5)
add("F.affine_grid", NN, "n:2x2x3", lambda t: F.affine_grid(t, [2, 1, 3, 4], align_corners=False), **R5)
add("F.grid_sample", NN, ("n:1x2x4x4", "u:1x3x3x2"), lambda x, g: F.grid_sample(x, g, align_corners=False), **R5)
add("F.sequence_mask", NN, "i5:4", lambda x: F.sequence_mask(x, maxlen=5))
add("F.temporal_shift", NN, "n:4x4x2x2", lambda x: F.temporal_shift(x, seg_num=2))
add("F.zeropad2d", NN, IMG, lambda x: F.zeropad2d(x, [1, 0, 2, 1]))
add("F.scaled_dot_product_attention", NN, ("n:1x4x2x8", "n:1x4x2x8", "n:1x4x2x8"), FN("scaled_dot_product_attention"), **R5)
add("amp.O1.bf16_matmul", NN, ("n:3x4", "n:4x5"), lambda x, y: _amp(lambda: paddle.matmul(x, y), "bfloat16", "O1"), rtol=1e-2, atol=1e-2)
add("amp.O1.bf16_linear_relu", NN, ("n:3x4", "n:4x5", "n:5"), lambda x, w, b: _amp(lambda: F.relu(F.linear(x, w, b)), "bfloat16", "O1"), rtol=1e-2, atol=1e-2)
add("amp.O2.bf16_add", NN, ("n:3x4", "n:3x4"), lambda x, y: _amp(lambda: x + y, "bfloat16", "O2"), rtol=1e-2, atol=1e-2)
add("mixed.layer_norm_f64_weight", NN, ("n:2x3x4:f64", "p:4:f64", "n:4:f64"), lambda x, w, b: F.layer_norm(x, 4, w, b), **R5)
add("F.gumbel_softmax.hard_shape", NN, X, lambda x: list(F.gumbel_softmax(x, hard=True).shape))
add("nn.Linear.layer", NN, "n:3x4", lambda x: (paddle.seed(1), paddle.nn.Linear(4, 2, weight_attr=paddle.nn.initializer.Constant(0.3))(x))[1], **R5)
add("nn.LSTM", NN, "n:2x5x3", lambda x: (paddle.seed(3), paddle.nn.LSTM(3, 4, weight_ih_attr=paddle.nn.initializer.Constant(0.1), weight_hh_attr=paddle.nn.initializer.Constant(-0.05))(x))[1], **R5)
add("nn.MultiHeadAttention", NN, "n:2x3x8", lambda x: paddle.nn.MultiHeadAttention(8, 2, weight_attr=paddle.nn.initializer.Constant(0.05))(x, x, x), **R5)

# -- sorting / searching ---------------------------------------------------------------------
SO = "sort"
add("sort", SO, X3, P("sort"))
add("sort.ax0.desc", SO, X3, lambda x: paddle.sort(x, axis=0, descending=True))
add("sort.i64", SO, "s9:3x5", P("sort"))
add("argsort", SO, X3, P("argsort"))
add("argsort.desc_stable", SO, "i3:3x6", lambda x: paddle.argsort(x, descending=True, stable=True))
add("topk", SO, "n:3x6", lambda x: paddle.topk(x, 2))
add("topk.smallest_ax0", SO, "n:5x3", lambda x: paddle.topk(x, 3, axis=0, largest=False))
add("argmax", SO, X3, P("argmax"))
add("argmax.ax1_keep", SO, X3, lambda x: paddle.argmax(x, axis=1, keepdim=True))
add("argmin.ax-1", SO, X3, lambda x: paddle.argmin(x, axis=-1))
add("argmax.i32_dtype", SO, "s9:3x5", lambda x: paddle.argmax(x, axis=0, dtype="int32"))
add("unique", SO, "i5:12", P("unique"))
add("unique.all", SO, "i5:12", lambda x: paddle.unique(x, return_index=True, return_inverse=True, return_counts=True))
add("unique.axis", SO, "i2:4x3", lambda x: paddle.unique(x, axis=0))
add("unique.float", SO, "i4:3x4:f32", P("unique"))
add("searchsorted", SO, ("sorted:2x6", "n:2x3"), P("searchsorted"))
add("searchsorted.right", SO, ("sorted:6", "n:4"), lambda s, v: paddle.searchsorted(s, v, right=True))
add("bucketize", SO, ("n:3x4", "sorted:5"), P("bucketize"))
add("nonzero", SO, "i2:3x4", P("nonzero"))
add("nonzero.as_tuple", SO, "b:3x4", lambda x: paddle.nonzero(x, as_tuple=True))
add("kthvalue", SO, "n:3x5", lambda x: paddle.kthvalue(x, 2))
add("kthvalue.ax0_keep", SO, "n:5x3", lambda x: paddle.kthvalue(x, 3, axis=0, keepdim=True))
add("mode", SO, "i3:3x6", lambda x: paddle.mode(x.astype("float32")))
add("msort", SO, "n:4x3", P("msort"))
add("histogramdd.shape", SO, "n:10x2", lambda x: paddle.histogramdd(x, bins=3)[0])
add("index_of_max_eq", SO, "n:3x4", lambda x: paddle.nonzero(x == x.max()))

# -- cumulative ------------------------------------------------------------------------------
CU = "cumulative"
add("cumsum", CU, X3, lambda x: paddle.cumsum(x, axis=1), rtol=1e-5)
add("cumsum.flat", CU, X3, P("cumsum"), rtol=1e-5)
add("cumsum.i64", CU, "s9:3x4", lambda x: paddle.cumsum(x, axis=-1))
add("cumsum.dtype", CU, "s9:3x4:i32", lambda x: paddle.cumsum(x, axis=0, dtype="int64"))
add("cumprod", CU, "p:3x4", lambda x: paddle.cumprod(x, dim=1), rtol=1e-5)
add("cummax", CU, X3, lambda x: paddle.cummax(x, axis=2))
add("cummin", CU, X3, lambda x: paddle.cummin(x, axis=0))
add("logcumsumexp", CU, X3, lambda x: paddle.logcumsumexp(x, axis=1), rtol=1e-5)
add("diff", CU, X3, lambda x: paddle.diff(x, axis=-1))
add("diff.prepend", CU, ("n:5", "n:2"), lambda x, p: paddle.diff(x, prepend=p))
add("trapezoid", CU, "n:3x5", lambda x: paddle.trapezoid(x, dx=0.5), rtol=1e-5)
add("cumulative_trapezoid", CU, "n:3x5", lambda x: paddle.cumulative_trapezoid(x), rtol=1e-5)
add("Tensor.cumsum_method", CU, X3, lambda x: x.cumsum(0), rtol=1e-5)

# -- random (fixed paddle.seed) ------------------------------------------------------------------
RN = "random"
add("rand", RN, (), lambda: paddle.rand([3, 4]), random=True)
add("randn", RN, (), lambda: paddle.randn([3, 4]), random=True)
add("randint", RN, (), lambda: paddle.randint(0, 10, [3, 4]), random=True)
add("randperm", RN, (), lambda: paddle.randperm(10), random=True)
add("uniform", RN, (), lambda: paddle.uniform([3, 4], min=-2.0, max=2.0), random=True)
add("normal", RN, (), lambda: paddle.normal(1.0, 2.0, [3, 4]), random=True)
add("standard_normal", RN, (), lambda: paddle.standard_normal([3, 4]), random=True)
add("bernoulli", RN, "z:3x4", P("bernoulli"), random=True)
add("multinomial", RN, "p:2x5", lambda x: paddle.multinomial(x, 3), random=True)
add("poisson", RN, "p:3x4", P("poisson"), random=True)
add("uniform_", RN, "n:3x4", inplace("uniform_"), random=True)
add("normal_", RN, "n:3x4", inplace("normal_"), random=True)
add("exponential_", RN, "n:3x4", inplace("exponential_"), random=True)
add("F.dropout.train", RN, "n:4x5", lambda x: F.dropout(x, 0.5, training=True), random=True)
add("F.gumbel_softmax", RN, "n:3x4", lambda x: F.gumbel_softmax(x), random=True)
add("F.rrelu.train", RN, "n:3x4", lambda x: F.rrelu(x, training=True), random=True)
add("randint_like", RN, "n:3x4", lambda x: paddle.randint_like(x, 0, 5), random=True)
add("rand_like", RN, "n:3x4", lambda x: paddle.rand_like(x) if hasattr(paddle, "rand_like") else paddle.rand(x.shape), random=True)
add("seed_reproducible", RN, (), lambda: [(paddle.seed(5), paddle.rand([4]))[1], (paddle.seed(5), paddle.rand([4]))[1]], random=True)

# -- complex --------------------------------------------------------------------------------------
CX = "complex"
add("c.real_imag", CX, "c:3x4", lambda x: [paddle.real(x), paddle.imag(x)])
add("c.abs", CX, "c:3x4", P("abs"))
add("c.angle", CX, "c:3x4", P("angle"))
add("c.conj", CX, "c:3x4", P("conj"))
add("c.add_mul_div", CX, ("c:3x4", "c:3x4"), lambda x, y: [x + y, x * y, x / y], rtol=1e-5)
add("c.matmul", CX, ("c:3x4", "c:4x2"), P("matmul"), rtol=1e-5, atol=1e-5)
add("c.exp", CX, "c:3x4", P("exp"), rtol=1e-5)
add("c.sum", CX, "c:3x4", lambda x: paddle.sum(x, axis=1), rtol=1e-5)
add("c.as_real", CX, "c:3x4", P("as_real"))
add("c.as_complex", CX, "n:3x4x2", P("as_complex"))
add("c.c128_mul", CX, ("c:3x4:c128", "c:3x4:c128"), lambda x, y: x * y)
add("c.equal", CX, ("c:3x4", "c:3x4"), lambda x, y: [x == x, x == y])
add("fft.fft", CX, "n:8", lambda x: paddle.fft.fft(x), rtol=1e-5, atol=1e-5)
add("fft.ifft", CX, "c:8", lambda x: paddle.fft.ifft(x), rtol=1e-5, atol=1e-5)
add("fft.rfft", CX, "n:3x8", lambda x: paddle.fft.rfft(x), rtol=1e-5, atol=1e-5)
add("fft.irfft", CX, "c:3x5", lambda x: paddle.fft.irfft(x), rtol=1e-5, atol=1e-5)
add("fft.fft2", CX, "c:4x4", lambda x: paddle.fft.fft2(x), rtol=1e-5, atol=1e-5)
add("fft.fftshift", CX, "n:3x4", lambda x: paddle.fft.fftshift(x))
add("fft.fftfreq", CX, (), lambda: paddle.fft.fftfreq(8, 0.5))
add("c.sqrt", CX, "c:3x4", P("sqrt"), rtol=1e-5)
add("signal.stft", CX, "n:2x32", lambda x: paddle.signal.stft(x, 8, 4), rtol=1e-5, atol=1e-5)


# -- more in-place variants (each is its own eager op: abs_ is not abs) --------------------------
def _ip(name: str, *args: Any) -> Callable[..., Any]:
    """x.<name>(*rest, *args) if Tensor has it, else paddle.<name>(x, *rest, *args); returns
    [result, x] (the in-place result and the input it was written into)."""

    def fn(x: Any, *rest: Any) -> Any:
        f = getattr(x, name, None)
        r = f(*rest, *args) if f is not None else getattr(paddle, name)(x, *rest, *args)
        return [r, x]

    return fn


for _n, _k in [("acos_", "u"), ("acosh_", "g"), ("asin_", "u"), ("asinh_", "n"), ("atan_", "n"),
               ("atanh_", "u"), ("ceil_", "n"), ("cos_", "n"), ("cosh_", "n"), ("digamma_", "p"),
               ("erf_", "n"), ("erfinv_", "u"), ("expm1_", "n"), ("frac_", "n"), ("i0_", "n"),
               ("lgamma_", "p"), ("log_", "p"), ("log10_", "p"), ("log1p_", "p"), ("log2_", "p"),
               ("logit_", "z"), ("neg_", "n"), ("reciprocal_", "p"), ("round_", "n"),
               ("rsqrt_", "p"), ("sin_", "n"), ("sinh_", "n"), ("square_", "n"), ("tan_", "u"),
               ("trunc_", "n"), ("gammaln_", "p")]:
    add(_n, IP, f"{_k}:3x4", _ip(_n))
add("polygamma_", IP, "p:3x4", _ip("polygamma_", 1))
for _n in ["equal_", "not_equal_", "less_than_", "less_equal_", "greater_than_", "greater_equal_"]:
    add(_n, IP, ("i3:3x4:f32", "i3:3x4:f32"), _ip(_n))
for _n in ["logical_and_", "logical_or_", "logical_xor_"]:
    add(_n, IP, ("b:3x4", "b:3x4"), _ip(_n))
add("logical_not_", IP, "b:3x4", _ip("logical_not_"))
for _n in ["bitwise_and_", "bitwise_or_", "bitwise_xor_"]:
    add(_n, IP, ("s50:3x4:i32", "s50:3x4:i32"), _ip(_n))
add("bitwise_not_", IP, "s50:3x4:i32", _ip("bitwise_not_"))
add("bitwise_left_shift_", IP, ("s50:3x4:i32", "i4:3x4:i32"), _ip("bitwise_left_shift_"))
add("bitwise_right_shift_", IP, ("s50:3x4:i32", "i4:3x4:i32"), _ip("bitwise_right_shift_"))
add("remainder_", IP, ("n:3x4", "p:3x4"), _ip("remainder_"))
add("floor_divide_", IP, ("s9:3x4", "i4:3x4"), lambda x, y: _ip("floor_divide_")(x, y + 1))
add("copysign_", IP, ("n:3x4", "n:3x4"), _ip("copysign_"))
add("tril_", IP, "n:4x4", _ip("tril_"))
add("triu_", IP, "n:4x4", _ip("triu_", 1))
add("cumsum_", IP, "n:3x4", lambda x: [paddle.cumsum_(x, axis=1), x], rtol=1e-5)
add("cumprod_", IP, "p:3x4", lambda x: [paddle.cumprod_(x, dim=0), x], rtol=1e-5)
add("renorm_", IP, "n:3x4", lambda x: [paddle.renorm_(x, 2.0, 0, 1.0), x], rtol=1e-5)
add("squeeze_", IP, "n:3x1x4", _ip("squeeze_", 1))
add("unsqueeze_", IP, "n:3x4", _ip("unsqueeze_", 0))
add("put_along_axis_", IP, ("n:3x4", "i4:3x1", "n:3x1"), lambda x, i, v: [x.put_along_axis_(i, v, 1), x])
add("index_add_", IP, ("n:4x5", "i5:3", "n:4x3"), lambda x, i, v: [paddle.index_add_(x, i, 1, v), x])
add("index_fill_", IP, ("n:4x5", "i5:2"), lambda x, i: [paddle.index_fill_(x, i, 1, -1.0), x])
add("addmm_", IP, ("n:3x5", "n:3x4", "n:4x5"), lambda i, x, y: [i.addmm_(x, y), i], rtol=1e-5)
add("F.hardtanh_", IP, "n:3x4", lambda x: [F.hardtanh_(x), x])
add("F.leaky_relu_", IP, "n:3x4", lambda x: [F.leaky_relu_(x), x])
add("F.thresholded_relu_", IP, "n:3x4", lambda x: [F.thresholded_relu_(x), x])
add("cast_.f32->i64", IP, lambda r: r.integers(0, 6, (3, 4)).astype("float32"), lambda x: [x.cast_("int64"), x])
add("cast_.f32->f16", IP, "n:3x4", lambda x: [x.cast_("float16"), x])
add("cast_.i64->f32", IP, "s9:3x4", lambda x: [x.cast_("float32"), x])
add("cast_.i32->f64", IP, "s9:3x4:i32", lambda x: [x.cast_("float64"), x])

# -- more ops Paddle exposes (vision, geometric, text, metric, signal, misc) ---------------------
MI = "misc"
add("renorm", MI, "n:3x4", lambda x: paddle.renorm(x, 2.0, 0, 1.0), rtol=1e-5)
add("gammaincc", MI, ("p:3x4", "p:3x4"), P("gammaincc"), rtol=1e-5)
add("gammainc", MI, ("p:3x4", "p:3x4"), P("gammainc"), rtol=1e-5)
add("shape", MI, X3, P("shape"), place_ok=True, note="the shape kernel's output is a CPU tensor on every device")
add("divide.trunc", MI, ("n:3x4", "p:3x4"), lambda x, y: paddle.divide(x, y, rounding_mode="trunc"))
add("divide.floor", MI, ("n:3x4", "p:3x4"), lambda x, y: paddle.divide(x, y, rounding_mode="floor"))
add("full.tensor_shape", MI, (), lambda: paddle.full(T([2, 3]), 1.5))
add("full.tensor_value", MI, (), lambda: paddle.full([2, 3], T(2.5)))
add("linalg.lu_solve", MI, ("n:3x3", "n:3x2"), lambda a, b: paddle.linalg.lu_solve(b, *paddle.linalg.lu(a)), rtol=1e-5, atol=1e-5)
add("linalg.matrix_rank.tol", MI, "n:4x3", lambda x: paddle.linalg.matrix_rank(x, tol=0.5))
add("linalg.norm.fro_axis", MI, "n:2x3x4", lambda x: paddle.linalg.norm(x, "fro", axis=[1, 2]), rtol=1e-5)
add("F.conv2d_transpose.depthwise", MI, ("n:1x3x4x4", "n:3x1x3x3"), lambda x, w: F.conv2d_transpose(x, w, groups=3), rtol=1e-5, atol=1e-5)
add("F.max_pool3d.mask", MI, "n:1x2x4x4x4", lambda x: F.max_pool3d(x, 2, return_mask=True))
add("F.max_unpool2d", MI, IMG, lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_mask=True), 2))
add("F.max_unpool3d", MI, "n:1x2x4x4x4", lambda x: F.max_unpool3d(*F.max_pool3d(x, 2, return_mask=True), 2))
add("F.hsigmoid_loss", MI, ("n:4x3", "i5:4", "n:4x3"), lambda x, y, w: F.hsigmoid_loss(x, y, 5, w), rtol=1e-5)
add("F.gather_tree", MI, ("i4:3x2x2", "i2:3x2x2"), lambda ids, par: F.gather_tree(ids, par))
add("F.swiglu", MI, ("n:3x4", "n:3x4"), lambda x, y: paddle.incubate.nn.functional.swiglu(x, y), rtol=1e-5)
add("geometric.segment_sum", MI, ("n:5x3", lambda r: np.array([0, 0, 1, 2, 2])), lambda x, s: paddle.geometric.segment_sum(x, s))
add("geometric.segment_max", MI, ("n:5x3", lambda r: np.array([0, 0, 1, 2, 2])), lambda x, s: paddle.geometric.segment_max(x, s))
add("geometric.send_u_recv", MI, ("n:4x3", "i4:6", "i4:6"), lambda x, s, d: paddle.geometric.send_u_recv(x, s, d, reduce_op="sum"))
add("geometric.send_ue_recv", MI, ("n:4x3", "n:6x3", "i4:6", "i4:6"), lambda x, e, s, d: paddle.geometric.send_ue_recv(x, e, s, d, "mul", "sum"))
add("geometric.send_uv", MI, ("n:4x3", "n:4x3", "i4:6", "i4:6"), lambda x, y, s, d: paddle.geometric.send_uv(x, y, s, d, "add"))
add("text.viterbi_decode", MI, ("n:2x4x3", "n:3x3", lambda r: np.array([4, 3])), lambda e, t, n: paddle.text.viterbi_decode(e, t, n, False))
add("metric.accuracy", MI, ("n:5x4", "i4:5x1"), lambda x, y: paddle.metric.accuracy(F.softmax(x), y, k=2))
add("amp.check_numerics", MI, "n:3x4", lambda x: paddle.amp.debugging.check_numerics(x, "op", "x"))
add("signal.istft", MI, "n:2x32", lambda x: paddle.signal.istft(paddle.signal.stft(x, 8, 4), 8, 4), rtol=1e-5, atol=1e-5)
add("vision.nms", MI, lambda r: np.array([[0, 0, 2, 2], [0.1, 0.1, 2, 2], [3, 3, 4, 4], [0, 0, 1.5, 1.5]], "float32"), lambda b: paddle.vision.ops.nms(b, 0.5))
add("vision.roi_align", MI, ("n:1x2x8x8", lambda r: np.array([[0, 0, 4, 4], [2, 2, 7, 6]], "float32")), lambda x, b: paddle.vision.ops.roi_align(x, b, T([2], "int32"), 2), rtol=1e-5)
add("vision.roi_pool", MI, ("n:1x2x8x8", lambda r: np.array([[0, 0, 4, 4], [2, 2, 7, 6]], "float32")), lambda x, b: paddle.vision.ops.roi_pool(x, b, T([2], "int32"), 2))
add("vision.box_coder", MI, ("p:4x4", "p:4x4"), lambda p, t: paddle.vision.ops.box_coder(p, [0.1, 0.1, 0.2, 0.2], t, "encode_center_size"), rtol=1e-5)
add("vision.prior_box", MI, ("n:1x2x4x4", "n:1x3x16x16"), lambda x, im: paddle.vision.ops.prior_box(x, im, min_sizes=[4.0]), rtol=1e-5)
add("vision.yolo_box", MI, ("n:1x14x2x2", lambda r: np.array([[32, 32]], "int32")), lambda x, s: paddle.vision.ops.yolo_box(x, s, [10, 13, 16, 30], 2, 0.01, 8), rtol=1e-5)
add("vision.deform_conv2d", MI, ("n:1x2x5x5", "u:1x18x3x3", "n:3x2x3x3"), lambda x, off, w: paddle.vision.ops.deform_conv2d(x, off, w), rtol=1e-5, atol=1e-5)
add("binomial", RN, (), lambda: paddle.binomial(T([10, 20, 30], "int64"), T([0.2, 0.5, 0.9])), random=True)
add("standard_gamma", RN, "p:3x4", P("standard_gamma"), random=True)
add("F.fractional_max_pool2d", RN, IMG, lambda x: F.fractional_max_pool2d(x, 3), random=True)
add("initializer.TruncatedNormal", RN, (), lambda: paddle.create_parameter([3, 4], "float32", default_initializer=paddle.nn.initializer.TruncatedNormal()), random=True)


def _opt_step(name: str, **kw: Any) -> Callable[..., Any]:
    """A Linear(4, 3) from numpy weights; two steps of the optimizer ``name``; the
    parameters after each step (and the grad-clip variants via ``grad_clip``)."""

    def fn(x: Any, y: Any) -> Any:
        lin = paddle.nn.Linear(4, 3)
        rng = np.random.default_rng(11)
        for p in lin.parameters():
            p.set_value((rng.standard_normal(p.shape) * 0.5).astype("float32"))
        opt_kw = dict(kw)
        clip = opt_kw.pop("clip", None)
        if clip == "global":
            opt_kw["grad_clip"] = paddle.nn.ClipGradByGlobalNorm(0.5)
        elif clip == "norm":
            opt_kw["grad_clip"] = paddle.nn.ClipGradByNorm(0.5)
        opt = getattr(paddle.optimizer, name)(parameters=lin.parameters(), **opt_kw)
        res = []
        for _ in range(2):
            loss = F.mse_loss(lin(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            res += [loss] + [p.clone() for p in lin.parameters()]
        return res

    return fn


OPT = "optimizer"
for _name, _kw in [("SGD", {"learning_rate": 0.1}), ("Momentum", {"learning_rate": 0.1}),
                   ("Momentum", {"learning_rate": 0.1, "use_nesterov": True, "weight_decay": 0.01}),
                   ("Adam", {"learning_rate": 0.01}), ("AdamW", {"learning_rate": 0.01}),
                   ("Adagrad", {"learning_rate": 0.1}), ("Adadelta", {"learning_rate": 0.5}),
                   ("Adamax", {"learning_rate": 0.01}), ("RMSProp", {"learning_rate": 0.01}),
                   ("Lamb", {"learning_rate": 0.01}), ("NAdam", {"learning_rate": 0.01}),
                   ("RAdam", {"learning_rate": 0.01}), ("ASGD", {"learning_rate": 0.01}),
                   ("Rprop", {"learning_rate": 0.01}),
                   ("SGD", {"learning_rate": 0.1, "clip": "global"}),
                   ("SGD", {"learning_rate": 0.1, "clip": "norm"})]:
    _tag = "".join(f".{k}={v}" for k, v in _kw.items() if k != "learning_rate")
    add(f"opt.{_name}{_tag}", OPT, ("n:5x4", "n:5x3"), _opt_step(_name, **_kw), rtol=1e-5, atol=1e-5)


def _grad_scaler(x: Any, y: Any) -> Any:
    lin = paddle.nn.Linear(4, 3)
    rng = np.random.default_rng(12)
    for p in lin.parameters():
        p.set_value((rng.standard_normal(p.shape) * 0.5).astype("float32"))
    opt = paddle.optimizer.SGD(0.1, parameters=lin.parameters())
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0, incr_every_n_steps=1)
    res = []
    for _ in range(2):
        loss = F.mse_loss(lin(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()
        res += [loss] + [p.clone() for p in lin.parameters()]
    return res


if os.environ.get("EAGER_SWEEP_SELFTEST"):  # the runner's own crash/timeout handling
    add("selftest.crash", "selftest", (), lambda: os.abort())
    add("selftest.hang", "selftest", (), lambda: time.sleep(3600))
    add("selftest.ok", "selftest", "n:3", lambda x: x + 1)

add("amp.GradScaler", OPT, ("n:5x4", "n:5x3"), _grad_scaler, rtol=1e-5, atol=1e-5)


def _embedding_step(sparse: bool) -> Callable[..., Any]:
    def fn(ids: Any, y: Any) -> Any:
        emb = paddle.nn.Embedding(6, 3, sparse=sparse)
        emb.weight.set_value((np.random.default_rng(13).standard_normal((6, 3)) * 0.5).astype("float32"))
        opt = paddle.optimizer.SGD(0.1, parameters=emb.parameters())
        loss = F.mse_loss(emb(ids).sum(1), y)
        loss.backward()
        opt.step()
        return [loss, emb.weight.clone()]

    return fn


add("opt.SGD.embedding", OPT, ("i6:4x2", "n:4x3"), _embedding_step(False), rtol=1e-5, atol=1e-5)
add("opt.SGD.embedding_sparse", OPT, ("i6:4x2", "n:4x3"), _embedding_step(True), rtol=1e-5, atol=1e-5)

# -- autograd: a representative subset of the cases above, with backward ---------------------------
GRAD_OF = [
    # unary
    "abs", "acos", "asin", "atan", "cos", "cosh", "erf", "exp", "expm1", "log", "log1p", "rsqrt",
    "reciprocal", "sigmoid", "sin", "sinh", "sqrt", "square", "tan", "tanh", "lgamma",
    "scale", "clip", "pow.scalar", "exp.f64",
    # binary
    "add.bcast", "subtract.bcast", "multiply.bcast", "divide", "pow", "maximum", "atan2", "lerp",
    "op.matmul", "cross",
    # activations
    "F.relu", "F.gelu", "F.silu", "F.softmax", "F.log_softmax", "F.leaky_relu", "F.elu",
    "F.hardswish", "F.softplus", "F.prelu",
    # reductions
    "sum.ax1", "mean.ax02", "max.ax1", "prod.ax1", "logsumexp.all", "std.ax1", "var.axm1.keep",
    "norm.fro",
    # manipulation and views
    "reshape", "transpose.3d", "concat.ax1", "stack.ax0", "split.sections", "getitem.slices",
    "gather", "gather_nd", "index_select", "tile", "expand", "flip", "roll", "squeeze",
    "pad.reflect", "where", "masked_fill", "view.transpose_concat", "view.step_slice_add",
    "view.as_strided", "view.unfold_cover", "view.diagonal_then_add", "view.split_then_add",
    "view.unbind_then_stack", "getitem.int", "slice", "strided_slice", "narrow", "unbind",
    "view.slice_matmul", "scatter.overwrite", "take_along_axis", "cumsum", "cumprod",
    "sort", "topk", "repeat_interleave.int", "tril",
    # linalg / nn
    "matmul.batched", "bmm", "einsum.bmm", "linalg.inv", "linalg.det", "linalg.cholesky",
    "F.conv2d", "F.conv2d_transpose", "F.max_pool2d", "F.avg_pool2d", "F.adaptive_avg_pool2d",
    "F.batch_norm.train", "F.layer_norm", "F.group_norm", "F.linear", "F.embedding",
    "F.interpolate.bilinear", "F.cross_entropy", "F.mse_loss", "F.binary_cross_entropy_with_logits",
    "F.kl_div", "F.smooth_l1_loss", "c.abs",
]
_BY_NAME = {c.name: c for c in CASES}
for _g in GRAD_OF:
    _c = _BY_NAME[_g]
    CASES.append(replace(_c, name=f"grad.{_g}", family="autograd", grad=True,
                         rtol=max(_c.rtol or 1e-6, 1e-5), atol=max(_c.atol or 1e-6, 1e-5)))
    _NAMES.add(f"grad.{_g}")


def _train_net(opt: str) -> Callable[..., Any]:
    """Conv2D + BatchNorm + ReLU + Linear: forward, backward, one optimizer step, and
    the forward after it.  Parameters come from numpy (no generator involved)."""

    def fn(x: Any, label: Any) -> Any:
        nn = paddle.nn
        net = nn.Sequential(
            nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4), nn.ReLU(), nn.Flatten(),
            nn.Linear(4 * 6 * 6, 5),
        )
        net.train()
        rng = np.random.default_rng(7)
        for p in net.parameters():  # BatchNorm's running stats included
            p.set_value(np.abs(rng.standard_normal(p.shape) * 0.1).astype("float32"))
        params = [p for p in net.parameters() if not p.stop_gradient]
        if opt == "sgd":
            o = paddle.optimizer.SGD(0.1, parameters=params)
        else:
            o = paddle.optimizer.Adam(0.01, parameters=params)
        out = net(x)
        loss = F.cross_entropy(out, label)
        loss.backward()
        grads = [p.grad.clone() for p in params]
        o.step()
        o.clear_grad()
        bn = net[1]
        after = [p.clone() for p in params] + [bn._mean.clone(), bn._variance.clone()]
        out2 = net(x)
        loss2 = F.cross_entropy(out2, label)
        loss2.backward()
        o.step()
        return [out, loss, grads, after, out2, loss2, [p.clone() for p in params]]

    return fn


add("train.conv_bn_relu_linear.sgd", "autograd", ("n:4x3x6x6", "i5:4"), _train_net("sgd"), rtol=1e-5, atol=1e-5)
add("train.conv_bn_relu_linear.adam", "autograd", ("n:4x3x6x6", "i5:4"), _train_net("adam"), rtol=1e-5, atol=1e-5)


# fmt: on

# ----------------------------------------------------------------------------
# Running one case
# ----------------------------------------------------------------------------

_CALLED: set[str] = set()  # paddle._C_ops names called (all cases)
_CASE_CALLED: set[str] = set()  # ... during the current case
_FAILED_OP: list[str] = []  # innermost _C_ops call that raised


def instrument_c_ops() -> int:
    """Wrap every callable of ``paddle._C_ops`` to record its name when called."""
    mod = sys.modules["paddle._C_ops"]
    n = 0
    for name in dir(mod):
        if name.startswith("__"):
            continue
        f = getattr(mod, name)
        if not callable(f) or getattr(f, "_sweep_wrapped", False) or isinstance(f, type):
            continue

        def wrapper(*a: Any, _f: Any = f, _n: str = name, **kw: Any) -> Any:
            _CALLED.add(_n)
            _CASE_CALLED.add(_n)
            try:
                return _f(*a, **kw)
            except Exception:
                if not _FAILED_OP:
                    _FAILED_OP.append(_n)
                raise

        functools.update_wrapper(wrapper, f)
        wrapper._sweep_wrapped = True  # type: ignore[attr-defined]
        setattr(mod, name, wrapper)
        n += 1
    return n


def _ipu_place() -> Any:
    return paddle.CustomPlace("ipu", 0)


def _to_numpy(t: Any) -> np.ndarray:
    a = t.numpy()
    if t.dtype == paddle.bfloat16:  # numpy() gives the bits as uint16
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def _flatten(out: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    if isinstance(out, (list, tuple)):
        res = []
        for i, o in enumerate(out):
            res += _flatten(o, f"{prefix}[{i}]")
        return res
    if out is None:
        return []
    return [(prefix, out)]


def _is_tensor(o: Any) -> bool:
    return isinstance(o, paddle.Tensor)


def _is_float_tensor(t: Any) -> bool:
    return _is_tensor(t) and t.dtype in (
        paddle.float32,
        paddle.float64,
        paddle.float16,
        paddle.bfloat16,
    )


def _materialize(
    items: list[tuple[str, Any]], want_ipu: bool
) -> tuple[list[tuple[str, Any, str]], list[str]]:
    """name -> (numpy value, bfloat16 marker); and the outputs off the expected place."""
    vals, off = [], []
    for name, o in items:
        if _is_tensor(o):
            pl = o.place
            on_ipu = pl.is_custom_place()
            if want_ipu and not on_ipu:
                off.append(f"{name}: {pl}")
            vals.append((name, _to_numpy(o), str(o.dtype)))
        else:
            vals.append((name, np.asarray(o), type(o).__name__))
    return vals, off


_TRACE = False  # --trace-transforms: mark each run in the worker's stderr (see _parse_traces)


def run_on(
    case: Case, arrays: list[np.ndarray], ipu: bool, seed: int | None = None
) -> dict[str, Any]:
    if _TRACE:
        print(f"@@sweep {case.name} {'ipu' if ipu else 'cpu'}", file=sys.stderr, flush=True)
    place = _ipu_place() if ipu else paddle.CPUPlace()
    paddle.set_device("ipu:0" if ipu else "cpu")
    ts = []
    for a in arrays:
        t = paddle.to_tensor(a.copy(), place=place)
        if case.grad and t.dtype in (
            paddle.float32,
            paddle.float64,
            paddle.float16,
            paddle.complex64,
        ):
            t.stop_gradient = False
        ts.append(t)
    paddle.seed(case.seed if seed is None else seed)
    out = case.fn(*ts)
    items = _flatten(out)
    if case.grad:
        losses = [o.sum() for _, o in items if _is_float_tensor(o) and not o.stop_gradient]
        if not losses:
            raise AssertionError("grad case: no differentiable output")
        loss = losses[0]
        for extra in losses[1:]:
            loss = loss + extra.astype(loss.dtype)
        loss.backward()
        for i, t in enumerate(ts):
            if not t.stop_gradient:
                items.append((f"grad(in{i})", t.grad))
    vals, off = _materialize(items, ipu)
    return {"vals": vals, "off_place": off}


def _tol(case: Case, dtype: str) -> tuple[float, float]:
    if case.rtol is not None or case.atol is not None:
        r, a = case.rtol or 1e-6, case.atol or 1e-6
    else:
        r = a = 1e-6
    if "float16" in dtype and "bfloat" not in dtype:
        r, a = max(r, 1e-3), max(a, 1e-3)
    if "bfloat16" in dtype:
        r, a = max(r, 1e-2), max(a, 1e-2)
    return r, a


def compare(case: Case, cpu: list, ipu: list) -> tuple[bool, str, float, float]:
    """(equal, detail, max_abs_err, max_rel_err) over all outputs."""
    if len(cpu) != len(ipu):
        return False, f"{len(cpu)} outputs on cpu, {len(ipu)} on ipu", float("nan"), float("nan")
    worst_abs = worst_rel = 0.0
    bad: list[str] = []
    for (name, a, dta), (_, b, dtb) in zip(cpu, ipu):
        if dta != dtb or a.dtype != b.dtype:
            bad.append(f"{name}: dtype cpu {dta}/{a.dtype} ipu {dtb}/{b.dtype}")
            continue
        if a.shape != b.shape:
            bad.append(f"{name}: shape cpu {a.shape} ipu {b.shape}")
            continue
        if a.size == 0:
            continue
        if a.dtype.kind in "biuSUO":
            neq = a != b
            if np.any(neq):
                diff = (
                    np.abs(a.astype(np.float64) - b.astype(np.float64))
                    if a.dtype.kind in "iu"
                    else neq.astype(float)
                )
                worst_abs = max(worst_abs, float(np.max(diff)))
                bad.append(f"{name}: {int(np.sum(neq))}/{a.size} elements differ (exact compare)")
            continue
        rtol, atol = _tol(case, dta)
        na, nb = np.isnan(a), np.isnan(b)
        if np.any(na != nb):
            bad.append(f"{name}: NaN positions differ (cpu {int(na.sum())}, ipu {int(nb.sum())})")
            continue
        fa, fb = a[~na], b[~nb]
        ia, ib = np.isinf(fa), np.isinf(fb)
        if np.any(ia != ib) or np.any(fa[ia] != fb[ib]):
            bad.append(f"{name}: inf positions differ")
            continue
        fa, fb = (
            fa[~ia].astype(np.complex128 if a.dtype.kind == "c" else np.float64),
            fb[~ib].astype(np.complex128 if b.dtype.kind == "c" else np.float64),
        )
        if fa.size == 0:
            continue
        err = np.abs(fa - fb)
        rel = err / np.maximum(np.abs(fa), 1e-30)
        worst_abs = max(worst_abs, float(err.max()))
        worst_rel = max(worst_rel, float(np.where(err > 0, rel, 0).max()))
        if np.any(err > atol + rtol * np.abs(fa)):
            n = int(np.sum(err > atol + rtol * np.abs(fa)))
            bad.append(
                f"{name}: {n}/{a.size} elements off (max abs {err.max():.3g}, rtol {rtol:g} atol {atol:g})"
            )
    return (not bad), "; ".join(bad), worst_abs, worst_rel


_SKIP_LINE = re.compile(r"^(-{3,}|=+|C\+\+ Traceback|Error Message Summary|\d+\s+\S|\[Hint)")


def error_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if re.match(r"^\((\w+)\)", ln):
            return ln
    for ln in lines:
        if not _SKIP_LINE.match(ln):
            return ln
    return lines[0] if lines else ""


def cause_of(err_type: str, line: str) -> str:
    m = re.search(
        r"The kernel with key \((\w+), ([^,]+), (\w+)\) of kernel `(\w+)` is not registered.*?(\(at [^)]*\))?$",
        line,
    )
    if m:
        at = re.sub(r":\d+\)", ")", m.group(5) or "")
        return f"kernel `{m.group(4)}` not registered for {m.group(1)} {at}".strip()
    m = re.search(r"kernel `?(\w+)`? .*not (found|registered)", line)
    if m:
        return f"kernel {m.group(1)} not found: {line[:120]}"
    generic = re.sub(r"\d+", "N", line)
    generic = re.sub(r"\(at ([^:)]*):N\)", r"(at \1)", generic)
    return f"{err_type}: {generic[:160]}"


def _stats_ops() -> set[str]:
    from paddle.base import core

    return set(core.get_low_precision_op_list())


def _clear_stats() -> None:
    from paddle.base import core

    core.clear_low_precision_op_list()


def run_case(case: Case) -> dict[str, Any]:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    arrays = [make_input(s, rng) for s in case.inputs]
    res: dict[str, Any] = {"name": case.name, "family": case.family}
    _CASE_CALLED.clear()
    _clear_stats()
    try:
        cpu = run_on(case, arrays, ipu=False)
    except Exception as e:
        line = error_line(e)
        if case.expect_error:
            return _expected_error(case, arrays, res, e, line)
        res.update(
            status="cpu_error",
            error_type=type(e).__name__,
            error=line,
            cause=cause_of(type(e).__name__, line),
        )
        res["traceback"] = traceback.format_exc(limit=-3)[-1500:]
        # What the ipu does with a case the oracle refuses (on an older Paddle, an API or
        # a dtype the table's release has and this one lacks): it should refuse it too.
        try:
            run_on(case, arrays, ipu=True)
            res["ipu_error_type"] = None
        except Exception as ipu_exc:
            res["ipu_error_type"] = type(ipu_exc).__name__
            res["ipu_error"] = error_line(ipu_exc)
        return _finish(res)
    cpu_ops = set(_CASE_CALLED)
    _CASE_CALLED.clear()
    _FAILED_OP.clear()
    try:
        ipu = run_on(case, arrays, ipu=True)
    except Exception as e:
        line = error_line(e)
        res.update(
            status="ipu_error",
            error_type=type(e).__name__,
            error=line,
            cause=cause_of(type(e).__name__, line),
        )
        res["failed_c_op"] = _FAILED_OP[0] if _FAILED_OP else None
        tb = traceback.extract_tb(e.__traceback__)
        res["where"] = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in tb[-3:]]
        res["c_ops_ipu"] = sorted(_CASE_CALLED)
        return _finish(res)
    res["c_ops"] = sorted(cpu_ops | _CASE_CALLED)
    same, detail, mabs, mrel = compare(case, cpu["vals"], ipu["vals"])
    res.update(max_abs=mabs, max_rel=mrel)
    if same and ipu["off_place"] and not case.place_ok:
        res.update(
            status="wrong_place",
            detail="; ".join(ipu["off_place"]),
            cause="output not on the ipu place",
        )
    elif same:
        res["status"] = "ok"
    elif case.random:
        again = run_on(case, arrays, ipu=True)
        self_same, _, _, _ = compare(case, ipu["vals"], again["vals"])
        why = (
            "ipu reproducible under paddle.seed"
            if self_same
            else "ipu NOT reproducible under paddle.seed"
        )
        res.update(
            status="random_differs",
            detail=f"{detail} [{why}]",
            cause=f"random generator differs ({why})",
        )
    else:
        kind = (
            "dtype"
            if "dtype" in detail
            else "shape"
            if "shape" in detail
            else "NaN"
            if "NaN" in detail
            else "value"
        )
        res.update(status="mismatch", detail=detail, cause=f"{kind} mismatch ({case.family})")
    return _finish(res)


def _expected_error(
    case: Case, arrays: list, res: dict[str, Any], cpu_exc: Exception, cpu_line: str
) -> dict[str, Any]:
    """The oracle raised, as the case expects: the ipu must raise the same."""
    res["cpu_error"] = f"{type(cpu_exc).__name__}: {cpu_line}"
    try:
        run_on(case, arrays, ipu=True)
    except Exception as e:
        line = error_line(e)
        if type(e) is type(cpu_exc) and line == cpu_line:
            res["status"] = "ok"
        else:
            res.update(
                status="mismatch",
                detail=f"cpu raised {res['cpu_error']}; ipu raised {type(e).__name__}: {line}",
                cause="different error",
            )
        return _finish(res)
    res.update(
        status="mismatch",
        detail=f"cpu raised {res['cpu_error']}; ipu did not raise",
        cause="ipu did not raise",
    )
    return _finish(res)


def _finish(res: dict[str, Any]) -> dict[str, Any]:
    from eager_ops_unswept import legacy_to_phi

    res["op_stats"] = sorted(legacy_to_phi(_stats_ops()))
    return res


# ----------------------------------------------------------------------------
# Worker and parent
# ----------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    global _TRACE
    _TRACE = args.trace_transforms
    _import_paddle()
    before = ipu_kernel_names()
    added = _import_paddle(args.preload_kernels)
    after = ipu_kernel_names()
    import paddle as _p
    from eager_ops_unswept import eager_op_list

    with open(args.names_file) as f:
        names = [ln.strip() for ln in f if ln.strip()]
    by_name = {c.name: c for c in CASES}
    wrapped = instrument_c_ops()
    _p.set_flags({"FLAGS_low_precision_op_list": 1})
    with open(args.progress, "a") as prog:

        def emit(obj: dict[str, Any]) -> None:
            prog.write(json.dumps(obj, default=str) + "\n")
            prog.flush()

        emit(
            {
                "op_list": eager_op_list(),
                "wrapped": wrapped,
                "paddle": _p.__version__,
                "ipu_kernels": after,
                "preload_added": added,
                "preload_new_names": sorted(set(after) - set(before)),
            }
        )
        for name in names:
            emit({"start": name, "t": time.time()})
            t0 = time.time()
            try:
                res = run_case(by_name[name])
            except Exception as e:
                res = {
                    "name": name,
                    "family": by_name[name].family,
                    "status": "runner_error",
                    "error": f"{type(e).__name__}: {e}"[:500],
                    "cause": "runner error",
                }
            res["seconds"] = round(time.time() - t0, 3)
            emit({"result": res})
        emit({"done": True})
    return 0


def _select(args: argparse.Namespace) -> list[str]:
    names = [c.name for c in CASES]
    if args.family:
        fams = set(args.family.split(","))
        names = [c.name for c in CASES if c.family in fams]
    if args.only:
        want = [n for n in args.only.split(",") if n]
        unknown = [n for n in want if n not in _NAMES]
        if unknown:
            sys.exit(f"unknown case names: {unknown}")
        names = [n for n in names if n in set(want)]
    return names


_TRACE_KINDS = {
    "contiguous": "data_transform.cc:275] Trans2Contiguous",
    "cast": "DataTypeTransform src_dtype",
    "to_cpu": "DeviceTransform in, src_place Place(ipu:0) dst_place: Place(cpu)",
    "to_ipu": "DeviceTransform in, src_place Place(cpu) dst_place: Place(ipu:0)",
}


def _parse_traces(tmp: str, runs: int, results: dict[str, dict[str, Any]]) -> None:
    """Count, per case, the data transforms Paddle logged (VLOG 3 of data_transform.cc)
    during the ipu run: Trans2Contiguous (the ``contiguous`` kernel lookup), the dtype
    transform (the ``cast`` lookup), and the place copies of the CPU fallback."""
    for run in range(1, runs + 1):
        path = os.path.join(tmp, f"worker{run}.log")
        if not os.path.exists(path):
            continue
        current = None
        counts: dict[str, int] = {}
        with open(path, errors="replace") as f:
            for ln in f:
                if ln.startswith("@@sweep "):
                    _, name, where = ln.split()
                    current = name if where == "ipu" else None
                    if current in results and "transforms_ipu" not in results[current]:
                        counts = results[current]["transforms_ipu"] = dict.fromkeys(_TRACE_KINDS, 0)
                    continue
                if current is None:
                    continue
                for kind, marker in _TRACE_KINDS.items():
                    if marker in ln:
                        counts[kind] += 1


def _progress_line(r: dict[str, Any]) -> str:
    return f"  {r['status']:14s} {r['name']}: {r.get('error') or r.get('detail', '')}"[:200]


def parent(args: argparse.Namespace) -> int:
    import tempfile

    names = _select(args)
    results: dict[str, dict[str, Any]] = {}
    op_list = None
    env: dict[str, Any] = {}
    exits: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="eager_sweep.")
    remaining = list(names)
    runs = 0
    while remaining:
        runs += 1
        names_file = os.path.join(tmp, f"names{runs}.txt")
        progress = os.path.join(tmp, f"progress{runs}.jsonl")
        with open(names_file, "w") as f:
            f.write("\n".join(remaining))
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--names-file",
            names_file,
            "--progress",
            progress,
        ]
        if args.preload_kernels:
            cmd += ["--preload-kernels", args.preload_kernels]
        env = dict(os.environ)
        if args.trace_transforms:
            cmd.append("--trace-transforms")
            env.update(GLOG_vmodule="data_transform=3", GLOG_minloglevel="0", GLOG_v="0")
        with open(os.path.join(tmp, f"worker{runs}.log"), "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            current, started, pos, timed_out = None, 0.0, 0, False
            finished_at = None  # when the worker said it ran its last case
            while True:
                rc = proc.poll()
                if os.path.exists(progress):
                    with open(progress) as f:
                        f.seek(pos)
                        chunk = f.read()
                    # only whole lines
                    cut = chunk.rfind("\n") + 1
                    pos += len(chunk[:cut].encode())
                    for ln in chunk[:cut].splitlines():
                        rec = json.loads(ln)
                        if "op_list" in rec:
                            op_list = rec["op_list"]
                            env = {
                                k: rec[k]
                                for k in (
                                    "paddle",
                                    "wrapped",
                                    "ipu_kernels",
                                    "preload_added",
                                    "preload_new_names",
                                )
                            }
                        elif "start" in rec:
                            current, started = rec["start"], time.time()
                        elif "done" in rec:
                            finished_at = time.time()
                        elif "result" in rec:
                            results[rec["result"]["name"]] = rec["result"]
                            current = None
                            if args.verbose or rec["result"]["status"] != "ok":
                                print(_progress_line(rec["result"]), flush=True)
                if rc is not None:
                    break
                if current and time.time() - started > args.timeout:
                    proc.kill()
                    proc.wait()
                    timed_out = True
                    break
                if finished_at and time.time() - finished_at > 30:  # hangs in its teardown
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.05)
        with open(os.path.join(tmp, f"worker{runs}.log"), errors="replace") as f:
            log_tail = "".join(ln for ln in f.readlines()[-400:] if not ln.startswith("I1"))[-1500:]  # fmt: skip
        exits.append(
            {
                "run": runs,
                "returncode": proc.returncode,
                "ran_all_its_cases": finished_at is not None,
                "hung_at_exit": finished_at is not None and time.time() - finished_at > 30,
                "log_tail": log_tail if proc.returncode else "",
            }
        )
        if finished_at is not None and proc.returncode:
            print(
                f"  WORKER {runs} ran all its cases, then exited with {proc.returncode}"
                f"{' (hung at exit, killed)' if exits[-1]['hung_at_exit'] else ''}: "
                f"{log_tail.strip().splitlines()[-1] if log_tail.strip() else ''}",
                flush=True,
            )
        done = set(results)
        if current is not None and current not in done:
            with open(os.path.join(tmp, f"worker{runs}.log")) as f:
                tail = f.read()[-800:]
            status = "timeout" if timed_out else "crash"
            results[current] = {
                "name": current,
                "family": next(c.family for c in CASES if c.name == current),
                "status": status,
                "error": f"worker {'killed after ' + str(args.timeout) + ' s' if timed_out else 'exited with ' + str(proc.returncode)}",
                "cause": status,
                "log_tail": tail,
            }
            print(f"  {status:14s} {current}", flush=True)
            done.add(current)
        new_remaining = [n for n in remaining if n not in done]
        if len(new_remaining) == len(remaining):  # no progress: the worker fails at start
            with open(os.path.join(tmp, f"worker{runs}.log")) as f:
                sys.stderr.write(f.read()[-3000:])
            return 3
        remaining = new_remaining

    if args.trace_transforms:
        _parse_traces(tmp, runs, results)
    ordered = [results[n] for n in names]
    counts = Counter(r["status"] for r in ordered)
    from eager_ops_unswept import coverage, format_report

    called = set().union(
        *(r.get("c_ops", []) for r in ordered), *(r.get("c_ops_ipu", []) for r in ordered)
    )
    stats = set().union(*(r.get("op_stats", []) for r in ordered))
    cov = coverage(op_list, called, stats) if op_list else None
    by_cause: dict[str, list[str]] = defaultdict(list)
    for r in ordered:
        if r["status"] != "ok":
            by_cause[f"[{r['status']}] {r.get('cause', '')}"].append(r["name"])
    summary = {
        "n_cases": len(ordered),
        "counts": dict(counts),
        "families": {
            f: dict(Counter(r["status"] for r in ordered if r["family"] == f))
            for f in dict.fromkeys(r["family"] for r in ordered)
        },
        "by_cause": dict(sorted(by_cause.items(), key=lambda kv: -len(kv[1]))),
        "worker_runs": runs,
        "preload_kernels": args.preload_kernels,
        "environment": env,
        "worker_exits": exits,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"summary": summary, "coverage": cov, "cases": ordered}, f, indent=1, default=str
            )
    print()
    if env:
        print(
            f"paddle {env['paddle']}; {env['wrapped']} paddle._C_ops callables instrumented; "
            f"kernels registered for the ipu itself: "
            f"{[k for k in env['ipu_kernels'] if not k.startswith('*')]} "
            f"(+{sum(k.startswith('*') for k in env['ipu_kernels'])} Paddle registers for every custom device)"
            + (
                f"; --preload-kernels added {env['preload_added']} kernels "
                f"(new names: {env['preload_new_names'] or 'none'})"
                if args.preload_kernels
                else ""
            )
        )
    print(f"cases: {len(ordered)}  " + "  ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for fam, c in summary["families"].items():
        print(f"  {fam:12s} " + "  ".join(f"{k}={v}" for k, v in sorted(c.items())))
    if by_cause:
        print("failures by cause:")
        for cause, ns in summary["by_cause"].items():
            print(f"  {len(ns):4d}  {cause}")
            print(f"        {', '.join(ns[:12])}{' ...' if len(ns) > 12 else ''}")
    if args.trace_transforms:
        traced = [r for r in ordered if "transforms_ipu" in r]
        for kind in ("contiguous", "cast"):
            hit = [r["name"] for r in traced if r["transforms_ipu"][kind]]
            print(
                f"ipu runs through the data transform `{kind}`: {len(hit)} cases: {', '.join(hit[:25])}{' ...' if len(hit) > 25 else ''}"
            )
        fell = sum(1 for r in traced if r["transforms_ipu"]["to_cpu"])
        print(
            f"ipu runs that copied inputs to the CPU (a CPU-kernel fallback): {fell} of {len(traced)} cases"
        )
    if cov:
        print(format_report(cov))
        print(
            f"N={cov['n_ops']} ops in Paddle's eager list, M={cov['n_covered']} exercised by the sample; "
            f"cases ok={counts.get('ok', 0)} mismatch={counts.get('mismatch', 0)} "
            f"error={sum(v for k, v in counts.items() if k not in ('ok', 'mismatch'))}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write per-case results, summary and op coverage here")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--family", help="comma-separated families")
    ap.add_argument(
        "--preload-kernels",
        metavar="PATH",
        help="a library whose paddle_ipu_register_kernels() registers extra ipu kernels",
    )
    ap.add_argument(
        "--trace-transforms",
        action="store_true",
        help="log Paddle's data transforms (GLOG_vmodule=data_transform=3) and count them per case",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--names-file", help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for c in CASES:
            print(f"{c.family:12s} {c.name}")
        print(f"{len(CASES)} cases", file=sys.stderr)
        return 0
    if args.worker:
        return worker(args)
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
