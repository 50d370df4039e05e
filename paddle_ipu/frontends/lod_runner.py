"""Runs of LoD inputs (Paddle 1.x's sequences: ``set_lod`` on an input handle) on the
IPU: the sequences padded into buckets of lengths and run as batches.

A model saved with LoD inputs (Baidu's LAC: sentences of word ids, a BiGRU, a CRF)
takes its sequences as one tensor of rows and their offsets.  The compiled graph takes
static shapes, so the sequences of a run are grouped by the bucket of lengths that
holds each (powers of two from 4), each
padded with zero rows to the bucket's length, ``sequences`` at a time (the Config's
micro-batch size; a last group is filled with one-row sequences whose rows are
dropped), and their lengths given to the graph as one more input: the sequence
operators run them as a batch with those lengths (an ONNX GRU's ``sequence_lens``, the
Viterbi decode per row; :mod:`paddle_ipu.compiler.sequence_rewrites`), and every other
operator that reads the rows must treat each row alone (the compile refuses one that
does not, naming it), so that the padding changes no real row.  One graph is compiled
per bucket, on first use.  Each output's rows are cut back per sequence and
concatenated in the sequences' order; its LoD is their offsets.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paddle_ipu.errors import FeedError, NotSupportedError

__all__ = ["LodRunner", "bucket_of", "sequence_operators"]

log = logging.getLogger("paddle_ipu")

#: the smallest default bucket; the others double it
FIRST_BUCKET = 4

#: operators that read their input's rows as sequences (its LoD): a run of such a model
#: without one has no sequences to give them (Paddle's CPU predictor crashes there)
SEQUENCE_OPERATORS = frozenset({"gru", "crf_decoding"})


def sequence_operators(prefix: str) -> list[str]:
    """The :data:`SEQUENCE_OPERATORS` the saved legacy program at ``prefix`` holds (in
    any block), sorted; none for a PIR program or one that is not there."""
    path = Path(prefix + ".pdmodel")
    if not path.is_file():
        return []
    from paddle_ipu._internals.paddle_api import legacy_op_types

    return sorted(legacy_op_types(path.read_bytes()) & SEQUENCE_OPERATORS)


def bucket_of(length: int, buckets: Sequence[int]) -> int:
    """The bucket of a sequence of ``length`` rows: the smallest of ``buckets`` that
    holds it, or (without ``buckets``) the smallest power of two from
    :data:`FIRST_BUCKET` up that does."""
    if buckets:
        for size in sorted(buckets):
            if size >= length:
                return int(size)
        raise FeedError(
            f"a sequence of {length} rows is longer than the largest sequence bucket "
            f"({max(buckets)}): set_ipu_sequence_buckets with a longer one"
        )
    size = FIRST_BUCKET
    while size < length:
        size *= 2
    return size


class LodRunner:
    """The saved model at ``prefix``, run on sequences (module docstring).
    ``sequences``: how many one run takes; ``buckets``: the padded lengths (empty: the
    default powers of two); ``options``: the predictor's strategy options."""

    def __init__(
        self,
        prefix: str,
        sequences: int,
        buckets: Sequence[int],
        options: Mapping[str, Any],
    ) -> None:
        self.prefix = prefix
        self.sequences = int(sequences)
        self.buckets = [int(b) for b in buckets]
        self.options = dict(options)
        self._executors: dict[int, Any] = {}
        self._loaded: tuple[Any, list[Any], list[Any], Any, bool] | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _guard(self, legacy: bool, scope: Any) -> Iterator[None]:
        import paddle

        from paddle_ipu.compiler.compile import static_mode

        ir = paddle.pir_utils.OldIrGuard() if legacy else contextlib.nullcontext()
        with static_mode(), ir, paddle.static.scope_guard(scope):
            yield

    def _load(self) -> tuple[Any, list[Any], list[Any], Any, bool]:
        if self._loaded is None:
            import paddle

            scope = paddle.static.Scope()
            legacy = Path(self.prefix + ".pdmodel").is_file()
            with self._guard(legacy, scope):
                exe = paddle.static.Executor(paddle.CPUPlace())
                program, feeds, fetches = paddle.static.load_inference_model(self.prefix, exe)
            self._loaded = (program, list(feeds), list(fetches), scope, legacy)
        return self._loaded

    def executor(self, bucket: int, lod_feeds: Sequence[str]) -> Any:
        """The executor of one bucket, compiled on first use."""
        with self._lock:
            found = self._executors.get(bucket)
            if found is not None:
                return found
            from paddle_ipu.compiler.sequence_rewrites import LodLayout
            from paddle_ipu.executor import executor_for
            from paddle_ipu.pipeline import compile_model
            from paddle_ipu.strategy import IpuStrategy

            program, feeds, fetches, scope, legacy = self._load()
            rows = self.sequences * bucket
            start = time.perf_counter()
            with self._guard(legacy, scope):
                model = compile_model(
                    program, feeds, fetches, scope=scope, micro_batch_size=rows,
                    lod=LodLayout(self.sequences, tuple(lod_feeds)),
                )  # fmt: skip
            strategy = IpuStrategy.unpatched()
            strategy.set_graph_config(is_training=False, micro_batch_size=rows)
            if self.options:
                strategy.set_options(self.options)
            executor = executor_for(model, strategy)
            self._executors[bucket] = executor
            log.info(
                "%s: sequences of up to %d rows, %d per run, compiled in %.2f s (bucket %d)",
                self.prefix, bucket, self.sequences, time.perf_counter() - start,
                len(self._executors),
            )  # fmt: skip
            return executor

    def run(
        self, feed: Mapping[str, np.ndarray], offsets: Sequence[int], lod_feeds: Sequence[str]
    ) -> tuple[list[np.ndarray], list[list[list[int]]]]:
        """The outputs of the sequences at ``offsets`` (rows of the ``lod_feeds``; the
        other feeds whole, in every run), and each output's LoD."""
        spans = list(zip(offsets, offsets[1:]))
        for k, (begin, end) in enumerate(spans):
            if end == begin:
                raise FeedError(
                    f"sequence {k} of input(s) {list(lod_feeds)} is empty (LoD {[list(offsets)]}):"
                    " the compiled graph runs sequences of at least one row"
                )
        groups: dict[int, list[int]] = {}
        for k, (begin, end) in enumerate(spans):
            groups.setdefault(bucket_of(end - begin, self.buckets), []).append(k)
        pieces: dict[int, list[np.ndarray]] = {}
        for bucket, members in sorted(groups.items()):
            executor = self.executor(bucket, lod_feeds)
            for first in range(0, len(members), self.sequences):
                chunk = members[first : first + self.sequences]
                batch = self._batch(feed, spans, chunk, bucket, lod_feeds)
                taken = {spec.paddle_name or spec.name for spec in executor.model.inputs}
                outputs = executor.run({n: v for n, v in batch.items() if n in taken})
                rows = self.sequences * bucket
                for n, k in enumerate(chunk):
                    length = spans[k][1] - spans[k][0]
                    pieces[k] = [self._rows(o, rows, executor, i)[n * bucket : n * bucket + length]
                                 for i, o in enumerate(outputs)]  # fmt: skip
        ordered = [pieces[k] for k in range(len(spans))]
        outputs_ = [np.concatenate(parts, axis=0) for parts in zip(*ordered)]
        lods = [
            [list(np.cumsum([0, *[p.shape[0] for p in parts]]).tolist())] for parts in zip(*ordered)
        ]
        return outputs_, lods

    def _batch(
        self,
        feed: Mapping[str, np.ndarray],
        spans: Sequence[tuple[int, int]],
        chunk: Sequence[int],
        bucket: int,
        lod_feeds: Sequence[str],
    ) -> dict[str, np.ndarray]:
        """One run's feed: the chunk's sequences padded to ``bucket`` rows each (the
        run filled with one-row sequences of zeros), and their lengths."""
        from paddle_ipu.compiler.sequence_rewrites import LENGTHS_FEED

        batch: dict[str, np.ndarray] = {}
        for name, value in feed.items():
            if name not in lod_feeds:
                batch[name] = value
                continue
            padded = np.zeros((self.sequences * bucket, *value.shape[1:]), value.dtype)
            for n, k in enumerate(chunk):
                begin, end = spans[k]
                padded[n * bucket : n * bucket + end - begin] = value[begin:end]
            batch[name] = padded
        lengths = [spans[k][1] - spans[k][0] for k in chunk]
        lengths += [1] * (self.sequences - len(chunk))
        batch[LENGTHS_FEED] = np.asarray(lengths, np.int64)
        return batch

    @staticmethod
    def _rows(output: np.ndarray, rows: int, executor: Any, index: int) -> np.ndarray:
        if output.ndim and output.shape[0] == rows:
            return output
        spec = executor.model.outputs[index]
        raise NotSupportedError(
            f"output {spec.paddle_name or spec.name!r} (shape {list(output.shape)}) has no "
            f"row per input row ({rows}): a run of sequences padded into a batch gives "
            "outputs of the sequences' rows only"
        )

    def close(self) -> None:
        with self._lock:
            executors = list(self._executors.values())
            self._executors.clear()
        for executor in executors:
            executor.reset()
