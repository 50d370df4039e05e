"""Serving compiled models.

- :mod:`.model_runtime`: :class:`ModelRuntime`, the queue with auto-batching over a
  compiled inference graph (Paddle 2.x's model runtime); :class:`BucketedRuntime`, one
  per bucket of sequence lengths; :func:`runtime_for` picks for a package;
- :mod:`.http`: :class:`InferenceServer`, the KServe v2 / Triton server (HTTP, and gRPC
  through :mod:`.grpc_service`); its request path is C++ (``paddle_ipu._core``);
- :mod:`.python_http`: :class:`~.python_http.PythonInferenceServer`, KServe v2 over HTTP
  in Python, for packages with buckets of sequence lengths (request shapes that vary);
- :mod:`.package`: portable compiled packages and the compile cache.
"""

from paddle_ipu.serving.model_runtime import (
    BucketedRuntime,
    ModelRuntime,
    RuntimeStats,
    runtime_for,
)

__all__ = ["BucketedRuntime", "ModelRuntime", "RuntimeStats", "runtime_for"]
