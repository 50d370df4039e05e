"""The host backend's training step: Paddle's CPU kernels for gradients, numpy (and the
C++ core, for Adam) for the optimizer update (:mod:`.update_rules`).

:class:`HostTrainer` runs one IPU training step on the host: every micro-batch of every
replica through the gradient program (:mod:`.gradients`) in a private scope, gradient
reduction over ``accumulation_factor x replication_factor`` micro-batches (Mean or
Sum), then one update.  Weights and optimizer state are numpy arrays held by Paddle name
(``w``, ``w_moment1_0``, ``w_beta1_pow_acc_0`` ...), so they can be written straight
back into a Paddle scope.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from paddle_ipu import _core
from paddle_ipu._internals import paddle_api
from paddle_ipu.backends.host import numerics
from paddle_ipu.backends.host.gradients import GradientProgram, empty_parameters
from paddle_ipu.backends.host.update_rules import (
    F16,
    F32,
    ONE,
    adam_fusable,
    adam_inputs,
    adam_numpy,
    adam_update_many,
    apply_update,
    clip_by_global_norm,
    f32,
    immutable,
    initial_state,
    regularised,
    round_fp16,
)
from paddle_ipu.backends.layout import buffer_error
from paddle_ipu.compiler.optimizer import STATE_PREFIXES, OptimizerConfig, ParamSlot, state_names
from paddle_ipu.errors import BackendError, OptionError

#: The address alignment a weight array needs to be shared with Paddle's scope.
_KERNEL_ALIGNMENT = 16
#: Threads for a step's Adam update.  Paddle's executor runs the program's adam ops,
#: which depend on nothing but their own parameter, on its pool of host threads
#: (OMP_NUM_THREADS does not bound it), so its CPU step updates parameters on more than
#: one core too; two threads is what the host backend's step uses for its update.
ADAM_THREADS = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
# Parameters per adam_update_many call, in elements: bounds the memory held twice
# (old and new weights and moments) while a step's update runs.
_ADAM_BATCH_ELEMENTS = 1 << 22


class HostTrainer:
    """One emulated IPU training session on the host.

    Args:
        artifact: the gradient program (built from ``SessionConfig.training_source``).
        optimizer: the optimizer (default: ``artifact.optimizer``).
        accumulation_factor: micro-batches per replica per step (af).
        replication_factor: replicas (rf).
        gradient_reduction: ``"mean"`` (divide the summed gradients by af*rf, Paddle
            2.x's IPU default) or ``"sum"``.
        weight_dtype: the device dtype of the weights and buffers: ``"float16"``
            emulates ``enable_fp16`` (values rounded to float16 after every write and
            update; the gradient program computes in float32 from the rounded values).
        arith: the IPU's float16 arithmetic (:class:`.numerics.Fp16Arithmetic`, with
            ``weight_dtype="float16"``): when it rounds, the gradient program rounds
            every result (:mod:`.fp16_program`), gradients accumulate in float16, the
            loss scaling applies, and the weight update rounds as the IPU does
            (stochastically with ``stochastic``); None: float16 storage only.
        processes: the replicas in other processes (``enable_distribution``): a
            :class:`~paddle_ipu.backends.host.replica_group.ReplicaGroup`, whose
            all-reduce adds every process's gradient sums before the reduction divides
            by the job's ``af * rf * processes`` micro-batches.

    Optimizer state whose ``accl*_type`` is ``FLOAT16`` is rounded to float16 after
    every update and read back as float16; the rest is float32.

    State.  Weights, optimizer state and the learning rate are numpy arrays held by
    Paddle name; BatchNorm-style buffers live in a private ``paddle.static.Scope``, one
    copy per replica (replica 0's is what :meth:`read` returns, as PopART's
    ``weightsToHost`` does for replicated weights).
    """

    def __init__(
        self,
        artifact: GradientProgram,
        optimizer: OptimizerConfig | None = None,
        *,
        accumulation_factor: int = 1,
        replication_factor: int = 1,
        gradient_reduction: str = "mean",
        weight_dtype: str = "float32",
        processes: Any = None,
        arith: Any = None,
    ) -> None:
        import paddle

        if accumulation_factor < 1 or replication_factor < 1:
            raise OptionError("accumulation_factor and replication_factor must be >= 1")
        reduction = gradient_reduction.lower()
        if reduction not in ("mean", "sum"):
            raise OptionError(
                f"gradient_reduction must be 'mean' or 'sum', got {gradient_reduction!r}"
            )
        self.artifact = artifact
        self.optimizer = optimizer if optimizer is not None else artifact.optimizer
        if weight_dtype not in ("float32", "float16"):
            raise OptionError(f"weight_dtype must be 'float32' or 'float16', got {weight_dtype!r}")
        #: the device holds weights (and buffers) in float16: every value written or
        #: updated is rounded to float16, and read back as float16
        self.fp16 = weight_dtype == "float16"
        self.af = int(accumulation_factor)
        self.rf = int(replication_factor)
        self.reduction = reduction
        self.processes = processes if processes is not None and processes.size > 1 else None
        #: training steps done (named by a failed all-reduce)
        self.steps = 0
        #: float16 arithmetic (not only storage): roundings, loss scaling (see arith)
        self.arith = arith if self.fp16 and arith is not None and arith.rounded else None
        self._seed = self.arith.seed_or_random() if self.arith is not None else 0
        self.loss_scaling = (
            float(self.optimizer.loss_scaling or 1.0) if self.arith is not None else 1.0
        )
        self._paddle = paddle
        self._place = paddle.CPUPlace()
        self._exe = paddle.static.Executor(self._place)
        self._scope = paddle.static.Scope()
        for name, (shape, dtype) in empty_parameters(artifact.program).items():
            self._scope.var(name).get_tensor().set(np.zeros(shape, dtype), self._place)
        # Gradients stay in the scope (GradientProgram.grad_outputs): only the loss and
        # the user's fetches go through fetch ops.
        self._runner = paddle_api.CachedProgramRunner(
            self._exe, artifact.program, artifact.output_list, self._scope
        )
        self.weights: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        # name -> (array, the DenseTensor over its memory, its address or 0): the
        # weights the gradient program's scope shares, the state share_into exported
        self._weight_src: dict[str, tuple[np.ndarray, Any, int]] = {}
        self._exported: dict[str, tuple[np.ndarray, Any, int]] = {}
        self.lr = f32(self.optimizer.lr)
        # per replica: buffer name -> array (only used when rf > 1)
        self._replica_buffers: list[dict[str, np.ndarray]] = [{} for _ in range(self.rf)]
        for slot in self.optimizer.params:
            self.state.update(initial_state(self.optimizer, slot))
        self._param_index = {slot.name: i for i, slot in enumerate(self.optimizer.params)}

    def __del__(self) -> None:
        # Paddle keeps every Scope made from Python in its scope pool until the process
        # exits; erasing the variables frees their tensors when the trainer goes.
        scope = getattr(self, "_scope", None)
        if scope is not None:
            with contextlib.suppress(Exception):
                scope.erase(scope.local_var_names())
        # the freed Adam outputs the core keeps for the next step's update
        with contextlib.suppress(Exception):
            _core.adam_release_memory()

    # ------------------------------------------------------------------ names and I/O
    @property
    def buffer_names(self) -> list[str]:
        return list(self.artifact.buffers)

    def names(self) -> list[str]:
        """Every tensor the trainer holds: weights, optimizer state, buffers, lr."""
        return [
            *self.optimizer.param_names,
            *self.optimizer.state_var_names(),
            *self.buffer_names,
            self.optimizer.lr_name,
        ]

    def share_into(self, tensors: Mapping[str, Any]) -> dict[str, int]:
        """Point each Paddle tensor of ``tensors`` (by weight or optimizer-state name)
        at the trainer's own array of that name, without a copy (the scope of a
        program trained on the ipu place).  Returns the address each shared tensor
        now holds; a name left out was not shared (the caller copies).

        Every update makes new arrays and the trainer never writes into one it made,
        so such a tensor holds the last step's values; a write into it before the
        next step is what that step reads, as it is the trainer's own state.  Not
        shared: values held in float16 (a read converts them), read-only arrays (the
        compiled model's weights, before the first update) and unaligned ones.

        Each array is exported to Paddle once (Paddle 3.3 never frees an array that
        ``from_dlpack`` took twice): a weight through the DenseTensor the gradient
        program's scope already shares, the state through one cached DenseTensor."""
        out: dict[str, int] = {}
        half = self._fp16_state()
        for name, tensor in tensors.items():
            value = self.weights.get(name)
            if value is not None:
                exported = self._weight_src.get(name)
                if self.fp16 or exported is None or exported[0] is not value or not exported[2]:
                    continue
            else:
                value = self.state.get(name)
                if value is None or name in half:
                    continue
                exported = self._exported.get(name)
                if exported is None or exported[0] is not value:
                    exported = self._export(value)
                    if exported is None:
                        continue
                    self._exported[name] = exported
            paddle_api.share_data(tensor, exported[1])
            out[name] = exported[2]
        return out

    @staticmethod
    def _export(value: np.ndarray) -> tuple[np.ndarray, Any, int] | None:
        """(value, a DenseTensor over its memory, its address) for a writable, aligned,
        C-contiguous float32 array; None for any other."""
        flags = value.flags
        if value.dtype != F32 or not (flags.writeable and flags.c_contiguous):
            return None
        try:
            dense = paddle_api.dense_from_array(value)
        except Exception:  # a layout or version DLPack refuses: not shared
            return None
        address = paddle_api.data_ptr(dense)
        if address % _KERNEL_ALIGNMENT:
            return None
        return value, dense, address

    def _set_scope(self, name: str, value: np.ndarray) -> None:
        self._scope.var(name).get_tensor().set(np.ascontiguousarray(value), self._place)

    def _share_weight(self, name: str, value: np.ndarray) -> None:
        """Point the gradient program's parameter at ``value``'s memory, without a copy.

        A weight array is never written after it is made (an update makes a new one),
        and the gradient program only reads parameters, so the scope can hold the same
        memory: the trainer keeps one copy of the weights, not two (and none of its
        own while they are the compiled model's: see compiler.weights).  An array that
        is not aligned, or that DLPack cannot export, is copied."""
        arr = np.ascontiguousarray(value)
        if arr.ctypes.data % _KERNEL_ALIGNMENT:
            # Paddle's CPU kernels compute wrong numbers from float tensors that are
            # not aligned (seen with a view of unpadded ONNX bytes): copy.
            self._weight_src.pop(name, None)
            self._set_scope(name, arr)
            return
        # Paddle's core converter gives a DenseTensor in static and dygraph mode alike
        # (paddle.utils.dlpack wraps it in an eager Tensor under dygraph, which
        # _share_data_with refuses).  The capsule's deleter keeps ``arr`` alive; the
        # compiled core's capsule carries read-only arrays (the compiled model's weights).
        # Each array is exported once (Paddle never frees an array from_dlpack took
        # twice): the DenseTensor is kept with it, for restore() and share_into().
        cached = self._weight_src.get(name)
        if cached is not None and cached[0] is arr:
            paddle_api.share_data(self._scope.var(name).get_tensor(), cached[1])
            return
        try:
            shared = paddle_api.dense_from_array(arr)
            paddle_api.share_data(self._scope.var(name).get_tensor(), shared)
        except Exception:  # a dtype, layout or version DLPack refuses: the copy below
            self._weight_src.pop(name, None)
            self._set_scope(name, arr)
            return
        # the address only for an array share_into may hand out (writable float32)
        writable = arr.flags.writeable and arr.dtype == F32
        self._weight_src[name] = (arr, shared, arr.ctypes.data if writable else 0)

    def _get_scope(self, name: str) -> np.ndarray:
        var = self._scope.find_var(name)
        if var is None:
            raise KeyError(name)
        return np.array(var.get_tensor())

    def write(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Set weights, optimizer state, buffers (all replicas) or the lr by Paddle name."""
        params = set(self.optimizer.param_names)
        buffers = set(self.buffer_names)
        for name, value in arrays.items():
            arr = np.asarray(value)
            if name in params:
                self.weights[name] = self._device_value(arr)
                self._share_weight(name, self.weights[name])
            elif name in self.state:
                value = arr.astype(F32, copy=True).reshape(self.state[name].shape)
                self.state[name] = round_fp16(value) if name in self._fp16_state() else value
            elif name in buffers:
                if self.fp16 and arr.dtype.kind == "f":
                    arr = self._device_value(arr)
                self._set_scope(name, arr)
                for copy in self._replica_buffers:
                    copy[name] = arr.copy()
            elif name == self.optimizer.lr_name:
                self.lr = f32(float(arr.reshape(-1)[0]))
            else:
                raise KeyError(f"{name!r} is not a weight, optimizer state or buffer of this model")

    def read(
        self, names: Iterable[str] | None = None, *, copy: bool = True
    ) -> dict[str, np.ndarray]:
        """Copies of the named tensors (default: all of :meth:`names`).  ``copy=False``:
        the trainer's own float32 weights and state where no conversion is needed, for
        a caller that only reads them before the next step (they are never written)."""
        wanted = list(names) if names is not None else self.names()
        buffers = set(self.buffer_names)
        out: dict[str, np.ndarray] = {}
        half = self._fp16_state()
        for name in wanted:
            if name in self.weights:
                value = self.weights[name]
                out[name] = value.astype(F16) if self.fp16 else value.copy() if copy else value
            elif name in self.state:
                value = self.state[name]
                out[name] = value.astype(F16) if name in half else value.copy() if copy else value
            elif name in buffers:
                if self.rf > 1 and name in self._replica_buffers[0]:
                    value = self._replica_buffers[0][name].copy()
                else:
                    value = self._get_scope(name)
                out[name] = value.astype(F16) if self.fp16 and value.dtype == F32 else value
            elif name == self.optimizer.lr_name:
                out[name] = np.array(self.lr, dtype=F32)
            else:
                raise KeyError(name)
        return out

    def load_scope(self, scope: Any, *, require_state: bool = False) -> None:
        """Read every weight, state, buffer and the lr from a Paddle scope.  A missing
        optimizer-state variable keeps its initial value unless ``require_state``."""
        arrays: dict[str, np.ndarray] = {}
        state = set(self.optimizer.state_var_names())
        for name in self.names():
            var = scope.find_var(name)
            tensor = var.get_tensor() if var is not None else None
            if tensor is None or not paddle_api.is_initialized(tensor):
                if name in state and not require_state:
                    continue
                if name == self.optimizer.lr_name:
                    continue
                raise KeyError(
                    f"{name!r} is not initialised in the scope (run the startup program)"
                )
            arrays[name] = np.array(tensor)
        self.write(arrays)

    def snapshot(self) -> tuple[Any, ...]:
        """The trainer's state at this point, for :meth:`restore`.

        HostTrainer replaces arrays (weights, optimizer state, replica buffers) on
        every update rather than writing into them, so copies of the dicts keep the
        old arrays; buffers in the gradient program's scope (BatchNorm statistics)
        are updated in place by Paddle's kernels and are copied."""
        t = self
        return (
            dict(t.weights),
            dict(t.state),
            t.lr,
            {
                name: t._get_scope(name)
                for name in t.buffer_names
                if t._scope.find_var(name) is not None
            },
            [dict(copy) for copy in t._replica_buffers],
            # the DenseTensors over those weights: restore() shares them again
            # rather than exporting the arrays a second time
            dict(t._weight_src),
        )

    def restore(self, snapshot: tuple[Any, ...]) -> None:
        """Put back the state :meth:`snapshot` returned (a failed training run is all
        or nothing)."""
        t = self
        weights, state, lr, buffers, replicas, sources = snapshot
        t._weight_src = dict(sources)
        t.weights = dict(weights)
        t.state = dict(state)
        t.lr = lr
        # The gradient program reads weights and buffers from its scope.
        for name, value in weights.items():
            t._share_weight(name, value)
        for name, value in buffers.items():
            t._set_scope(name, value)
        t._replica_buffers = [dict(copy) for copy in replicas]

    def set_lr(self, lr: float) -> None:
        self.lr = f32(lr)

    def _device_value(self, value: np.ndarray) -> np.ndarray:
        """A weight as the device holds it: float16-rounded in fp16, else float32; a
        copy, unless it is already an immutable float32 array (the compiled weights)."""
        if self.fp16:
            return round_fp16(value)
        if value.dtype == F32 and immutable(value):
            return value
        return np.array(value, dtype=F32, copy=True)

    def _fp16_state(self) -> frozenset[str]:
        """The optimizer-state variables held in float16 (``accl*_type`` FLOAT16)."""
        config = self.optimizer
        types = {"accl1": config.accl1_type, "accl2": config.accl2_type, "accl3": config.accl3_type}
        if "FLOAT16" not in types.values():
            return frozenset()
        half: set[str] = set()
        for entry in state_names(config.type):
            accl = STATE_PREFIXES.get(entry.device_prefix, "").removesuffix("_type")
            if not accl or types[accl] != "FLOAT16":
                continue
            half.update(
                slot.state[entry.role] for slot in config.params if entry.role in slot.state
            )
        return frozenset(half)

    def _round_buffers(self) -> None:
        """fp16: the buffers a step updated (BatchNorm statistics) as the device holds them."""
        for name in self.artifact.buffers:
            value = self._get_scope(name)
            if value.dtype == F32:
                self._set_scope(name, round_fp16(value))
        for copy in self._replica_buffers:
            for name, value in copy.items():
                if value.dtype == F32:
                    copy[name] = round_fp16(value)

    # ------------------------------------------------------------------ the step
    def compute_gradients(
        self, feeds: Mapping[str, np.ndarray], *, across_processes: bool = True
    ) -> tuple[dict[str, np.ndarray], list[list[list[np.ndarray]]]]:
        """Run every micro-batch; return the reduced gradients and, per [a][r], the
        outputs (loss first, then the user's fetches).  With replicas in other
        processes the gradients are reduced over theirs too (``across_processes``:
        every process must take part)."""
        # The executor checked every feed (paddle_ipu.executor.feeds): [af, rf, *shape].
        arrays = {name: np.asarray(feeds[name]) for name in self.artifact.feed_names}
        gp = self.artifact
        n_out = 1 + len(gp.fetches)
        n_end = None if gp.flags is None else -1
        sums: list[np.ndarray | None] = [None] * len(gp.grads)
        outputs: list[list[list[np.ndarray]]] = []
        swap = self.rf > 1 and bool(gp.buffers)
        if swap and not self._replica_buffers[0]:
            for copy in self._replica_buffers:
                for name in gp.buffers:
                    copy[name] = self._get_scope(name)
        for a in range(self.af):
            row: list[list[np.ndarray]] = []
            for r in range(self.rf):
                if swap:
                    for name, value in self._replica_buffers[r].items():
                        self._set_scope(name, value)
                feed = {name: arr[a, r] for name, arr in arrays.items()}
                if self.arith is not None and self.arith.stochastic:
                    # the forward and backward passes' random state: seed + replica
                    # (PopART's replica-differing state), then the step and micro-batch
                    state = (
                        numerics.stream_seed(
                            self._seed + self.arith.replica_offset + r,
                            numerics.FORWARD_BACKWARD,
                            self.steps,
                            a,
                        )
                        & 0x7FFFFFFFFFFFFFFF
                    )
                    self._paddle.seed(state)
                    if gp.seed_feed:
                        feed[gp.seed_feed] = np.array([state], np.int64)
                elif gp.seed_feed:
                    feed[gp.seed_feed] = np.zeros([1], np.int64)
                try:
                    result = self._runner.run(feed)
                except Exception as exc:  # a kernel's own check (an index out of range ...)
                    raise BackendError(
                        f"the emulated IPU failed to run the training graph (Paddle's CPU "
                        f"kernels) on micro-batch {a} of replica {r}: {exc}"
                    ) from exc
                if swap:
                    for name in gp.buffers:
                        self._replica_buffers[r][name] = self._get_scope(name)
                if gp.flags is not None:
                    self._check_flags(result[-1], a, r)
                row.append([np.asarray(v) for v in result[:n_out]])
                for i, g in enumerate(self._read_grads(result[n_out:n_end])):
                    prev = sums[i]
                    if prev is None:
                        # a view of the scope's memory, which the next run may reuse:
                        # kept as it is only when no other run follows this step's update
                        one = self.af * self.rf == 1 and g.dtype == F32
                        sums[i] = g if one else np.array(g, dtype=F32)
                    elif self.arith is not None:
                        # the IPU's gradient accumulator is float16 (the weights' type)
                        sums[i] = self._round(prev + g, numerics.ACCUMULATION, i, a, r)
                    else:
                        prev += g
            outputs.append(row)
        count = self.af * self.rf
        if across_processes and self.processes is not None:
            # the sums of every process's micro-batches, then one division by all of them
            sums = list(
                self.processes.all_reduce_sum(
                    sums, f"the gradient all-reduce of training step {self.steps + 1}"
                )
            )
            count *= self.processes.size
        grads: dict[str, np.ndarray] = {}
        for i, (slot, total) in enumerate(zip(self.optimizer.params, sums)):
            assert total is not None
            mean = self.reduction == "mean" and count > 1  # x / 1 is x
            grad = total / F32(count) if mean else total
            if mean and self.arith is not None:
                grad = self._round(grad, numerics.ACCUMULATION, i, -1)
            if self.loss_scaling != 1.0:
                # the update unscales the gradients (PopART folds 1 / loss_scaling into
                # the optimizer's float32 scalars)
                grad = (grad / F32(self.loss_scaling)).astype(F32, copy=False)
            grads[slot.name] = grad
        return grads, outputs

    def _round(self, value: np.ndarray, kind: int, *keys: int) -> np.ndarray:
        """``value`` rounded as the IPU's float16 arithmetic rounds it; the random
        stream of stochastic rounding is keyed on this step, ``kind`` and ``keys``."""
        arith = self.arith
        assert arith is not None
        return numerics.round_fp16(
            value,
            stochastic=arith.stochastic,
            saturate=arith.saturate,
            seed=self._seed,
            stream=numerics.stream_seed(kind, self.steps, *keys),
        )

    def _check_flags(self, flags: Any, micro_batch: int, replica: int) -> None:
        """The floating-point checks of one micro-batch (fp16_program): the first
        operator whose result holds a NaN or an infinity stops the step, before any
        update."""
        counts = np.asarray(flags).reshape(-1, 2)
        bad = np.flatnonzero(counts.sum(axis=1) > 0)
        if bad.size == 0:
            return
        first = int(bad[0])
        index, op_name = self.artifact.checked[first]
        nan, inf = (int(c) for c in counts[first])
        from paddle_ipu.backends.host.fp_checks import raise_failure

        backward = op_name.endswith("_grad")
        raise_failure(
            node=f"{op_name} #{index}",
            op_type=op_name,
            paddle_op="",
            kind="invalid operation" if nan else "overflow",
            step=self.steps + 1,
            where=f"training step {self.steps + 1}, micro-batch {micro_batch}, replica "
            f"{replica}, {'backward' if backward else 'forward'} pass; its result holds "
            f"{inf} infinities and {nan} NaN",
        )

    def _read_grads(self, fetched: Sequence[Any]) -> list[np.ndarray]:
        """The last run's gradients: read-only views of the scope's tensors, and the
        ``fetched`` ones (GradientProgram.output_list) in their places."""
        from paddle_ipu._tensors.views import as_numpy

        grads = []
        rest = iter(fetched)
        for name in self.artifact.grad_outputs:
            if not name:
                grads.append(np.asarray(next(rest)))
                continue
            var = self._scope.find_var(name)
            if var is None or not paddle_api.is_initialized(var.get_tensor()):
                raise BackendError(f"the gradient program left no gradient {name!r} in its scope")
            grads.append(as_numpy(var.get_tensor(), readonly=True))
        return grads

    def apply_gradients(self, grads: Mapping[str, np.ndarray]) -> None:
        """Clip, regularise and update every parameter (one optimizer step).

        Adam and AdamW update every parameter the core's loop takes in a few calls of
        ``adam_update_many`` (on :data:`ADAM_THREADS` threads), the same arithmetic as
        :func:`apply_update` parameter by parameter."""
        config = self.optimizer
        grads = clip_by_global_norm(grads, config)
        half = self._fp16_state()
        adam = config.type in ("adam", "adamw") and not config.no_bias
        lr32 = f32(self.lr)
        scalars: dict[tuple[float, float], tuple[np.float32, np.float32]] = {}
        batch: list[tuple[ParamSlot, tuple[Any, ...]]] = []
        batch_elements = 0
        for slot in config.params:
            if slot.name not in self.weights:
                raise KeyError(f"weight {slot.name!r} was never written to the trainer")
        for slot in config.params:
            weight, grad = self.weights[slot.name], grads[slot.name]
            if not adam:
                new = apply_update(config, slot, weight, grad, self.state, self.lr)
                self._updated(slot, new, half)
                continue
            w, g, wd = regularised(config, slot, weight, grad)
            inputs = adam_inputs(config, slot, w, g, self.state, lr32, wd, scalars)
            if not adam_fusable(*inputs[:4]):
                self._updated(
                    slot, adam_numpy(config, slot, *inputs[:4], self.state, *inputs[4:]), half
                )
                continue
            batch.append((slot, inputs))
            batch_elements += inputs[0].size
            if batch_elements >= _ADAM_BATCH_ELEMENTS:
                self._adam_batch(batch, half)
                batch, batch_elements = [], 0
        if batch:
            self._adam_batch(batch, half)

    def _adam_batch(
        self, batch: Sequence[tuple[ParamSlot, tuple[Any, ...]]], half: frozenset[str]
    ) -> None:
        """The core's Adam loop over ``batch``: (slot, :func:`adam_inputs`) pairs."""
        b1, b2 = f32(self.optimizer.beta1), f32(self.optimizer.beta2)
        columns = list(zip(*(inputs for _, inputs in batch)))
        weights, grads, moment1s, moment2s = (list(c) for c in columns[:4])
        results = adam_update_many(
            weights,
            grads,
            moment1s,
            moment2s,
            b1,
            ONE - b1,
            b2,
            ONE - b2,
            list(columns[4]),
            list(columns[5]),
            threads=ADAM_THREADS,
        )
        for (slot, _), (new, m1, m2) in zip(batch, results):
            self.state[slot.state["moment1"]] = m1
            self.state[slot.state["moment2"]] = m2
            self._updated(slot, new, half)

    def _updated(self, slot: ParamSlot, new: np.ndarray, half: frozenset[str]) -> None:
        """Hold ``slot``'s new weight (and its state) as the device does, and point the
        gradient program's parameter at it."""
        index = self._param_index.get(slot.name, 0)
        if half:
            for k, var in enumerate(slot.state.values()):
                if var in half:
                    self.state[var] = (
                        self._round(self.state[var], numerics.OPTIMIZER_STATE, index, k)
                        if self.arith is not None
                        else round_fp16(self.state[var])
                    )
        if self.arith is not None:
            # the replica-identical random state (PopART's weight update): no replica key
            new = self._round(new, numerics.WEIGHT_UPDATE, index)
        else:
            new = round_fp16(new) if self.fp16 else new.astype(F32, copy=False)
        self.weights[slot.name] = new
        self._share_weight(slot.name, new)

    def step(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One training step.  Each feed is ``[af, rf, *micro_batch_shape]``; returns
        the loss and fetches by name, each ``[af, rf, *shape]``."""
        grads, outputs = self.compute_gradients(feeds)
        self.apply_gradients(grads)
        self.steps += 1
        if self.fp16:
            self._round_buffers()
        result: dict[str, np.ndarray] = {}
        for k, name in enumerate(self.artifact.output_names):
            result[name] = np.stack(
                [np.stack([outputs[a][r][k] for r in range(self.rf)]) for a in range(self.af)]
            )
        return result


def stack_micro_batches(
    batches: Sequence[Mapping[str, np.ndarray]], af: int, rf: int
) -> dict[str, np.ndarray]:
    """``af * rf`` per-micro-batch feed dicts, in [a][r] order, as step feeds."""
    if len(batches) != af * rf:
        raise buffer_error(f"expected {af * rf} micro-batches, got {len(batches)}")
    names = batches[0].keys()
    return {
        n: np.stack([np.asarray(b[n]) for b in batches]).reshape(
            af, rf, *np.asarray(batches[0][n]).shape
        )
        for n in names
    }
