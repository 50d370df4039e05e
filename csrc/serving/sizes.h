// Sizes computed from what a client sent: a tensor's element count and byte size from
// its shape, offsets into a body, lengths a message declares. Every decoder (JSON and
// binary tensors over HTTP, ModelInferRequest over gRPC, BYTES elements) computes them
// here, overflow detected, and checks them against the bytes the request holds before
// anything is allocated: a size that does not fit is a 400 / INVALID_ARGUMENT naming
// the input, never a wrapped product.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// a * b and a + b (a, b >= 0) into *out; false when the result does not fit int64.
inline bool MulSize(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool AddSize(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// The element count and the byte size (`elem` bytes an element; 0 for BYTES, whose
// elements have their own lengths) of input `name` of shape `dims` (each >= 0) of
// datatype `dtype`. An error when the shape's sizes pass int64: its dims, zeros aside,
// times the element size (at least 1) -- numpy's rule for an array it can make; and
// when a tensor of no elements has other dims that take more than `max_body` bytes (a
// model's handler given [0, 2**31] makes, pads or compiles for the dims, not the
// elements: no request could carry one row of it).
Error TensorSize(std::string_view name, const std::vector<int64_t>& dims, DType dtype,
                 int64_t max_body, int64_t* count, int64_t* bytes);

// An error naming input `name` of shape `dims` unless its `count` elements fit in the
// `have` bytes of the request that hold its data, `min_bytes` at least an element (a
// JSON value takes one character or more, a BYTES element its 4-byte length).
Error ElementsFit(std::string_view name, const std::vector<int64_t>& dims, int64_t count,
                  int64_t min_bytes, int64_t have);

}  // namespace serving
}  // namespace paddle_ipu
