// A gRPC ModelInfer call (KServe v2 over gRPC): the gRPC server in
// paddle_ipu/serving/grpc_service.py hands its bytes to FrontEnd::GrpcInfer, which
// parses, checks and queues them; one of the server's threads then waits, without
// the GIL, for the answer here.
#pragma once

#include <condition_variable>
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

class GrpcCall : public NativeSink, public std::enable_shared_from_this<GrpcCall> {
 public:
  // A call answered `e` at once, counted in `counters` (no model took it: an unknown
  // model, a malformed message, a stopping server).
  // (`trace`, `model`, `version`: what the access log says of it.)
  static std::shared_ptr<GrpcCall> Refused(const Error& e, std::shared_ptr<Counters> counters,
                                           std::string trace = std::string(),
                                           std::string_view model = {},
                                           std::string_view version = {});

  void Deliver(std::vector<RequestPtr>&& finished) override;

  // Answers the call without running it.
  void Fail(const Error& e);

  // Waits (call without the GIL) for the answer, at most `timeout` seconds (> 0; the
  // request's timeout parameter and the server's request timeout also bound it) for
  // the request to start, then it is taken out of the queue (504). Counts the
  // answer. Returns its gRPC code: 0 (then response() holds the serialized
  // ModelInferResponse), or the code of the error that message() says.
  int Result(double timeout);
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
};

}  // namespace serving
}  // namespace paddle_ipu
