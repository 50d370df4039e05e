"""The data-parallel job a script runs in: its instances (processes), their shards of
the data, a barrier.

One script runs unchanged in three places:

- alone (a job of one instance);
- under Paddle's launcher on the host backend (the emulated IPU), one process per
  instance, on one host or several: ``python -m paddle.distributed.launch
  --nproc_per_node 2 train.py``;
- under poprun on IPUs (the popart backend), where popdist runs the instances:
  ``poprun --num-instances 2 --num-replicas 2 python3 train.py``.

The script sets ``enable_distribution`` on its IpuStrategy, feeds each instance its own
shard, and reads its place in the job here::

    import paddle_ipu.distributed as ipu_dist

    job = ipu_dist.job()                 # job.index of job.count instances
    x_mine = ipu_dist.shard(x_batch)     # this instance's rows of the job's batch
    if job.is_first:
        print(loss)

See docs/distributed.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paddle_ipu._util.job import PADDLE, POPRUN, Job
from paddle_ipu._util.job import current as job
from paddle_ipu.errors import FeedError, NotSupportedError

__all__ = ["PADDLE", "POPRUN", "Job", "barrier", "check_same", "job", "shard"]


def shard(batch: Any, *, axis: int = 0, name: str = "batch") -> np.ndarray:
    """This instance's equal share of ``batch`` along ``axis`` (instance ``i`` of ``n``
    takes the ``i``-th of ``n`` consecutive blocks): a view, no copy.  A batch whose
    length does not split evenly raises :class:`FeedError` naming ``name``."""
    array = np.asarray(batch)
    here = job()
    if array.ndim == 0:
        raise FeedError(f"{name!r}: a scalar has no rows to share among {here.count} instances")
    rows = array.shape[axis]
    if rows % here.count:
        raise FeedError(
            f"{name!r}: {rows} rows along axis {axis} do not split evenly among the job's "
            f"{here.count} instances (expected a multiple of {here.count}, received {rows})"
        )
    size = rows // here.count
    index: list[Any] = [slice(None)] * array.ndim
    index[axis] = slice(here.index * size, (here.index + 1) * size)
    return array[tuple(index)]


def barrier(what: str = "paddle_ipu.distributed.barrier()", timeout: float | None = None) -> None:
    """Wait until every instance of the job reaches a barrier (in the same order on
    every instance).  Use one after work that only some instances do between training
    steps and that may take longer than gloo's 30 s (an evaluation on instance 0):
    the next all-reduce would take the wait for a hang.  ``timeout`` defaults to
    ``PADDLE_IPU_BARRIER_TIMEOUT``; a missing instance whose process died fails it
    sooner, naming the rank.  A job of one returns at once."""
    here = job()
    if here.count == 1:
        return
    if here.launcher == POPRUN:
        raise NotSupportedError(
            "paddle_ipu.distributed.barrier() runs on Paddle's launcher (the host backend); "
            "under poprun, use MPI's barrier (mpi4py: MPI.COMM_WORLD.Barrier())"
        )
    from paddle_ipu.backends import job_group

    job_group().barrier(what, timeout)


def check_same(data: bytes, what: str) -> None:
    """Raise :class:`~paddle_ipu.errors.DistributedError` naming the instances whose
    ``data`` differs from instance 0's (a digest each, one all-reduce; every instance
    calls it).  A job of one returns at once; under poprun it raises
    :class:`NotSupportedError`."""
    here = job()
    if here.count == 1:
        return
    if here.launcher == POPRUN:
        raise NotSupportedError("paddle_ipu.distributed.check_same() runs on Paddle's launcher")
    from paddle_ipu.backends import job_group

    job_group().check_agreement(data, what)
