"""Host sessions share one activation arena: a model compiled for many input shapes (one
session per shape) holds the largest shape's activations, not the sum of every shape's.
Measured in a fresh process (the arena is process-wide), by its resident memory."""

from __future__ import annotations

import json
from typing import Any

from support.helpers import run_python

_SCRIPT = r"""
import json, sys, numpy as np, paddle
from paddle_ipu import inference

paddle.enable_static()
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [-1, 3, -1, -1], "float32")
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 32, 3, padding=1)(x))
    h = paddle.nn.functional.relu(paddle.nn.Conv2D(32, 32, 3, padding=1)(h))
    y = paddle.nn.Conv2D(32, 1, 1)(h)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(start)
    paddle.static.save_inference_model(PREFIX, [x], [y], exe, program=main)
paddle.disable_static()

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

config = inference.Config(PREFIX)
config.enable_ipu()
config.disable_glog_info()
predictor = inference.create_predictor(config)
widths = [1024, 960, 896, 832, 768, 704]
rss = []
for w in widths:
    feed = np.random.default_rng(w).standard_normal((1, 3, 512, w)).astype("float32")
    for _ in range(2):
        predictor.run([feed])
    rss.append(rss_mb())
sessions = []
shapes = predictor._shared.shapes
for key in shapes.specialisations():
    opts = shapes.executor(key).session._ort.get_session_options()
    try:
        shared = opts.get_session_config_entry("session.use_env_allocators")
    except RuntimeError:  # not set
        shared = None
    sessions.append([shared, opts.enable_mem_pattern])
print(json.dumps({"rss": rss, "shapes": len(predictor._shared.shapes.specialisations()),
                  "sessions": sessions}))
"""


def test_shapes_share_one_activation_arena(tmp_path: Any) -> None:
    """Six input widths, the largest first: one activation of the largest is
    32 x 512 x 1024 float32 = 64 MiB.  With an arena per session, each smaller shape's
    session kept its own activations after its runs: resident memory grew by 1.2 GB over
    the five smaller shapes (measured).  Sharing one arena, they reuse what the largest
    shape's runs reserved: 125-130 MB (their graphs and compiles) in the same runs."""
    code = _SCRIPT.replace("PREFIX", repr(str(tmp_path / "model")))
    done = run_python(code, env={"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["shapes"] == 6
    assert result["sessions"] == [["1", False]] * 6
    first, last = result["rss"][0], result["rss"][-1]
    assert last - first < 400, result["rss"]
