// Dynamic models' queue and answers (see dynamic.h).
#include "dynamic.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>

#include "front_end.h"
#include "json_tensors.h"
#include "protobuf.h"
#include "text.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace serving {

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The HTTP status of an exception a handler raised: bad input 400, a closed or busy
// runtime 503, else 500.
Error HandlerError(const py::error_already_set& e) {
  py::module_ errors = py::module_::import("paddle_ipu.errors");
  const std::string what = py::str(e.value());
  const std::string type = py::str(e.type().attr("__name__"));
  auto is = [&](py::handle cls) { return e.matches(cls); };
  if (is(errors.attr("RuntimeClosedError")) || is(errors.attr("RuntimeBusyError"))) {
    return {503, type + ": " + what};
  }
  if (is(PyExc_ValueError) || is(PyExc_KeyError) || is(PyExc_TypeError) ||
      is(PyExc_IndexError)) {
    return {400, type + ": " + what};
  }
  return {500, "the model's handler failed: " + type + ": " + what};
}

bool ShapeFits(const TensorPlan& t, const std::vector<int64_t>& shape) {
  bool fits = shape.size() == t.shape.size();
  for (size_t d = 0; fits && d < shape.size(); ++d) fits = t.shape[d] < 0 || t.shape[d] == shape[d];
  return fits;
}

// A BYTES output: an array of bytes (or str: UTF-8) elements, length-prefixed.
Error ReadBytes(const TensorPlan& t, py::array a, OutTensor* o) {
  const std::string kind = py::str(a.dtype().attr("kind"));
  if (kind != "O" && kind != "S" && kind != "U") {
    return {500, "output " + Repr(t.name) + ": the model declares BYTES (an object array of "
                 "bytes), its handler gave " + std::string(py::str(a.dtype().attr("name")))};
  }
  for (py::ssize_t d = 0; d < a.ndim(); ++d) o->shape.push_back(a.shape(d));
  if (!ShapeFits(t, o->shape)) {
    return {500, "output " + Repr(t.name) + ": the model declares shape " + ShapeStr(t.shape) +
                     ", its handler gave " + ShapeStr(o->shape)};
  }
  for (py::handle e : py::list(a.attr("reshape")(-1).attr("tolist")())) {
    if (PyBytes_Check(e.ptr())) {
      PutBytesElement(&o->data, std::string_view(PyBytes_AS_STRING(e.ptr()),
                                                 static_cast<size_t>(PyBytes_GET_SIZE(e.ptr()))));
    } else if (PyUnicode_Check(e.ptr())) {
      PutBytesElement(&o->data, std::string(py::str(e)));
    } else {
      return {500, "output " + Repr(t.name) + ": a BYTES element is " +
                       std::string(py::str(py::type::of(e).attr("__name__"))) +
                       ", not bytes or str"};
    }
  }
  return {};
}

// The handler's outputs, checked against the plan: a dict by name or a list in order.
Error ReadOutputs(const ModelPlan& m, py::handle result, std::vector<OutTensor>* outs) {
  const bool by_name = py::isinstance<py::dict>(result);
  const py::module_ np = py::module_::import("numpy");
  py::list listed;
  if (!by_name) {
    listed = py::list(py::reinterpret_borrow<py::object>(result));
    if (listed.size() != m.outputs.size()) {
      return {500, "the model's handler gave " + std::to_string(listed.size()) +
                       " outputs, the model declares " + std::to_string(m.outputs.size()) +
                       " (" + ReprNames(m.outputs, false) + ")"};
    }
  }
  py::dict named = by_name ? py::reinterpret_borrow<py::dict>(result) : py::dict();
  outs->assign(m.outputs.size(), {});
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const TensorPlan& t = m.outputs[i];
    py::object value;
    if (by_name) {
      if (!named.contains(t.name)) {
        return {500, "the model's handler gave no output " + Repr(t.name)};
      }
      value = named[py::str(t.name)];
    } else {
      value = listed[i];
    }
    if (t.dtype == DType::kBytes) {
      // An object array: numpy's fixed-width bytes ("S") would drop trailing zero bytes.
      py::object arr = np.attr("asarray")(value, py::arg("dtype") = "object");
      if (Error e = ReadBytes(t, arr, &(*outs)[i])) return e;
      continue;
    }
    py::array a = np.attr("ascontiguousarray")(value);
    const std::string dtype = py::str(a.dtype().attr("name"));
    if (dtype != NumpyName(t.dtype)) {
      return {500, "output " + Repr(t.name) + ": the model declares " + V2Name(t.dtype) +
                       " (" + NumpyName(t.dtype) + "), its handler gave " + dtype};
    }
    OutTensor& o = (*outs)[i];
    for (py::ssize_t d = 0; d < a.ndim(); ++d) o.shape.push_back(a.shape(d));
    if (!ShapeFits(t, o.shape)) {
      return {500, "output " + Repr(t.name) + ": the model declares shape " + ShapeStr(t.shape) +
                       ", its handler gave " + ShapeStr(o.shape)};
    }
    o.data.assign(static_cast<const char*>(a.data()), static_cast<size_t>(a.nbytes()));
  }
  return {};
}

// A BYTES input (checked: Elements(shape) length-prefixed elements at `p`) as a numpy
// object array of bytes.
py::object BytesArray(const char* p, const std::vector<int64_t>& shape) {
  const int64_t n = Elements(shape);
  py::list items(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t len = Load<uint32_t>(p);
    items[static_cast<size_t>(i)] = py::bytes(p + 4, len);
    p += 4 + len;
  }
  const py::module_ np = py::module_::import("numpy");
  py::object a = np.attr("empty")(n, py::arg("dtype") = "object");
  a[py::slice(0, n, 1)] = items;
  return a.attr("reshape")(py::cast(shape));
}

}  // namespace

DynamicQueue::DynamicQueue(py::object model, const ModelPlan* plan, int64_t limit, int workers)
    : model_(std::move(model)),
      plan_(plan),
      routes_(std::make_shared<ShapeRoutes>(plan)),
      limit_(limit),
      workers_(workers) {}

DynamicQueue::~DynamicQueue() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.detach();
  }
  if (Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    model_ = py::object();
    PyGILState_Release(gil);
  } else {
    model_.release();
  }
}

void DynamicQueue::Start() {
  auto self = shared_from_this();
  for (int i = 0; i < workers_; ++i) threads_.emplace_back([self] { self->Loop(); });
}

int DynamicQueue::Submit(const RequestPtr& r, std::shared_ptr<Job> job, int64_t* in_flight,
                         Error* error) {
  const int routed = routes_->Submit(r, job, error);
  if (routed >= 0) return routed;
  std::lock_guard<std::mutex> lock(mu_);
  *in_flight = in_flight_;
  if (closed_) return 2;
  if (in_flight_ >= limit_) return 1;
  auto item = std::make_shared<Item>();
  item->r = r;
  item->job = std::move(job);
  item->arrived = std::chrono::steady_clock::now();
  r->arrived = item->arrived;
  r->state = RequestState::kQueued;
  queued_.push_back(std::move(item));
  in_flight_ += 1;
  cv_.notify_one();
  return 0;
}

bool DynamicQueue::Cancel(Request* r) {
  bool cancelled = false;
  if (routes_->Cancel(r, &cancelled)) return cancelled;
  std::lock_guard<std::mutex> lock(mu_);
  if (r->state != RequestState::kQueued && r->state != RequestState::kStarted) return false;
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    if ((*it)->r.get() == r) {
      r->state = RequestState::kCancelled;
      queued_.erase(it);  // no Python object yet: released without the GIL
      in_flight_ -= 1;
      return true;
    }
  }
  auto it = started_.find(r);
  if (it == started_.end()) return false;
  r->state = RequestState::kCancelled;
  cancels_.push_back(it->second);  // its future is cancelled by a worker
  cv_.notify_one();
  return true;
}

void DynamicQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
}

bool DynamicQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

QueueStats DynamicQueue::Stats() {
  QueueStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.in_flight = in_flight_;
  }
  routes_->AddStats(&s);
  return s;
}

void DynamicQueue::Loop() {
  // One Python thread state for the thread's life (its threading.local values, such
  // as Paddle's static-graph mode, persist as in any Python thread); the GIL is let
  // go while the thread waits.
  py::gil_scoped_acquire python;
  for (;;) {
    std::shared_ptr<Item> item;
    std::vector<std::shared_ptr<Item>> cancels;
    {
      py::gil_scoped_release nogil;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return closed_ || !queued_.empty() || !cancels_.empty(); });
      cancels.swap(cancels_);
      if (!queued_.empty()) {
        item = std::move(queued_.front());
        queued_.pop_front();
        item->r->state = RequestState::kStarted;
        started_[item->r.get()] = item;
        item->started = std::chrono::steady_clock::now();
        item->r->started = item->started;
        stats_.queue_seconds += Seconds(item->started - item->arrived);
      } else if (cancels.empty()) {
        return;  // closed, nothing left
      }
    }
    // Nothing a request brings may end this thread (its exception would end the
    // process): what escapes the handler's own checks is logged.
    try {
      for (const auto& c : cancels) {
        if (c->future) c->future.attr("cancel")();
      }
      cancels.clear();
      if (item) Handle(item);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "paddle-ipu: a dynamic model's worker caught: %s\n", e.what());
    }
    cancels.clear();
    item.reset();
  }
}

void DynamicQueue::Handle(const std::shared_ptr<Item>& item) {
  const ModelPlan& m = *plan_;
  const InferRequest& req = item->job->req;
  try {
    py::dict feed;
    for (size_t k = 0; k < m.inputs.size(); ++k) {
      const TensorPlan& t = m.inputs[k];
      const std::vector<int64_t>& shape = req.in_shapes[k];
      if (t.dtype == DType::kBytes) {
        feed[py::str(t.name)] = BytesArray(req.in[k], shape);
      } else {
        feed[py::str(t.name)] = py::array(py::dtype(NumpyName(t.dtype)), shape, req.in[k]);
      }
    }
    py::object future = model_.attr("submit")(feed);
    {
      std::lock_guard<std::mutex> lock(mu_);
      item->future = future;
    }
    std::weak_ptr<DynamicQueue> weak = shared_from_this();
    future.attr("add_done_callback")(py::cpp_function([weak, item](py::handle f) {
      if (auto self = weak.lock()) self->Done(item, f);
    }));
  } catch (py::error_already_set& e) {
    item->job->failure = HandlerError(e);
    Finish(item, RequestState::kFailed);
  } catch (const std::exception& e) {
    item->job->failure = {500, std::string("the model's request failed: ") + e.what()};
    Finish(item, RequestState::kFailed);
  }
}

void DynamicQueue::Done(const std::shared_ptr<Item>& item, py::handle future) {
  RequestState state = RequestState::kDone;
  try {
    if (future.attr("cancelled")().cast<bool>()) {
      state = RequestState::kCancelled;
    } else {
      py::object result = future.attr("result")();
      if (Error e = ReadOutputs(*plan_, result, &item->job->outputs)) {
        item->job->failure = e;
        state = RequestState::kFailed;
      }
    }
  } catch (py::error_already_set& e) {
    item->job->failure = HandlerError(e);
    state = RequestState::kFailed;
  } catch (const std::exception& e) {
    item->job->failure = {500, std::string("the model's answer failed: ") + e.what()};
    state = RequestState::kFailed;
  }
  Finish(item, state);
}

// With the GIL: the request leaves the queue; its sink answers it unless cancelled.
void DynamicQueue::Finish(const std::shared_ptr<Item>& item, RequestState state) {
  bool deliver = false;
  py::object future;
  // A model with routes (per-shape or bucketed runtimes; routes removed since
  // included) runs the handler's request in a route's queue, whose counters the
  // statistics sum already (AddStats): counted here too, a shape's first request was
  // two runs.
  const bool routed = routes_->ever();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_.erase(item->r.get()) == 0) return;  // answered already
    in_flight_ -= 1;
    const double busy = Seconds(std::chrono::steady_clock::now() - item->started);
    if (!routed) {
      stats_.runs += 1;
      stats_.requests += 1;
      stats_.units += 1;
      if (state != RequestState::kDone) stats_.failed_runs += 1;
      stats_.busy_seconds += busy;
    }
    item->r->compute_seconds = busy;  // the handler's time: its future's
    deliver = item->r->state == RequestState::kStarted;
    if (deliver) {
      item->r->state = state;
      if (state == RequestState::kFailed) item->r->error_message = item->job->failure.message;
    }
    future = std::move(item->future);
  }
  if (deliver) item->r->sink->Deliver({item->r});
  (void)future;  // released here, with the GIL
}

}  // namespace serving
}  // namespace paddle_ipu
