// The KServe v2 / Triton inference protocol, without Python: the model's plan (what
// a request must look like), the infer request parsers of HTTP (a JSON header, with
// JSON tensors or the binary tensor extension) and gRPC (ModelInferRequest at the
// protobuf wire level), the checks the model runtime makes on a feed (dtype casts,
// shapes, index ranges), and the writers of the answers and of the GET routes' JSON.
//
// Every error message names the input (or output) and says what was expected and
// what was received, as paddle_ipu.errors.FeedError does.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "../core/queue.h"

namespace paddle_ipu {
namespace serving {

// KServe v2 datatypes (BYTES is no tensor dtype a model here takes).
enum class DType : int {
  kBool = 0,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kFp32,
  kFp64,
  kInvalid
};

const char* V2Name(DType t);
int64_t ElemSize(DType t);
DType FromV2(std::string_view name);
// numpy's name ("float32"): the names FeedError uses.
const char* NumpyName(DType t);
// Triton's model configuration name ("TYPE_FP32").
std::string ConfigName(DType t);

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
  std::vector<TensorPlan> inputs;
  std::vector<TensorPlan> outputs;
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
};

// An error: an HTTP status and a message (gRPC maps the status, see GrpcCode).
struct Error {
  int status = 0;
  std::string message;
  explicit operator bool() const { return status != 0; }
};

int GrpcCode(int http_status);

// `head` is the JSON header, `blob` the binary tensors after it (empty without the
// binary extension). Inputs may point into blob: keep it alive.
Error ParseHttpInfer(const ModelPlan& m, std::string_view head, std::string_view blob,
                     InferRequest* r);
// A serialized inference.ModelInferRequest. Inputs may point into msg.
Error ParseGrpcInfer(const ModelPlan& m, std::string_view msg, InferRequest* r);

// The response body of an HTTP infer request, laid out before the run when every
// wanted output is binary (the queue then scatters the outputs straight into it).
struct HttpAnswer {
  std::string body;
  int64_t header_length = -1;  // Inference-Header-Content-Length; -1: all JSON
  std::vector<char*> out;      // per model output: where the queue writes it
  std::vector<std::vector<char>> scratch;  // outputs not written into the body
  bool laid_out = false;
};
void StartHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a);
// After the run, when the answer was not laid out before it: render it.
void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a);

// The serialized inference.ModelInferResponse, laid out before the run (outputs
// go to raw_output_contents, written in place by the queue).
struct GrpcAnswer {
  std::string body;
  std::vector<char*> out;
  std::vector<std::vector<char>> scratch;
};
void StartGrpcAnswer(const ModelPlan& m, const InferRequest& r, GrpcAnswer* a);

std::string ErrorJson(std::string_view message);
// `s` with every byte that is not part of valid UTF-8 written as \xNN: messages echo
// what a request sent, and JSON and Python strings need text.
std::string ValidUtf8(std::string_view s);
std::string Quote(std::string_view s);

// Counters of the front ends (HTTP and gRPC together), for /metrics and statistics.
struct Counters {
  std::mutex mu;
  int64_t success = 0;
  int64_t success_ns = 0;
  int64_t success_rows = 0;
  int64_t fail = 0;
  int64_t fail_ns = 0;
  int64_t last_inference_ms = 0;
  std::vector<std::pair<int, int64_t>> by_status;  // (status, count)
  double duration_s = 0;
  int64_t rejected_busy = 0;   // 503: the queue was full
  int64_t timed_out = 0;       // 504: not started within the request's timeout
  int64_t disconnected = 0;    // the client went away before its request ran
  void Done(int status, int64_t rows, std::chrono::steady_clock::duration took);
};

std::string ServerMetadataJson(const ModelPlan& m);
std::string ModelMetadataJson(const ModelPlan& m);
std::string ModelConfigJson(const ModelPlan& m);
std::string RepositoryIndexJson(const ModelPlan& m, bool ready);
std::string StatisticsJson(const ModelPlan& m, Counters* c, const QueueStats& s);
std::string Prometheus(const ModelPlan& m, Counters* c, const QueueStats& s);

}  // namespace serving
}  // namespace paddle_ipu
