"""Paddle 1.x/2.x's first predictor API over the IPU predictor: ``AnalysisConfig``,
``create_paddle_predictor`` and ``PaddleTensor``.

Scripts of that era (Baidu's LAC among them) build an ``AnalysisConfig``, call
``create_paddle_predictor(config)``, and run ``predictor.run([PaddleTensor, ...])``,
which returns ``PaddleTensor`` s (read through ``lod``, ``data.int64_data()``,
``as_ndarray()``).  :class:`LegacyPredictor` is that predictor over
:class:`~paddle_ipu.frontends.predictor.Predictor`: the inputs are taken in the
model's input order, as Paddle's ``AnalysisPredictor`` takes them by default, each
with its LoD (given to the handle's ``set_lod``: its sequences); the outputs are
Paddle's own ``PaddleTensor`` s, named after the model's outputs, with their LoD.  Its
zero-copy methods (``get_input_tensor``, ``zero_copy_run``) are the handles' API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paddle_ipu._internals import paddle_api
from paddle_ipu.errors import FeedError
from paddle_ipu.frontends.predictor import Predictor, Tensor

__all__ = ["LegacyPredictor"]


class LegacyPredictor:
    """``create_paddle_predictor``'s predictor (module docstring) over ``predictor``."""

    __module__ = "paddle_ipu.inference"  # its public home (what type() names)

    def __init__(self, predictor: Predictor) -> None:
        self._predictor = predictor

    def get_input_names(self) -> list[str]:
        return self._predictor.get_input_names()

    def get_output_names(self) -> list[str]:
        return self._predictor.get_output_names()

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """The outputs for ``inputs`` (``PaddleTensor`` s, or arrays, in the model's
        input order), as ``PaddleTensor`` s with their LoD."""
        names = self.get_input_names()
        if len(inputs) != len(names):
            raise FeedError(
                f"run() got {len(inputs)} PaddleTensors, the model takes {len(names)}: {names}"
            )
        for name, given in zip(names, inputs):
            handle = self._predictor.get_input_handle(name)
            as_array = getattr(given, "as_ndarray", None)
            array = np.asarray(as_array() if as_array is not None else given)
            handle.reshape(array.shape)
            handle.copy_from_cpu(array)
            handle.set_lod(getattr(given, "lod", None) or [])
        self._predictor.run()
        core = paddle_api.paddle_core()
        outputs = []
        for name in self.get_output_names():
            handle = self._predictor.get_output_handle(name)
            tensor = core.PaddleTensor(np.ascontiguousarray(handle.copy_to_cpu()))
            tensor.name = name
            tensor.lod = handle.lod()
            outputs.append(tensor)
        return outputs

    def get_input_tensor(self, name: str) -> Tensor:
        return self._predictor.get_input_handle(name)

    def get_output_tensor(self, name: str) -> Tensor:
        return self._predictor.get_output_handle(name)

    def zero_copy_run(self) -> None:
        self._predictor.run()

    def clone(self) -> LegacyPredictor:
        return LegacyPredictor(self._predictor.clone())

    def clear_intermediate_tensor(self) -> None:
        self._predictor.clear_intermediate_tensor()

    def try_shrink_memory(self) -> int:
        return self._predictor.try_shrink_memory()
