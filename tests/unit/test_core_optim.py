"""The core's one-pass Adam update against numpy evaluating the same formulas one
operation at a time (each rounded to float32), bit for bit; and the host trainer's
Adam against Paddle's own CPU kernel (tests/conformance/test_optimizers.py and the zoo tier cover
whole training runs)."""

from __future__ import annotations

import numpy as np
import pytest

from paddle_ipu import _core
from paddle_ipu.backends.host.update_rules import apply_update, initial_state
from paddle_ipu.compiler.optimizer import OptimizerConfig, ParamSlot

F = np.float32
ONE = F(1)


def _numpy_adam(
    w: np.ndarray, g: np.ndarray, m1: np.ndarray, m2: np.ndarray, b1: F, b2: F, lr_t: F, eps_t: F
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m1n = m1 * b1 + g * (ONE - b1)
    m2n = m2 * b2 + (g * (ONE - b2)) * g
    return w + (m1n / (np.sqrt(m2n) + eps_t)) * (-lr_t), m1n, m2n


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("n", [1, 7, 16384, 100_003])
def test_adam_update_is_bitwise_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    w = rng.standard_normal(n).astype(F)
    g = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 3, n)).astype(F)
    m1 = (rng.standard_normal(n) * 1e-3).astype(F)
    m2 = np.abs(rng.standard_normal(n) * 1e-6).astype(F)
    # edge values: zero gradients and moments, a denormal, a huge gradient
    g[:1] = 0.0
    if n > 3:
        m2[1] = 0.0
        g[2] = F(1e-42)
        g[3] = F(3e18)
    b1, b2 = F(0.9), F(0.999)
    b1p, b2p = F(0.9) ** 3, F(0.999) ** 3
    lr_t = F(1e-3) * (np.sqrt(ONE - b2p) / (ONE - b1p))
    eps_t = F(1e-8) * np.sqrt(ONE - b2p)
    want = _numpy_adam(w, g, m1, m2, b1, b2, lr_t, eps_t)
    before = [a.copy() for a in (w, g, m1, m2)]
    got = _core.adam_update(w, g, m1, m2, b1, ONE - b1, b2, ONE - b2, -lr_t, eps_t)
    for name, a, b in zip(("weight", "moment1", "moment2"), got, want):
        assert a.dtype == F and a.shape == (n,)
        np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=name)
    for a, b in zip((w, g, m1, m2), before):
        np.testing.assert_array_equal(a, b)  # the inputs are not written


@pytest.mark.parametrize("threads", [1, 2])
def test_adam_update_many_is_bitwise_numpy(threads: int) -> None:
    """Every parameter of a step in one call (chunked over threads, sizes that end
    mid-chunk and mid-vector) gives each parameter's numpy result, in aligned arrays."""
    rng = np.random.default_rng(threads)
    sizes = [(3,), (17, 5), (300_001,), (64, 1025), (1,), (40_000,)]
    b1, b2 = F(0.9), F(0.999)
    ws, gs, m1s, m2s, lrs, epss = [], [], [], [], [], []
    for k, shape in enumerate(sizes):
        ws.append(rng.standard_normal(shape).astype(F))
        gs.append((rng.standard_normal(shape) * 1e-2).astype(F))
        m1s.append((rng.standard_normal(shape) * 1e-3).astype(F))
        m2s.append(np.abs(rng.standard_normal(shape) * 1e-6).astype(F))
        b1p, b2p = F(0.9) ** (k + 1), F(0.999) ** (k + 1)
        lrs.append(F(1e-3) * (np.sqrt(ONE - b2p) / (ONE - b1p)))
        epss.append(F(1e-8) * np.sqrt(ONE - b2p))
    for _ in range(2):  # the second call reuses the first one's freed memory
        got = _core.adam_update_many(
            ws, gs, m1s, m2s, b1, ONE - b1, b2, ONE - b2, [-x for x in lrs], epss, threads
        )
        assert len(got) == len(sizes)
        for k, outputs in enumerate(got):
            want = _numpy_adam(ws[k], gs[k], m1s[k], m2s[k], b1, b2, lrs[k], epss[k])
            for name, a, b in zip(("weight", "moment1", "moment2"), outputs, want):
                assert a.shape == sizes[k] and a.dtype == F
                assert a.ctypes.data % 64 == 0
                np.testing.assert_array_equal(_bits(a), _bits(b), err_msg=f"{k} {name}")
        del got


def test_adam_keeps_freed_outputs_for_reuse_until_released() -> None:
    """The outputs of an update, once dropped, are held for the next update; releasing
    frees them (the trainer does when it goes), and nothing is held after."""
    _core.adam_release_memory()
    a = np.ones(1 << 16, F)
    out = _core.adam_update(a, a, a, a, 0.9, 0.1, 0.9, 0.1, -1.0, 1.0)
    del out
    held = _core.adam_release_memory()
    assert held >= 3 * a.nbytes
    assert _core.adam_release_memory() == 0


def test_adam_update_many_checks_its_lists() -> None:
    a = np.zeros(4, F)
    with pytest.raises(ValueError, match="one entry per weight"):
        _core.adam_update_many([a, a], [a], [a, a], [a, a], 0.9, 0.1, 0.9, 0.1, [-1.0], [1.0])
    with pytest.raises(ValueError, match="moment1 has 3 elements"):
        _core.adam_update_many([a], [a], [np.zeros(3, F)], [a], 0.9, 0.1, 0.9, 0.1, [-1.0], [1.0])


def test_adam_update_refuses_what_it_cannot_read() -> None:
    a = np.zeros((2, 3), F)
    with pytest.raises(TypeError, match="grad must be a C-contiguous float32"):
        _core.adam_update(a, a.astype(np.float64), a, a, 0.9, 0.1, 0.9, 0.1, -1.0, 1.0)
    with pytest.raises(TypeError, match="moment1 must be a C-contiguous float32"):
        _core.adam_update(a, a, np.zeros((3, 2), F).T, a, 0.9, 0.1, 0.9, 0.1, -1.0, 1.0)
    with pytest.raises(ValueError, match=r"moment2 has 5 elements; expected 6"):
        _core.adam_update(a, a, a, np.zeros(5, F), 0.9, 0.1, 0.9, 0.1, -1.0, 1.0)


@pytest.mark.parametrize("contiguous", [True, False])
def test_host_adam_matches_paddle_kernel(contiguous: bool) -> None:
    """apply_update (the core's loop, or numpy for strided arrays) against Paddle's
    adam kernel on the CPU, three steps."""
    import paddle

    rng = np.random.default_rng(3)
    shape = (64, 48)
    w0 = rng.standard_normal(shape).astype(F)
    grads = [rng.standard_normal(shape).astype(F) for _ in range(3)]
    slot = ParamSlot(
        "w", state={"moment1": "m1", "moment2": "m2", "beta1_pow": "b1", "beta2_pow": "b2"}
    )
    config = OptimizerConfig(type="adam", params=(slot,), lr=0.01)
    state = {
        "m1": np.zeros(shape, F),
        "m2": np.zeros(shape, F),
        "b1": np.array([0.9], F),
        "b2": np.array([0.999], F),
    }
    w = w0
    for g in grads:
        if not contiguous:
            g = np.asfortranarray(g)
        w = apply_update(config, slot, w, g, state, 0.01)

    paddle.disable_static()
    try:
        p = paddle.create_parameter(shape, "float32")
        p.set_value(w0)
        opt = paddle.optimizer.Adam(0.01, parameters=[p])
        for g in grads:
            p.grad = paddle.to_tensor(g)  # type: ignore[misc]
            opt.step()
        ref = p.numpy()
    finally:
        paddle.enable_static()
    np.testing.assert_allclose(w, ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_trainer_batched_adam_is_apply_update_per_parameter(kind: str) -> None:
    """HostTrainer.apply_gradients (the core's batched loop, numpy for a strided
    gradient) against apply_update one parameter at a time, bit for bit, two steps."""
    from paddle_ipu.backends.host import trainer as host_optim

    rng = np.random.default_rng(7)
    shapes = {"a": (33, 7), "b": (5000,), "c": (3, 4, 5), "d": (1200, 900)}
    slots = tuple(
        ParamSlot(
            n,
            shape=s,
            weight_decay=0.01 if n != "c" else 0.0,
            state={r: f"{n}_{r}" for r in ("moment1", "moment2", "beta1_pow", "beta2_pow")},
        )
        for n, s in shapes.items()
    )
    config = OptimizerConfig(type=kind, params=slots, lr=0.01)
    trainer = object.__new__(host_optim.HostTrainer)
    trainer.optimizer = config
    trainer.fp16 = False
    trainer.arith = None
    trainer._param_index = {slot.name: i for i, slot in enumerate(slots)}
    trainer.lr = F(0.01)
    trainer.weights = {n: rng.standard_normal(s).astype(F) for n, s in shapes.items()}
    trainer.state = {}
    for slot in slots:
        trainer.state.update(initial_state(config, slot))
    trainer._share_weight = lambda name, value: None  # type: ignore[method-assign]
    weights, state = dict(trainer.weights), dict(trainer.state)
    for _ in range(2):
        grads = {n: rng.standard_normal(s).astype(F) for n, s in shapes.items()}
        grads["c"] = np.asfortranarray(grads["c"])
        trainer.apply_gradients(grads)
        for slot in slots:
            weights[slot.name] = apply_update(
                config, slot, weights[slot.name], grads[slot.name], state, trainer.lr
            )
        for name, value in weights.items():
            np.testing.assert_array_equal(_bits(trainer.weights[name]), _bits(value), name)
        for name, value in state.items():
            np.testing.assert_array_equal(_bits(trainer.state[name]), _bits(value), name)
