"""paddle-ipu's own log lines (the ``paddle_ipu`` logger), and a way to leave out the
INFO ones for a stretch of one thread's work: what a Paddle Inference script's
``config.disable_glog_info()`` asks of the predictor it makes (its compile's progress,
the notes of calls that have no effect), without touching other threads or loggers."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

LOGGER = "paddle_ipu"

_local = threading.local()


class _QuietFilter(logging.Filter):
    """Drops INFO and DEBUG records made by a thread inside :func:`quiet_info`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(_local, "depth", 0)


_filter = _QuietFilter()
_installed = threading.Lock()


@contextlib.contextmanager
def quiet_info(on: bool = True) -> Iterator[None]:
    """Leave out the ``paddle_ipu`` logger's INFO and DEBUG lines this thread makes
    inside the block (``on=False``: change nothing)."""
    if not on:
        yield
        return
    logger = logging.getLogger(LOGGER)
    with _installed:
        if _filter not in logger.filters:
            logger.addFilter(_filter)
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
