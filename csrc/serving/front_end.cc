// The front end's state shared by HTTP and gRPC: the plan, the queue, the counters,
// admission and draining (see front_end.h).
#include "front_end.h"

#include <cstdio>

#include "clock.h"
#include "dynamic.h"

#include "metadata.h"
#include "text.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace serving {

RequestPtr MakeRequest(const ModelPlan& m, const std::shared_ptr<Job>& job,
                       const std::vector<char*>& out, NativeSink* sink,
                       std::shared_ptr<void> owner) {
  auto r = std::make_shared<Request>();
  r->units = job->req.units;
  r->sink = sink;
  r->owner = std::move(owner);
  if (m.dynamic) return r;  // no spans: the handler gets the parsed request
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    r->in.push_back({const_cast<char*>(job->req.in[k]), r->units * m.inputs[k].unit_bytes});
  }
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    r->out.push_back({out[i], r->units * m.outputs[i].unit_bytes});
  }
  return r;
}

Error RunError(const Request& r) {
  if (r.state == RequestState::kCancelled || r.error_message.find("closed") != std::string::npos) {
    return {503, r.error_message.empty() ? "the model runtime is closed" : r.error_message};
  }
  return {500, "inference failed: " + r.error_message};
}

std::string TimeoutMessage(double seconds, bool dynamic) {
  char ms[32];
  std::snprintf(ms, sizeof(ms), "%g", seconds * 1e3);
  if (dynamic) {  // its future was cancelled: a result that comes later is dropped
    return std::string("the model did not answer within the request's timeout of ") + ms +
           " ms: the server is busy; retry later or allow a longer timeout";
  }
  return std::string("the request was not started within its timeout of ") + ms +
         " ms: the server is busy; retry later or allow a longer timeout";
}

FrontEnd::FrontEnd(py::object queue, ModelPlan plan) : queue_obj_(queue), plan_(std::move(plan)) {
  if (plan_.dynamic) {
    dynamic_ = std::make_shared<DynamicQueue>(queue, &plan_, plan_.limit, plan_.workers);
  } else {
    queue_ = QueueOf(queue);
  }
  metadata_ = ModelMetadataJson(plan_);
  server_metadata_ = ServerMetadataJson(plan_.server_version);
  config_ = ModelConfigJson(plan_);
  config_message_ = ModelConfigMessage(plan_, &config_refused_);
}

// The last owner may be an IO thread (a connection that served the model, after an
// unload): the queue's Python object is released with the GIL.
FrontEnd::~FrontEnd() {
  if (Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    queue_obj_ = py::object();
    PyGILState_Release(gil);
  } else {
    queue_obj_.release();  // no interpreter left to give it back to
  }
}

void FrontEnd::Start() {
  if (dynamic_) dynamic_->Start();
}

void FrontEnd::StopWorkers() {
  if (dynamic_) dynamic_->Stop();
}

bool FrontEnd::ready() const {
  const bool closed = dynamic_ ? dynamic_->closed() : ClosedOf(queue_.get());
  return ready_.load() && !draining_.load() && !closed;
}

std::string FrontEnd::Statistics(bool message) {
  const QueueStats s = dynamic_ ? dynamic_->Stats() : StatsOf(queue_.get());
  SpecialisationValues v;
  {
    std::lock_guard<std::mutex> lock(specialisations_mu_);
    v = specialisations_;
  }
  return message ? serving::StatisticsMessage(plan_, counters_.Copy(), s, &v)
                 : serving::StatisticsJson(plan_, counters_.Copy(), s, &v);
}

std::string FrontEnd::Prometheus() {
  const QueueStats s = dynamic_ ? dynamic_->Stats() : StatsOf(queue_.get());
  SpecialisationValues v;
  {
    std::lock_guard<std::mutex> lock(specialisations_mu_);
    v = specialisations_;
  }
  return serving::Prometheus(plan_, counters_.Copy(), s, active.load(), &v);
}

void FrontEnd::SetSpecialisations(const SpecialisationValues& v) {
  std::lock_guard<std::mutex> lock(specialisations_mu_);
  specialisations_ = v;
  specialisations_.set = true;
}

std::string FrontEnd::RemoveRoute(py::handle queue, const ModelPlan& plan) {
  if (!dynamic_) return "model " + Quote(plan_.name) + " is a fixed model: it has one shape";
  return dynamic_->routes()->Remove(QueueOf(queue).get(), plan);
}

std::string FrontEnd::AddRoute(py::handle queue, ModelPlan plan, const Bucket* bucket) {
  if (!dynamic_) return "model " + Quote(plan_.name) + " is a fixed model: it has one shape";
  return dynamic_->routes()->Add(QueueOf(queue), std::move(plan), bucket);
}

size_t FrontEnd::routes() const { return dynamic_ ? dynamic_->routes()->size() : 0; }

bool FrontEnd::Cancel(Request* r) { return dynamic_ ? dynamic_->Cancel(r) : CancelNative(r); }

Error FrontEnd::Failure(const Request& r, const Job& job) const {
  if (dynamic_ && r.state == RequestState::kFailed && job.failure) return job.failure;
  return RunError(r);
}

Error FrontEnd::Admit(const RequestPtr& r, const std::shared_ptr<Job>& job) {
  // Counted before the check, so that Close() + Drain() never miss a request admitted
  // between the two.
  active += 1;
  if (draining_) {
    Answered();
    return {503, "model " + Quote(plan_.name) + " version " + Quote(plan_.version) +
                     " is unloading or the server is stopping: no new requests are accepted"};
  }
  int64_t in_flight = 0;
  Error routed;  // a dynamic model's request of a routed shape: its answer, if refused
  const int submitted = dynamic_ ? dynamic_->Submit(r, job, &in_flight, &routed)
                                 : SubmitNative(queue_.get(), r, &in_flight);
  if (submitted != 0) Answered();
  if (routed) {
    if (submitted == 1) counters_.Add(&CounterValues::rejected_busy);
    return routed;
  }
  switch (submitted) {
    case 0: return {};
    case 1:
      counters_.Add(&CounterValues::rejected_busy);
      return {503, "the server is busy: " + std::to_string(in_flight) + " of " +
                       std::to_string(plan_.limit) +
                       (plan_.dynamic      ? " requests"
                        : plan_.auto_batch ? " rows"
                                           : " micro-batches") +
                       " in flight (num_buffers); retry later"};
    case 2: return {503, "the model runtime is closed: no new requests are accepted"};
    default: return {500, "internal error: the request's sizes do not match the queue's"};
  }
}

void FrontEnd::Answered() {
  active -= 1;
  NotifyDrain();
}

void FrontEnd::NotifyDrain() {
  std::lock_guard<std::mutex> lock(drain_mu_);
  drained_.notify_all();
}

bool FrontEnd::Drain(double timeout) {
  std::unique_lock<std::mutex> lock(drain_mu_);
  auto done = [this] { return active.load() == 0; };
  if (timeout < 0) {
    drained_.wait(lock, done);
    return true;
  }
  return drained_.wait_until(lock, DeadlineAfter(timeout), done);
}

}  // namespace serving
}  // namespace paddle_ipu
