"""The executor core: one compiled model on one backend session.

- :mod:`.ipu_executor`: :class:`IpuExecutor` (prepare, run, weights to and from the
  Paddle scope, eval mode, lr updates), Paddle 2.x's ipu_executor.cc in Python;
- the step layout of feeds and anchors (PopART's) is :mod:`paddle_ipu.backends.layout`.
"""

from paddle_ipu.executor.ipu_executor import IpuExecutor, check_ranges

__all__ = ["IpuExecutor", "check_ranges"]
