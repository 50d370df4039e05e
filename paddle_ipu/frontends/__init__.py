"""The front doors: the ways a Paddle program or Layer reaches the IPU.

- :mod:`.program`: ``IpuCompiledProgram`` (Paddle 2.x's static API);
- :mod:`.implicit`: a plain static program run on the ipu place;
- :mod:`.dygraph`: dygraph Layers (PopTorch's ``trainingModel`` / ``inferenceModel``
  style and Paddle 2.x's dy2static patch);
- :mod:`.pipeline`: the one entry every front door compiles through (compile ->
  IpuExecutor);
- :mod:`.graph_op`: the whole compiled graph as one op of a Paddle program;
- :mod:`.predictor`: the predictor and handles of :mod:`paddle_ipu.inference`.

Saved inference models come in through :mod:`paddle_ipu.inference` (Paddle Inference's
API) and :mod:`paddle_ipu.serving.package`; Paddle 2.x's names through
:mod:`paddle_ipu.compat`.
"""
