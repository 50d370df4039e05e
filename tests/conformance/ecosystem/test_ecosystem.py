"""Models of Paddle's own libraries, built from their code (eco_models.py), against
their own dygraph forward: one test per architecture, each compiling the saved model
through the command line (``paddle-ipu compile``, ``paddle-ipu run``), matching in
fp32, and in fp16 within its family's bound -- in float32 arithmetic and in float16
arithmetic, as the IPU computes (the default); the float32 arithmetic also against
Paddle's own forward with the weights rounded to float16 (what it computes).
Text models with a -1 sequence length run through buckets of sequence lengths.

Skipped where a library is not installed (``pip install 'paddle-ipu[ecosystem]'``).
The bounds are docs/ecosystem.md's (checked below).
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import eco_models as E

from paddle_ipu import cli
from paddle_ipu.compiler import fp16_pass
from paddle_ipu.serving import runtime_for
from paddle_ipu.serving.package import load_package
from paddle_ipu.serving.saved_model import compile_model

#: max |out - ref| / max |ref| against the dygraph forward
FP32_BOUND = 2e-4
#: fp16 in float32 arithmetic (host_fp16_arithmetic="float32") against Paddle's own
#: forward with the same weights rounded to float16 (what that fp16 mode computes:
#: float16 weights and constants, float32 arithmetic)
FP16_WEIGHTS_BOUND = 2e-3
#: against the fp32 dygraph forward, by family: fp16 in float32 arithmetic and in float16
#: arithmetic (host_fp16_arithmetic="float16", the default: the IPU's)
FP16_BOUNDS: dict[str, tuple[float, float]] = {
    "decoder": (5e-3, 5e-3),
    "ocr_det": (1.5e-1, 2.5e-1),
    "ocr_rec": (1.5e-1, 2.5e-1),
    "classification": (5e-2, 1.5e-1),
    "segmentation": (1e-1, 2e-1),
}
#: text models with a -1 sequence length: the buckets, and the lengths asked for
BUCKETS, LENGTHS = [8, 16], [5, 16]


def _feeds(built: E.Built) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(zlib.crc32(built.arch.name.encode()))
    if built.arch.text and not built.arch.fixed_seq:
        return [{built.feed_name: built.sample(rng, seq=n)} for n in LENGTHS]
    return [{built.feed_name: built.sample(rng)}]


def _run(package: Any, feed: dict[str, np.ndarray], **options: Any) -> np.ndarray:
    with runtime_for(package, executor_options=options, timeout_ms=0.0) as runtime:
        return np.asarray(runtime.run(feed)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(E.ARCHS))
def test_compiles_matches_fp32_and_fp16_and_round_trips_the_cli(
    name: str, tmp_path: Path, capsys: Any
) -> None:
    reason = E.missing_library(name)
    if reason:
        pytest.skip(reason)
    built = E.build(name, str(tmp_path / "saved"))
    feeds = _feeds(built)
    refs = [built.eager(f[built.feed_name]) for f in feeds]
    buckets = BUCKETS if built.arch.text and not built.arch.fixed_seq else []

    # the command line: compile into a package, run it on an input saved as .npy
    package_path = tmp_path / f"{name}.pdipu"
    args = ["compile", built.prefix, "-o", str(package_path), "--no-cache"]
    if buckets:
        args += ["--seq-buckets", ",".join(map(str, buckets))]
    assert cli.main(args) == 0, capsys.readouterr().err
    np.save(tmp_path / "x.npy", feeds[0][built.feed_name])
    out_dir = tmp_path / "out"
    args = ["run", str(package_path), "--input", f"{built.feed_name}={tmp_path / 'x.npy'}"]
    assert cli.main([*args, "--output-dir", str(out_dir)]) == 0, capsys.readouterr().err
    (written,) = out_dir.glob("*.npy")
    assert E.rel_error(np.load(written), refs[0]) <= FP32_BOUND

    # fp32, every length
    package = load_package(package_path)
    for feed, ref in zip(feeds, refs):
        err = E.rel_error(_run(package, feed), ref)
        assert err <= FP32_BOUND, f"{name} fp32: relative error {err:.2e}"

    # fp16, with the host's two arithmetics, against the fp32 forward
    half, _ = compile_model(built.prefix, enable_fp16=True, seq_buckets=buckets, cache=False)
    storage, arithmetic = FP16_BOUNDS[built.arch.family]
    outs = {}
    for which, bound in (("float32", storage), ("float16", arithmetic)):
        outs[which] = _run(half, feeds[0], host_fp16_arithmetic=which)
        assert outs[which].dtype == refs[0].dtype
        err = E.rel_error(outs[which], refs[0])
        assert err <= bound, f"{name} fp16 ({which} arithmetic): relative error {err:.2e}"
    # and the default against Paddle's own forward with the weights in float16, where
    # the fp16 pass rounds the model's own weights (it folds constant arithmetic into
    # convolutions first, in float32: their rounded weights are the folded ones)
    report = fp16_pass.report_for(half.model)
    # random weights fit float16; what stays float32 are the decoders' attention-mask
    # fills (float32's lowest value), which float16 cannot hold
    assert all(t.reason == "overflow" and t.largest > 3e38 for t in report.kept_float32)
    if report.folded_ops:
        return
    built.round_weights_to_fp16()
    err = E.rel_error(outs["float32"], built.eager(feeds[0][built.feed_name]))
    assert err <= FP16_WEIGHTS_BOUND, f"{name} fp16 against fp16 weights: {err:.2e}"


def test_the_documented_bounds_are_the_tested_ones() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "ecosystem.md").read_text()
    rows = dict(
        (m.group(1), (float(m.group(2)), float(m.group(3))))
        for m in re.finditer(r"^\| (\w+) \| .*? \| ([\d.e-]+) \| ([\d.e-]+) \|$", text, re.M)
    )
    assert {f: rows.get(f) for f in FP16_BOUNDS} == FP16_BOUNDS
    assert f"fp32: {FP32_BOUND:g}" in text
    assert f"fp16 weights: {FP16_WEIGHTS_BOUND:g}" in text
