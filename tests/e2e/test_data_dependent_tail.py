"""A detector as PaddleDetection's exporter writes it by default, ending in Paddle's own
``multiclass_nms3`` (its output size depends on the data), saved under PIR and as a
legacy ``.pdmodel``, runs as exported: the conv head compiled for the emulated IPU, NMS
and what follows it on the host with Paddle's CPU kernels.  The oracle is Paddle
Inference on the CPU in a process without paddle-ipu (``PADDLE_IPU_AUTOLOAD=0``): the
same counts, the same rows in the same order with the same labels, scores and boxes
within float32 tolerance (the class logits are scaled by 4 to spread the scores, so that
float32 rounding in the compiled graph does not decide NMS)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.helpers import fresh_programs, run_python

# A conv head with random weights over an image of open height and width: per
# location 4 box offsets and 3 class logits, decoded to boxes on a grid (pixel
# coordinates), NMS as ppdet's exporter emits it, boxes scaled back by scale_factor.
# Saved under PIR (.json) or, as Paddle 2.x exported, the legacy IR (.pdmodel: its
# operators appended as Paddle 2.x's layers appended them).
PRELUDE = {
    "pir": """
def act(kind, x):
    return {"tanh": paddle.tanh, "sigmoid": paddle.nn.functional.sigmoid}[kind](x)

def nms(boxes, scores):
    return paddle._C_ops.multiclass_nms3(
        boxes, scores, None, 0.3, 1000, 100, 0.45, False, 1.0, -1
    )
""",
    "legacy": """
from paddle.base.layer_helper import LayerHelper

def act(kind, x):
    helper = LayerHelper(kind)
    y = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type=kind, inputs={"X": x}, outputs={"Out": y})
    return y

def nms(boxes, scores):
    helper = LayerHelper("multiclass_nms3")
    out, index, num = (helper.create_variable_for_type_inference(t)
                       for t in ("float32", "int32", "int32"))
    helper.append_op(
        type="multiclass_nms3", inputs={"BBoxes": boxes, "Scores": scores},
        attrs={"background_label": -1, "score_threshold": 0.3, "nms_top_k": 1000,
               "nms_threshold": 0.45, "keep_top_k": 100, "nms_eta": 1.0,
               "normalized": False},
        outputs={"Out": out, "Index": index, "NmsRoisNum": num},
    )
    return out, index, num
""",
}
SAVE = """
import numpy as np, paddle
paddle.enable_static()
paddle.seed(7)
{prelude}
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    image = paddle.static.data("image", [-1, 3, -1, -1], "float32")
    scale_factor = paddle.static.data("scale_factor", [-1, 2], "float32")
    feat = paddle.nn.functional.relu(paddle.nn.Conv2D(3, 8, 3, padding=1)(image))
    reg = paddle.nn.Conv2D(8, 4, 1)(feat)
    cls = paddle.nn.Conv2D(8, 3, 1)(feat) * 4.0
    h, w = paddle.shape(image)[2], paddle.shape(image)[3]
    ys, xs = paddle.meshgrid(paddle.arange(h, dtype="float32"), paddle.arange(w, dtype="float32"))
    centre = paddle.stack([xs, ys, xs, ys], axis=0).flatten(1).unsqueeze(0) * 8.0  # 1,4,HW
    size = paddle.to_tensor([-12.0, -12.0, 12.0, 12.0]).reshape([1, 4, 1])
    boxes = (centre + size + act("tanh", reg.flatten(2)) * 6.0).transpose([0, 2, 1])
    scores = act("sigmoid", cls.flatten(2))
    out, index, num = nms(boxes, scores)
    factor = paddle.concat([scale_factor[:, ::-1], scale_factor[:, ::-1]], axis=1)
    bbox = paddle.concat([out[:, :2], out[:, 2:] / factor[0]], axis=1)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model({prefix!r}, [image, scale_factor], [bbox, num], exe,
                                   program=main)
"""

# Paddle Inference's Python example, with one added line (enable_ipu) on the IPU side.
# Prints the output names and writes the outputs per run; on the IPU side also the
# process state the predictor must leave as it found it.
SCRIPT = """
import json, logging, sys
import numpy as np
import paddle
import paddle.inference as paddle_infer
# paddle-ipu's INFO lines on stderr whatever Paddle's release does to logging when
# imported (3.2 sets the root logger's level to WARNING, 3.3 to INFO)
logging.basicConfig()
logging.getLogger("paddle_ipu").setLevel(logging.INFO)

def state():
    import paddle
    return [paddle.in_dynamic_mode(), paddle.get_device(),
            str(paddle.framework._current_expected_place()),
            id(paddle.static.global_scope()),
            sorted(paddle.static.global_scope().local_var_names())]

before = state()
config = paddle_infer.Config({model!r}, {params!r})
config.set_cpu_math_library_num_threads(1)
{enable_ipu}
predictor = paddle_infer.create_predictor(config)
results = {{}}
for n, (rows, h, w) in enumerate([(1, 16, 16), (3, 16, 16), (2, 24, 20)]):
    rng = np.random.default_rng(n)
    feed = {{"image": rng.random((rows, 3, h, w), dtype=np.float32),
             "scale_factor": np.tile(np.float32([[1.5, 0.5]]), (rows, 1))}}
    for name in predictor.get_input_names():
        handle = predictor.get_input_handle(name)
        handle.reshape(feed[name].shape)
        handle.copy_from_cpu(feed[name])
    predictor.run()
    for i, name in enumerate(predictor.get_output_names()):
        results["run%d_%d" % (n, i)] = predictor.get_output_handle(name).copy_to_cpu()
np.savez(sys.argv[1], **results)
print(json.dumps({{"names": predictor.get_output_names(), "same_state": state() == before,
                  "state": state(), "before": before}}))
"""


def _paddle_ipu_cmd() -> list[str]:
    script = Path(sys.executable).parent / "paddle-ipu"
    return [str(script)] if script.exists() else [sys.executable, "-m", "paddle_ipu"]


@pytest.fixture(scope="module", params=["pir", "legacy"])
def detector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ir = request.param
    tmp = tmp_path_factory.mktemp(f"detector_{ir}")
    prefix = tmp / "det"
    env = {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "1" if ir == "pir" else "0"}
    proc = run_python(SAVE.format(prelude=PRELUDE[ir], prefix=str(prefix)), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp / ("det.json" if ir == "pir" else "det.pdmodel")).is_file()
    return prefix


def _model_file(prefix: Path) -> str:
    return str(prefix) + (".json" if Path(str(prefix) + ".json").is_file() else ".pdmodel")


def _script(tmp: Path, prefix: Path, ipu: bool, env: dict[str, str]) -> tuple[dict, dict, str]:
    tag = "ipu" if ipu else "cpu"
    path = tmp / f"predict_{tag}.py"
    path.write_text(
        SCRIPT.format(
            model=_model_file(prefix),
            params=str(prefix) + ".pdiparams",
            enable_ipu="config.enable_ipu()" if ipu else "config.disable_mkldnn()",
        )
    )
    out = tmp / f"{tag}.npz"
    proc = subprocess.run(
        [sys.executable, str(path), str(out)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=str(tmp),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    return dict(np.load(out)), info, proc.stderr


def _same_detections(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """NMS output rows [label, score, x1, y1, x2, y2]: the same rows in the same order,
    labels exact, scores and coordinates within float32 rounding."""
    assert got.shape == want.shape, f"{what}: {got.shape} boxes, the CPU {want.shape}"
    if got.ndim == 1:  # the counts per image
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_array_equal(got[:, 0], want[:, 0], err_msg=f"{what}: labels")
    np.testing.assert_allclose(got[:, 1], want[:, 1], rtol=0, atol=1e-6, err_msg=what)
    np.testing.assert_allclose(got[:, 2:], want[:, 2:], rtol=1e-5, atol=1e-4, err_msg=what)


@pytest.fixture(scope="module")
def oracle(detector: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    tmp = tmp_path_factory.mktemp("oracle")
    results, info, _ = _script(tmp, detector, False, {"PADDLE_IPU_AUTOLOAD": "0"})
    counts = [results[f"run{n}_1"] for n in range(3)]
    # the model keeps some boxes and drops others: NMS decides
    assert all(c.sum() > 0 for c in counts), counts
    assert all(int(c.sum()) == len(results[f"run{n}_0"]) for n, c in enumerate(counts))
    return results, info


def test_paddle_inference_script_with_enable_ipu_gives_the_cpus_detections(
    detector: Path, oracle: tuple[dict, dict], tmp_path: Path
) -> None:
    want, cpu_info = oracle
    env = {"PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache"), "GLOG_v": "0"}
    got, info, stderr = _script(tmp_path, detector, True, env)
    assert info["names"] == cpu_info["names"]
    assert sorted(got) == sorted(want)
    for key in sorted(want):
        _same_detections(got[key], want[key], key)
    # the process's mode, default place and global scope as the script left them
    assert info["same_state"], (info["before"], info["state"])
    # said once, naming the operators and why
    lines = [line for line in stderr.splitlines() if "run on the host" in line]
    assert len(lines) == 1, stderr[-3000:]
    assert "pd_op.multiclass_nms3" in lines[0] and "depends on the data" in lines[0]


def test_paddle_ipu_inference_predictor_in_process(
    detector: Path, oracle: tuple[dict, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import paddle

    from paddle_ipu import inference

    want, _ = oracle
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    dynamic = paddle.in_dynamic_mode()
    scope = paddle.static.global_scope()
    config = inference.Config(_model_file(detector), str(detector) + ".pdiparams")
    config.enable_ipu()
    predictor = inference.create_predictor(config)
    try:
        rng = np.random.default_rng(1)  # run1 of the oracle: 3 rows, 16x16
        image = rng.random((3, 3, 16, 16), dtype=np.float32)
        factor = np.tile(np.float32([[1.5, 0.5]]), (3, 1))
        bbox, num = predictor.run([image, factor])
    finally:
        predictor.close()
    _same_detections(bbox, want["run1_0"], "bbox")
    _same_detections(num, want["run1_1"], "bbox_num")
    assert paddle.in_dynamic_mode() == dynamic
    assert paddle.static.global_scope() is scope


def test_cli_compile_and_run_give_the_cpus_detections(
    detector: Path, oracle: tuple[dict, dict], tmp_path: Path
) -> None:
    want, cpu_info = oracle
    env = {**os.environ, "PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
    package = tmp_path / "det.pdipu"
    compiled = subprocess.run(
        [*_paddle_ipu_cmd(), "compile", str(detector), "-o", str(package),
         "--input-shapes", "image:-1x3x24x20,scale_factor:-1x2"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert "from a host tail of" in compiled.stdout, compiled.stdout
    rng = np.random.default_rng(2)  # run2 of the oracle: 2 rows, 24x20
    np.save(tmp_path / "image.npy", rng.random((2, 3, 24, 20), dtype=np.float32))
    np.save(tmp_path / "sf.npy", np.tile(np.float32([[1.5, 0.5]]), (2, 1)))
    out = tmp_path / "out"
    ran = subprocess.run(
        [*_paddle_ipu_cmd(), "run", str(package), "--input", f"image={tmp_path / 'image.npy'}",
         "--input", f"scale_factor={tmp_path / 'sf.npy'}", "--output-dir", str(out)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    names = cpu_info["names"]
    assert sorted(p.stem for p in out.glob("*.npy")) == sorted(names), ran.stdout
    for i, name in enumerate(names):
        _same_detections(np.load(out / f"{name}.npy"), want[f"run2_{i}"], name)


def test_serve_refuses_a_data_dependent_output_by_name(
    detector: Path, oracle: tuple[dict, dict], tmp_path: Path
) -> None:
    env = {**os.environ, "PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [*_paddle_ipu_cmd(), "serve", str(detector), "--port", "0",
         "--input-shapes", "image:-1x3x16x16,scale_factor:-1x2"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "data-dependent sizes" in proc.stderr, proc.stderr[-3000:]
    # named as Paddle Inference names it, with its declared shape
    assert f"{oracle[1]['names'][0]} [-1, 6]" in proc.stderr, proc.stderr[-3000:]
    assert "exclude_nms=True" in proc.stderr


# NMS whose kept boxes feed a layer with weights: the data-dependent result feeds back
# into the model's compute, which is not split off.
FEEDS_BACK = """
import paddle
paddle.enable_static()
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    boxes = paddle.static.data("boxes", [-1, 6, 4], "float32")
    scores = paddle.static.data("scores", [-1, 2, 6], "float32")
    out, index, num = paddle._C_ops.multiclass_nms3(
        boxes, scores, None, 0.1, 100, 5, 0.5, True, 1.0, -1
    )
    y = paddle.nn.Linear(6, 3)(out)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model({prefix!r}, [boxes, scores], [y], exe, program=main)
"""


def test_a_tail_that_feeds_the_models_compute_is_refused_naming_the_op(tmp_path: Path) -> None:
    from paddle_ipu.errors import CompileError
    from paddle_ipu.serving.saved_model import compile_model

    prefix = tmp_path / "back"
    proc = run_python(FEEDS_BACK.format(prefix=str(prefix)), {"PADDLE_IPU_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with pytest.raises(CompileError) as info:
        compile_model(str(prefix), cache=False)
    text = str(info.value)
    assert "pd_op.multiclass_nms3" in text and "pd_op.matmul" in text
    assert "exclude_nms=True" in text


def test_a_program_compiled_directly_still_refuses_nms() -> None:
    import paddle

    from paddle_ipu.compiler import compile_program
    from paddle_ipu.errors import UnsupportedOpError

    with fresh_programs() as (main, _, scope):
        boxes = paddle.static.data("boxes", [1, 6, 4], "float32")
        scores = paddle.static.data("scores", [1, 2, 6], "float32")
        out = paddle._C_ops.multiclass_nms3(boxes, scores, None, 0.1, 100, 5, 0.5, True, 1.0, -1)
        with pytest.raises(UnsupportedOpError, match="exclude_nms=True"):
            compile_program(main, [boxes, scores], [out[0]], scope=scope)


def test_the_package_keeps_the_tail(detector: Path, tmp_path: Path) -> None:
    from paddle_ipu.errors import NotSupportedError
    from paddle_ipu.serving.bucketed_runtime import runtime_for
    from paddle_ipu.serving.package import load_package
    from paddle_ipu.serving.saved_model import compile_model

    package, _ = compile_model(
        str(detector), cache=False, input_shapes=[{"image": [-1, 3, 16, 16]}]
    )
    assert package.tail is not None
    path = package.save(tmp_path / "det.pdipu")
    loaded = load_package(path)
    assert loaded.tail is not None and loaded.tail.program == package.tail.program
    assert loaded.output_names == package.output_names
    assert len(package.output_names) == 2
    # the compiled graph stops before NMS
    assert "pd_op.multiclass_nms3" not in package.meta["source_ops"]
    assert "pd_op.multiclass_nms3" in loaded.tail.ops
    # nothing passes the score threshold: an empty result, as Paddle's kernel gives it
    # the graph of the 16 x 16 shape (declared: made from the open graph when it runs)
    from paddle_ipu.serving.saved_model import compile_shape
    from paddle_ipu.serving.shape_graphs import graph_for

    assert package.policy is not None
    key = package.policy.key({"image": [1, 3, 16, 16]})
    graph, _ = graph_for(package, key, compile_shape)
    graph_outputs = [np.zeros(s.shape, s.numpy_dtype) for s in graph.outputs]
    feed = {"image": np.zeros((1, 3, 16, 16), np.float32)}
    feed["scale_factor"] = np.ones((1, 2), np.float32)
    bbox, num = loaded.tail.run(feed, graph_outputs)
    assert bbox.shape == (0, 6) and num.tolist() == [0]
    # the package's runtime alone gives what the tail reads, not the model's outputs
    with pytest.raises(NotSupportedError, match="data-dependent sizes"):
        runtime_for(loaded)
    shutil.rmtree(tmp_path, ignore_errors=True)


# A linear layer, then the indices and the values of its positive outputs: nonzero and
# masked_select, whose output sizes depend on the data.
SELECT = """
import paddle
paddle.enable_static()
paddle.seed(3)
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 8], "float32")
    y = paddle.nn.Linear(8, 6)(x)
    index = paddle.nonzero(y > 0.0)
    values = paddle.masked_select(y, y > 0.0) * 2.0
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
paddle.static.save_inference_model({prefix!r}, [x], [index, values], exe, program=main)
"""


@pytest.mark.parametrize("model_runtime", [False, True], ids=["executor", "model_runtime"])
def test_nonzero_and_masked_select_run_on_the_host_as_paddle_inference_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_runtime: bool
) -> None:
    import paddle.inference as paddle_infer

    from paddle_ipu import inference

    prefix = tmp_path / "select"
    proc = run_python(SELECT.format(prefix=str(prefix)), {"PADDLE_IPU_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    x = np.random.default_rng(5).standard_normal((5, 8)).astype(np.float32)
    outputs = {}
    for route in ("cpu", "ipu"):
        module = inference if route == "ipu" else paddle_infer
        config = module.Config(str(prefix) + ".json", str(prefix) + ".pdiparams")
        if route == "ipu":
            config.enable_ipu(1, 2)  # micro-batches of 2 rows: 5 rows run in 3
            config.set_ipu_config(ipu_enable_model_runtime_executor=model_runtime)
        predictor = module.create_predictor(config)
        handle = predictor.get_input_handle(predictor.get_input_names()[0])
        handle.reshape(list(x.shape))
        handle.copy_from_cpu(x)
        predictor.run()
        names = predictor.get_output_names()
        outputs[route] = [predictor.get_output_handle(n).copy_to_cpu() for n in names]
        if route == "ipu":
            predictor.close()
    (cpu_index, cpu_values), (index, values) = outputs["cpu"], outputs["ipu"]
    assert 0 < len(cpu_index) < x.shape[0] * 6  # some outputs are positive, not all
    np.testing.assert_array_equal(index, cpu_index)
    np.testing.assert_allclose(values, cpu_values, rtol=1e-5, atol=1e-6)


def test_a_model_repository_does_not_serve_a_data_dependent_output(
    detector: Path, oracle: tuple[dict, dict], tmp_path: Path
) -> None:
    from support.serving_models import ServerProcess, raw

    from paddle_ipu.serving.saved_model import compile_model

    package, _ = compile_model(
        str(detector), cache=False, input_shapes=[{"image": [-1, 3, 16, 16]}]
    )
    (tmp_path / "repo" / "det" / "1").mkdir(parents=True)
    package.save(tmp_path / "repo" / "det" / "1" / "model.pdipu")
    srv = ServerProcess(f"--model-repository={tmp_path / 'repo'}", grpc=False)
    try:
        status, _, body = raw(srv, "POST", "/v2/repository/index", b"")
    finally:
        srv.terminate()
    assert status == 200, body
    (entry,) = json.loads(body)
    assert (entry["name"], entry["state"]) == ("det", "UNAVAILABLE"), entry
    assert "data-dependent sizes" in entry["reason"], entry
    assert oracle[1]["names"][0] in entry["reason"], entry


# PaddleDetection 2.x's other NMS operators, appended as its exporter appended them.
NMS_KINDS = {
    "multiclass_nms3": PRELUDE["legacy"],
    "matrix_nms": PRELUDE["legacy"].split("def nms")[0]
    + """
def nms(boxes, scores):
    helper = LayerHelper("matrix_nms")
    out, index, num = (helper.create_variable_for_type_inference(t)
                       for t in ("float32", "int32", "int32"))
    helper.append_op(
        type="matrix_nms", inputs={"BBoxes": boxes, "Scores": scores},
        attrs={"background_label": -1, "score_threshold": 0.3, "post_threshold": 0.3,
               "nms_top_k": 1000, "keep_top_k": 100, "normalized": False,
               "use_gaussian": False, "gaussian_sigma": 2.0},
        outputs={"Out": out, "Index": index, "RoisNum": num},
    )
    return out, index, num
""",
    "multiclass_nms": PRELUDE["legacy"].split("def nms")[0]
    + """
def nms(boxes, scores):
    helper = LayerHelper("multiclass_nms")
    out = helper.create_variable_for_type_inference("float32")
    helper.append_op(
        type="multiclass_nms", inputs={"BBoxes": boxes, "Scores": scores},
        attrs={"background_label": -1, "score_threshold": 0.3, "nms_top_k": 1000,
               "nms_threshold": 0.45, "keep_top_k": 100, "nms_eta": 1.0,
               "normalized": False},
        outputs={"Out": out},
    )
    return out, None, paddle.shape(out)[:1]
""",
}

# Paddle Inference on the CPU, in a process without paddle-ipu: the oracle's outputs.
CPU_RUN = """
import sys, numpy as np, paddle.inference as paddle_infer
config = paddle_infer.Config({prefix!r} + ".pdmodel", {prefix!r} + ".pdiparams")
config.disable_mkldnn()
predictor = paddle_infer.create_predictor(config)
feed = dict(np.load({feed!r}))
for name in predictor.get_input_names():
    predictor.get_input_handle(name).copy_from_cpu(feed[name])
predictor.run()
np.savez({out!r}, *[predictor.get_output_handle(n).copy_to_cpu()
                    for n in predictor.get_output_names()])
"""


@pytest.mark.parametrize("kind", ["multiclass_nms3", "matrix_nms"])
def test_a_legacy_export_with_a_static_batch_of_one_runs_its_tail_on_the_host(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PicoDet's export spelling: the image declared ``[1, 3, H, W]`` (its reader's
    fixed shape), ``scale_factor`` ``[-1, 2]``: both spell the batch."""
    from paddle_ipu import inference

    prefix = tmp_path / kind
    save = SAVE.format(prelude=NMS_KINDS[kind], prefix=str(prefix))
    save = save.replace('"image", [-1, 3, -1, -1]', '"image", [1, 3, 16, 16]')
    env = {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "0"}
    proc = run_python(save, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rng = np.random.default_rng(0)
    feed = {"image": rng.random((1, 3, 16, 16), dtype=np.float32),
            "scale_factor": np.float32([[1.5, 0.5]])}  # fmt: skip
    np.savez(tmp_path / "feed.npz", **feed)
    cpu = run_python(
        CPU_RUN.format(prefix=str(prefix), feed=str(tmp_path / "feed.npz"),
                       out=str(tmp_path / "cpu.npz")), {"PADDLE_IPU_AUTOLOAD": "0"},
    )  # fmt: skip
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    want = np.load(tmp_path / "cpu.npz")
    assert int(want["arr_1"].sum()) > 0  # NMS keeps some boxes
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    config = inference.Config(str(prefix) + ".pdmodel", str(prefix) + ".pdiparams")
    config.enable_ipu()
    predictor = inference.create_predictor(config)
    try:
        bbox, num = predictor.run([feed["image"], feed["scale_factor"]])
    finally:
        predictor.close()
    _same_detections(bbox, want["arr_0"], "bbox")
    _same_detections(num, want["arr_1"], "bbox_num")


def test_a_legacy_operator_without_a_pir_counterpart_is_named(tmp_path: Path) -> None:
    from paddle_ipu.errors import CompileError
    from paddle_ipu.serving.saved_model import compile_model

    prefix = tmp_path / "v1"
    save = SAVE.format(prelude=NMS_KINDS["multiclass_nms"], prefix=str(prefix))
    proc = run_python(save, {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with pytest.raises(CompileError) as info:
        compile_model(str(prefix), cache=False, input_shapes=[{"image": [1, 3, 16, 16]}])
    text = str(info.value)
    assert "'multiclass_nms'" in text and "pd_op.multiclass_nms" in text
    assert "multiclass_nms3" in text
