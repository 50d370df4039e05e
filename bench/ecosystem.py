"""Models of Paddle's own libraries on the emulated IPU against their peers, in one run.

    python bench/ecosystem.py [--models pplcnet_x0_25,llama,...] [--batches 1,8]
                              [--threads 1,all] [--repeat 20] [--small] [--json FILE]

The models are the ecosystem tier's (tests/support/eco_models.py: built
from PaddleFormers, PaddleX, PaddleClas and PaddleSeg code, random weights, saved with
jit.save), at their released input sizes (``--small``: the tier's).  Text models run
16 tokens (a bucket of 16 where the length is -1).  Each model runs in a fresh process;
per batch size and thread count, the engines take turns in short blocks (so load from
elsewhere on the machine hits them alike; each turn starts with an untimed call, so that
the previous engine's spinning threads do not count) and the median per engine is
reported:

- ``ipu``: paddle-ipu's executor of the compiled package, fp32, on the host backend;
- ``ipu16``: the same in fp16, in float32 arithmetic (``host_fp16_arithmetic="float32"``:
  float16 weights and constants; the default, ``"float16"``, rounds every operator's
  result as the IPU does: bench/fp16_arithmetic.py);
- ``PI``: Paddle Inference (``paddle.inference``) with oneDNN and without; its *best
  correct* configuration is the faster of those whose answer is within 1e-4 of the
  dygraph forward (oneDNN gives wrong answers on some models and fails on others);
- ``ORT``: ONNX Runtime running paddle-ipu's compiled ONNX graph directly (what the
  executor adds on top of it).

Ratios: PI / ipu (> 1: paddle-ipu faster), ORT / ipu (the executor's overhead) and
ipu16 / ipu (fp16 against fp32 on the host).  Errors: max |out - eager| / max |eager|
at batch 1.  Needs the libraries: pip install 'paddle-ipu[ecosystem]'.
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
sys.path.insert(0, str(ROOT / "tests"))

SEQ = 16  # tokens per text request
CORRECT = 1e-4  # Paddle Inference's answers within this of the dygraph forward count
BUDGET_S = 3.0  # per engine and setting: fewer calls for slow models
_BLOCK = 3  # timed calls per engine's turn


def _paddle_inference(prefix: str, threads: int, onednn: bool) -> Callable[[np.ndarray], Any]:
    import paddle.inference as pi

    config = pi.Config(prefix + ".json", prefix + ".pdiparams")
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    if not onednn:
        config.disable_mkldnn()
    config.disable_glog_info()
    predictor = pi.create_predictor(config)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    out = predictor.get_output_handle(predictor.get_output_names()[0])

    def run(x: np.ndarray) -> np.ndarray:
        handle.reshape(list(x.shape))
        handle.copy_from_cpu(x)
        predictor.run()
        return np.asarray(out.copy_to_cpu())

    return run


def _ipu(package: Any, threads: int, **options: Any) -> tuple[Callable[[np.ndarray], Any], Any]:
    """paddle-ipu's executor (the bucket of SEQ tokens for a bucketed package)."""
    options.update(host_num_threads=threads, host_spin_threads=False)
    if package.sequence is not None:
        executor = package.executors(**options)[SEQ]
    else:
        executor = package.executor(**options)
    name = executor.model.inputs[0].paddle_name

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(executor.run({name: x})[0])

    return run, executor


def _ort(package: Any, threads: int) -> Callable[[np.ndarray], Any]:
    """ONNX Runtime on the same compiled graph, without paddle-ipu's executor."""
    import onnxruntime as ort

    model = package.buckets[SEQ] if package.sequence is not None else package.model
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # The engines take turns call by call: a pool left spinning after its run would
    # take the cores from the next engine's run (paddle-ipu's executors sleep too).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    session = ort.InferenceSession(model.onnx, options, providers=["CPUExecutionProvider"])
    feed, fetch = model.inputs[0].name, [model.outputs[0].name]

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(fetch, {feed: x})[0])

    return run


def _time(engines: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median ms per engine.  The engines take turns in short blocks: each turn starts
    with an untimed call, which absorbs the previous engine's threads still spinning
    (Paddle Inference's OpenMP threads do, after a call), then times ``_BLOCK`` calls."""
    first: dict[str, float] = {}
    for name, fn in engines.items():
        fn()  # warm-up
        t = time.perf_counter()
        fn()
        first[name] = time.perf_counter() - t
    rounds = max(3, min(repeat, int(BUDGET_S / max(max(first.values()), 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(max(1, rounds // _BLOCK)):
        for name, fn in engines.items():
            fn()
            for _ in range(_BLOCK):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    return {name: 1e3 * statistics.median(v) for name, v in times.items()}


def measure(name: str, batches: list[int], threads: list[int], repeat: int, small: bool) -> dict:
    from support import eco_models as E

    from paddle_ipu.serving.saved_model import compile_model

    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"model": name, "rows": rows, "versions": E.versions()}
    with tempfile.TemporaryDirectory() as tmp:
        built = E.build(name, tmp, small=small)
        out["family"] = built.arch.family
        out["input"] = list(built.input_shape)
        buckets = [SEQ] if built.arch.text and not built.arch.fixed_seq else []
        rng = np.random.default_rng(0)
        for batch in batches:
            x = built.sample(rng, batch=batch, seq=SEQ)
            ref = built.eager(x)
            t = time.perf_counter()
            p32, _ = compile_model(
                built.prefix, micro_batch_size=batch, seq_buckets=buckets, cache=False
            )
            compile_s = time.perf_counter() - t
            p16, _ = compile_model(
                built.prefix,
                micro_batch_size=batch,
                seq_buckets=buckets,
                enable_fp16=True,
                cache=False,
            )
            for n in threads:
                engines: dict[str, Callable[[np.ndarray], Any]] = {}
                errors: dict[str, float | str] = {}
                held = []
                ipu, e32 = _ipu(p32, n)
                ipu16, e16 = _ipu(p16, n, host_fp16_arithmetic="float32")
                held += [e32, e16]
                engines["ipu"], engines["ipu16"] = ipu, ipu16
                engines["ORT"] = _ort(p32, n)
                for onednn in (True, False):
                    label = "PI oneDNN" if onednn else "PI"
                    try:
                        engines[label] = _paddle_inference(built.prefix, n, onednn)
                    except Exception as exc:  # Paddle Inference's own failure: reported
                        errors[label] = f"fails: {type(exc).__name__}"
                for label, fn in list(engines.items()):
                    try:
                        errors[label] = E.rel_error(fn(x), ref)
                    except Exception as exc:
                        errors[label] = f"fails: {type(exc).__name__}: {str(exc)[:60]}"
                        del engines[label]
                ms = _time({k: (lambda fn=fn, x=x: fn(x)) for k, fn in engines.items()}, repeat)
                correct = [
                    k
                    for k in ("PI oneDNN", "PI")
                    if k in ms and isinstance(errors[k], float) and errors[k] <= CORRECT
                ]
                best = min(correct, key=lambda k: ms[k]) if correct else None
                rows.append(
                    {
                        "batch": batch,
                        "threads": n,
                        "ms": ms,
                        "errors": errors,
                        "pi_best": best,
                        "compile_s": compile_s,
                    }
                )
                for e in held:
                    e.reset()
    return out


def _fmt_err(v: Any) -> str:
    return f"{v:.1e}" if isinstance(v, float) else str(v)


def main() -> None:
    from support import eco_models as E

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(E.ARCHS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,all", help="thread counts; all: every core")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="the tier's smaller inputs")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    cores = os.cpu_count() or 1
    threads = [cores if t == "all" else int(t) for t in args.threads.split(",")]
    threads = list(dict.fromkeys(threads))
    if args.child:
        print(json.dumps(measure(args.child, batches, threads, args.repeat, args.small)))
        return
    print(
        f"ecosystem models, {'small' if args.small else 'released'} inputs, {SEQ} tokens for "
        f"text; median ms of up to {args.repeat} interleaved calls; threads {threads} of "
        f"{cores} cores; one process per model"
    )
    header = (
        f"{'model':<20}{'b':>3}{'thr':>4}{'ipu':>9}{'ipu16':>9}{'PI best':>9}{'ORT':>9}"
        f"{'PI/ipu':>8}{'ORT/ipu':>8}{'16/32':>7}  {'PI config':<10}"
        f"{'err ipu':>8}{'ipu16':>8}{'PI':>8}{'PI 1DNN':>10}"
    )
    print(header)
    results = []
    env = dict(os.environ, GLOG_minloglevel="2")
    for name in args.models.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--batches", args.batches]
        cmd += ["--threads", args.threads, "--repeat", str(args.repeat)]
        cmd += ["--small"] if args.small else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{name:<20} failed: {tail}")
            results.append({"model": name, "error": tail})
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        for row in r["rows"]:
            ms, err, best = row["ms"], row["errors"], row["pi_best"]
            pi = ms.get(best) if best else None
            ratio = f"{pi / ms['ipu']:.2f}" if pi else "-"
            print(
                f"{name:<20}{row['batch']:>3}{row['threads']:>4}{ms['ipu']:>9.2f}"
                f"{ms['ipu16']:>9.2f}{(f'{pi:.2f}' if pi else '-'):>9}{ms['ORT']:>9.2f}"
                f"{ratio:>8}{ms['ORT'] / ms['ipu']:>8.2f}"
                f"{ms['ipu16'] / ms['ipu']:>7.2f}  {(best or 'none correct'):<10}"
                f"{_fmt_err(err['ipu']):>8}{_fmt_err(err['ipu16']):>8}"
                f"{_fmt_err(err.get('PI', '-')):>8}{_fmt_err(err.get('PI oneDNN', '-')):>10}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
