"""The job this process belongs to, as its launcher describes it in the environment.

Two launchers start the processes (instances) of a data-parallel IPU job:

- Paddle's, ``python -m paddle.distributed.launch``: ``PADDLE_TRAINER_ID`` (the rank),
  ``PADDLE_TRAINERS_NUM`` (the processes of the job), ``PADDLE_LOCAL_RANK`` and
  ``PADDLE_LOCAL_SIZE`` (this host's), ``PADDLE_NNODES``;
- Graphcore's ``poprun``, through popdist: ``POPDIST_NUM_TOTAL_REPLICAS``,
  ``POPDIST_NUM_LOCAL_REPLICAS``, ``POPDIST_REPLICA_INDEX_OFFSET``,
  ``POPDIST_LOCAL_INSTANCE_INDEX`` (popdist's ``getInstanceIndex()`` and
  ``getNumInstances()`` when the module is importable).

Nothing here imports Paddle: the job is known before any collective exists.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from paddle_ipu.errors import OptionError

#: the launchers a job can come from
PADDLE = "paddle.distributed.launch"
POPRUN = "poprun"


@dataclass(frozen=True)
class Job:
    """This process's place in its job.

    ``launcher`` is :data:`PADDLE`, :data:`POPRUN` or ``""`` (a process started on its
    own: a job of one).  ``index`` is the instance (process) index, popdist's
    ``getInstanceIndex()`` and Paddle's rank; ``count`` the instances of the job;
    ``local_index`` / ``local_count`` the same on this host.  Under poprun,
    ``local_replicas`` is the replica count popdist gives each instance."""

    launcher: str = ""
    index: int = 0
    count: int = 1
    local_index: int = 0
    local_count: int = 1
    hosts: int = 1
    local_replicas: int | None = None

    @property
    def is_first(self) -> bool:
        """Whether this is the job's first instance (the one that writes checkpoints)."""
        return self.index == 0

    def total_replicas(self, local_replicas: int) -> int:
        """Replicas of the whole job: instances x replicas of one instance."""
        return self.count * int(local_replicas)

    def replica_offset(self, local_replicas: int) -> int:
        """The index of this instance's first replica among the job's replicas."""
        return self.index * int(local_replicas)

    def describe(self) -> str:
        if not self.launcher:
            return "a single process (no launcher)"
        return (
            f"instance {self.index} of {self.count} ({self.launcher}, {self.hosts} host(s), "
            f"{self.local_count} instance(s) on this host)"
        )


def _int(name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        if default is None:
            raise OptionError(f"environment variable {name} is not set; the launcher sets it")
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise OptionError(
            f"environment variable {name}: expected an integer >= {minimum}, received {raw!r}"
        )
    return value


def _popdist() -> object | None:
    """popdist, when the SDK's module is importable and poprun set its environment."""
    try:
        module = importlib.import_module("popdist")
    except ImportError:
        return None
    is_set = getattr(module, "isPopdistEnvSet", None)
    return module if callable(is_set) and is_set() else None


def current() -> Job:
    """The job of this process, read from its launcher's environment (poprun first,
    then Paddle's launcher; a process started on its own is a job of one)."""
    env = os.environ
    if env.get("POPDIST_NUM_TOTAL_REPLICAS", "").strip():
        total = _int("POPDIST_NUM_TOTAL_REPLICAS", minimum=1)
        local = _int("POPDIST_NUM_LOCAL_REPLICAS", 1, minimum=1)
        offset = _int("POPDIST_REPLICA_INDEX_OFFSET", 0)
        popdist = _popdist()
        if popdist is not None:
            index = int(popdist.getInstanceIndex())  # type: ignore[attr-defined]
            count = int(popdist.getNumInstances())  # type: ignore[attr-defined]
        else:
            # poprun gives every instance the same replica count (the
            # POPDIST_UNIFORM_REPLICAS_PER_INSTANCE layout)
            index, count = offset // local, max(1, total // local)
        return Job(
            POPRUN,
            index,
            count,
            _int("POPDIST_LOCAL_INSTANCE_INDEX", 0),
            count,
            1,
            local,
        )
    if env.get("PADDLE_TRAINERS_NUM", "").strip():
        count = _int("PADDLE_TRAINERS_NUM", minimum=1)
        index = _int("PADDLE_TRAINER_ID")
        if index >= count:
            raise OptionError(
                f"environment variable PADDLE_TRAINER_ID: expected a rank below "
                f"PADDLE_TRAINERS_NUM={count}, received {index}"
            )
        return Job(
            PADDLE,
            index,
            count,
            _int("PADDLE_LOCAL_RANK", 0),
            _int("PADDLE_LOCAL_SIZE", count, minimum=1),
            _int("PADDLE_NNODES", 1, minimum=1),
        )
    return Job()
