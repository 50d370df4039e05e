"""The host backend's gradient program: forward + backward of a training program, with
the optimizer (and everything only the optimizer needs) removed.

How it is built.  ``program.clone()`` copies a PIR program op for op, in order, so an op
(and each of its results) is identified across the two programs by its position in the
global block.  On the source program we mark what must survive: the ancestors of the
loss, of the user's fetches, and of every parameter's raw gradient (the backward pass's
output, found by :func:`paddle_ipu.compiler.optimizer.extract_optimizer`), plus every
non-persistable ``pd_op.data`` op (the feeds).  Every other op -- the update ops, the
regularisation and clipping ops, the learning-rate variable, the optimizer-state
variables, Adamax's ``beta1_pow`` ``scale_`` -- is removed from the clone with
``block.remove_op``, last op first.  The clone also loses the ``lr_scheduler`` /
``lr_name`` attributes Paddle attaches to the program, so running it never writes a
learning rate anywhere.

Running it: ``paddle.static.Executor(paddle.CPUPlace()).run(program, feed=...,
fetch_list=fetch_values, scope=private_scope)`` with the parameters (and any other
persistable variable the forward reads) present in ``private_scope``.

BatchNorm.  In training mode ``pd_op.batch_norm_`` reads the running mean and variance
(persistable variables) and writes the updated statistics back to the same variables in
place.  The op is an ancestor of the loss, so it stays, and every run of the gradient
program updates the statistics in the private scope, one micro-batch at a time, as on
the device.  :attr:`GradientProgram.buffers` lists those variables (every persistable
variable the kept ops read that is not a trainable parameter) so that the trainer can
copy them in and out with the weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paddle_ipu._internals import paddle_api
from paddle_ipu._util import dtypes
from paddle_ipu.compiler.optimizer import OptimizerConfig, extract_optimizer
from paddle_ipu.compiler.training import TrainingSource
from paddle_ipu.errors import CompileError

_PROGRAM_ATTRS_TO_DROP = ("lr_scheduler", "lr_name", "lr_var")


@dataclass
class GradientProgram:
    """The host backend's gradient program (:func:`build_from_source`).

    Attributes:
        program: the pruned clone (a ``paddle.pir.Program``): forward + backward, no
            optimizer.
        feed_names: the names of the ``pd_op.data`` feeds the program keeps.
        param_names: the trainable parameters, in :attr:`OptimizerConfig.params` order.
        buffers: persistable non-parameter variables the program reads (BatchNorm
            running statistics); updated in place by every run.
        loss: the loss ``pir.Value`` in :attr:`program`.
        fetches: the user's other fetch ``pir.Value`` s in :attr:`program`.
        fetch_names: names for :attr:`fetches` (as given, or ``fetch_<i>``).
        loss_name: the name of the loss output.
        grads: the raw gradient ``pir.Value`` of each parameter in :attr:`program`,
            aligned with :attr:`param_names`.
        optimizer: the extracted optimizer.
    """

    program: Any
    feed_names: list[str]
    param_names: list[str]
    buffers: list[str]
    loss: Any
    fetches: list[Any]
    fetch_names: list[str]
    loss_name: str
    grads: list[Any]
    optimizer: OptimizerConfig
    removed_ops: list[str] = field(default_factory=list)
    #: the scope variable each gradient is left in by a run (a persistable output of
    #: the program), aligned with :attr:`param_names`: read without a fetch's copy.
    #: ``""``: the gradient is fetched (see :attr:`output_list`)
    grad_outputs: list[str] = field(default_factory=list)
    #: the floating-point checks' flags (:mod:`.fp16_program`), fetched last; None
    #: without the checks
    flags: Any = None
    #: per operator the flags watch: its index in :attr:`program` and its name
    checked: list[tuple[int, str]] = field(default_factory=list)
    #: the feed of the float16 roundings' random state (fp16_program.SEED_FEED), fed by
    #: the trainer each run; "" when the program has none
    seed_feed: str = ""

    @property
    def fetch_list(self) -> list[Any]:
        """What to pass to ``Executor.run``: loss, user fetches, then the gradients."""
        return [self.loss, *self.fetches, *self.grads]

    @property
    def output_list(self) -> list[Any]:
        """What to fetch when the gradients with a :attr:`grad_outputs` name are read
        from the scope: loss, user fetches, then the other gradients."""
        fetched = [g for g, name in zip(self.grads, self.grad_outputs) if not name]
        flags = [] if self.flags is None else [self.flags]
        return [self.loss, *self.fetches, *fetched, *flags]

    @property
    def output_names(self) -> list[str]:
        """Names of the non-gradient outputs, in :attr:`fetch_list` order."""
        return [self.loss_name, *self.fetch_names]


def _inner_operands(op: Any) -> list[Any]:
    """Operands of ``op`` and of every op nested in its regions (if/while bodies)."""
    values = list(op.operands_source())
    try:
        blocks = op.blocks()
    except Exception:
        blocks = []
    for block in blocks:
        for inner in block.ops:
            values.extend(_inner_operands(inner))
    return values


def _position(ops: Sequence[Any]) -> dict[int, tuple[int, int]]:
    pos: dict[int, tuple[int, int]] = {}
    for i, op in enumerate(ops):
        for j, res in enumerate(op.results()):
            pos[res.id] = (i, j)
    return pos


def build_gradient_program(
    program: Any,
    loss: Any,
    fetch_list: Sequence[Any] = (),
    *,
    fetch_names: Sequence[str] | None = None,
    loss_name: str = "loss",
    optimizer: OptimizerConfig | None = None,
    scope: Any = None,
    grad_values: Mapping[str, Any] | None = None,
    numerics: ProgramNumerics | None = None,
) -> GradientProgram:
    """Build the gradient program of a PIR training program.

    Args:
        program: the training program (after ``optimizer.minimize(loss)``); unchanged.
        loss: the loss ``pir.Value`` of ``program``.
        fetch_list: other ``pir.Value`` s of ``program`` to return per micro-batch.
        fetch_names: names for ``fetch_list`` (default ``fetch_0`` ...).
        loss_name: the name of the loss output.
        optimizer: an already extracted config (else :func:`extract_optimizer` runs).
        scope: passed to :func:`extract_optimizer` (reads the lr).
        grad_values: parameter name -> raw gradient ``pir.Value``, when ``optimizer``'s
            slots do not carry them (a CompiledModel's optimizer does not).
        numerics: the IPU's float16 arithmetic and floating-point checks to put into
            the program (:mod:`.fp16_program`); None: Paddle's float32 kernels as
            they are.

    Raises:
        CompileError: no optimizer, or a fetch that is not a value of ``program``.
    """
    if optimizer is None:
        optimizer = extract_optimizer(program, scope=scope, loss_name=loss_name)
    if numerics is not None and numerics.arith is not None and numerics.arith.rounded:
        from paddle_ipu.backends.host import fp16_program

        # registered before the program guard below (see device.load_host_operators)
        fp16_program.round_op_available()
    fetch_list = list(fetch_list)
    if fetch_names is None:
        fetch_names = [f"fetch_{i}" for i in range(len(fetch_list))]
    if len(fetch_names) != len(fetch_list):
        raise CompileError("fetch_names and fetch_list differ in length")

    ops = list(program.global_block().ops)
    pos = _position(ops)

    def locate(value: Any, what: str) -> tuple[int, int]:
        try:
            return pos[value.id]
        except (KeyError, AttributeError):
            raise CompileError(f"{what} is not a value of the training program") from None

    targets = [locate(loss, "the loss")]
    targets += [locate(v, f"fetch {n!r}") for v, n in zip(fetch_list, fetch_names)]
    grad_of = (
        dict(grad_values) if grad_values else {slot.name: slot.grad for slot in optimizer.params}
    )
    grad_pos = [
        locate(grad_of.get(slot.name), f"the gradient of {slot.name!r}")
        for slot in optimizer.params
    ]
    targets += grad_pos

    # Ancestors of the targets (plus the feeds).
    keep: set[int] = set()
    stack = [i for i, _ in targets]
    for i, op in enumerate(ops):
        if op.name() == "pd_op.data" and not op.attrs().get("persistable", [False])[0]:
            stack.append(i)
    while stack:
        i = stack.pop()
        if i in keep:
            continue
        keep.add(i)
        for value in _inner_operands(ops[i]):
            if value is None or not value.initialized():
                continue
            src = pos.get(value.id)
            if src is not None and src[0] not in keep:
                stack.append(src[0])

    param_names = optimizer.param_names
    params = set(param_names)
    feed_names: list[str] = []
    buffers: list[str] = []
    for i in sorted(keep):
        op = ops[i]
        attrs = op.attrs()
        if op.name() == "pd_op.data":
            name = str(attrs["name"])
            if attrs.get("persistable", [False])[0]:
                buffers.append(name)
            else:
                feed_names.append(name)
        elif op.name() == "builtin.parameter":
            name = str(attrs["parameter_name"])
            # A zero-element parameter (the dropout_state of paddle.nn.LSTM / GRU)
            # holds no value to keep in step with the scope; the trainer makes it.
            if name not in params and 0 not in _static_shape(op.result(0)):
                buffers.append(name)

    clone = program.clone()
    for attr in _PROGRAM_ATTRS_TO_DROP:
        if attr in getattr(clone, "__dict__", {}):
            delattr(clone, attr)
    block = clone.global_block()
    clone_ops = list(block.ops)
    if len(clone_ops) != len(ops):
        raise CompileError("cloning the training program changed its op count")
    removed: list[str] = []
    for i in range(len(clone_ops) - 1, -1, -1):
        if i in keep:
            continue
        op = clone_ops[i]
        if any(not res.use_empty() for res in op.results()):
            raise CompileError(
                f"cannot prune {op.name()} from the gradient program: a kept op uses it"
            )
        removed.append(op.name())
        block.remove_op(op)

    kept_ops = list(block.ops)
    new_index = {old: new for new, old in enumerate(sorted(keep))}

    def remap(p: tuple[int, int]) -> Any:
        return kept_ops[new_index[p[0]]].result(p[1])

    import paddle

    grads = [remap(p) for p in grad_pos]
    loss_value = remap(targets[0])
    fetch_values = [remap(p) for p in targets[1 : 1 + len(fetch_list)]]
    flags: Any = None
    checked: list[tuple[int, str]] = []
    seed_feed = ""
    if numerics is not None:
        from paddle_ipu.backends.host import fp16_program

        done = fp16_program.rewrite(
            clone,
            loss_value,
            fetch_values,
            grads,
            arith=numerics.arith,
            checks=numerics.checks,
            loss_scaling=numerics.loss_scaling,
        )
        loss_value, fetch_values, grads = done.loss, done.fetches, done.grads
        flags, checked = done.flags, done.checked
        seed_feed = done.seed_feed
    grad_outputs = []
    with paddle.static.program_guard(clone):
        for value, param in zip(grads, param_names):
            if str(value.get_defining_op().name()).startswith("builtin."):
                # a part of a list result (rnn's weight gradients): Paddle's executor
                # cannot keep it as a variable of its own; fetched instead
                grad_outputs.append("")
                continue
            # The executor then leaves the gradient in the run's scope under this
            # name (as a startup program leaves the parameters), without a fetch's copy.
            name = f"{param}@PADDLE_IPU_GRAD"
            paddle_api.keep_in_scope(value, name)
            grad_outputs.append(name)

    return GradientProgram(
        program=clone,
        feed_names=feed_names,
        param_names=param_names,
        buffers=buffers,
        loss=loss_value,
        fetches=fetch_values,
        fetch_names=list(fetch_names),
        loss_name=loss_name,
        grads=grads,
        optimizer=optimizer,
        removed_ops=removed[::-1],
        grad_outputs=grad_outputs,
        flags=flags,
        checked=checked,
        seed_feed=seed_feed,
    )


def _static_shape(value: Any) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in value.shape)
    except Exception:  # not a dense tensor
        return ()


def empty_parameters(program: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """Parameters of ``program`` with zero elements: name -> (shape, numpy dtype)."""
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for op in program.global_block().ops:
        if op.name() != "builtin.parameter":
            continue
        shape = _static_shape(op.result(0))
        if 0 in shape:
            dtype = dtypes.name_of(op.result(0).dtype)
            out[str(op.attrs()["parameter_name"])] = (shape, dtype)
    return out


@dataclass(frozen=True)
class ProgramNumerics:
    """What :func:`build_gradient_program` puts into the program (:mod:`.fp16_program`):
    the float16 arithmetic (None: float32), the floating-point checks, and the loss
    scaling (applied with float16 arithmetic only)."""

    arith: Any = None
    checks: bool = False
    loss_scaling: float = 1.0

    @property
    def active(self) -> bool:
        return self.checks or (self.arith is not None and self.arith.rounded)


def build_from_source(
    source: TrainingSource, optimizer: OptimizerConfig, numerics: ProgramNumerics | None = None
) -> GradientProgram:
    """The forward + backward program (no optimizer) the host runs per micro-batch, from
    the Paddle program a training model was compiled from."""
    return build_gradient_program(
        source.program,
        source.loss,
        source.fetches,
        fetch_names=source.fetch_names,
        loss_name=source.loss_name,
        optimizer=optimizer,
        scope=source.scope,
        grad_values=source.grads,
        numerics=numerics if numerics is not None and numerics.active else None,
    )
