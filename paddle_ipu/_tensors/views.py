"""Zero-copy views of a Paddle tensor's host memory.

``view(tensor)`` returns a :class:`TensorView` (implemented in ``paddle_ipu._core``)
that exports the tensor's memory through the buffer protocol: ``np.asarray(view)``
shares it, so numpy and ONNX Runtime (``OrtValue.ortvalue_from_numpy``, or IO binding
with ``view.data_ptr``) read and write the tensor without a copy.  It is the Python
counterpart of the seed's ``PdIArray``.

Accepted: a scope tensor (``global_scope().find_var(name).get_tensor()``) and a dygraph
``paddle.Tensor``, on the CPU or on the "ipu" custom device (whose memory the plugin
allocates on the host).

Lifetime: the view holds the tensor object, and also a second reference to the tensor's
allocation (a DLPack capsule on the CPU, a DenseTensor sharing the storage on the ipu
place). The memory therefore outlives ``del tensor``, the variable leaving the scope, and
an op that gives the tensor new storage -- in that last case the view keeps showing the
old memory, so take a new view after anything that may reallocate.

Contiguity: a dygraph tensor reports it; a CPU tensor's DLPack strides are checked.  A
scope tensor on the ipu place exposes no strides from Python and is taken to be
contiguous, which the static-graph kernels that produce scope tensors guarantee.
"""

from __future__ import annotations

from typing import Any, Protocol, Union

import numpy as np
import paddle
from paddle.base import core

from paddle_ipu import _core
from paddle_ipu._internals import paddle_api
from paddle_ipu._util import dtypes
from paddle_ipu.errors import TensorViewError

# Custom devices whose "device" memory is ordinary host memory (csrc/device allocates
# it with aligned_alloc), so a pointer into it is safe to hand to numpy.
_HOST_MEMORY_DEVICES = frozenset({"ipu"})

DenseTensor = core.DenseTensor
Tensorish = Union[paddle.Tensor, "core.DenseTensor"]


class TensorView(Protocol):
    """What ``paddle_ipu._core.TensorView`` provides, for type checkers."""

    @property
    def data_ptr(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def numel(self) -> int: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def owner(self) -> object: ...
    def dim(self, index: int) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...


def view(tensor: Tensorish, *, readonly: bool = False) -> TensorView:
    """A zero-copy view of ``tensor``'s memory.

    Raises :class:`~paddle_ipu.errors.TensorViewError` for anything that cannot be
    viewed in place: not a dense tensor, not contiguous, not in host memory, holding
    no memory yet, or a dtype numpy cannot represent (bfloat16).
    """
    # Paddle's stubs type get_tensor() as returning a Tensor; it is a DenseTensor.
    dense: Any
    if isinstance(tensor, DenseTensor):
        dense = tensor
    elif isinstance(tensor, paddle.Tensor):
        if not tensor.is_dense():
            raise TensorViewError("cannot view a sparse or distributed paddle.Tensor")
        if not tensor.is_contiguous():
            raise TensorViewError(
                f"cannot view a non-contiguous paddle.Tensor (shape {list(tensor.shape)}, "
                f"strides {list(tensor.strides)}); call .contiguous() on it first"
            )
        dense = tensor.get_tensor()
    else:
        raise TensorViewError(
            "expected a paddle.Tensor or a scope tensor "
            f"(scope.find_var(name).get_tensor()), got {type(tensor).__name__}"
        )
    if not paddle_api.is_initialized(dense):
        raise TensorViewError(
            "cannot view a tensor that holds no memory yet (run the startup program, "
            "or set a value first)"
        )
    place = paddle_api.place_of(dense)
    try:
        if place.is_cpu_place():
            # DLPack gives pointer, shape, dtype and strides in one call, and its
            # capsule holds a share of the allocation.
            return _core.TensorView._from_dlpack(paddle_api.to_dlpack(dense), tensor, readonly)
        if place.is_custom_place() and place.custom_device_type() in _HOST_MEMORY_DEVICES:
            # Paddle cannot export custom places through DLPack; a DenseTensor sharing
            # the storage holds the allocation instead.
            keep = DenseTensor()
            paddle_api.share_data(keep, dense)
            numel = paddle_api.numel(keep)
            # Positional arguments: keyword matching in the binding costs ~1 us.
            return _core.TensorView(
                tensor,
                paddle_api.data_ptr(keep) if numel else 0,
                dtypes.name_of(paddle_api.dtype_of(keep)),
                keep.shape(),
                readonly,
                keep,
            )
    except (TypeError, ValueError) as e:
        raise TensorViewError(str(e)) from None
    raise TensorViewError(
        f"cannot view a tensor on {place}: only host memory (CPU, or the ipu device) can be "
        "viewed; copy it with tensor.cpu() first"
    )


def as_numpy(tensor: Tensorish, *, readonly: bool = False) -> np.ndarray:
    """``np.asarray(view(tensor))``: a numpy array sharing the tensor's memory."""
    return np.asarray(view(tensor, readonly=readonly))
