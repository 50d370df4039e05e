"""Taking a device for a PopART session: the IPU Model, an offline IPU, popdist's device,
or real IPUs acquired with retries.

Environment (the names Paddle 2.x used): ``IPU_COMPILE_ONLY=1`` compiles for an offline
device, ``POPLAR_IPUMODEL=1`` runs on the simulated IPU Model.  Checked against PopART
3.0-3.4's ``python/popart/popart_core/popart.cpp`` and ``willow/src/devicemanager.cpp``
(docs/backends.md lists the calls).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paddle_ipu._util.env import env_flag
from paddle_ipu.backends.base import SessionConfig
from paddle_ipu.compiler.model import CompiledModel
from paddle_ipu.errors import BackendError, BackendUnavailableError, OptionError

DEFAULT_DEVICE_WAIT_S = 30.0
_TILES_PER_IPU = {"ipu1": 1216, "ipu2": 1472, "ipu21": 1472}

# Indirection so tests can replace the clock without sleeping.
_monotonic = time.monotonic
_sleep = time.sleep


def next_power_of_two(n: int) -> int:
    """IPUs are handed out in groups of a power of two."""
    if n < 1:
        raise OptionError(f"the number of IPUs must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def import_popdist() -> Any:
    """``popdist.popart`` (enable_distribution), or BackendUnavailableError."""
    try:
        importlib.import_module("popdist")
        return importlib.import_module("popdist.popart")
    except ImportError as exc:
        raise BackendUnavailableError(
            f"enable_distribution needs popdist (run under poprun): {exc}"
        ) from exc


def device_wait_seconds(extras: Mapping[str, Any]) -> float:
    """How long to wait for busy IPUs (the backend's ``device_wait_seconds`` setting)."""
    return float(extras.get("device_wait_seconds", DEFAULT_DEVICE_WAIT_S))


@dataclass(frozen=True)
class DeviceRequest:
    """What device one session needs: IPUs per replica from the model's shards, the
    replicas and ``num_ipus`` from the config, the architecture and the wait from the
    backend's own settings (``extras``)."""

    model: CompiledModel
    config: SessionConfig
    extras: Mapping[str, Any]
    compile_only: bool

    @property
    def distributed(self) -> bool:
        return bool(self.config.option("enable_distribution"))

    def ipus_per_replica(self) -> int:
        indices = [s.ipu_index for s in self.model.shards.values() if s.ipu_index >= 0]
        return max(indices) + 1 if indices else 1

    def num_ipus(self) -> int:
        replicas = max(1, self.config.replication_factor)
        needed = self.ipus_per_replica() * replicas
        if not self.config.changed("num_ipus"):
            return needed
        asked = int(self.config.option("num_ipus"))
        if asked < needed:
            raise OptionError(
                f"num_ipus is {asked}, but {self.ipus_per_replica()} IPU(s) per "
                f"replica x {replicas} replica(s) need {needed}"
            )
        return asked

    def device_opts(self, for_offline: bool) -> dict[str, str]:
        version = str(self.extras.get("ipu_version", "ipu2"))
        tiles: Any = None
        if not for_offline or self.config.changed("tiles_per_ipu"):
            tiles = self.config.option("tiles_per_ipu")
        if tiles is None:
            # Paddle 2.x used 4 tiles for the IPU Model; an offline executable meant
            # for real IPUs is compiled for the whole chip unless told otherwise.
            tiles = _TILES_PER_IPU.get(version, 1472) if for_offline else 4
        return {"numIPUs": str(self.num_ipus()), "tilesPerIPU": str(tiles), "ipuVersion": version}

    def acquire(self, popart: Any) -> Any:
        """The device, from the environment and the config (the caller turns SDK
        exceptions into BackendError)."""
        manager = popart.DeviceManager()
        if self.compile_only:
            # Before POPLAR_IPUMODEL: compileAndExport refuses an IPU Model device
            # ("Executables for device type ... cannot be saved", session.cpp
            # assertDeviceCanCompileOffline; only Ipu and OfflineIpu devices can).
            return manager.createOfflineIPUDevice(self.device_opts(for_offline=True))
        if env_flag("POPLAR_IPUMODEL"):
            return manager.createIpuModelDevice(self.device_opts(for_offline=False))
        if self.distributed:
            device = import_popdist().getDevice(self.ipus_per_replica())
            if device is None:
                raise BackendError(
                    f"popdist could not attach {self.ipus_per_replica()} IPU(s) per replica"
                )
            return device
        return self._acquire_hardware(manager)

    def _acquire_hardware(self, manager: Any) -> Any:
        asked = self.num_ipus()
        request = next_power_of_two(asked)
        wait = device_wait_seconds(self.extras)
        deadline = _monotonic() + max(0.0, wait)
        delay = 0.5
        attempts = 0
        last_error: str = "no device was returned"
        while True:
            attempts += 1
            try:
                device = manager.acquireAvailableDevice(request)
            except Exception as exc:  # the SDK raises when none is free
                device = None
                last_error = str(exc) or type(exc).__name__
            if device is not None:
                return device
            remaining = deadline - _monotonic()
            if remaining <= 0:
                break
            _sleep(min(delay, remaining))
            delay = min(delay * 2, 5.0)
        rounded = f" (asked for {asked}, rounded up to a power of two)" if request != asked else ""
        raise BackendError(
            f"could not acquire {request} IPU(s){rounded} after {attempts} attempt(s) over "
            f"{wait:g} s: {last_error}. Other processes may hold the IPUs (see `gc-monitor`); "
            "raise extras['device_wait_seconds'] to wait longer, or set POPLAR_IPUMODEL=1 "
            "to use the simulated IPU Model."
        )


__all__ = [
    "DEFAULT_DEVICE_WAIT_S",
    "DeviceRequest",
    "device_wait_seconds",
    "import_popdist",
    "next_power_of_two",
]
