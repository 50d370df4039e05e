"""Baidu's LAC (PyPI ``LAC`` 2.1.2, a BiGRU-CRF lexical analyser in Paddle 1.x's
``__model__`` format with a LoD input) through its own pipeline on paddle-ipu's
emulated IPU, against the same pipeline on stock Paddle's CPU predictor.

LAC imports ``paddle.fluid`` (gone since Paddle 2.6): both sides alias it to
``paddle.base``, the port every Paddle 3 user of LAC makes.  The IPU side adds one
line to LAC's own code, ``config.enable_ipu(ipu_micro_batch_size=N)`` on its
``AnalysisConfig`` before ``create_paddle_predictor`` (both Paddle 1.x/2.x names, which
``import paddle_ipu`` points at the IPU predictor for a Config that enabled the IPU).
The CPU side runs in a process without paddle-ipu (``PADDLE_IPU_AUTOLOAD=0``); both
compute on one thread (Paddle's CPU default; the bench sets it on the IPU side, whose
host backend otherwise takes every core).

The sentences come from LAC's own files (no download): the Chinese sentences of its
README, and sentences drawn from its segmentation dictionary (``small_seg.dic``),
words weighted by their counts, 2 to 40 words each (seeded).  Each side segments and
tags them in batches of ``--batch`` sentences (LAC's ``run(list)``: one predictor run of
a LoD tensor per batch), once to warm up (the IPU side compiles one graph per bucket of
sentence lengths then), then ``--repeat`` times timed.  Prints how many sentences'
words and tags agree, the sentences per second of each side (medians), and the IPU
side's compiles.

    pip install --no-deps --build-constraint <(echo 'setuptools<70') LAC==2.1.2
    python bench/lac.py [--sentences 300] [--batch 32] [--sequences 1 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SIDE = r"""
import json, sys, time, logging
import paddle, paddle.base, paddle.base.core
sys.modules["paddle.fluid"] = paddle.base          # LAC's Paddle 3 port
sys.modules["paddle.fluid.core"] = paddle.base.core
paddle.fluid = paddle.base
sequences = int(sys.argv[2])
if sequences:
    import paddle_ipu  # noqa: F401  (loaded by the plugin anyway; here by name)
    logging.basicConfig()
    logging.getLogger("paddle_ipu").setLevel(logging.INFO)
    import LAC.models as models
    create = models.create_paddle_predictor

    def create_on_ipu(config):
        config.enable_ipu(ipu_micro_batch_size=sequences)  # the one added line
        # one thread, as Paddle's CPU predictor uses by default (the emulated IPU's
        # default is every core)
        config.set_cpu_math_library_num_threads(1)
        return create(config)

    models.create_paddle_predictor = create_on_ipu
from LAC import LAC
args = json.load(open(sys.argv[1]))
texts, batch, repeat = args["texts"], args["batch"], args["repeat"]
lac = LAC(mode="lac")
batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
start = time.perf_counter()
results = [r for b in batches for r in lac.run(list(b))]
warm = time.perf_counter() - start
times = []
for _ in range(repeat):
    start = time.perf_counter()
    for b in batches:
        lac.run(list(b))
    times.append(time.perf_counter() - start)
# the buckets the IPU side compiled (LAC's predictor, paddle_ipu's LoD runner)
runner = getattr(getattr(getattr(lac.model.predictor, "_predictor", None), "_shared", None),
                 "lod", None)
buckets = sorted(runner._executors) if runner is not None else []
with open(sys.argv[3], "w") as f:
    json.dump({"results": results, "warm": warm, "times": times, "buckets": buckets}, f)
"""


def _sentences(count: int, seed: int) -> list[str]:
    """LAC's README sentences, then sentences of dictionary words (module docstring)."""
    import importlib.util
    import re

    import numpy as np

    spec = importlib.util.find_spec("LAC")  # not imported here: it needs paddle.fluid
    if spec is None or spec.origin is None:
        raise SystemExit("LAC is not installed (see the docstring)")
    here = os.path.dirname(spec.origin)
    package = os.path.dirname(here)
    texts: list[str] = []
    readme = os.path.join(package, "README.md")
    if os.path.isfile(readme):
        with open(readme, encoding="utf8") as f:
            text = f.read()
        for part in re.split(r"[。；！？\n]", text):
            part = re.sub(r"[`*#>|\[\]()（）-]", "", part).strip()
            if len(re.findall(r"[\u4e00-\u9fff]", part)) >= 4 and len(part) <= 120:
                texts.append(part)
    words, counts = [], []
    dic = os.path.join(here, "lac_model", "conf", "small_seg.dic")
    with open(dic, encoding="utf8") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 2:
                words.append(fields[0])
                counts.append(float(fields[1]))
    p = np.asarray(counts) / sum(counts)
    rng = np.random.default_rng(seed)
    while len(texts) < count:
        n = int(rng.integers(2, 41))
        texts.append("".join(words[i] for i in rng.choice(len(words), n, p=p)))
    return texts[:count]


def _side(texts: list[str], batch: int, repeat: int, sequences: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(inp, "w") as f:
            json.dump({"texts": texts, "batch": batch, "repeat": repeat}, f)
        env = dict(os.environ)
        if not sequences:
            env.update(PADDLE_IPU_AUTOLOAD="0", CUSTOM_DEVICE_ROOT="")
        proc = subprocess.run(
            [sys.executable, "-c", SIDE, inp, str(sequences), out],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        with open(out) as f:
            result = json.load(f)
        return result


def main() -> None:
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    texts = _sentences(args.sentences, args.seed)
    chars = [len(t) for t in texts]
    print(
        f"{len(texts)} sentences, {min(chars)}-{max(chars)} characters "
        f"(median {statistics.median(chars):.0f}), batches of {args.batch}"
    )
    cpu = _side(texts, args.batch, args.repeat, 0)
    cpu_s = statistics.median(cpu["times"])
    print(f"Paddle CPU predictor: {len(texts) / cpu_s:.1f} sentences/s (median of "
          f"{args.repeat}; first pass {cpu['warm']:.2f} s)")  # fmt: skip
    for sequences in args.sequences:
        ipu = _side(texts, args.batch, args.repeat, sequences)
        same = sum(a == b for a, b in zip(cpu["results"], ipu["results"]))
        ipu_s = statistics.median(ipu["times"])
        print(
            f"paddle-ipu, {sequences} sequence(s) per run: {same}/{len(texts)} sentences with "
            f"the CPU's words and tags; {len(texts) / ipu_s:.1f} sentences/s "
            f"({ipu_s and cpu_s / ipu_s:.2f}x the CPU); first pass {ipu['warm']:.2f} s, "
            f"compiling buckets of {ipu['buckets']} rows"
        )


if __name__ == "__main__":
    main()
