"""The compiler: a Paddle static program -> :class:`CompiledModel`.

``compile_program`` prunes the program to the fetches, checks every operator
against what paddle2onnx converts, lowers it to ONNX (with the converter
isolated in a child process) and post-processes the model: parameters become
initializers named after the Paddle parameters, the batch dimension is fixed,
outputs get readable names and static shapes, and shard annotations land on
the nodes.
"""

from __future__ import annotations

from paddle_ipu.compiler.compile import compile_program
from paddle_ipu.compiler.model import CompiledModel, ShardSpec, TensorSpec
from paddle_ipu.compiler.ops import supported_ops
from paddle_ipu.compiler.sharding import ipu_shard_guard, set_ipu_shard

__all__ = [
    "CompiledModel",
    "ShardSpec",
    "TensorSpec",
    "compile_program",
    "ipu_shard_guard",
    "set_ipu_shard",
    "supported_ops",
]
