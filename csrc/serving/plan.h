// What the protocol code works on: the model's plan (what a request must look like,
// made once from Python by bindings.cc), one parsed infer request, and an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtypes.h"

namespace paddle_ipu {
namespace serving {

// The values an integer input may take (paddle_ipu.compiler.model.IndexRange).
struct IndexRange {
  int64_t low = 0;
  int64_t high = 0;
  std::vector<int64_t> allowed;
  int64_t column = -1;  // -1: every value; else only input[..., column]
  std::string describe;
};

struct TensorPlan {
  std::string name;
  DType dtype = DType::kInvalid;
  // The shape of one request: the first dimension is -1 (any number of rows) when
  // auto-batching, else the whole micro-batch.
  std::vector<int64_t> shape;
  int64_t unit_bytes = 0;  // bytes of one queue unit (a row, or the micro-batch)
  int64_t unit_elems = 0;
  std::vector<IndexRange> ranges;
};

struct ModelPlan {
  std::string name = "model";
  std::string version = "1";
  std::string server_version;
  bool auto_batch = true;
  int64_t max_rows = 1;          // a request's cap (auto-batching)
  int64_t capacity = 1;          // units per run
  int64_t limit = 1;             // units in flight
  int64_t micro_batch_size = 1;
  double batch_timeout_us = 0;   // the runtime's timeout_ms, in microseconds
  double request_timeout_s = 0;  // 0: none
  int64_t max_body = 64 << 20;
  // Triton's instance_group: the server processes serving the model (--workers),
  // and where each runs it (KIND_CPU: the host backend; KIND_MODEL: the IPU).
  int64_t instance_count = 1;
  std::string instance_kind = "KIND_CPU";
  std::vector<TensorPlan> inputs;
  std::vector<TensorPlan> outputs;
  // A dynamic model (dynamic.h): shapes may hold -1 on any axis; a request is one
  // unit, handed to a Python handler by `workers` threads.
  bool dynamic = false;
  int workers = 1;
};

// One output of a dynamic model's handler.
struct OutTensor {
  std::vector<int64_t> shape;
  std::string data;
};

// One parsed and checked infer request: every input as `units` units of the
// model's dtype, ready for the queue.
struct InferRequest {
  int64_t units = 0;
  int64_t rows = 0;                 // rows of the request (units when auto-batching)
  std::vector<const char*> in;      // per model input (into the body, or into owned)
  std::vector<std::string> owned;   // inputs converted (JSON data, casts)
  std::vector<std::vector<int64_t>> in_shapes;
  std::vector<int> want;            // model outputs asked for, in order
  std::vector<char> binary;         // per wanted output: as binary data?
  std::string id;
  double timeout_s = -1;            // the request's own timeout parameter; -1: none
  std::string_view model, version;  // gRPC: as the request named them (into its body)
};

// An error: an HTTP status and a message (gRPC maps the status, see GrpcCode).
struct Error {
  int status = 0;
  std::string message;
  explicit operator bool() const { return status != 0; }
};

// The number of elements of a shape whose sizes are known to fit: the model's own, or
// a request's that TensorSize (sizes.h) checked.
inline int64_t Elements(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace serving
}  // namespace paddle_ipu
