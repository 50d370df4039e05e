"""The oldest saved format -- a ``__model__`` file and one file per parameter, or one
combined parameters file -- and LoD inputs (``set_lod``), through every route that
loads a saved model, against stock Paddle 3.3.1 loading the same files: Paddle
Inference on the CPU (``Config(model_dir)``, ``set_lod``) in a process without
paddle-ipu, and ``paddle.static.load_inference_model(dirname, exe, model_filename=...)``
in the legacy IR.

The model is a tagger in the shape of Baidu's LAC (an embedding of word ids fed as a
LoD tensor of sentences, a projection, per-word tag scores), built and saved with
Paddle's legacy-IR APIs as Paddle 1.x/2.x's ``save_inference_model(dirname, ...)`` wrote
it: the program as ``__model__`` (with its feed and fetch operators) and each parameter
in a file named after it (``save_vars``), or all of them in one file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.helpers import run_python

SAVE = """
import os, shutil, numpy as np, paddle
paddle.enable_static()
paddle.seed(11)
from paddle.base.layer_helper import LayerHelper

def softmax(x):
    helper = LayerHelper("softmax")
    y = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type="softmax", inputs={{"X": x}}, outputs={{"Out": y}}, attrs={{"axis": -1}})
    return y

main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    words = paddle.static.data("words", [-1, 1], "int64", lod_level=1)
    emb = paddle.static.nn.embedding(words, size=[50, 16])
    hidden = paddle.static.nn.fc(emb, 24, activation="relu")
    tags = softmax(paddle.static.nn.fc(hidden, 7))
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
out = {out!r}
tmp = out + "_tmp"
paddle.static.save_inference_model(os.path.join(tmp, "m"), [words], [tags], exe, program=main)
for form in ("separate", "combined"):
    d = os.path.join(out, form)
    os.makedirs(d)
    shutil.copy(os.path.join(tmp, "m.pdmodel"), os.path.join(d, "__model__"))
    if form == "combined":
        shutil.copy(os.path.join(tmp, "m.pdiparams"), os.path.join(d, "params"))
    else:
        params = [v for v in main.list_vars() if v.persistable and v.name not in ("feed", "fetch")]
        paddle.static.save_vars(exe, d, main, vars=params)
shutil.rmtree(tmp)
print(sorted(os.listdir(os.path.join(out, "separate"))))
"""

# Paddle Inference on the CPU, stock: Config(model_dir) or Config(prog, params), the
# sentences as one LoD tensor (set_lod), as LAC's pipeline feeds them.
CPU = """
import json, sys, numpy as np, paddle.inference as paddle_infer
d, form = sys.argv[1], sys.argv[2]
if form == "separate":
    config = paddle_infer.Config(d)
else:
    config = paddle_infer.Config(d + "/__model__", d + "/params")
config.disable_mkldnn()
predictor = paddle_infer.create_predictor(config)
ids = np.load(sys.argv[3])
words = predictor.get_input_handle("words")
words.reshape(list(ids.shape))
words.copy_from_cpu(ids)
words.set_lod([json.loads(sys.argv[4])])
predictor.run()
out = predictor.get_output_handle(predictor.get_output_names()[0])
np.save(sys.argv[5], out.copy_to_cpu())
print(json.dumps({"lod": out.lod(), "names": predictor.get_output_names()}))
"""

LENGTHS = [5, 2, 7]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("old_format") / "tagger"
    proc = run_python(
        SAVE.format(out=str(out)), {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "0"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert "__model__" in files and len(files) > 2  # the program and a file per parameter
    return out


@pytest.fixture(scope="module")
def sentences() -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 50, size=(sum(LENGTHS), 1)).astype(np.int64)
    return ids, list(np.cumsum([0, *LENGTHS]).tolist())


def _cpu(saved: Path, form: str, sentences: tuple[np.ndarray, list[int]], tmp: Path) -> tuple:
    ids, lod = sentences
    np.save(tmp / "ids.npy", ids)
    script = tmp / "cpu.py"
    script.write_text(CPU)
    proc = subprocess.run(
        [sys.executable, str(script), str(saved / form), form, str(tmp / "ids.npy"),
         json.dumps(lod), str(tmp / "cpu.npy")],
        env={**__import__("os").environ, "PADDLE_IPU_AUTOLOAD": "0"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(tmp / "cpu.npy"), json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("route", ["paddle_ipu", "paddle_inference"])
@pytest.mark.parametrize("form", ["separate", "combined"])
def test_predictor_loads_the_oldest_format_and_runs_lod_sentences(
    saved: Path,
    sentences: tuple[np.ndarray, list[int]],
    form: str,
    route: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    want, info = _cpu(saved, form, sentences, tmp_path)
    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    if route == "paddle_ipu":
        from paddle_ipu.inference import Config, create_predictor
    else:  # Paddle's own Config, as a 2.x IPU script wrote it (compat)
        from paddle.inference import Config, create_predictor
    d = saved / form
    config = Config(str(d)) if form == "separate" else Config(f"{d}/__model__", f"{d}/params")
    config.enable_ipu()
    predictor = create_predictor(config)
    try:
        ids, lod = sentences
        words = predictor.get_input_handle("words")
        words.reshape(list(ids.shape))
        words.copy_from_cpu(ids)
        words.set_lod([lod])
        assert words.lod() == [lod]
        predictor.run()
        assert predictor.get_output_names() == info["names"]
        out = predictor.get_output_handle(predictor.get_output_names()[0])
        got = out.copy_to_cpu()
    finally:
        predictor.close()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert out.lod() == info["lod"] == [lod]


def test_a_lod_that_does_not_cover_the_rows_is_refused_by_name(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from paddle_ipu.errors import FeedError
    from paddle_ipu.inference import Config, create_predictor

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    config = Config(str(saved / "separate"))
    config.enable_ipu()
    predictor = create_predictor(config)
    try:
        words = predictor.get_input_handle("words")
        words.copy_from_cpu(np.zeros((6, 1), np.int64))
        with pytest.raises(FeedError, match="offsets start at 0"):
            words.set_lod([[1, 6]])
        words.set_lod([[0, 2, 9]])
        with pytest.raises(FeedError, match=r"'words'.*covers 9 rows, the data has 6"):
            predictor.run()
    finally:
        predictor.close()


LOAD = """
import json, sys, numpy as np, paddle
paddle.enable_static()
exe = paddle.static.Executor(paddle.CPUPlace())
d = sys.argv[1]
kwargs = {"model_filename": "__model__"}
if d.endswith("combined"):
    kwargs["params_filename"] = "params"
program, feeds, fetches = paddle.static.load_inference_model(d, exe, **kwargs)
ids = np.load(sys.argv[2])
want = exe.run(program, feed={"words": ids}, fetch_list=fetches)[0]
import paddle_ipu
strategy = paddle_ipu.IpuStrategy()
strategy.set_graph_config(is_training=False, micro_batch_size=ids.shape[0])
prog = paddle_ipu.IpuCompiledProgram(program, ipu_strategy=strategy).compile(feeds, fetches)
got = exe.run(prog, feed={"words": ids}, fetch_list=prog.fetch_names)[0]
print(json.dumps({"feeds": feeds, "diff": float(np.abs(got - want).max())}))
"""


@pytest.mark.parametrize("form", ["separate", "combined"])
def test_paddles_own_loader_in_the_legacy_ir_then_the_ipu(
    saved: Path, sentences: tuple[np.ndarray, list[int]], form: str, tmp_path: Path
) -> None:
    np.save(tmp_path / "ids.npy", sentences[0])
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    proc = subprocess.run(
        [sys.executable, str(script), str(saved / form), str(tmp_path / "ids.npy")],
        env={**__import__("os").environ, "FLAGS_enable_pir_api": "0"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["feeds"] == ["words"]
    assert result["diff"] < 1e-5


def test_cli_compiles_a_model_directory(saved: Path, tmp_path: Path) -> None:
    import os

    from paddle_ipu.serving.package import load_package

    exe = Path(sys.executable).parent / "paddle-ipu"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "paddle_ipu"]
    proc = subprocess.run(
        [*cmd, "compile", str(saved / "separate"), "-o", str(tmp_path / "t.pdipu")],
        env={**os.environ, "PADDLE_IPU_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [s.name for s in load_package(tmp_path / "t.pdipu").model.inputs] == ["words"]
    shutil.rmtree(tmp_path, ignore_errors=True)
