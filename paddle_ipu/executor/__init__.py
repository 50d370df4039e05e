"""The executor layer: one compiled model on one backend session.

- :mod:`.ipu_executor`: :class:`IpuExecutor` (prepare, run, weights to and from the
  Paddle scope, eval mode, lr updates), Paddle 2.x's ipu_executor.cc in Python, and
  :func:`executor_for` (a compiled model -> a prepared executor);
- :mod:`.feeds`: the feed contract, checked once for every route into a model;
- :mod:`.shapes`: the shape policy (buckets of sequence lengths: padding a request
  into a compiled shape and cutting its outputs back).

The step layout of feeds and anchors (PopART's) is part of the Session protocol:
:mod:`paddle_ipu.backends.layout`.
"""

from paddle_ipu.executor.feeds import check_ranges
from paddle_ipu.executor.ipu_executor import IpuExecutor, executor_for

__all__ = ["IpuExecutor", "check_ranges", "executor_for"]
