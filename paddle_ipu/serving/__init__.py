"""Serving compiled models.

- :mod:`.runtime`: :class:`Runtime`, the one interface every served model implements
  (the server, the model repository and pipelines use nothing else);
- :mod:`.model_runtime`: :class:`ModelRuntime`, the queue with auto-batching over a
  compiled inference graph (Paddle 2.x's model runtime);
- :mod:`.bucketed_runtime`: :class:`BucketedRuntime`, one model runtime per bucket of
  sequence lengths; :func:`runtime_for` picks the runtime of a package;
- :mod:`.server`: :class:`InferenceServer`, the KServe v2 / Triton server (HTTP, and gRPC
  through :mod:`.grpc_service`); its request path is C++ (``paddle_ipu._core``);
- :mod:`.dynamic`: the interface of a dynamic model (request shapes that vary, BYTES
  tensors, any Python handler), which the server hands parsed requests to;
- :mod:`.package`: the package format; :mod:`.saved_model`: compiling a saved inference
  model into a package; :mod:`.cache`: the compile cache.
"""

from paddle_ipu.serving.bucketed_runtime import BucketedRuntime, runtime_for
from paddle_ipu.serving.model_runtime import ModelRuntime
from paddle_ipu.serving.runtime import Runtime, RuntimeStats

__all__ = ["BucketedRuntime", "ModelRuntime", "Runtime", "RuntimeStats", "runtime_for"]
