"""A Paddle Inference style predictor for saved inference models on the IPU.

It mirrors ``paddle.inference``'s API, as Paddle 2.x scripts used it on the IPU::

    from paddle_ipu import inference

    config = inference.Config("model/inference")          # prefix, or (model, params)
    config.enable_ipu(ipu_device_num=1, ipu_micro_batch_size=4)
    config.set_ipu_config(ipu_enable_fp16=False)
    predictor = inference.create_predictor(config)
    x = predictor.get_input_handle(predictor.get_input_names()[0])
    x.reshape([4, 3, 224, 224])
    x.copy_from_cpu(batch)
    predictor.run()
    out = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()

The model is compiled (through the compile cache, see :mod:`paddle_ipu.serving.package`)
into one whole graph for ``ipu_micro_batch_size x ipu_batches_per_step`` rows.  A run of
another number of rows -- Paddle Inference takes any batch -- compiles it once more for
that size (a log line; kept for the next run of that size).  With
``set_ipu_config(ipu_enable_model_runtime_executor=True)`` a run takes any number of rows
without compiling again, and predictors made by :meth:`Predictor.clone` share one
runtime that batches their concurrent runs together.

Every public name of ``paddle.inference.Config`` is on :class:`Config` (see
:data:`DECISIONS`, and the table in docs/inference.md).  The code is the front door's:
the Config in :mod:`paddle_ipu.frontends.predictor_config`, the predictor and its
handles in :mod:`paddle_ipu.frontends.predictor`.  A Paddle Inference CPU script
runs here changed only by ``config.enable_ipu()``, with either import:
``paddle.inference`` (``import paddle_ipu`` lets its Config enable the IPU, see
:mod:`paddle_ipu.compat`) or ``paddle_ipu.inference``.

A text model saved with a ``-1`` sequence length runs through buckets of sequence
lengths (``config.set_ipu_sequence_buckets([16, 32, 64])``): one graph per length, a
request padded to the shortest that holds it and its outputs cut back (see
:mod:`paddle_ipu.serving.package`).
"""

from __future__ import annotations

from typing import Any

from paddle_ipu.frontends.legacy_predictor import LegacyPredictor
from paddle_ipu.frontends.predictor import Predictor, Tensor
from paddle_ipu.frontends.predictor_config import (
    DECISIONS,
    FIXED_ANSWERS,
    NO_EFFECT,
    REFUSED,
    Config,
    create_predictor,
)

__all__ = [
    "DECISIONS",
    "FIXED_ANSWERS",
    "NO_EFFECT",
    "REFUSED",
    "AnalysisConfig",
    "Config",
    "LegacyPredictor",
    "Predictor",
    "Tensor",
    "create_paddle_predictor",
    "create_predictor",
]


# Paddle 1.x/2.x's first predictor API (paddle.fluid.core's names; its predictor is in
# paddle_ipu/frontends/legacy_predictor.py): AnalysisConfig was Config already.
AnalysisConfig = Config


def create_paddle_predictor(config: Config) -> LegacyPredictor:
    """Compile the Config's model for the IPU: a predictor of ``run([PaddleTensor])``."""
    return LegacyPredictor(Predictor(config))


def __getattr__(name: str) -> Any:
    if name == "PaddleTensor":  # Paddle's own class, the legacy predictor's data
        from paddle_ipu._internals import paddle_api

        return paddle_api.paddle_core().PaddleTensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
