"""The exceptions paddle-ipu raises.  Every one derives from :class:`IpuError`.

Each also derives from the built-in exception a caller would expect (``ValueError``
for bad values, ``TypeError`` for bad types, ``KeyError`` for unknown names), so
code written against Paddle 2.x's behaviour still catches them.
"""

from __future__ import annotations


class IpuError(Exception):
    """Base class of every paddle-ipu error."""


class PaddleVersionError(IpuError, ImportError):
    """The installed PaddlePaddle is not the release paddle-ipu was built against."""


class OptionError(IpuError, ValueError):
    """An IpuStrategy option has an unknown name, a wrong type or a value out of range."""


class OptionTypeError(OptionError, TypeError):
    """An IpuStrategy option was given a value of the wrong type."""


class UnknownOptionError(OptionError, KeyError):
    """An IpuStrategy option name that does not exist."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class CompileError(IpuError, RuntimeError):
    """A Paddle program could not be compiled for the IPU."""


class UnsupportedOpError(CompileError):
    """The program uses Paddle operators that cannot be lowered."""


class FeedError(IpuError, ValueError):
    """A feed does not match what the compiled program expects."""


class BackendError(IpuError, RuntimeError):
    """A backend failed, or is not available on this machine."""


class BackendUnavailableError(BackendError):
    """The requested backend cannot be used here (for example, no Poplar SDK)."""


class NotSupportedError(IpuError, NotImplementedError):
    """A feature or option that this backend or release does not provide."""


class DeviceError(IpuError, RuntimeError):
    """The "ipu" custom device is not registered or not usable."""


class TensorViewError(IpuError, TypeError):
    """A tensor or buffer cannot be used in place: wrong dtype, not contiguous, not in host
    memory, read-only, or not a tensor at all."""


class ConversionError(IpuError, ValueError):
    """An fp16/fp32 conversion was given sizes or options that do not fit (output size,
    overlapping buffers, thread count)."""


class RuntimeClosedError(IpuError, RuntimeError):
    """The model runtime is closed: a request was submitted after ``close()``, or was still
    queued when it was closed with ``cancel=True``."""


class RuntimeBusyError(IpuError, TimeoutError):
    """The model runtime's ``num_buffers`` micro-batches stayed in flight for longer than a
    submit's timeout (backpressure)."""


class FetchError(IpuError, KeyError):
    """A fetch that the compiled program does not produce."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OutputFileError(IpuError, OSError):
    """A file paddle-ipu writes (an exported executable, a model) cannot be written: the
    message names the path and why."""


class WorkDirError(OutputFileError):
    """A directory paddle-ipu needs (the working directory, the directory for temporary
    files) is missing or cannot be written: the message names it."""


class CheckpointError(IpuError):
    """A checkpoint that cannot be written, read or applied to the program: the message
    names the file and, for a mismatch, the variable, the expected and the received value."""


class PackageError(IpuError, ValueError):
    """A compiled package (``paddle-ipu compile``) or compile-cache entry that cannot be
    read: not a package, a checksum that does not match, or a format from another
    version; the message names the file."""


class PrivateApiError(IpuError, RuntimeError):
    """A private interface of PaddlePaddle, ONNX Runtime or paddle2onnx that paddle-ipu
    relies on is missing or changed its signature in the installed release, and there is
    no public fallback: the message names the interface and the release it was checked
    on (see ``python -m paddle_ipu._internals``)."""


class DistributedError(BackendError):
    """A data-parallel job across processes failed: another rank died, stopped or did
    not reach a collective in time, or the ranks disagree (different programs, weights
    that differ).  The message names the ranks; :attr:`ranks` holds them."""

    def __init__(self, message: str, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        #: the ranks the message names as the cause (empty when none could be named)
        self.ranks = tuple(ranks)


class FloatingPointCheckError(IpuError, FloatingPointError):
    """With ``enable_floating_point_checks``, an operator produced an infinity or a NaN
    from finite operands (overflow, invalid operation, division by zero) -- where the
    IPU's floating-point trap stops the run.  The message names the operator; the
    attributes hold what it names."""

    def __init__(
        self,
        message: str,
        *,
        node: str = "",
        op_type: str = "",
        paddle_op: str = "",
        step: int = 0,
        kind: str = "",
    ) -> None:
        super().__init__(message)
        #: the ONNX node (inference) or Paddle operator (training) that trapped
        self.node = node
        #: its ONNX operator type ("" in training, where the graph is Paddle's)
        self.op_type = op_type
        #: the Paddle operator type it was converted from ("" when not known)
        self.paddle_op = paddle_op
        #: the run of the session (1 for its first) in which it happened
        self.step = step
        #: "overflow", "invalid operation" or "division by zero"
        self.kind = kind


class IpuMemoryError(CompileError, MemoryError):
    """The model does not fit in the memory of an IPU (or of one pipeline stage): the
    message is the memory report of the IPUs that do not fit; :attr:`report` holds the
    whole report (``paddle_ipu.memory_report``)."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        #: the :class:`paddle_ipu.compiler.memory.MemoryReport`
        self.report = report


class PipelineStepError(IpuError, RuntimeError):
    """A step of a served pipeline (:mod:`paddle_ipu.serving.pipeline`) failed: the
    message names the pipeline, the step and the cause (``step``: the step's name;
    ``__cause__``: the step's own exception)."""

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


class PipelineInputError(PipelineStepError, ValueError):
    """A step of a pipeline refused what the request sent (its own exception was a
    ValueError: an image that does not decode, a shape a model refuses): the server
    answers it as bad input (400)."""
