// gRPC ModelInfer calls (see grpc_call.h).
#include "grpc_call.h"

#include <cstdio>
#include <exception>
#include <new>

#include "clock.h"
#include "dynamic.h"
#include "front_end.h"
#include "requests.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

int GrpcCode(int status) {
  switch (status) {
    case 200: return 0;     // OK
    case 400: return 3;     // INVALID_ARGUMENT
    case 413: return 8;     // RESOURCE_EXHAUSTED
    case 404: return 5;     // NOT_FOUND
    case 503: return 14;    // UNAVAILABLE
    case 504: return 4;     // DEADLINE_EXCEEDED
    case 499: return 1;     // CANCELLED
    default: return 13;     // INTERNAL
  }
}

void GrpcCall::Deliver(std::vector<RequestPtr>&& finished) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const RequestPtr& r : finished) {
    if (r == request_) Finish(*r);
  }
  cv_.notify_all();
}

void GrpcCall::Done(int status, std::string message) {
  status_ = status;
  message_ = std::move(message);
  done_ = true;
  request_.reset();  // the request owns this call: break the cycle
  if (done_cb_) {
    GrpcDone cb = std::move(done_cb_);
    done_cb_ = nullptr;
    cb(shared_from_this());
  }
}

void GrpcCall::Finish(const Request& r) {
  RanTimes(r, &queue_s_, &compute_s_);
  if (r.state == RequestState::kDone) {
    if (fe_->dynamic()) FinishGrpcAnswer(fe_->plan(), job_->req, job_->outputs, &job_->grpc);
    return Done(200, std::string());
  }
  Error e = fe_->Failure(r, *job_);
  Done(e.status, std::move(e.message));
}

void GrpcCall::Fail(const Error& e) {
  std::lock_guard<std::mutex> lock(mu_);
  Done(e.status, e.message);
  cv_.notify_all();
}

void GrpcCall::Wait(double timeout, Counters* counters) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout > 0) {
    const auto deadline = DeadlineAfter(timeout);
    if (!cv_.wait_until(lock, deadline, [this] { return done_; })) {
      RequestPtr r = request_;
      lock.unlock();
      const bool cancelled = r && fe_->Cancel(r.get());
      lock.lock();
      if (cancelled && !done_) {
        Done(504, TimeoutMessage(timeout, fe_ && fe_->dynamic()));
        counters->Add(&CounterValues::timed_out);
      }
    }
  }
  cv_.wait(lock, [this] { return done_; });
}

std::shared_ptr<GrpcCall> GrpcCall::Refused(const Error& e, std::shared_ptr<Counters> counters,
                                            std::string trace, std::string_view model,
                                            std::string_view version, GrpcDone done) {
  auto call = std::make_shared<GrpcCall>();
  call->done_cb_ = std::move(done);
  call->job_ = std::make_shared<Job>();
  call->job_->start = std::chrono::steady_clock::now();
  call->trace_ = std::move(trace);
  // The names, kept in the job's body for the access log's line.
  call->job_->body = std::string(model) + std::string(version);
  call->job_->req.model = std::string_view(call->job_->body).substr(0, model.size());
  call->job_->req.version = std::string_view(call->job_->body).substr(model.size());
  call->unrouted_ = std::move(counters);
  call->Fail(e);
  return call;
}

Counters* GrpcCall::counters() const { return fe_ ? fe_->counters() : unrouted_.get(); }

double GrpcCall::EffectiveTimeout(double deadline) const {
  double t = deadline;
  const double server_timeout = fe_ ? fe_->plan().request_timeout_s : 0.0;
  for (double other : {job_->req.timeout_s, server_timeout}) {
    if (other > 0 && (t <= 0 || other < t)) t = other;
  }
  return t;
}

void GrpcCall::Expire(double timeout) {
  RequestPtr r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    r = request_;
  }
  const bool cancelled = r && fe_->Cancel(r.get());
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled && !done_) {
    counters()->Add(&CounterValues::timed_out);
    Done(504, TimeoutMessage(timeout, fe_ && fe_->dynamic()));
  }
}

int GrpcCall::Result(double timeout) {
  // The first of: the call's deadline, the request's timeout parameter, the server's
  // request timeout.
  Wait(EffectiveTimeout(timeout), counters());
  return Complete();
}

int GrpcCall::Complete() {
  const int status = status_;
  const int64_t rows = status == 200 && job_ ? job_->req.rows : 0;
  AccessEntry e;
  e.protocol = "grpc";
  e.status = status;
  e.rows = rows;
  e.id = job_->req.id;
  e.model = job_->req.model;
  e.version = job_->req.version;
  if (e.version.empty() && fe_) e.version = fe_->plan().version;  // the one served
  e.trace = trace_;
  e.queue_s = queue_s_;
  e.compute_s = compute_s_;
  counters()->Record(e, job_->start, nullptr);
  if (admitted_) {  // it left the queue: one less in flight
    admitted_ = false;
    fe_->Answered();
  }
  return GrpcCode(status);
}

const std::string& GrpcCall::response() const { return job_->grpc.body; }

std::string GrpcCall::message() const { return ValidUtf8(Bounded(message_, 2048)); }

bool GrpcCall::Cancel() {
  RequestPtr r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;
    r = request_;
  }
  if (!r || !fe_->Cancel(r.get())) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) {
    counters()->Add(&CounterValues::disconnected);
    Done(499, "the client cancelled the call");
    cv_.notify_all();
  }
  return true;
}

std::shared_ptr<GrpcCall> FrontEnd::GrpcInfer(std::string msg, std::string trace,
                                              GrpcDone done) {
  auto call = std::make_shared<GrpcCall>();
  call->done_cb_ = std::move(done);
  call->trace_ = std::move(trace);
  auto job = std::make_shared<Job>();
  job->start = std::chrono::steady_clock::now();
  job->body = std::move(msg);
  call->job_ = job;
  call->fe_ = shared_from_this();
  const ModelPlan& m = plan_;
  if (draining_) {
    call->Fail({503, kShuttingDown});
    return call;
  }
  Error parsed;
  try {
    parsed = ParseGrpcInfer(m, job->body, &job->req);
    if (!parsed && !m.dynamic) StartGrpcAnswer(m, job->req, &job->grpc);
  } catch (const std::bad_alloc&) {
    parsed = {500, "the server ran out of memory parsing the call (std::bad_alloc)"};
  } catch (const std::exception& e) {
    parsed = {500, std::string("the server failed parsing the call: ") + e.what()};
  }
  if (parsed) {
    if (parsed.status >= 500) {
      std::fprintf(stderr, "paddle-ipu: a gRPC call failed in the server: %s\n",
                   parsed.message.c_str());
    }
    call->Fail(parsed);
    return call;
  }
  if (job->req.units == 0) {
    call->Fail({200, std::string()});
    return call;
  }
  RequestPtr r = MakeRequest(m, job, job->grpc.out, call.get(), call);
  {
    std::lock_guard<std::mutex> lock(call->mu_);
    call->request_ = r;
    // Before it is queued: the run may finish it, and its Complete() run on another
    // thread, before Admit() returns here (a decode thread's call).
    call->admitted_ = true;
  }
  if (Error e = Admit(r, job)) {
    {
      std::lock_guard<std::mutex> lock(call->mu_);
      call->admitted_ = false;  // not counted in flight: Admit() took it back
    }
    call->Fail(e);
  }
  return call;
}

}  // namespace serving
}  // namespace paddle_ipu
