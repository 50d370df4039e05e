"""A small static Paddle program on the "ipu" device, checked against the CPU."""

from __future__ import annotations

# Paddle finds the ipu device by itself; importing paddle_ipu first only keeps Paddle's
# own log lines and warnings out of the output (PADDLE_IPU_PADDLE_LOGS=1 shows them).
import paddle_ipu  # noqa: F401

import numpy as np
import paddle


def run(place: object, x: np.ndarray) -> np.ndarray:
    main, startup = paddle.static.Program(), paddle.static.Program()
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope), paddle.static.program_guard(main, startup):
        inp = paddle.static.data("x", [-1, 16], "float32")
        init = paddle.nn.initializer.Assign(np.linspace(-1.0, 1.0, 16 * 8).reshape(16, 8))
        hidden = paddle.static.nn.fc(inp, 8, weight_attr=paddle.ParamAttr(initializer=init))
        out = paddle.mean(paddle.nn.functional.relu(hidden))
        exe = paddle.static.Executor(place)
        exe.run(startup)
        (value,) = exe.run(main, feed={"x": x}, fetch_list=[out])
    return np.asarray(value)


def main() -> None:
    paddle.enable_static()
    x = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
    on_ipu = run(paddle.CustomPlace("ipu", 0), x)
    on_cpu = run(paddle.CPUPlace(), x)
    print(f"ipu:0 result {float(on_ipu):.6f}, cpu result {float(on_cpu):.6f}")
    if not np.allclose(on_ipu, on_cpu, rtol=1e-6):
        raise SystemExit("the ipu device and the CPU disagree")
    print("ok: the static program ran on the ipu device and matches the CPU")


if __name__ == "__main__":
    main()
