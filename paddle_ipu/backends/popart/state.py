"""Optimizer state between Paddle's names and values and PopART's.

Most state maps one to one (``Accl1___w`` is Paddle's ``w_moment1_0``, see
:data:`paddle_ipu.compiler.optimizer.STATE_PREFIXES`); the Adam family's step count does
not.  Paddle keeps ``beta1_pow_acc`` and ``beta2_pow_acc``, the powers of the betas;
PopART keeps one float step count ``Step___<w>`` per weight and derives both bias
corrections from it (willow/src/patterns/adamdecompose.cpp, adamupdaterx.cpp).  The
session writes and reads ``Step___`` as Paddle's ``beta1_pow`` and reads Paddle's
``beta2_pow`` from the same count (:class:`StepCounts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from paddle_ipu.backends.layout import buffer_error
from paddle_ipu.compiler.optimizer import OptimizerConfig

#: The optimizers whose PopART form keeps a ``Step___`` count (adam.hpp: AdamMode Adam,
#: Lamb and AdaMax; the no-bias modes keep none and have no such tensor).
STEP_COUNTED = ("adam", "adamw", "adamax", "lamb")
#: Those of them with a ``beta2_pow`` in Paddle (AdaMax has none).
BETA2_COUNTED = ("adam", "adamw", "lamb")


def beta1_pow_to_step(name: str, value: np.ndarray, beta1: float) -> np.ndarray:
    """Paddle's ``beta1_pow_acc`` -> PopART's ``Step___``.

    Paddle's beta1_pow starts at beta1 and is multiplied by beta1 after each update,
    so after k updates it is beta1**(k+1).  PopART's Step___ is a float count that
    starts at 0 and is incremented before the bias correction 1 - beta1**t
    (adamdecompose.cpp, adamupdaterx.cpp): after k updates it is k.  The count is kept
    fractional, so the device corrects by exactly 1 - pow."""
    pow_ = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
    if not 0.0 < beta1 < 1.0:
        return np.zeros((), np.float64)  # bias correction is 1 - beta1**t = 1 - 0 / 0
    if not 0.0 < pow_ <= 1.0:
        raise buffer_error(f"optimizer state {name!r}: beta1_pow must be in (0, 1], got {pow_!r}")
    return np.asarray(math.log(pow_) / math.log(beta1) - 1.0, dtype=np.float64)


def step_to_beta_pow(value: np.ndarray, beta: float) -> np.ndarray:
    """PopART's ``Step___`` -> Paddle's ``beta1_pow_acc`` (or ``beta2_pow_acc`` with
    beta2): beta**(t+1), shaped as Paddle's ``[1]``."""
    step = float(np.asarray(value, dtype=np.float64).reshape(-1)[0])
    return np.asarray([beta ** (step + 1.0)], dtype=np.float32)


class StepCounts:
    """The step-count conversions of one session's optimizer (none for optimizers
    without a ``Step___``).  ``weights`` maps ONNX (device) names to Paddle names."""

    def __init__(self, optimizer: OptimizerConfig | None, weights: Mapping[str, str]) -> None:
        self.optimizer = optimizer
        self._weights = dict(weights)

    def beta1_of(self, name: str) -> float | None:
        """beta1 when ``name`` is PopART's step count of an Adam-family weight."""
        cfg = self.optimizer
        if not name.startswith("Step___") or cfg is None or cfg.type not in STEP_COUNTED:
            return None
        return float(cfg.beta1)

    def beta2_pow_steps(self) -> dict[str, str]:
        """Paddle's ``beta2_pow_acc`` variable -> the ``Step___`` tensor it follows.

        PopART keeps one step count per weight and derives both bias corrections from
        it (adamupdaterx.cpp), so Paddle's beta2_pow has no device tensor: it is read
        as beta2**(t+1) and never written (the count comes from beta1_pow)."""
        cfg = self.optimizer
        if cfg is None or cfg.type not in BETA2_COUNTED:
            return {}
        onnx_of = {paddle: onnx for onnx, paddle in self._weights.items()}
        return {
            var: "Step___" + onnx_of.get(slot.name, slot.name)
            for slot in cfg.params
            if (var := slot.state.get("beta2_pow"))
        }

    def to_device(self, name: str, value: np.ndarray) -> np.ndarray:
        """A value written under ``name`` as PopART holds it (a beta1_pow as its count)."""
        beta1 = self.beta1_of(name)
        return value if beta1 is None else beta1_pow_to_step(name, value, beta1)

    def from_device(self, name: str, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """The value of ``name`` as Paddle holds it, from the raw device values ``raw``
        (which hold the step count a derived ``beta2_pow`` follows)."""
        step = self.beta2_pow_steps().get(name)
        if step is not None:
            assert self.optimizer is not None
            return step_to_beta_pow(raw[step], float(self.optimizer.beta2))
        beta1 = self.beta1_of(name)
        return raw[name] if beta1 is None else step_to_beta_pow(raw[name], beta1)


__all__ = ["BETA2_COUNTED", "STEP_COUNTED", "StepCounts", "beta1_pow_to_step", "step_to_beta_pow"]
