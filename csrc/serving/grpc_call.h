// A gRPC ModelInfer call (KServe v2 over gRPC): the native gRPC connection
// (grpc_connection.h) hands its bytes to FrontEnd::GrpcInfer, which parses, checks and
// queues them; the answer comes back through the call's `done` callback (which posts
// it to the connection's IO thread: no thread waits for it). Without a callback (the
// Python binding, for tests), a thread waits without the GIL in Result().
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "../core/queue.h"
#include "plan.h"

namespace paddle_ipu {
namespace serving {

class FrontEnd;
class Counters;
struct Job;

// The gRPC status code of an HTTP status.
int GrpcCode(int http_status);

class GrpcCall;
// Called once, on whichever thread finished the call (with the call's lock held: it
// must only post the call somewhere else).
using GrpcDone = std::function<void(std::shared_ptr<GrpcCall>)>;

class GrpcCall : public NativeSink, public std::enable_shared_from_this<GrpcCall> {
 public:
  // A call answered `e` at once, counted in `counters` (no model took it: an unknown
  // model, a malformed message, a stopping server).
  // (`trace`, `model`, `version`: what the access log says of it.)
  static std::shared_ptr<GrpcCall> Refused(const Error& e, std::shared_ptr<Counters> counters,
                                           std::string trace = std::string(),
                                           std::string_view model = {},
                                           std::string_view version = {},
                                           GrpcDone done = nullptr);

  void Deliver(std::vector<RequestPtr>&& finished) override;

  // Answers the call without running it.
  void Fail(const Error& e);

  // Waits (call without the GIL) for the answer, at most `timeout` seconds (> 0; the
  // request's timeout parameter and the server's request timeout also bound it) for
  // the request to start, then it is taken out of the queue (504). Counts the
  // answer. Returns its gRPC code: 0 (then response() holds the serialized
  // ModelInferResponse), or the code of the error that message() says.
  int Result(double timeout);
  // The timeout Result() applies: the first of `deadline` (seconds, <= 0: none), the
  // request's timeout parameter and the server's request timeout (0: none).
  double EffectiveTimeout(double deadline) const;
  // That timeout passed (the connection's timer): a request not started is taken out
  // of the queue and answered 504 (through `done`).
  void Expire(double timeout);
  // After `done` was called: counts the answer (and logs it) and returns its gRPC
  // code, as Result() does. Once per call.
  int Complete();
  const std::string& response() const;
  std::string message() const;

  // The client went away (the gRPC server's callback): drop the request if queued.
  bool Cancel();
  // The model that took the call (null when none did).
  FrontEnd* front_end() const { return fe_.get(); }

 private:
  friend class FrontEnd;

  void Finish(const Request& r);  // with mu_ held
  void Wait(double timeout, Counters* counters);
  // With mu_ held: the answer is known.
  void Done(int status, std::string message);

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int status_ = 0;
  std::string message_;
  RequestPtr request_;
  std::shared_ptr<Job> job_;
  bool admitted_ = false;  // counted in FrontEnd::active until Result() returns
  std::shared_ptr<FrontEnd> fe_;           // the model's front end, or
  std::shared_ptr<Counters> unrouted_;     // where a call no model took counts
  Counters* counters() const;
  double queue_s_ = -1, compute_s_ = -1;  // when it ran (RanTimes)
  std::string trace_;  // the call's traceparent metadata, for the access log
  GrpcDone done_cb_;   // the native connection's: called once when done_ turns true
};

}  // namespace serving
}  // namespace paddle_ipu
