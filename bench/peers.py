"""paddle-ipu's host backend against the CPU inference engines a user would pick instead,
in one run.

    python bench/peers.py [--models resnet50,mobilenet_v3_large,bert] [--budget 40]
                          [--threads 1] [--json FILE]

Models (random weights, batch 1): ``resnet50`` and ``mobilenet_v3_large`` of
``paddle.vision.models`` at 224 x 224, and ``bert``: a BERT-base-sized encoder
(:func:`bert_base`: 12 layers, hidden 768, 12 heads, feed-forward 3072, GELU, vocabulary
30522) on 128 tokens.  Each is saved with ``paddle.jit.save`` and run, in a fresh process
per model, by:

- ``PI``: Paddle Inference, its default CPU configuration (oneDNN);
- ``ORT``: a plain ONNX Runtime session (its default optimisations) on the ONNX graph
  paddle-ipu compiles from the saved model;
- ``OV f32``: OpenVINO on that ONNX graph, ``INFERENCE_PRECISION_HINT=f32``;
- ``OV default``: OpenVINO at its default precision (bf16 on a CPU with AVX512-BF16 or AMX);
- ``ipu``: paddle-ipu through the user's route: ``paddle_ipu.inference.Config(prefix)``,
  ``enable_ipu()``, ``create_predictor``, the handles;
- ``ipu bf16``: the same with ``Config.enable_onednn_bfloat16()`` (the host backend's
  ``host_precision="bfloat16"``), where the CPU has bfloat16 arithmetic.

Every engine gets ``--threads`` threads (1 by default, as the table of
docs/performance.md).  The engines take turns in short blocks (each turn starts with an
untimed call) until the time budget of the model is spent; the median per engine is
reported, with the ratio engine time / paddle-ipu time of the same precision (fp32
engines against ``ipu``, ``OV default`` against ``ipu bf16``: > 1 means paddle-ipu is
faster), and each engine's error against Paddle Inference without oneDNN (largest
absolute difference over the largest magnitude of the reference).  The second table
also gives the median CPU time of the process per call (less sensitive than the wall
clock to other jobs on a shared machine) and the engines paddle-ipu's sessions chose.  The OpenVINO
columns need the ``openvino`` extra: ``pip install 'paddle-ipu[openvino]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet50", "mobilenet_v3_large", "bert")
ENGINES = ("PI", "ORT", "OV f32", "OV default", "ipu", "ipu bf16")
_BLOCK = 3  # timed calls per engine's turn


def bert_base(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> Any:
    """A BERT-base-sized encoder: token, position and segment embeddings, LayerNorm,
    ``layers`` post-norm Transformer encoder layers (GELU), the last hidden states."""
    import paddle
    from paddle import nn

    class Bert(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(30522, hidden)
            self.position = nn.Embedding(512, hidden)
            self.segment = nn.Embedding(2, hidden)
            self.norm = nn.LayerNorm(hidden, epsilon=1e-12)
            layer = nn.TransformerEncoderLayer(
                hidden, heads, ffn, dropout=0.0, activation="gelu", attn_dropout=0.0
            )
            self.encoder = nn.TransformerEncoder(layer, layers)

        def forward(self, input_ids: Any) -> Any:
            positions = paddle.arange(input_ids.shape[1], dtype="int64").unsqueeze(0)
            x = self.word(input_ids) + self.position(positions)
            x = x + self.segment(paddle.zeros_like(input_ids))
            return self.encoder(self.norm(x))

    return Bert()


def save(name: str, directory: str) -> tuple[str, dict[str, np.ndarray]]:
    """Save model ``name`` (random weights, seed 0) under ``directory``; return its
    path prefix and one input."""
    import paddle

    paddle.disable_static()
    paddle.seed(0)
    rng = np.random.default_rng(0)
    if name == "bert":
        net = bert_base()
        spec = [paddle.static.InputSpec([1, 128], "int64", "input_ids")]
        feed = {"input_ids": rng.integers(0, 30522, (1, 128)).astype(np.int64)}
    else:
        net = getattr(paddle.vision.models, name)(pretrained=False)
        spec = [paddle.static.InputSpec([1, 3, 224, 224], "float32", "x")]
        feed = {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}
    net.eval()
    prefix = os.path.join(directory, name)
    paddle.jit.save(net, prefix, input_spec=spec)
    paddle.enable_static()
    return prefix, feed


# -- the engines: each returns a callable of the feed, giving the first output --------


def _paddle_inference(prefix: str, threads: int, onednn: bool) -> Callable[[Any], np.ndarray]:
    import paddle.inference as pi

    config = pi.Config(prefix + ".json", prefix + ".pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    config.disable_glog_info()
    if not onednn:
        config.disable_mkldnn()
    predictor = pi.create_predictor(config)
    return _handles(predictor)


def _handles(predictor: Any) -> Callable[[Any], np.ndarray]:
    inputs = {n: predictor.get_input_handle(n) for n in predictor.get_input_names()}
    out = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        for name, handle in inputs.items():
            handle.reshape(list(feed[name].shape))
            handle.copy_from_cpu(feed[name])
        predictor.run()
        return np.asarray(out.copy_to_cpu())

    return run


def _ipu(prefix: str, threads: int, bf16: bool) -> Callable[[Any], np.ndarray]:
    from paddle_ipu import inference

    config = inference.Config(prefix)
    config.enable_ipu()
    config.set_cpu_math_library_num_threads(threads)
    config.disable_glog_info()
    if bf16:
        config.enable_onednn_bfloat16()
    return _handles(inference.create_predictor(config))


def _onnx(prefix: str) -> tuple[bytes, dict[str, str]]:
    """The ONNX graph paddle-ipu compiles from the saved model (with its weights), and
    feed name -> graph input name."""
    from paddle_ipu.serving.saved_model import compile_model

    package, _ = compile_model(prefix, cache=False)
    model = package.model
    return model.onnx, {s.paddle_name or s.name: s.name for s in model.inputs}


def _ort(onnx_bytes: bytes, names: dict[str, str], threads: int) -> Callable[[Any], np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(session.run([output], {names[k]: v for k, v in feed.items()})[0])

    return run


def _openvino(
    path: str, names: dict[str, str], threads: int, f32: bool
) -> Callable[[Any], np.ndarray]:
    import openvino as ov

    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(core.read_model(path), "CPU", config)
    request = compiled.create_infer_request()
    output = compiled.output(0)

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        result = request.infer({names[k]: v for k, v in feed.items()})
        return np.asarray(result[output])

    return run


def _engines() -> str:
    """The engines of paddle-ipu's host sessions in this process (host_engine's choice)."""
    import gc

    from paddle_ipu.backends.host.session import HostSession

    found = [o.engine for o in gc.get_objects() if isinstance(o, HostSession)]
    return ", ".join(sorted(str(e) for e in found))


def _time(
    engines: dict[str, Callable[[], Any]], budget: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms per engine, of the wall clock and of the process's CPU time, the
    engines taking turns in blocks of ``_BLOCK`` timed calls after an untimed one, until
    ``budget`` seconds are spent (at least 5 turns)."""
    wall: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    start = time.perf_counter()
    turns = 0
    while turns < 5 or time.perf_counter() - start < budget:
        for name, fn in engines.items():
            fn()
            for _ in range(_BLOCK):
                t, c = time.perf_counter(), time.process_time()
                fn()
                cpu[name].append(time.process_time() - c)
                wall[name].append(time.perf_counter() - t)
        turns += 1
    return (
        {name: 1e3 * statistics.median(v) for name, v in wall.items()},
        {name: 1e3 * statistics.median(v) for name, v in cpu.items()},
    )


def measure(name: str, threads: int, budget: float, engines: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "threads": threads, "skipped": {}}
    with tempfile.TemporaryDirectory(prefix="pipu-peers-") as tmp:
        prefix, feed = save(name, tmp)
        reference = _paddle_inference(prefix, threads, onednn=False)(feed)
        onnx_bytes, names = _onnx(prefix)
        path = os.path.join(tmp, name + ".onnx")
        Path(path).write_bytes(onnx_bytes)
        makers: dict[str, Callable[[], Callable[[Any], np.ndarray]]] = {
            "PI": lambda: _paddle_inference(prefix, threads, onednn=True),
            "ORT": lambda: _ort(onnx_bytes, names, threads),
            "OV f32": lambda: _openvino(path, names, threads, f32=True),
            "OV default": lambda: _openvino(path, names, threads, f32=False),
            "ipu": lambda: _ipu(prefix, threads, bf16=False),
            "ipu bf16": lambda: _ipu(prefix, threads, bf16=True),
        }
        runs: dict[str, Callable[[Any], np.ndarray]] = {}
        for engine in engines:
            try:
                runs[engine] = makers[engine]()
            except Exception as exc:  # the table says why a column is empty
                row["skipped"][engine] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        scale = float(np.abs(reference).max()) or 1.0
        row["errors"] = {
            k: float(np.abs(fn(feed).astype(np.float64) - reference).max()) / scale
            for k, fn in runs.items()
        }
        row["engine"] = _engines()
        row["ms"], row["cpu_ms"] = _time(
            {k: (lambda fn=fn: fn(feed)) for k, fn in runs.items()}, budget
        )
    return row


def _ratio(ms: dict[str, float], engine: str) -> str:
    base = "ipu bf16" if engine == "OV default" else "ipu"
    if engine not in ms or base not in ms:
        return "-"
    return f"{ms[engine] / ms[base]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", type=float, default=40.0, help="seconds per model")
    parser.add_argument("--json", default="")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if args.one:
        print(json.dumps(measure(args.one, args.threads, args.budget, engines)))
        return
    rows = []
    for name in args.models.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--threads", str(args.threads)]
        cmd += ["--budget", str(args.budget), "--engines", ",".join(engines)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    compared = [e for e in engines if not e.startswith("ipu")]
    print(f"threads {args.threads}, batch 1; engine time / paddle-ipu time of the same precision")
    print("| model | " + " | ".join(compared) + " |")
    print("|---" * (len(compared) + 1) + "|")
    for row in rows:
        print(f"| {row['model']} | " + " | ".join(_ratio(row["ms"], e) for e in compared) + " |")
    print()
    print("| model | engine | median ms | CPU ms | error vs Paddle Inference (no oneDNN) |")
    print("|---|---|---|---|---|")
    for row in rows:
        for engine in engines:
            if engine in row["ms"]:
                ms, cpu, err = row["ms"][engine], row["cpu_ms"][engine], row["errors"][engine]
                print(f"| {row['model']} | {engine} | {ms:.2f} | {cpu:.2f} | {err:.1e} |")
            else:
                why = row["skipped"].get(engine, "not run")
                print(f"| {row['model']} | {engine} | - | - | {why} |")
        if "ipu" in row["ms"]:
            print(f"| {row['model']} | (paddle-ipu's engine) | {row.get('engine', '?')} | | |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
