"""Host training math: optimizer extraction, the gradient program and the numpy update
rules, checked against Paddle 3.3's own CPU training of the same program."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from paddle_ipu.backends.host.gradients import build_gradient_program  # noqa: E402
from paddle_ipu.backends.host.trainer import HostTrainer, stack_micro_batches  # noqa: E402
from paddle_ipu.compiler.optimizer import (  # noqa: E402
    OPTIMIZER_TYPES,
    extract_optimizer,
    split_state_name,
    state_names,
)
from paddle_ipu.errors import CompileError, NotSupportedError  # noqa: E402

P = paddle.optimizer
STEPS = 20
LOSS_RTOL = 1e-5

paddle.enable_static()


@pytest.fixture(autouse=True)
def _fresh_scope() -> Iterator[None]:
    paddle.enable_static()
    with paddle.static.scope_guard(paddle.static.Scope()):
        yield


def _mlp(
    make_opt: Callable[[], Any] | None, *, batch_norm: bool = False, names: str = ""
) -> tuple[Any, Any, Any]:
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [-1, 4], "float32")
        y = paddle.static.data("y", [-1, 1], "float32")
        attr = paddle.ParamAttr(name=f"{names}w1") if names else None
        h = paddle.static.nn.fc(x, 8, weight_attr=attr)
        if batch_norm:
            h = paddle.nn.BatchNorm1D(8)(h)
        h = paddle.tanh(h)
        out = paddle.static.nn.fc(h, 1)
        loss = paddle.mean((out - y) ** 2)
        if make_opt is not None:
            make_opt().minimize(loss)
    return main, startup, loss


def _scope_array(name: str) -> np.ndarray:
    return np.array(paddle.static.global_scope().find_var(name).get_tensor())


def _batches(seed: int, n: int, rows: int) -> list[dict[str, np.ndarray]]:
    """Random inputs with a learnable target (a fixed teacher), so losses fall."""
    rng = np.random.default_rng(seed)
    teacher = np.array([[0.5], [-1.0], [0.25], [0.75]], dtype="float32")
    out = []
    for _ in range(n):
        x = rng.standard_normal((rows, 4)).astype("float32")
        out.append({"x": x, "y": np.tanh(x @ teacher).astype("float32")})
    return out


# The ten optimizer types; "wd" variants add weight decay in the form each optimizer takes.
CASES: dict[str, tuple[str, Callable[[], Any], Callable[[], Any]]] = {
    "sgd": ("sgd", lambda: P.SGD(0.1), lambda: P.SGD(0.1, weight_decay=0.01)),
    "momentum": (
        "momentum",
        lambda: P.Momentum(0.05, momentum=0.9),
        lambda: P.Momentum(0.05, momentum=0.9, weight_decay=0.01),
    ),
    "adam": ("adam", lambda: P.Adam(0.01), lambda: P.Adam(0.01, weight_decay=0.01)),
    "adamw": (
        "adamw",
        lambda: P.AdamW(0.01, weight_decay=0.0),
        lambda: P.AdamW(
            0.01, weight_decay=0.05, apply_decay_param_fun=lambda n: not n.endswith("b_0")
        ),
    ),
    "adamax": ("adamax", lambda: P.Adamax(0.01), lambda: P.Adamax(0.01, weight_decay=0.01)),
    "lamb": (
        "lamb",
        lambda: P.Lamb(0.01, lamb_weight_decay=0.0),
        lambda: P.Lamb(
            0.01,
            lamb_weight_decay=0.02,
            exclude_from_weight_decay_fn=lambda p: p.name.endswith("b_0"),
        ),
    ),
    "adagrad": ("adagrad", lambda: P.Adagrad(0.05), lambda: P.Adagrad(0.05, weight_decay=0.01)),
    "adadelta": (
        "adadelta",
        lambda: P.Adadelta(1.0),
        lambda: P.Adadelta(1.0, weight_decay=0.01),
    ),
    "rmsprop": (
        "rmsprop",
        lambda: P.RMSProp(0.01, momentum=0.5),
        lambda: P.RMSProp(0.01, momentum=0.5, weight_decay=0.01),
    ),
    "centered_rmsprop": (
        "centered_rmsprop",
        lambda: P.RMSProp(0.01, centered=True),
        lambda: P.RMSProp(0.01, centered=True, weight_decay=0.01),
    ),
}


def _train_both(
    make_opt: Callable[[], Any],
    *,
    steps: int = STEPS,
    batch_norm: bool = False,
    scheduler: Any = None,
) -> tuple[list[float], list[float], HostTrainer, Any]:
    """Train the same program from the same weights with Paddle and with HostTrainer."""
    paddle.seed(7)
    main, startup, loss = _mlp(make_opt, batch_norm=batch_norm)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    gp = build_gradient_program(main, loss)
    trainer = HostTrainer(gp)
    trainer.load_scope(paddle.static.global_scope())
    ref, got = [], []
    for batch in _batches(3, steps, 6):
        (expected,) = exe.run(main, feed=batch, fetch_list=[loss])
        if scheduler is not None:
            trainer.set_lr(scheduler())
        out = trainer.step({k: v[None, None] for k, v in batch.items()})
        if scheduler is not None:
            scheduler.step()
        ref.append(float(expected))
        got.append(float(out["loss"][0, 0]))
    return ref, got, trainer, gp


def _assert_weights_match(trainer: HostTrainer, gp: Any) -> None:
    for name in [*gp.param_names, *trainer.optimizer.state_var_names(), *gp.buffers]:
        np.testing.assert_allclose(
            trainer.read([name])[name].reshape(-1),
            _scope_array(name).reshape(-1),
            rtol=1e-5,
            atol=1e-6,
            err_msg=name,
        )


@pytest.mark.parametrize("decay", [False, True], ids=["plain", "decay"])
@pytest.mark.parametrize("case", list(CASES))
def test_host_training_matches_paddle(case: str, decay: bool) -> None:
    kind, plain, with_decay = CASES[case]
    ref, got, trainer, gp = _train_both(with_decay if decay else plain)
    assert trainer.optimizer.type == kind
    if decay:
        assert any(slot.weight_decay > 0 for slot in trainer.optimizer.params)
        assert trainer.optimizer.weight_decay_mode in ("l2_regularization", "decay")
    assert np.mean(ref[-5:]) < np.mean(ref[:5]), "the reference did not train"
    np.testing.assert_allclose(got, ref, rtol=LOSS_RTOL)
    _assert_weights_match(trainer, gp)


def test_global_norm_clip_and_changing_lr() -> None:
    sched = P.lr.LambdaDecay(0.02, lambda epoch: 0.8**epoch)
    ref, got, trainer, gp = _train_both(
        lambda: P.Adam(sched, grad_clip=paddle.nn.ClipGradByGlobalNorm(0.05)), scheduler=sched
    )
    cfg = trainer.optimizer
    assert cfg.clip_norm == pytest.approx(0.05)
    assert cfg.lr_scheduler
    assert all(slot.clip for slot in cfg.params)
    np.testing.assert_allclose(got, ref, rtol=LOSS_RTOL)
    _assert_weights_match(trainer, gp)


def test_batch_norm_running_stats_follow_paddle() -> None:
    ref, got, trainer, gp = _train_both(lambda: P.Momentum(0.05, momentum=0.9), batch_norm=True)
    assert len(gp.buffers) == 2  # running mean and variance
    np.testing.assert_allclose(got, ref, rtol=LOSS_RTOL)
    _assert_weights_match(trainer, gp)


def test_replicas_keep_their_own_batch_norm_statistics() -> None:
    """rf=2: replica 0's running statistics after one step are those of its own two
    micro-batches (weights change only after all micro-batches)."""
    paddle.seed(5)
    main, startup, loss = _mlp(lambda: P.SGD(0.1), batch_norm=True)
    paddle.static.Executor(paddle.CPUPlace()).run(startup)
    gp = build_gradient_program(main, loss)
    micro = _batches(9, 4, 5)
    replicated = HostTrainer(gp, accumulation_factor=2, replication_factor=2)
    replicated.load_scope(paddle.static.global_scope())
    replicated.step(stack_micro_batches(micro, 2, 2))
    single = HostTrainer(gp, accumulation_factor=2, replication_factor=1)
    single.load_scope(paddle.static.global_scope())
    single.step(stack_micro_batches([micro[0], micro[2]], 2, 1))
    initial = {n: _scope_array(n) for n in gp.buffers}
    for name in gp.buffers:
        got = replicated.read([name])[name]
        np.testing.assert_allclose(got, single.read([name])[name], rtol=1e-6, atol=1e-7)
        assert not np.allclose(got, initial[name])


def _numpy_mlp_loss(weights: dict[str, np.ndarray], batch: dict[str, np.ndarray]) -> float:
    by_shape = {v.shape: v for v in weights.values()}
    h = np.tanh(batch["x"] @ by_shape[(4, 8)] + by_shape[(8,)])
    out = h @ by_shape[(8, 1)] + by_shape[(1,)]
    return float(np.mean((out - batch["y"]) ** 2))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_accumulation_and_replication(reduction: str) -> None:
    """af=4, rf=2: per-micro-batch gradients reduced once, one update, outputs in
    [af, rf] order.  Reference: Paddle CPU on the 8 micro-batches concatenated (for a
    mean loss over equal micro-batches its gradient is the mean of theirs); Sum is the
    same with an 8x learning rate under SGD."""
    af, rf, rows = 4, 2, 3
    lr = 0.02
    if reduction == "mean":
        host_opt, ref_opt = (lambda: P.Adam(lr)), (lambda: P.Adam(lr))
    else:
        host_opt, ref_opt = (lambda: P.SGD(lr)), (lambda: P.SGD(lr * af * rf))
    paddle.seed(11)
    main, startup, loss = _mlp(host_opt, names="acc_")
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    initial = [_scope_array(p.name) for p in main.global_block().all_parameters()]
    trainer = HostTrainer(
        build_gradient_program(main, loss),
        accumulation_factor=af,
        replication_factor=rf,
        gradient_reduction=reduction,
    )
    trainer.load_scope(paddle.static.global_scope())

    ref_main, ref_startup, ref_loss = _mlp(ref_opt, names="acc_")
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(ref_startup)
        ref_params = [p.name for p in ref_main.global_block().all_parameters()]
        for name, value in zip(ref_params, initial):
            paddle.static.global_scope().var(name).get_tensor().set(value, paddle.CPUPlace())
        for step in range(3):
            micro = _batches(100 + step, af * rf, rows)
            before = trainer.read(trainer.optimizer.param_names)
            out = trainer.step(stack_micro_batches(micro, af, rf))
            assert out["loss"].shape == (af, rf)
            for a in range(af):
                for r in range(rf):
                    expected = _numpy_mlp_loss(before, micro[a * rf + r])
                    assert out["loss"][a, r] == pytest.approx(expected, rel=1e-5)
            full = {k: np.concatenate([m[k] for m in micro]) for k in ("x", "y")}
            (ref_value,) = exe.run(ref_main, feed=full, fetch_list=[ref_loss])
            assert float(out["loss"].mean()) == pytest.approx(float(ref_value), rel=1e-5)
        host_params = [p.name for p in main.global_block().all_parameters()]
        for host_name, ref_name in zip(host_params, ref_params):
            np.testing.assert_allclose(
                trainer.weights[host_name], _scope_array(ref_name), rtol=1e-5, atol=1e-6
            )


def test_state_names_are_paddle_3_names() -> None:
    """Every state variable a real program creates parses with the table, including
    a counter other than 0 (a second optimizer for the same parameter names)."""
    seen: set[str] = set()
    for _case, (kind, make, _) in CASES.items():
        for attempt in range(2):
            main, _startup, _loss = _mlp(make, names=f"sn_{kind}_")
            cfg = extract_optimizer(main)
            assert cfg.type == kind
            roles = {e.role for e in state_names(kind)}
            for slot in cfg.params:
                assert set(slot.state) == roles, (kind, slot.state)
                for role, var in slot.state.items():
                    parsed = split_state_name(slot.name, var, kind)
                    assert parsed is not None, var
                    assert parsed[0].role == role
                    if slot.name == f"sn_{kind}_w1":
                        assert parsed[1] == attempt, var
            seen.add(kind)
    assert seen == set(OPTIMIZER_TYPES)
    assert [e.suffix for e in state_names("adadelta")] == [
        "__avg_squared_grad",
        "__avg_squared_update",
    ]
    table = cfg.device_names()
    assert table[f"Accl3___sn_{kind}_w1"].startswith(f"sn_{kind}_w1_momentum_")
    assert re.fullmatch(
        r"sn_centered_rmsprop_w1_mean_grad_1", table["Accl2___sn_centered_rmsprop_w1"]
    )


def test_gradient_program_has_no_optimizer_ops() -> None:
    main, _startup, loss = _mlp(lambda: P.Adamax(0.01, weight_decay=0.01))
    before = [op.name() for op in main.global_block().ops]
    gp = build_gradient_program(main, loss)
    names = [op.name() for op in gp.program.global_block().ops]
    assert [op.name() for op in main.global_block().ops] == before  # source untouched
    assert not [n for n in names if n in ("pd_op.adamax_", "pd_op.scale_", "pd_op.add_n")]
    assert "pd_op.adamax_" in before
    assert gp.feed_names == ["x", "y"]
    assert not hasattr(gp.program, "lr_scheduler")


@pytest.mark.parametrize(
    ("make_opt", "needle"),
    [
        (lambda: P.Momentum(0.1, use_nesterov=True), "use_nesterov"),
        (lambda: P.SGD(0.1, weight_decay=paddle.regularizer.L1Decay(0.01)), "L1"),
        (lambda: P.Adam(0.1, lazy_mode=True), "lazy_mode"),
        (lambda: P.Adam(0.1, amsgrad=True), "amsgrad"),
        (lambda: P.SGD(0.1, grad_clip=paddle.nn.ClipGradByNorm(1.0)), "ClipGradByNorm"),
        (lambda: P.Momentum(0.1, rescale_grad=0.5), "rescale_grad"),
    ],
    ids=["nesterov", "l1", "lazy", "amsgrad", "clip_by_norm", "rescale_grad"],
)
def test_unsupported_settings_are_named(make_opt: Callable[[], Any], needle: str) -> None:
    main, _startup, _loss = _mlp(make_opt)
    with pytest.raises(NotSupportedError, match=needle):
        extract_optimizer(main)


class _FakeOp:
    """Stands in for an update op: the CPU wheel cannot build an fp16 optimizer op
    (``multi_precision`` is only set for fp16/bf16 parameters)."""

    def __init__(self, attrs: dict[str, Any]) -> None:
        self._attrs = attrs

    def attrs(self) -> dict[str, Any]:
        return self._attrs


def test_multi_precision_is_rejected() -> None:
    from paddle_ipu.compiler.optimizer import _check_attrs

    _check_attrs(_FakeOp({"multi_precision": False}), "adam", "w")
    with pytest.raises(NotSupportedError, match="multi_precision"):
        _check_attrs(_FakeOp({"multi_precision": True}), "adam", "w")


def test_no_optimizer_is_a_compile_error() -> None:
    main, _startup, loss = _mlp(None)
    with pytest.raises(CompileError, match="no optimizer"):
        extract_optimizer(main)
    with pytest.raises(CompileError, match="no optimizer"):
        build_gradient_program(main, loss)


def test_gradients_stay_in_the_scope_instead_of_being_fetched() -> None:
    """Each gradient is a persistable output of the gradient program, read in place
    from the trainer's scope (a fetch copies it twice); a gradient that is part of a
    list result (rnn's weights) cannot be, and is fetched.  Both give Paddle's numbers
    (the zoo tier trains an LSTM against the CPU)."""
    main, startup, loss = _mlp(lambda: P.SGD(0.1))
    paddle.static.Executor(paddle.CPUPlace()).run(startup)
    gp = build_gradient_program(main, loss)
    assert gp.grad_outputs == [f"{n}@PADDLE_IPU_GRAD" for n in gp.param_names]
    assert len(gp.output_list) == 1 + len(gp.fetches)  # no gradient is fetched

    lstm_main, lstm_startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(lstm_main, lstm_startup):
        x = paddle.static.data("x", [-1, 5, 4], "float32")
        out, _ = paddle.nn.LSTM(4, 6)(x)
        lstm_loss = paddle.mean(out)
        P.SGD(0.1).minimize(lstm_loss)
    paddle.static.Executor(paddle.CPUPlace()).run(lstm_startup)
    lgp = build_gradient_program(lstm_main, lstm_loss)
    fetched = [g for g, n in zip(lgp.grads, lgp.grad_outputs) if not n]
    assert fetched and len(lgp.output_list) == 1 + len(fetched)
    trainer = HostTrainer(lgp)
    trainer.load_scope(paddle.static.global_scope())
    batch = {"x": np.random.default_rng(0).standard_normal((1, 1, 3, 5, 4)).astype("float32")}
    before = {n: _scope_array(n) for n in lgp.param_names}
    trainer.step(batch)
    moved = [n for n in lgp.param_names if not np.array_equal(trainer.read([n])[n], before[n])]
    assert len(moved) == len(lgp.param_names)
