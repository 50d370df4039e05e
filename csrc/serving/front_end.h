// The serving front ends of paddle_ipu._core: KServe v2 over HTTP/1.1 (Boost.Beast on
// Boost.Asio: listener.h, connection.h, routes.cc) and the ModelInfer path of KServe
// v2 over gRPC (the call's bytes, from the gRPC server in
// paddle_ipu/serving/grpc_service.py: grpc_call.h), both feeding the model runtime's
// ServingQueue (csrc/core/queue.h) without the GIL.
//
// A request is parsed, checked (requests.h), and admitted to the queue on an IO
// thread; its inputs are read by the queue straight from the request body, and its
// outputs are written straight into the response body (answers.h). The Python
// worker (ModelRuntime._loop) takes the GIL once per run, not per request; a
// finished run's requests come back to their IO thread in one post. No Python object
// is made or touched per request.
//
// Policies: the queue's bound answers 503 with Retry-After at once (never blocks an
// IO thread); a request not started within its timeout is taken out of the queue and
// answered 504; a request whose client closed the connection is taken out of the
// queue before it runs; stop_accepting() + drain() answer what is in flight and
// close idle connections.
#pragma once

#include <pybind11/pytypes.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../core/queue.h"
#include "access_log.h"
#include "answers.h"
#include "metrics.h"
#include "plan.h"

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
  std::chrono::steady_clock::time_point start;
  std::weak_ptr<Connection> connection;  // HTTP: who answers
  // HTTP: the request's sink. A request outlives its front end when a stop gave up
  // waiting for it: the worker still delivers it, to a sink that must still exist.
  std::shared_ptr<Listener> io;
};

// The queue's request for `job`, its outputs written to `out`, answered to `sink`.
RequestPtr MakeRequest(const ModelPlan& m, const std::shared_ptr<Job>& job,
                       const std::vector<char*>& out, NativeSink* sink,
                       std::shared_ptr<void> owner);

// The answer of a request the queue finished without computing it (state not
// kDone): 503 when the runtime closed, else 500.
Error RunError(const Request& r);
// The answer of a request not started within `seconds` (504).
std::string TimeoutMessage(double seconds);

class FrontEnd {
 public:
  FrontEnd(pybind11::object queue, ModelPlan plan);
  ~FrontEnd();

  const ModelPlan& plan() const { return plan_; }
  ServingQueue* queue() { return queue_.get(); }
  Counters* counters() { return &counters_; }
  const std::string& metadata() const { return metadata_; }
  const std::string& server_metadata() const { return server_metadata_; }
  const std::string& config() const { return config_; }
  bool draining() const { return draining_.load(); }
  bool ready() const;
  void set_ready(bool ready) { ready_ = ready; }
  // Triton's statistics JSON and the Prometheus text of /metrics, from one copy of
  // the counters and one of the queue's.
  std::string StatisticsJson();
  std::string Prometheus();

  // Admits a request to the queue: no error when queued (then one more is active),
  // else its answer (503: busy, counted, or closed; 500: sizes wrong).
  Error Admit(const RequestPtr& r);
  // An admitted request was answered (or left the queue unanswered).
  void Answered();

  // An inference request was answered: the counters, and the access log's line
  // (latency from `start`; `ran`: the queue's request when it ran, else nullptr).
  void Record(AccessEntry e, std::chrono::steady_clock::time_point start, const Request* ran);
  // Writes a line per inference request to `path` ("-": standard error) from now on.
  void OpenAccessLog(const std::string& path);
  bool logging() const { return log_ != nullptr; }
  void FlushAccessLog() {
    if (log_) log_->Flush();
  }

  // HTTP (listener.cc).
  int StartHttp(const std::string& host, int port, int threads, bool reuse_port);
  void StopAccepting();
  bool Drain(double timeout);
  void Shutdown();

  // gRPC (grpc_call.cc).
  // `trace`: the call's traceparent metadata ("" when none), for the access log.
  std::shared_ptr<GrpcCall> GrpcInfer(std::string msg, std::string trace = std::string());

  std::atomic<int64_t> active{0};       // requests admitted, not answered
  std::atomic<int64_t> connections{0};  // open HTTP connections

  void NotifyDrain();

 private:
  pybind11::object queue_obj_;
  std::shared_ptr<ServingQueue> queue_;
  ModelPlan plan_;
  Counters counters_;
  std::string metadata_, server_metadata_, config_;
  std::vector<std::shared_ptr<Listener>> listeners_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> ready_{true};
  std::mutex drain_mu_;
  std::condition_variable drained_;
  std::unique_ptr<AccessLog> log_;  // set before the front ends start, if at all
};

}  // namespace serving
}  // namespace paddle_ipu
