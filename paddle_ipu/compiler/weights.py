"""Keeping weight bytes out of the ONNX graph while it is transformed.

A model's weights dominate its size; the graph around them is small.  The compiler
therefore moves only the graph between processes and through its passes, and puts
the weights in once, when it writes the final bytes:

- :func:`strip_constants` (run in the converter's process) empties the ``Constant``
  nodes that hold parameters, keeping their dims and data type;
- :func:`serialize_with_weights` writes a ModelProto plus weight arrays as one ONNX
  model, appending each weight as a serialized initializer straight from the array's
  memory (protobuf merges repeated embedded messages, so the result parses as one
  graph);
- :func:`split_weights` reads such bytes back as a ModelProto whose weight
  initializers carry dims and type but no data, and read-only numpy views of the
  weights that share the bytes' memory.

All three work on the protobuf wire format of ONNX's ``ModelProto`` (field 7: graph),
``GraphProto`` (field 5: initializer) and ``TensorProto`` (1: dims, 2: data_type,
8: name, 9: raw_data; 12: doc_string, which pads each raw_data to
:data:`WEIGHT_ALIGNMENT`; 13/14: external data and its location).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np

_LEN = 2  # wire type of length-delimited fields
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_NAME = 8
_TENSOR_RAW_DATA = 9
_TENSOR_DOC_STRING = 12

#: Each weight's raw data starts at a multiple of this many bytes from the start of
#: the bytes :func:`serialize_with_weights` returns.  Views of them (split_weights)
#: are then as aligned as the buffer (16 bytes for a Python bytes object): Paddle's
#: CPU kernels give wrong numbers for float tensors that are not 4-byte aligned.
WEIGHT_ALIGNMENT = 64


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, value start, value end) of each field."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
            yield number, wire, field_start, pos, pos
            continue
        if wire == 1:
            value_start, pos = pos, pos + 8
        elif wire == 5:
            value_start, pos = pos, pos + 4
        elif wire == _LEN:
            size, value_start = _read_varint(buf, pos)
            pos = value_start + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("truncated field")
        yield number, wire, field_start, value_start, pos


def _len_field(number: int, payload_size: int) -> bytes:
    return _varint((number << 3) | _LEN) + _varint(payload_size)


def strip_constants(model_bytes: bytes, names: Collection[str]) -> bytes:
    """``model_bytes`` with the values of the Constant nodes that output one of
    ``names`` emptied (dims and data type kept)."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    wanted = set(names)
    for node in model.graph.node:
        if node.op_type != "Constant" or len(node.output) != 1 or node.output[0] not in wanted:
            continue
        for attr in node.attribute:
            if attr.name == "value":
                tensor = attr.t
                for data in ("raw_data", "float_data", "int32_data", "int64_data",
                             "double_data", "uint64_data", "string_data"):  # fmt: skip
                    tensor.ClearField(data)
    return bytes(model.SerializeToString())


def _tensor_header(name: str, dims: tuple[int, ...], data_type: int) -> bytes:
    import onnx

    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.dims.extend(dims)
    tensor.data_type = data_type
    return bytes(tensor.SerializeToString())


def serialize_with_weights(model: Any, weights: Mapping[str, np.ndarray]) -> bytes:
    """One ONNX model: ``model`` (whose initializers named in ``weights`` must hold no
    data) with each array of ``weights`` as that initializer's raw data.

    Each array is read once, into the result: no intermediate copy of all weights."""
    import onnx

    graph = model.graph
    meta: dict[str, tuple[tuple[int, ...], int]] = {}
    keep = []
    for init in graph.initializer:
        if init.name in weights:
            meta[init.name] = (tuple(int(d) for d in init.dims), int(init.data_type))
        else:
            keep.append(init)
    missing = sorted(set(weights) - set(meta))
    if missing:
        raise KeyError(f"the graph has no initializer for weights {missing}")
    del graph.initializer[:]
    graph.initializer.extend(keep)
    try:
        head = bytes(model.SerializeToString())
    finally:
        # Leave the caller's model as it was.
        empty = []
        for name, (dims, data_type) in meta.items():
            init = onnx.TensorProto()
            init.name = name
            init.dims.extend(dims)
            init.data_type = data_type
            empty.append(init)
        graph.initializer.extend(empty)
    parts: list[Any] = [head]
    offset = len(head)
    for name, (dims, data_type) in meta.items():
        array = weights[name]
        expected = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).newbyteorder("<")
        if array.dtype != expected or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=expected)
        if array.size != int(np.prod(dims, dtype=np.int64)):
            raise ValueError(
                f"weight {name!r}: {array.size} elements for an initializer of shape {list(dims)}"
            )
        data = memoryview(array.reshape(-1)).cast("B")  # type: ignore[arg-type]
        prefix = _aligned_prefix(offset, _tensor_header(name, dims, data_type), data.nbytes)
        offset += len(prefix) + data.nbytes
        parts.append(prefix)
        parts.append(data)
    return b"".join(parts)


def _aligned_prefix(offset: int, header: bytes, nbytes: int) -> bytes:
    """The bytes before one weight's raw data (graph, initializer and tensor fields),
    with a doc_string padding the data's start to :data:`WEIGHT_ALIGNMENT` bytes when
    the prefix starts at ``offset``."""
    raw_field = _len_field(_TENSOR_RAW_DATA, nbytes)

    def prefix_for(size: int) -> bytes:
        padding = b"" if size < 0 else _len_field(_TENSOR_DOC_STRING, size) + b" " * size
        tensor_size = len(header) + len(padding) + len(raw_field) + nbytes
        initializer = _len_field(_GRAPH_INITIALIZER, tensor_size)
        graph = _len_field(_MODEL_GRAPH, len(initializer) + tensor_size)
        return graph + initializer + header + padding + raw_field

    # No padding, then doc_strings of 0, 1, 2... characters: the prefix grows by at
    # least one byte a character (a length varint that gains a byte skips a size), so
    # two alignments' worth of candidates cover every remainder.  A doc_string of
    # ``size`` characters adds its 2 + size bytes and at most 4 of longer varints:
    # sizes below ``short - 6`` fall short of the first remainder that aligns, and the
    # search starts there (the same prefix as trying every size from 0).
    bare = prefix_for(-1)
    short = -(offset + len(bare)) % WEIGHT_ALIGNMENT
    if short == 0:
        return bare
    for size in range(max(0, short - 6), 2 * WEIGHT_ALIGNMENT):
        prefix = prefix_for(size)
        if (offset + len(prefix)) % WEIGHT_ALIGNMENT == 0:
            return prefix
    raise AssertionError("unreachable: the candidates cover every remainder")


def split_weights(
    model_bytes: bytes, names: Collection[str] | None, external: str | None = None
) -> tuple[Any, dict[str, np.ndarray]]:
    """(ModelProto, weights) from ONNX bytes: the initializers named in ``names`` (None:
    every one) that hold raw data come back as read-only arrays sharing
    ``model_bytes``' memory, and as data-less initializers (dims and type only) in the
    ModelProto.  Initializers stored any other way stay in the ModelProto as they are.

    ``external``: when given, the data-less initializers are marked as external data
    at that location (ONNX Runtime then takes their values from
    ``SessionOptions.add_external_initializers`` instead of rejecting them as empty)."""
    import onnx

    wanted = None if names is None else set(names)
    buf = memoryview(model_bytes)
    weights: dict[str, np.ndarray] = {}
    top: list[bytes | memoryview] = []
    for number, wire, field_start, value_start, value_end in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH or wire != _LEN:
            top.append(buf[field_start:value_end])
            continue
        graph_parts: list[bytes | memoryview] = []
        for g_number, g_wire, g_start, g_value, g_end in _fields(buf, value_start, value_end):
            if g_number == _GRAPH_INITIALIZER and g_wire == _LEN:
                found = _weight_view(buf, g_value, g_end, wanted, external)
                if found is not None:
                    name, array, stripped = found
                    weights[name] = array
                    graph_parts.append(_len_field(_GRAPH_INITIALIZER, len(stripped)) + stripped)
                    continue
            graph_parts.append(buf[g_start:g_end])
        graph = b"".join(graph_parts)
        top.append(_len_field(_MODEL_GRAPH, len(graph)) + graph)
    model = onnx.load_from_string(b"".join(top))
    return model, weights


def _weight_view(
    buf: memoryview, start: int, end: int, wanted: Collection[str] | None, external: str | None
) -> tuple[str, np.ndarray, bytes] | None:
    import onnx

    name = None
    raw: tuple[int, int, int] | None = None
    for number, wire, field_start, value_start, value_end in _fields(buf, start, end):
        if number == _TENSOR_NAME and wire == _LEN:
            name = bytes(buf[value_start:value_end]).decode("utf-8")
        elif number == _TENSOR_RAW_DATA and wire == _LEN:
            raw = (field_start, value_start, value_end)
    if name is None or (wanted is not None and name not in wanted) or raw is None:
        return None
    field_start, value_start, value_end = raw
    stripped = bytes(buf[start:field_start]) + bytes(buf[value_end:end])
    tensor = onnx.TensorProto()
    tensor.ParseFromString(stripped)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    dims = tuple(int(d) for d in tensor.dims)
    count = int(np.prod(dims, dtype=np.int64))
    if count * dtype.itemsize != value_end - value_start:
        return None
    array = np.frombuffer(buf[value_start:value_end], dtype=dtype).reshape(dims)
    if external is not None:
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", external), ("offset", "0"),
                           ("length", str(value_end - value_start))):  # fmt: skip
            entry = tensor.external_data.add()
            entry.key = key
            entry.value = value
        stripped = bytes(tensor.SerializeToString())
    return name, array, stripped
