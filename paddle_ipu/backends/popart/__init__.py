"""The ``popart`` backend: Graphcore's Poplar SDK (PopART, PopEF, model_runtime).

- :mod:`.session`: the Session over PopART's InferenceSession / TrainingSession;
- :mod:`.popef`: serving an exported PopEF executable through model_runtime.

``import popart`` fails once ``onnx`` is imported: :mod:`.session` imports the SDK
first, and ``import paddle_ipu`` imports this package early where the SDK is installed.
"""

from paddle_ipu.backends.popart.session import PopartSession, available, create_session

__all__ = ["PopartSession", "available", "create_session"]
