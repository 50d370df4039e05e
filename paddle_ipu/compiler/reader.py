"""The one interface between the compiler and a Paddle program.

A reader turns (program, feeds, fetches) into a :class:`ForwardGraph`: the
forward part of the program pruned to the fetches, described in plain Python
objects, plus a way to write it in the format paddle2onnx reads.  Everything
after the reader (op checks, lowering, ONNX post-processing) only sees a
ForwardGraph, so a reader for the legacy IR slots in without touching the rest.
This module is the interface only: the readers (:mod:`.pir_reader`,
:mod:`.legacy_reader`) implement it, and the compile step picks one
(:func:`paddle_ipu.compiler.compile.reader_for`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from paddle_ipu.compiler.ops import OpUse


@dataclass(frozen=True)
class FeedInfo:
    """One feed: the name of its data op, dtype (numpy spelling) and declared shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    used: bool = True


@dataclass(frozen=True)
class FetchInfo:
    """One fetch.

    ``paddle_name`` is the name the user knows it by ("" when the value has
    none); ``producer`` is the index into ForwardGraph.ops of the operator that
    computes it (-1 for a feed or parameter fetched as is) and ``result`` the
    result index on that operator; ``default_name`` is a readable name made up
    for values that have none.
    """

    paddle_name: str
    default_name: str
    dtype: str
    shape: tuple[int, ...]
    producer: int = -1
    result: int = 0


@dataclass
class OpInfo:
    """One forward operator, in program order."""

    use: OpUse
    # What the converter names this operator's results in the ONNX graph.
    onnx_names: list[str] = field(default_factory=list)
    ipu_index: int = -1
    ipu_stage: int = -1
    # Paddle 2.x's IPU hints set with ``op._set_attr`` (pir_values.op_hints):
    # ``__available_memory``, ``serialize_factor``, ``serialize_mode``.
    hints: dict[str, Any] = field(default_factory=dict)
    # The custom-op region the operator belongs to (custom_ops: region, in, out,
    # spec), empty for any other operator.
    custom: dict[str, Any] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return self.use.op


class ForwardGraph(Protocol):
    """The forward program, pruned to the fetches, as the rest of the compiler sees it."""

    feeds: list[FeedInfo]
    fetches: list[FetchInfo]
    ops: list[OpInfo]
    # Paddle parameter name -> (shape, numpy dtype) for every persistable the
    # forward graph reads.
    parameters: dict[str, tuple[tuple[int, ...], str]]

    def write_inference_model(
        self, directory: str, placeholders: Collection[str] = ()
    ) -> tuple[str, str]:
        """Write the model in paddle2onnx's input format; return (model, params) paths.
        The parameters named in ``placeholders`` are written as one element of their
        dtype with every dimension 1 (see compile._placeholders)."""
        ...


class ProgramReader(Protocol):
    def read(
        self,
        program: Any,
        feed_list: Sequence[Any],
        fetch_list: Sequence[Any],
        scope: Any = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        batch: int = 1,
        lod: Any = None,
    ) -> ForwardGraph:
        """The forward graph of ``program``; with ``input_shapes`` (feed name -> full
        shape; an open batch dimension is ``batch``), made static for them first
        (:mod:`.specialise`); with ``lod`` (a :class:`.sequence_rewrites.LodLayout`),
        its LoD feeds' rows are sequences padded into a batch, whose lengths are one
        more feed."""
        ...
