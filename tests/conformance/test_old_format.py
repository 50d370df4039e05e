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
from collections.abc import Callable
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


# A tagger in LAC's own shape (Paddle 1.x's lexical analyser): lookup_table (version 1,
# whose ids keep a last dimension of 1), two layers of a forward and a reverse gru over
# fully connected projections, a fully connected emission and crf_decoding, appended as
# Paddle 1.x's fluid layers appended them (Paddle 3.3 has no Python builder for gru,
# crf_decoding or lookup_table), saved in the oldest format with a file per parameter;
# it fetches the tag path and the emission.
SAVE_CRF = """
import os, shutil, sys, numpy as np, paddle
paddle.enable_static()
paddle.seed(12)
from paddle.base.layer_helper import LayerHelper
V, E, D, L = 60, 16, 8, 7
U = paddle.nn.initializer.Uniform(-0.5, 0.5)

def append(kind, inputs, outputs, attrs=None):
    helper = LayerHelper(kind)
    outs = {{k: helper.create_variable_for_type_inference(t) for k, t in outputs.items()}}
    helper.append_op(type=kind, inputs=inputs, outputs=outs, attrs=attrs or {{}})
    return outs

def param(shape, name=None):
    return paddle.static.create_parameter(shape, "float32", name=name, default_initializer=U)

def gru(x, reverse):
    hidden = {{k: "float32" for k in ("Hidden", "BatchGate", "BatchResetHiddenPrev",
                                      "BatchHidden")}}
    return append("gru", {{"Input": x, "Weight": param([D, 3 * D]), "Bias": param([1, 3 * D])}},
                  hidden, {{"is_reverse": reverse, "gate_activation": "sigmoid",
                            "activation": "tanh", "origin_mode": False}})["Hidden"]

main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    words = paddle.static.data("words", [-1, 1], "int64", lod_level=1)
    x = append("lookup_table", {{"Ids": words, "W": param([V, E], "word_emb")}},
               {{"Out": "float32"}}, {{"padding_idx": -1, "is_sparse": False}})["Out"]
    for _ in range(2):
        x = paddle.concat([gru(paddle.static.nn.fc(x, 3 * D), r) for r in (False, True)], 1)
    emission = paddle.static.nn.fc(x, L)
    path = append("crf_decoding", {{"Emission": emission, "Transition": param([L + 2, L], "crfw")}},
                  {{"ViterbiPath": "int64"}})["ViterbiPath"]
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
out = {out!r}
paddle.static.save_inference_model(out + "_tmp/m", [words], [path, emission], exe, program=main)
os.makedirs(out)
# Paddle 3.3's save prunes gru's batch outputs, which Paddle 1.x wrote (LAC's files hold
# them) and Paddle 3.3's own predictor needs (its InferShape crashes without them)
with open(out + "_tmp/m.pdmodel", "rb") as f:
    saved = paddle.static.Program.parse_from_string(f.read())
block = saved.global_block()
for op in block.ops:
    if op.type == "gru":
        for slot, width in (("BatchGate", 3 * D), ("BatchResetHiddenPrev", D),
                            ("BatchHidden", D)):
            if slot not in op.output_names or not op.output(slot):
                name = op.output("Hidden")[0] + "." + slot
                block.create_var(name=name, shape=[-1, width], dtype="float32", lod_level=1)
                op.desc.set_output(slot, [name])
with open(os.path.join(out, "__model__"), "wb") as f:
    f.write(saved.desc.serialize_to_string())
params = [v for v in main.list_vars() if v.persistable and v.name not in ("feed", "fetch")]
paddle.static.save_vars(exe, out, main, vars=params)
shutil.rmtree(out + "_tmp")
print(" ".join(op.type for op in main.global_block().ops))
"""

# Paddle Inference on the CPU, stock, or (with an argument) Paddle 1.x/2.x's first API
# -- AnalysisConfig, create_paddle_predictor, PaddleTensor with its lod, as LAC calls
# it (paddle.fluid aliased to paddle.base, LAC's port to Paddle 3) -- with, on the IPU
# side, config.enable_ipu(...) added.  Writes each output and its LoD.
RUN_CRF = """
import json, sys, numpy as np, paddle, paddle.base, paddle.base.core
d, ids_file, offsets, out, api, ipu = sys.argv[1:7]
ids, offsets = np.load(ids_file), json.loads(offsets)
if ipu != "cpu":  # "plain": paddle_ipu loaded, the Config left on the CPU
    import paddle_ipu
if api == "legacy":
    sys.modules["paddle.fluid"], sys.modules["paddle.fluid.core"] = paddle.base, paddle.base.core
    from paddle.fluid.core import AnalysisConfig, PaddleTensor, create_paddle_predictor
    config = AnalysisConfig(d)
    config.disable_glog_info()
    if ipu not in ("cpu", "plain"):
        config.enable_ipu(ipu_micro_batch_size=int(ipu))
    predictor = create_paddle_predictor(config)
    tensor = PaddleTensor(ids.reshape(-1))
    tensor.lod = [offsets]
    tensor.shape = [offsets[-1], 1]
    outs = predictor.run([tensor])
    got = {{f"out{{k}}": t.as_ndarray() for k, t in enumerate(outs)}}
    lods = [t.lod for t in outs]
else:
    import paddle.inference as paddle_infer
    config = paddle_infer.Config(d)
    config.disable_mkldnn()
    if ipu not in ("cpu", "plain"):
        config.enable_ipu(ipu_micro_batch_size=int(ipu))
    predictor = paddle_infer.create_predictor(config)
    words = predictor.get_input_handle("words")
    words.reshape(list(ids.shape))
    words.copy_from_cpu(ids)
    words.set_lod([offsets])
    predictor.run()
    handles = [predictor.get_output_handle(n) for n in predictor.get_output_names()]
    got = {{f"out{{k}}": h.copy_to_cpu() for k, h in enumerate(handles)}}
    lods = [h.lod() for h in handles]
np.savez(out, **got)
print(json.dumps({{"lods": [[list(map(int, level)) for level in lod] for lod in lods]}}))
"""

# sentences of 5, 2, 7, 13, 1 and 9 words: buckets of 4, 8 and 16 rows
CRF_LENGTHS = [5, 2, 7, 13, 1, 9]


@pytest.fixture(scope="module")
def crf_saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("old_format_crf") / "bigru_crf"
    proc = run_python(
        SAVE_CRF.format(out=str(out)), {"PADDLE_IPU_AUTOLOAD": "0", "FLAGS_enable_pir_api": "0"}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = proc.stdout.strip().splitlines()[-1].split()
    assert kinds.count("gru") == 4 and "crf_decoding" in kinds and "lookup_table" in kinds
    return out


def _run_crf(saved: Path, api: str, ipu: str, tmp: Path) -> tuple[dict, list]:
    rng = np.random.default_rng(9)
    ids = rng.integers(0, 60, size=(sum(CRF_LENGTHS), 1)).astype(np.int64)
    np.save(tmp / "ids.npy", ids)
    offsets = list(np.cumsum([0, *CRF_LENGTHS]).tolist())
    script = tmp / "run.py"
    script.write_text(RUN_CRF.format())
    env = {**__import__("os").environ, "PADDLE_IPU_CACHE_DIR": str(tmp / "cache")}
    if ipu == "cpu":
        env["PADDLE_IPU_AUTOLOAD"] = "0"
    out = tmp / f"{api}_{ipu}.npz"
    proc = subprocess.run(
        [sys.executable, str(script), str(saved), str(tmp / "ids.npy"), json.dumps(offsets),
         str(out), api, ipu],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(out)), json.loads(proc.stdout.strip().splitlines()[-1])["lods"]


@pytest.fixture(scope="module")
def crf_cpu(
    crf_saved: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], tuple[dict, list]]:
    """Paddle's CPU predictor on the sentences through one API (the oracle): run once per
    API for the tests of this module, in a process without paddle-ipu."""
    runs: dict[str, tuple[dict, list]] = {}

    def run(api: str) -> tuple[dict, list]:
        if api not in runs:
            runs[api] = _run_crf(crf_saved, api, "cpu", tmp_path_factory.mktemp(f"crf_{api}"))
        return runs[api]

    return run


@pytest.mark.parametrize(("api", "sequences"), [("predictor", "1"), ("predictor", "4"),
                                                ("legacy", "2")])  # fmt: skip
def test_a_bigru_crf_tagger_runs_sentences_in_buckets_as_paddle_inference_does(
    crf_saved: Path,
    crf_cpu: Callable[[str], tuple[dict, list]],
    api: str,
    sequences: str,
    tmp_path: Path,
) -> None:
    """The sentences padded into buckets of lengths and run ``sequences`` at a time
    (frontends/lod_runner.py), through Paddle Inference's handles or Paddle 1.x/2.x's
    ``create_paddle_predictor`` API, against the same calls on Paddle's CPU predictor."""
    want, want_lods = crf_cpu(api)
    got, got_lods = _run_crf(crf_saved, api, sequences, tmp_path)
    offsets = list(np.cumsum([0, *CRF_LENGTHS]).tolist())
    assert got_lods == want_lods == [[offsets], [offsets]]
    assert got["out0"].dtype == want["out0"].dtype == np.int64
    np.testing.assert_array_equal(got["out0"], want["out0"])  # the tags
    assert len(np.unique(want["out0"])) > 2  # the decode is not trivial
    np.testing.assert_allclose(got["out1"], want["out1"], rtol=1e-5, atol=1e-5)  # emissions


def test_the_first_predictor_api_on_the_cpu_is_paddles_with_paddle_ipu_loaded(
    crf_saved: Path, crf_cpu: Callable[[str], tuple[dict, list]], tmp_path: Path
) -> None:
    """AnalysisConfig / create_paddle_predictor, which ``import paddle_ipu`` points at
    its router: a Config that did not enable the IPU runs on Paddle's own predictor,
    with the same results as in a process without paddle-ipu."""
    want, want_lods = crf_cpu("legacy")
    got, got_lods = _run_crf(crf_saved, "legacy", "plain", tmp_path)
    assert got_lods == want_lods
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_run_of_a_sequence_model_without_its_lod_is_refused(
    crf_saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model whose gru / crf_decoding read the rows as sequences, run without
    ``set_lod``: refused, naming them (Paddle's CPU predictor crashes there; each
    micro-batch of rows taken as a sequence would give other tags)."""
    from paddle_ipu.errors import FeedError
    from paddle_ipu.inference import Config, create_predictor

    monkeypatch.setenv("PADDLE_IPU_CACHE_DIR", str(tmp_path / "cache"))
    config = Config(str(crf_saved))
    config.enable_ipu()
    predictor = create_predictor(config)
    try:
        words = predictor.get_input_handle("words")
        words.copy_from_cpu(np.arange(7, dtype=np.int64).reshape(7, 1))
        with pytest.raises(FeedError, match=r"crf_decoding, gru read\(s\).*set_lod"):
            predictor.run()
        with pytest.raises(FeedError, match="set_lod"):
            predictor.run([np.arange(7, dtype=np.int64).reshape(7, 1)])
        words.set_lod([[0, 3, 7]])
        predictor.run()
        assert predictor.get_output_handle(predictor.get_output_names()[0]).lod() == [[0, 3, 7]]
    finally:
        predictor.close()
