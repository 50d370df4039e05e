// The serving front ends of paddle_ipu._core: KServe v2 over HTTP/1.1 (Boost.Beast on
// Boost.Asio: listener.h, connection.h, routes.cc) and over gRPC (nghttp2 on the same
// IO threads: grpc_connection.h; ModelInfer in grpc_call.h, the control calls in
// grpc_control.cc), both feeding the model runtime's ServingQueue
// (csrc/core/queue.h) without the GIL. Of the control calls, only the repository's
// load and unload go to Python (repository.cc, grpc_unary.cc).
//
// A request is parsed, checked (requests.h), and admitted to the queue on an IO
// thread; its inputs are read by the queue straight from the request body, and its
// outputs are written straight into the response body (answers.h). The Python
// worker (ModelRuntime._loop) takes the GIL once per run, not per request; a
// finished run's requests come back to their IO thread in one post. No Python object
// is made or touched per request.
//
// A FrontEnd is one model version: its plan, queue, counters and metadata. The
// Server (server.h) holds the set of them a server serves, its listeners and IO
// threads, and routes every request to its model.
//
// Policies: the queue's bound answers 503 with Retry-After at once (never blocks an
// IO thread); a request not started within its timeout is taken out of the queue and
// answered 504; a request whose client closed the connection is taken out of the
// queue before it runs; Close() + Drain() refuse new requests and wait for those in
// flight (a model's unload, or the server's stop).
#pragma once

#include <pybind11/pytypes.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../core/queue.h"
#include "answers.h"
#include "metrics.h"
#include "plan.h"
#include "shape_routes.h"

namespace paddle_ipu {
namespace serving {

class Connection;
class GrpcCall;
struct Listener;

constexpr const char* kShuttingDown = "the server is shutting down: no new requests are accepted";

// What a native request owns: the body its inputs point into, the converted
// inputs, and the answer its outputs are written into.
struct Job {
  std::string body;
  InferRequest req;
  HttpAnswer http;
  GrpcAnswer grpc;
  // A dynamic model's outputs (by model output), or why its handler failed.
  std::vector<OutTensor> outputs;
  // A request routed to a bucket of sequence lengths: its inputs padded to the bucket
  // (by model input; empty where not padded).
  std::vector<std::string> padded;
  Error failure;
  std::chrono::steady_clock::time_point start;
  std::weak_ptr<Connection> connection;  // HTTP: who answers
  // HTTP: the request's sink. A request outlives its front end when a stop gave up
  // waiting for it: the worker still delivers it, to a sink that must still exist.
  std::shared_ptr<Listener> io;
  // A dynamic model's request of a routed shape: the routes that forward its answer
  // to its sink (shape_routes.h), kept while the request is.
  std::shared_ptr<NativeSink> routes;
};

// The queue's request for `job`, its outputs written to `out`, answered to `sink`.
RequestPtr MakeRequest(const ModelPlan& m, const std::shared_ptr<Job>& job,
                       const std::vector<char*>& out, NativeSink* sink,
                       std::shared_ptr<void> owner);

// The answer of a request the queue finished without computing it (state not
// kDone): 503 when the runtime closed, else 500.
Error RunError(const Request& r);
// The answer of a request not started within `seconds` (504).
// (A dynamic model's request: not answered within them.)
std::string TimeoutMessage(double seconds, bool dynamic = false);

class DynamicQueue;

class FrontEnd : public std::enable_shared_from_this<FrontEnd> {
 public:
  // `queue`: the ServingQueue of a fixed model, or the handler of a dynamic one
  // (plan.dynamic; Start() starts its workers).
  FrontEnd(pybind11::object queue, ModelPlan plan);
  void Start();
  // A dynamic model's workers stop once what was admitted was handed over (call
  // without the GIL, after Close()).
  void StopWorkers();
  bool dynamic() const { return plan_.dynamic; }
  ~FrontEnd();

  const ModelPlan& plan() const { return plan_; }
  ServingQueue* queue() { return queue_.get(); }
  Counters* counters() { return &counters_; }
  const std::string& metadata() const { return metadata_; }
  const std::string& server_metadata() const { return server_metadata_; }
  const std::string& config() const { return config_; }
  // The configuration as model_config.proto's ModelConfig; "" when a value does not
  // fit its field (then config_refused() says which).
  const std::string& config_message() const { return config_message_; }
  const std::string& config_refused() const { return config_refused_; }
  bool draining() const { return draining_.load(); }
  // Refuses new requests (503) from now on: the model is unloading or the server
  // stopping; Drain() waits for those admitted.
  void Close() { draining_ = true; }
  bool ready() const;
  void set_ready(bool ready) { ready_ = ready; }
  // Triton's statistics JSON, the same as gRPC's ModelStatistics message, and the
  // Prometheus text of /metrics, each from one copy of the counters and one of the
  // queue's.
  std::string StatisticsJson() { return Statistics(false); }
  std::string StatisticsMessage() { return Statistics(true); }
  std::string Prometheus();

  // Admits a request to the queue: no error when queued (then one more is active),
  // else its answer (503: busy, counted, or closed; 500: sizes wrong).
  Error Admit(const RequestPtr& r, const std::shared_ptr<Job>& job);
  // Takes back a request not answered yet (its client went away, or its timeout
  // passed): true when its sink will not be called (a fixed model's request that has
  // not started; any dynamic model's request still queued or running).
  bool Cancel(Request* r);
  // The answer of a request that did not finish kDone.
  Error Failure(const Request& r, const Job& job) const;
  // An admitted request was answered (or left the queue unanswered).
  void Answered();

  // Waits until every admitted request is answered; false on timeout (negative: no
  // limit).
  bool Drain(double timeout);

  // A dynamic model (call with the GIL): requests of the shape of `plan`, the plan of
  // a fixed runtime of the model, go to `queue` (that runtime's ServingQueue) without
  // Python from now on (shape_routes.h). Returns "" when routed, else why not.
  // `bucket`: the runtime is a bucket of sequence lengths (requests of shorter
  // lengths are padded to it).
  std::string AddRoute(pybind11::handle queue, ModelPlan plan, const Bucket* bucket = nullptr);
  // Stops routing the shape of `plan` to `queue` (its runtime has closed). "" when
  // removed, else why not.
  std::string RemoveRoute(pybind11::handle queue, const ModelPlan& plan);
  // The shapes (and buckets) routed so.
  size_t routes() const;
  // A model compiled per input shape: its specialisations, shown in the statistics.
  void SetSpecialisations(const SpecialisationValues& v);

  // gRPC (grpc_call.cc).
  // `trace`: the call's traceparent metadata ("" when none), for the access log.
  // `done`: called when the call is answered (see grpc_call.h; null: wait in Result()).
  std::shared_ptr<GrpcCall> GrpcInfer(std::string msg, std::string trace = std::string(),
                                      std::function<void(std::shared_ptr<GrpcCall>)> done =
                                          nullptr);

  std::atomic<int64_t> active{0};  // requests admitted, not answered

  void NotifyDrain();

 private:
  std::string Statistics(bool message);

  pybind11::object queue_obj_;
  std::shared_ptr<ServingQueue> queue_;      // a fixed model's
  std::shared_ptr<DynamicQueue> dynamic_;    // a dynamic model's
  ModelPlan plan_;
  Counters counters_;
  std::mutex specialisations_mu_;
  SpecialisationValues specialisations_;
  std::string metadata_, server_metadata_, config_, config_message_, config_refused_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> ready_{true};
  std::mutex drain_mu_;
  std::condition_variable drained_;
};

}  // namespace serving
}  // namespace paddle_ipu
