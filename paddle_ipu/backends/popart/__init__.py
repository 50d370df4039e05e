"""The ``popart`` backend: Graphcore's Poplar SDK (PopART, PopEF, model_runtime).

- :mod:`.session`: the Session over PopART's InferenceSession / TrainingSession;
- :mod:`.device`: taking a device (IPU Model, offline IPU, popdist, real IPUs);
- :mod:`.options`: the IpuStrategy options in PopART's names, a session's SessionOptions;
- :mod:`.optimizer`: the compiled optimizer as a PopART optimizer;
- :mod:`.state`: optimizer state between Paddle's form and PopART's (beta1_pow <-> Step___);
- :mod:`.popef`: serving an exported PopEF executable through model_runtime.

``import popart`` fails once ``onnx`` is imported: :mod:`.session` imports the SDK
first, and ``import paddle_ipu`` imports this package early where the SDK is installed.
"""

from paddle_ipu.backends.popart.session import SUPPORT, PopartSession, available, create_session

__all__ = ["SUPPORT", "PopartSession", "available", "create_session"]
