"""Paddle tensors as numpy arrays without copies (:mod:`.views`) and float16 <-> float32
conversion of arrays and tensors (:mod:`.fp16`), both over the compiled core
(``paddle_ipu._core``) and the seam to Paddle's tensor internals
(:mod:`paddle_ipu._internals.paddle_api`)."""
