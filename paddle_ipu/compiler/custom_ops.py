"""Custom operators of IPU programs that run on both backends without a PopART compile.

Paddle 2.x's IPU scripts build some operators from PopART C++ sources
(``paddle.utils.cpp_extension.load``, which needs the Poplar SDK's headers).  Four of
them Paddle 2.x's IPU backend lowered to PopART built-ins itself
(popart_canonicalization): ``checkpointoutput``, ``detach``, ``identity`` and
``custom_nll_loss``.  :data:`custom_ops` holds them, with the call signatures of the
compiled module a script loads (``custom_ops.custom_nll_loss(probs, label, 1, "None",
False)``), so a script that loads its custom ops optionally runs with these instead.

Each call builds, in the PIR program being built, Paddle operators that compute the
operator's semantics (so Paddle's CPU executor runs the program, and Paddle's autodiff
differentiates it), marked as one region (:mod:`.custom_regions`).  The host backend
runs the region as it is; the popart backend gives PopART the one node the region
stands for.

- ``detach(x)``: an ``assign`` whose gradient is stopped; PopART: ``ai.graphcore``
  ``Detach`` v1.
- ``identity(x)``: an ``assign``; PopART: ``Identity``.
- ``checkpointoutput(x)``: an ``assign``; PopART: an ``Identity`` whose
  ``__recompute_output_in_backward_pass`` is Checkpoint (``Builder.checkpointOutput``).
- ``custom_nll_loss(p, l, reduction, ignoreIndex, inputIsLogProbability)``: PopART's
  Nll (willow/src/popx/op/nllx.cpp) in Paddle operators, ``-log(max(p[l], eps))`` with
  eps 1e-7 (6.104e-5 for float16 ``p``), the ignored labels masked, Sum, Mean over the
  labels not ignored, or None; PopART: ``ai.graphcore`` ``Nll`` v1.

:func:`register_custom_op` registers a user's PopART custom operator under its name with
a host stand-in: a function of Paddle tensors that computes what the PopART operator
computes.  The stand-in runs on the host (and on Paddle's CPU executor); PopART gets the
node of the operator's domain, type and version, with its attributes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from paddle_ipu.compiler.pir_values import CUSTOM_REGION_ATTR
from paddle_ipu.errors import NotSupportedError, OptionError

#: the region an operator belongs to (a str unique in the process)
REGION_ATTR = CUSTOM_REGION_ATTR
#: on a region's k-th input marker (an ``assign`` of the k-th operand)
INPUT_ATTR = "__ipu_custom_in"
#: on a region's k-th output marker (the ``assign`` that makes the k-th result)
OUTPUT_ATTR = "__ipu_custom_out"
#: on the region's first output marker: the PopART node, as JSON
SPEC_ATTR = "__ipu_custom_spec"
ATTRS = (REGION_ATTR, INPUT_ATTR, OUTPUT_ATTR, SPEC_ATTR)

_counter = itertools.count()
_lock = threading.Lock()
#: operators paddle_ipu builds that it does not expect a user to register again
BUILT_IN = ("checkpointoutput", "detach", "identity", "custom_nll_loss")

#: the operators of :data:`custom_ops` plus the ones registered by users
custom_ops = SimpleNamespace()


def _new_region(name: str) -> str:
    with _lock:
        return f"{name}#{next(_counter)}"


@contextlib.contextmanager
def _region(name: str, spec: Mapping[str, Any]) -> Iterator[list[Any]]:
    """Mark every operator built inside as one region of ``name``; the caller appends
    its output markers' values to the list it is given."""
    import paddle

    if not paddle.framework.in_pir_mode():
        raise NotSupportedError(
            f"paddle_ipu.custom_ops.{name} builds PIR static programs: call "
            "paddle.enable_static() and keep the default PIR API"
        )
    block = paddle.static.default_main_program().global_block()
    before = {op.id() for op in block.ops}
    region = _new_region(name)
    outputs: list[Any] = []
    yield outputs
    for op in block.ops:
        if op.id() not in before and not op.has_attr(REGION_ATTR):
            op.set_str_attr(REGION_ATTR, region)
    for k, value in enumerate(outputs):
        op = value.get_defining_op()
        op.set_int_attr(OUTPUT_ATTR, k)
        if k == 0:
            op.set_str_attr(SPEC_ATTR, json.dumps(dict(spec), sort_keys=True))


def _marked_inputs(values: Sequence[Any]) -> list[Any]:
    """An ``assign`` of each operand, marked as the region's k-th input."""
    import paddle

    marked = []
    for k, value in enumerate(values):
        copy = paddle.assign(value)
        copy.get_defining_op().set_int_attr(INPUT_ATTR, k)
        marked.append(copy)
    return marked


def _spec(domain: str, op_type: str, version: int, attrs: Mapping[str, Any]) -> dict[str, Any]:
    return {"domain": domain, "op_type": op_type, "version": int(version), "attrs": dict(attrs)}


def _through(name: str, x: Any, spec: Mapping[str, Any], stop_gradient: bool = False) -> Any:
    import paddle

    with _region(name, spec) as outputs:
        (marked,) = _marked_inputs([x])
        out = paddle.assign(marked)
        if stop_gradient:
            out.stop_gradient = True
        outputs.append(out)
    return out


def detach(x: Any) -> Any:
    """``x``, with no gradient flowing back through it (PopART's ``Detach``)."""
    return _through("detach", x, _spec("ai.graphcore", "Detach", 1, {}), stop_gradient=True)


def identity(x: Any) -> Any:
    """``x`` (ONNX ``Identity``)."""
    return _through("identity", x, _spec("", "Identity", 1, {}))


def checkpointoutput(x: Any) -> Any:
    """``x``, kept for the backward pass rather than recomputed (PopART's
    ``Builder.checkpointOutput``: an Identity whose recomputation type is Checkpoint)."""
    spec = _spec(
        "",
        "Identity",
        1,
        {
            # willow/include/popart/names.hpp; RecomputeType::Checkpoint is 1
            "__recompute_output_in_backward_pass": 1,
            "__exclude_patterns": ["PreUniRepl", "PostNRepl"],
        },
    )
    return _through("checkpointoutput", x, spec)


#: PopART's ReductionType (willow/include/popart/op.hpp) and its node spelling (loss.cpp)
_REDUCTIONS = {0: "Sum", 1: "Mean", 2: "None"}


def _ignore_index(value: Any) -> int | None:
    """``ignoreIndex`` as the compiled operator takes it (a str, ``"None"`` for none)
    or as an int."""
    if value is None or (isinstance(value, str) and value.strip() == "None"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise OptionError(
            f"custom_nll_loss: ignoreIndex must be an int, or 'None', got {value!r}"
        ) from None


def custom_nll_loss(
    x: Any,
    y: Any,
    reduction: int = 1,
    ignoreIndex: Any = "None",
    inputIsLogProbability: bool = False,
) -> Any:
    """PopART's negative log likelihood of probabilities ``x`` (``[..., classes]``) at
    the labels ``y`` (``x``'s shape without its last dimension).  ``reduction``: 0
    Sum, 1 Mean (over the labels not ignored), 2 None (one loss per label).
    ``ignoreIndex``: a label whose loss is 0 ("None": none).  Without
    ``inputIsLogProbability`` the probabilities are clamped at eps before the log."""
    import paddle

    if reduction not in _REDUCTIONS:
        raise OptionError(
            f"custom_nll_loss: reduction must be 0 (Sum), 1 (Mean) or 2 (None), got {reduction!r}"
        )
    ignore = _ignore_index(ignoreIndex)
    probs_shape, label_shape = list(x.shape), list(y.shape)
    if not probs_shape or label_shape != probs_shape[:-1]:
        raise OptionError(
            f"custom_nll_loss: the labels' shape must be the probabilities' without their "
            f"last dimension (PopART's Nll), got probabilities {probs_shape} and labels "
            f"{label_shape}"
        )
    attrs: dict[str, Any] = {
        "reduction": _REDUCTIONS[reduction],
        "inputIsLogProbability": int(bool(inputIsLogProbability)),
    }
    if ignore is not None:
        attrs["ignoreIndex"] = ignore
    # nllx.cpp: eps 1e-7, 6.104e-05 for float16 probabilities
    eps = 6.104e-05 if x.dtype == paddle.float16 else 1e-7
    with _region("custom_nll_loss", _spec("ai.graphcore", "Nll", 1, attrs)) as outputs:
        probs, label = _marked_inputs([x, y])
        classes = probs_shape[-1]
        flat = paddle.reshape(probs, [-1, classes])
        labels = paddle.cast(paddle.reshape(label, [-1]), "int64")
        # (no full_like here: the compiler finds the loss by the full_like that seeds
        # the backward pass)
        keep = None
        if ignore is not None:
            keep = paddle.not_equal(labels, paddle.full([1], ignore, "int64"))
            labels = paddle.where(keep, labels, paddle.full([1], 0, "int64"))
        picked = paddle.take_along_axis(flat, paddle.unsqueeze(labels, 1), axis=1)
        picked = paddle.reshape(picked, [-1])
        if not inputIsLogProbability:
            picked = paddle.log(paddle.maximum(picked, paddle.full([1], eps, picked.dtype)))
        losses = -picked
        if keep is not None:
            losses = losses * paddle.cast(keep, losses.dtype)
        if reduction == 2:
            out = paddle.reshape(losses, label_shape)
        elif reduction == 0:
            out = paddle.sum(losses)
        elif keep is not None:
            count = paddle.sum(paddle.cast(keep, losses.dtype))
            out = paddle.sum(losses) / paddle.maximum(count, paddle.full([], 1.0, count.dtype))
        else:
            out = paddle.mean(losses)
        out = paddle.assign(out)
        outputs.append(out)
    return out


for _fn in (detach, identity, checkpointoutput, custom_nll_loss):
    setattr(custom_ops, _fn.__name__, _fn)


def _plain(name: str, value: Any) -> Any:
    """An attribute value PopART's node can hold: int, float, str, or a list of one."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and value:
        items = [_plain(name, v) for v in value]
        if len({type(v) for v in items}) == 1 and not isinstance(items[0], list):
            return items
    raise OptionError(
        f"custom op attribute {name!r}: an int, float, str or a non-empty list of one of "
        f"them, got {value!r}"
    )


def register_custom_op(
    name: str,
    forward: Callable[..., Any],
    *,
    popart_op: str | None = None,
    domain: str = "custom.ops",
    version: int = 1,
    attr_names: Sequence[str] = (),
) -> Callable[..., Any]:
    """Register a user's PopART custom operator ``name`` with its host stand-in.

    ``forward(*tensors, **attrs)`` builds, from Paddle operators, what the PopART
    operator computes (its result: one tensor or a tuple of them); its gradient is
    Paddle's.  The returned function (also ``paddle_ipu.custom_ops.<name>``) takes the
    operator's tensors, then its attributes (positionally in ``attr_names`` order, or by
    keyword): on the host the stand-in runs, and the popart backend gives PopART the
    node ``domain::popart_op`` (default: ``name``) of ``version`` with those attributes
    -- Paddle 2.x's ``IpuStrategy.add_custom_op(paddle_op, popart_op, domain,
    version)`` -- which a PopART custom operator loaded into the process must
    implement."""
    if not isinstance(name, str) or not name.isidentifier():
        raise OptionError(f"register_custom_op: the name must be an identifier, got {name!r}")
    if name in BUILT_IN:
        raise OptionError(
            f"register_custom_op: {name!r} is built in (paddle_ipu.custom_ops.{name})"
        )
    if not callable(forward):
        raise OptionError(f"register_custom_op({name!r}): forward must be callable")
    op_type = popart_op or name
    names = tuple(attr_names)

    @functools.wraps(forward)
    def call(*args: Any, **kwargs: Any) -> Any:
        import paddle

        tensors = [a for a in args if isinstance(a, paddle.pir.Value)]
        rest = list(args[len(tensors) :])
        if any(isinstance(a, paddle.pir.Value) for a in rest):
            raise OptionError(f"custom op {name!r}: give its tensors before its attributes")
        if len(rest) > len(names):
            raise OptionError(
                f"custom op {name!r}: {len(rest)} positional attributes for attr_names {names}"
            )
        attrs = {**dict(zip(names, rest)), **kwargs}
        spec = _spec(domain, op_type, version, {k: _plain(k, v) for k, v in attrs.items()})
        with _region(name, spec) as outputs:
            marked = _marked_inputs(tensors)
            result = forward(*marked, **attrs)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            outs = [paddle.assign(r) for r in results]
            outputs.extend(outs)
        return tuple(outs) if isinstance(result, (tuple, list)) else outs[0]

    setattr(custom_ops, name, call)
    return call
