// The model runtime's request queue (see queue.h): admission with backpressure,
// packing into step buffers, the flush timeout from the oldest request, splitting
// of large requests, scatter of the outputs, close and cancel.
#include "queue.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"

namespace py = pybind11;

namespace paddle_ipu {

namespace {

// Releases the GIL for a scope. (Plain C API: the threads that wait here may be
// Paddle executor threads, which share no pybind11 internals with this module.)
class NoGil {
 public:
  NoGil() : state_(PyEval_SaveThread()) {}
  ~NoGil() { PyEval_RestoreThread(state_); }
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  PyThreadState* state_;
};

// A C-contiguous Py_buffer of `obj`, or a TypeError naming `role`.
Py_buffer GetBuffer(py::handle obj, bool writable, const std::string& role) {
  Py_buffer view;
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    throw py::type_error(role + " must be a C-contiguous" + (writable ? " writable" : "") +
                         " buffer (a numpy array); got " +
                         std::string(Py_TYPE(obj.ptr())->tp_name));
  }
  return view;
}

void ReleaseBuffers(std::vector<Py_buffer>* views) {
  for (Py_buffer& v : *views) PyBuffer_Release(&v);
  views->clear();
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Waits longer than this (about three years) are waits without end: the clock's
// 64-bit nanoseconds would overflow near threading.TIMEOUT_MAX (292 years).
constexpr double kForeverSeconds = 1e8;

// A run whose outputs are at most this large is scattered without giving up the GIL.
constexpr int64_t kCopyWithGilBytes = 256 * 1024;

Clock::duration ToDuration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::min(seconds, kForeverSeconds)));
}

}  // namespace

Request::~Request() {
  if (inputs.empty() && outputs.empty() && error == nullptr && token == nullptr) return;
  if (!Py_IsInitialized()) return;  // interpreter shut down: the memory goes with it
  PyGILState_STATE gil = PyGILState_Ensure();
  ReleaseBuffers(&inputs);
  ReleaseBuffers(&outputs);
  Py_CLEAR(error);
  Py_CLEAR(token);
  PyGILState_Release(gil);
}

class ServingQueue : public std::enable_shared_from_this<ServingQueue> {
 public:
  // step_inputs: one C-contiguous writable array per model input, `capacity`
  // units long (the run's feed, preallocated and zeroed by the caller).
  // out_unit_bytes: bytes of one unit of every output.
  ServingQueue(const py::list& step_inputs, std::vector<int64_t> out_unit_bytes, int64_t capacity,
               int64_t limit, double timeout_s, bool auto_batch)
      : out_unit_bytes_(std::move(out_unit_bytes)),
        capacity_(capacity),
        limit_(limit),
        timeout_(ToDuration(timeout_s)),
        auto_batch_(auto_batch) {
    if (capacity < 1 || limit < 1) throw py::value_error("capacity and limit must be >= 1");
    if (!(timeout_s >= 0.0) || !std::isfinite(timeout_s)) {
      throw py::value_error("timeout_s must be a finite number >= 0");
    }
    for (size_t i = 0; i < step_inputs.size(); ++i) {
      Py_buffer view = GetBuffer(step_inputs[i], true, "step input " + std::to_string(i));
      steps_.push_back(view);
      if (view.len % capacity != 0) {
        ReleaseBuffers(&steps_);
        throw py::value_error("step input " + std::to_string(i) + " holds " +
                              std::to_string(view.len) + " bytes, not a multiple of capacity " +
                              std::to_string(capacity));
      }
      in_unit_bytes_.push_back(view.len / capacity);
    }
    for (int64_t b : out_unit_bytes_) out_run_bytes_ += b;
    stats_.fill_histogram.assign(static_cast<size_t>(capacity) + 1, 0);
    stats_.fill_seconds.assign(static_cast<size_t>(capacity) + 1, 0.0);
  }

  ~ServingQueue() {
    if (Py_IsInitialized()) {
      PyGILState_STATE gil = PyGILState_Ensure();
      ReleaseBuffers(&steps_);
      PyGILState_Release(gil);
    }
  }

  // Admits a request. Returns (0, request) when queued, (1, in_flight) when no
  // space freed within `timeout` seconds (negative: no limit), (2, None) when
  // the queue is closed.
  py::tuple Submit(const py::list& inputs, const py::list& outputs, int64_t units,
                   double timeout, py::object token) {
    if (units < 1) throw py::value_error("a request must have at least one unit");
    if (inputs.size() != in_unit_bytes_.size() || outputs.size() != out_unit_bytes_.size()) {
      throw py::value_error("expected " + std::to_string(in_unit_bytes_.size()) +
                            " inputs and " + std::to_string(out_unit_bytes_.size()) +
                            " outputs");
    }
    auto request = std::make_shared<Request>();
    request->units = units;
    request->queue = shared_from_this();
    // Views of the caller's arrays: no copy. Sizes are checked here, so the
    // copies made without the GIL stay inside every buffer.
    for (size_t i = 0; i < inputs.size(); ++i) {
      request->inputs.push_back(GetBuffer(inputs[i], false, "input " + std::to_string(i)));
      CheckSize(request->inputs.back(), units * in_unit_bytes_[i], "input", i);
      const Py_buffer& v = request->inputs.back();
      request->in.push_back({static_cast<char*>(v.buf), static_cast<int64_t>(v.len)});
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      request->outputs.push_back(GetBuffer(outputs[i], true, "output " + std::to_string(i)));
      CheckSize(request->outputs.back(), units * out_unit_bytes_[i], "output", i);
      const Py_buffer& v = request->outputs.back();
      request->out.push_back({static_cast<char*>(v.buf), static_cast<int64_t>(v.len)});
    }
    if (!token.is_none()) request->token = token.release().ptr();
    // Admitted without letting go of the GIL when there is space (the common case):
    // giving it up for a few instructions would let one of the other callers take it,
    // and this thread would wait behind it to return (the queue mutex is only ever
    // never held by a thread that waits for the GIL, so taking it here cannot deadlock).
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return py::make_tuple(2, py::none());
      if (inflight_units_ == 0 || inflight_units_ + units <= limit_) {
        AdmitLocked(request);
        return py::make_tuple(0, py::cast(request));
      }
    }
    int status = 0;
    int64_t in_flight = 0;
    {
      NoGil nogil;
      std::unique_lock<std::mutex> lock(mu_);
      const bool bounded = timeout >= 0.0;
      const auto deadline = Clock::now() + ToDuration(bounded ? timeout : 0.0);
      // A request larger than the whole bound is admitted when nothing else is in flight.
      while (!closed_ && inflight_units_ > 0 && inflight_units_ + units > limit_) {
        if (!bounded) {
          space_.wait(lock);
        } else if (space_.wait_until(lock, deadline) == std::cv_status::timeout &&
                   !closed_ && inflight_units_ > 0 && inflight_units_ + units > limit_) {
          status = 1;
          in_flight = inflight_units_;
          break;
        }
      }
      if (status == 0 && closed_) status = 2;
      if (status == 0) AdmitLocked(request);
    }
    if (status == 1) return py::make_tuple(1, in_flight);
    if (status == 2) return py::make_tuple(2, py::none());
    return py::make_tuple(0, py::cast(request));
  }

  // A request from C++ (see SubmitNative in queue.h): admitted now or never.
  int SubmitNativeRequest(const RequestPtr& request, int64_t* in_flight) {
    if (request->units < 1 || request->in.size() != in_unit_bytes_.size() ||
        request->out.size() != out_unit_bytes_.size() || request->sink == nullptr) {
      return 3;
    }
    for (size_t i = 0; i < request->in.size(); ++i) {
      if (request->in[i].len != request->units * in_unit_bytes_[i]) return 3;
    }
    for (size_t i = 0; i < request->out.size(); ++i) {
      if (request->out[i].len != request->units * out_unit_bytes_[i]) return 3;
    }
    request->queue = shared_from_this();
    std::lock_guard<std::mutex> lock(mu_);
    *in_flight = inflight_units_;
    if (closed_) return 2;
    // As Submit: a request larger than the whole bound is admitted when nothing
    // else is in flight.
    if (inflight_units_ > 0 && inflight_units_ + request->units > limit_) return 1;
    AdmitLocked(request);
    return 0;
  }

  // Waits for the next run and packs it into the step buffers. Returns the units
  // filled (the rest of the run is zero padding), or -1: stop.
  int64_t NextBatch() {
    std::vector<RequestPtr> dropped;  // destroyed after the GIL is back
    int64_t filled = 0;
    {
      NoGil nogil;
      std::unique_lock<std::mutex> lock(mu_);
      if (!current_.empty()) throw std::logic_error("next_batch() before the last run finished");
      // The first caller of the last run: the GIL is free now.
      PassBatonLocked(false, &dropped);
      while (true) {
        DropDeadHeads(&dropped);
        if (closed_ && cancel_) {
          WakeAllLocked(&dropped);
          return -1;
        }
        if (pending_.empty()) {
          if (closed_) {
            WakeAllLocked(&dropped);
            return -1;
          }
          WaitForWork(&lock, Clock::time_point::max(), &dropped);
          continue;
        }
        if (pending_units_ >= capacity_ || !auto_batch_ || closed_) break;
        const auto flush = pending_.front()->arrived + timeout_;
        if (Clock::now() >= flush) break;
        WaitForWork(&lock, flush, &dropped);
      }
      filled = Take(&dropped);
      lock.unlock();
      Pack(filled);
    }
    return filled;
  }

  // Scatters the run's outputs (C-contiguous, `capacity` units each) to the
  // requests of the run. Returns the tokens of the requests now answered.
  py::list Complete(const py::list& outputs, double busy_seconds) {
    if (outputs.size() != out_unit_bytes_.size()) {
      throw py::value_error("expected " + std::to_string(out_unit_bytes_.size()) + " outputs");
    }
    std::vector<Py_buffer> views;
    try {
      for (size_t i = 0; i < outputs.size(); ++i) {
        views.push_back(GetBuffer(outputs[i], false, "run output " + std::to_string(i)));
        CheckSize(views.back(), capacity_ * out_unit_bytes_[i], "run output", i);
      }
    } catch (...) {
      ReleaseBuffers(&views);
      throw;
    }
    std::vector<RequestPtr> finished;
    std::vector<Piece> pieces;
    {
      // A small run's rows are copied back with the GIL held: letting go of it for a
      // few microseconds of copying would make this worker, which every request
      // waits for, queue behind the callers for it.
      std::optional<NoGil> nogil;
      if (capacity_ * out_run_bytes_ > kCopyWithGilBytes) nogil.emplace();
      {
        std::lock_guard<std::mutex> lock(mu_);
        pieces.swap(current_);
      }
      // Only this thread writes a started request's outputs: no lock for the copy.
      for (const Piece& p : pieces) {
        Request& r = *p.request;
        if (r.state != RequestState::kStarted) continue;  // failed in an earlier run
        for (size_t i = 0; i < views.size(); ++i) {
          const int64_t unit = out_unit_bytes_[i];
          std::memcpy(r.out[i].buf + p.start * unit,
                      static_cast<const char*>(views[i].buf) + p.offset * unit, p.count * unit);
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const Piece& p : pieces) {
          Request& r = *p.request;
          if (r.state != RequestState::kStarted) continue;
          r.done += p.count;
          if (r.done == r.units) {
            r.state = RequestState::kDone;
            SignalInTurn(p.request);
            finished.push_back(p.request);
          }
        }
        EndRun(pieces, busy_seconds, false, static_cast<int64_t>(finished.size()));
      }
      DeliverNative(finished);
    }
    ReleaseBuffers(&views);
    return Tokens(finished);
  }

  // Fails every request of the current run with `error`; returns their tokens.
  py::list Fail(py::object error, double busy_seconds) {
    const std::string message = py::str(error);
    std::vector<Piece> pieces;
    std::vector<RequestPtr> finished;
    {
      std::lock_guard<std::mutex> lock(mu_);  // the GIL is held: fine, see queue.h
      pieces.swap(current_);
      for (const Piece& p : pieces) {
        Request& r = *p.request;
        if (r.state != RequestState::kStarted) continue;
        FailLocked(&r, error, message);
        finished.push_back(p.request);
      }
      EndRun(pieces, busy_seconds, true, static_cast<int64_t>(finished.size()));
    }
    DeliverNative(finished);
    return Tokens(finished);
  }

  // Fails every queued request with `error` (close with cancel, a broken worker,
  // a runtime closed before it started); returns their tokens.
  py::list FailPending(py::object error) {
    const std::string message = py::str(error);
    std::vector<RequestPtr> finished;
    std::deque<RequestPtr> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dropped.swap(pending_);
      for (const RequestPtr& r : dropped) {
        if (r->Finished()) continue;
        FailLocked(r.get(), error, message);
        finished.push_back(r);
      }
      pending_units_ = 0;
      space_.notify_all();
    }
    stats_requests_add(static_cast<int64_t>(finished.size()));
    DeliverNative(finished);
    return Tokens(finished);
  }

  void Close(bool cancel) {
    std::vector<RequestPtr> woken;  // (with the GIL: destroyed after the mutex)
    std::lock_guard<std::mutex> lock(mu_);
    WakeAllLocked(&woken);
    closed_ = true;
    cancel_ = cancel_ || cancel;
    work_.notify_all();
    space_.notify_all();
  }

  // Cancels a request that has not started; false once it has.
  bool Cancel(Request* r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->state != RequestState::kQueued) return false;
    r->state = RequestState::kCancelled;
    pending_units_ -= r->units - r->taken;
    inflight_units_ -= r->units - r->taken;
    r->Signal();
    space_.notify_all();
    return true;
  }

  // Waits (without the GIL) until the request is finished; false on timeout.
  bool Wait(Request* r, double timeout) {
    {
      std::lock_guard<std::mutex> lock(r->wait_mu);  // answered already: keep the GIL
      if (r->signalled) return true;
      r->waiting = true;
    }
    std::vector<RequestPtr> passed;  // destroyed once the GIL is back (see queue.h)
    NoGil nogil;
    {
      // The GIL is free: the next caller of the last run may take it now.
      std::lock_guard<std::mutex> lock(mu_);
      PassBatonLocked(false, &passed);
    }
    std::unique_lock<std::mutex> lock(r->wait_mu);
    bool done = true;
    if (timeout < 0.0) {
      r->finished.wait(lock, [r] { return r->signalled; });
    } else {
      done = r->finished.wait_for(lock, ToDuration(timeout), [r] { return r->signalled; });
    }
    r->waiting = false;
    return done;
  }

  RequestState State(const Request* r) {
    std::lock_guard<std::mutex> lock(mu_);
    return r->state;
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_;
  }
  int64_t in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return inflight_units_;
  }
  int64_t pending_units() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_units_;
  }
  int64_t capacity() const { return capacity_; }

  QueueStats StatsCopy() {
    std::lock_guard<std::mutex> lock(mu_);
    QueueStats s = stats_;
    s.in_flight = inflight_units_;
    return s;
  }

  py::dict Stats() {
    const QueueStats s = StatsCopy();
    py::dict d;
    d["runs"] = s.runs;
    d["requests"] = s.requests;
    d["units"] = s.units;
    d["padded_units"] = s.padded_units;
    d["failed_runs"] = s.failed_runs;
    d["busy_seconds"] = s.busy_seconds;
    d["queue_seconds"] = s.queue_seconds;
    d["fill_histogram"] = s.fill_histogram;
    return d;
  }

 private:
  void CheckSize(const Py_buffer& view, int64_t want, const char* role, size_t i) const {
    if (view.len != want) {
      throw py::value_error(std::string(role) + " " + std::to_string(i) + " holds " +
                            std::to_string(view.len) + " bytes, expected " +
                            std::to_string(want));
    }
  }

  void stats_requests_add(int64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.requests += n;
  }

  // The callers of a finished run are woken one at a time, each once the previous one
  // has given up the GIL (in its next Wait, or the worker in NextBatch): woken together,
  // they would all queue for the GIL at once and be put to sleep again in turn. A caller
  // that does not come back within kBatonStale is passed over by the worker.
  static constexpr auto kBatonStale = std::chrono::microseconds(200);

  // With mu_ held: a finished request whose caller waits joins the line; one nobody
  // waits for (a future's, a native one, a caller not there yet) is signalled now.
  void SignalInTurn(const RequestPtr& r) {
    bool blocked = false;
    {
      std::lock_guard<std::mutex> lock(r->wait_mu);
      blocked = r->waiting;
    }
    if (blocked) {
      baton_.push_back(r);
    } else {
      r->Signal();
    }
  }

  // With mu_ held: wake the next caller in line (``stale``: only if the last one was
  // woken kBatonStale ago or more). The request goes to ``keep``, for the caller to
  // destroy with the GIL held and the mutex not (see queue.h).
  void PassBatonLocked(bool stale, std::vector<RequestPtr>* keep) {
    if (baton_.empty()) return;
    const auto now = Clock::now();
    if (stale && now - baton_passed_ < kBatonStale) return;
    keep->push_back(std::move(baton_.front()));
    baton_.pop_front();
    baton_passed_ = now;
    keep->back()->Signal();
  }

  // With mu_ held: wake every caller in line (the queue closes, or its worker stops).
  void WakeAllLocked(std::vector<RequestPtr>* keep) {
    for (RequestPtr& r : baton_) {
      r->Signal();
      keep->push_back(std::move(r));
    }
    baton_.clear();
  }

  // With mu_ held (as ``lock``), the GIL released: one wait for work, until ``until``
  // at the latest, or until the baton's holder is late (then it is passed on); the
  // caller looks at the queue again after each.
  void WaitForWork(std::unique_lock<std::mutex>* lock, Clock::time_point until,
                   std::vector<RequestPtr>* keep) {
    if (!baton_.empty() && baton_passed_ + kBatonStale < until) {
      if (work_.wait_until(*lock, baton_passed_ + kBatonStale) == std::cv_status::timeout) {
        PassBatonLocked(true, keep);
      }
      return;
    }
    if (until == Clock::time_point::max()) {
      work_.wait(*lock);
    } else {
      work_.wait_until(*lock, until);
    }
  }

  // With mu_ held: queue an admitted request.
  void AdmitLocked(const RequestPtr& request) {
    request->arrived = Clock::now();
    const int64_t before = pending_units_;
    pending_.push_back(request);
    pending_units_ += request->units;
    inflight_units_ += request->units;
    // The worker waits for a first request or for the oldest one's timeout: wake it
    // only when that changes (a first request, a full run).
    if (!auto_batch_ || before == 0 ||
        (before < capacity_ && capacity_ <= before + request->units)) {
      work_.notify_one();
    }
  }

  // With mu_ held (and the GIL, for the error's reference count).
  void FailLocked(Request* r, const py::object& error, const std::string& message) {
    const int64_t left = r->units - r->taken;  // queued units that will not run
    if (r->state == RequestState::kQueued || r->state == RequestState::kStarted) {
      pending_units_ -= left;
      inflight_units_ -= left;
    }
    r->state = RequestState::kFailed;
    if (r->sink != nullptr) {
      // Native: no Python object, so that its destructor never needs the GIL.
      r->error_message = message;
    } else {
      Py_XDECREF(r->error);
      r->error = error.inc_ref().ptr();
    }
    r->Signal();
    space_.notify_all();
  }

  // With mu_ held: requests finished while queued (cancelled, or failed in an
  // earlier run) leave the head of the queue.
  void DropDeadHeads(std::vector<RequestPtr>* dropped) {
    while (!pending_.empty() && pending_.front()->Finished()) {
      dropped->push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
  }

  // With mu_ held: up to one run of units, in arrival order.
  int64_t Take(std::vector<RequestPtr>* dropped) {
    int64_t filled = 0;
    const auto now = Clock::now();
    while (!pending_.empty() && filled < capacity_) {
      RequestPtr& r = pending_.front();
      if (r->Finished()) {
        dropped->push_back(std::move(r));
        pending_.pop_front();
        continue;
      }
      if (r->state == RequestState::kQueued) {
        r->state = RequestState::kStarted;
        r->started = now;
        stats_.queue_seconds += Seconds(now - r->arrived);
      }
      const int64_t count = std::min(r->units - r->taken, capacity_ - filled);
      current_.push_back(Piece{r, r->taken, filled, count});
      r->taken += count;
      filled += count;
      pending_units_ -= count;
      if (r->taken == r->units) {
        dropped->push_back(std::move(r));  // the piece keeps it alive
        pending_.pop_front();
      }
    }
    return filled;
  }

  // Without mu_ (only the worker touches the step buffers and current_ here).
  void Pack(int64_t filled) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      const int64_t unit = in_unit_bytes_[i];
      char* dst = static_cast<char*>(steps_[i].buf);
      for (const Piece& p : current_) {
        std::memcpy(dst + p.offset * unit,
                    p.request->in[i].buf + p.start * unit,
                    p.count * unit);
      }
      // Zero padding: only the units a fuller earlier run left behind.
      if (dirty_units_ > filled) {
        std::memset(dst + filled * unit, 0, (dirty_units_ - filled) * unit);
      }
    }
    dirty_units_ = filled;
  }

  // With mu_ held.
  void EndRun(const std::vector<Piece>& pieces, double busy, bool failed, int64_t finished) {
    int64_t filled = 0;
    for (const Piece& p : pieces) {
      filled = std::max(filled, p.offset + p.count);
      p.request->compute_seconds += busy;
    }
    stats_.runs += 1;
    stats_.units += filled;
    stats_.padded_units += capacity_ - filled;
    stats_.busy_seconds += busy;
    stats_.requests += finished;
    if (failed) stats_.failed_runs += 1;
    stats_.fill_histogram[static_cast<size_t>(filled)] += 1;
    stats_.fill_seconds[static_cast<size_t>(filled)] += busy;
    inflight_units_ -= filled;
    space_.notify_all();
  }

  // Without the queue mutex: native requests go to their sinks, one Deliver per sink.
  static void DeliverNative(const std::vector<RequestPtr>& finished) {
    std::vector<std::pair<NativeSink*, std::vector<RequestPtr>>> groups;
    for (const RequestPtr& r : finished) {
      if (r->sink == nullptr) continue;
      size_t g = 0;
      while (g < groups.size() && groups[g].first != r->sink) ++g;
      if (g == groups.size()) groups.push_back({r->sink, {}});
      groups[g].second.push_back(r);
    }
    // A sink that fails (out of memory posting to an IO thread) loses its answers, not
    // the run's other requests, nor the worker.
    for (auto& g : groups) {
      try {
        g.first->Deliver(std::move(g.second));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "paddle-ipu: answering a run's requests failed: %s\n", e.what());
      }
    }
  }

  // With the GIL: the tokens of finished requests (each handed out once).
  static py::list Tokens(const std::vector<RequestPtr>& finished) {
    py::list out;
    for (const RequestPtr& r : finished) {
      if (r->token != nullptr) {
        out.append(py::reinterpret_steal<py::object>(r->token));
        r->token = nullptr;
      }
    }
    return out;
  }

  std::vector<Py_buffer> steps_;
  std::vector<int64_t> in_unit_bytes_;
  std::vector<int64_t> out_unit_bytes_;
  int64_t out_run_bytes_ = 0;  // bytes of one unit of every output, summed
  const int64_t capacity_;
  const int64_t limit_;
  const Clock::duration timeout_;
  const bool auto_batch_;

  std::mutex mu_;
  std::condition_variable work_;   // the worker waits here
  std::condition_variable space_;  // submitters wait here
  std::deque<RequestPtr> pending_;
  std::vector<Piece> current_;  // the run under way
  std::deque<RequestPtr> baton_;  // finished requests whose callers wait their turn
  Clock::time_point baton_passed_{};
  int64_t pending_units_ = 0;   // units queued, not yet in a run
  int64_t inflight_units_ = 0;  // units admitted and not yet answered
  int64_t dirty_units_ = 0;     // units of the step buffers holding old rows
  bool closed_ = false;
  bool cancel_ = false;
  QueueStats stats_;
};

int SubmitNative(ServingQueue* queue, const RequestPtr& request, int64_t* in_flight) {
  return queue->SubmitNativeRequest(request, in_flight);
}
bool CancelNative(Request* request) { return request->queue && request->queue->Cancel(request); }
std::shared_ptr<ServingQueue> QueueOf(py::handle obj) {
  return obj.cast<std::shared_ptr<ServingQueue>>();
}
QueueStats StatsOf(ServingQueue* queue) { return queue->StatsCopy(); }
bool ClosedOf(ServingQueue* queue) { return queue->closed(); }
int64_t CapacityOf(ServingQueue* queue) { return queue->capacity(); }

void RegisterQueue(py::module_& m) {
  py::enum_<RequestState>(m, "RequestState")
      .value("QUEUED", RequestState::kQueued)
      .value("STARTED", RequestState::kStarted)
      .value("DONE", RequestState::kDone)
      .value("FAILED", RequestState::kFailed)
      .value("CANCELLED", RequestState::kCancelled);

  py::class_<Request, RequestPtr>(m, "QueuedRequest",
                                  "A request in a ServingQueue (made by ServingQueue.submit).")
      .def(
          "wait",
          [](Request& r, py::object timeout) {
            return r.queue->Wait(&r, timeout.is_none() ? -1.0 : timeout.cast<double>());
          },
          py::arg("timeout") = py::none(),
          "Wait without the GIL until the request is answered; False on timeout.")
      .def(
          "cancel", [](Request& r) { return r.queue->Cancel(&r); },
          "Cancel the request if it has not started; False once it has.")
      .def_property_readonly("state", [](Request& r) { return r.queue->State(&r); })
      .def_property_readonly("error",
                             [](Request& r) -> py::object {
                               if (r.queue->State(&r) != RequestState::kFailed ||
                                   r.error == nullptr) {
                                 return py::none();
                               }
                               return py::reinterpret_borrow<py::object>(r.error);
                             })
      .def_property_readonly("units", [](const Request& r) { return r.units; });

  py::class_<ServingQueue, std::shared_ptr<ServingQueue>>(
      m, "ServingQueue",
      "The model runtime's request queue: requests are zero-copy views; a worker packs\n"
      "units into preallocated step buffers (zero-padded), flushing a partial run\n"
      "timeout_s after the oldest request arrived, and scatters the outputs back.")
      .def(py::init<const py::list&, std::vector<int64_t>, int64_t, int64_t, double, bool>(),
           py::arg("step_inputs"), py::arg("out_unit_bytes"), py::arg("capacity"),
           py::arg("limit"), py::arg("timeout_s"), py::arg("auto_batch"))
      .def("submit", &ServingQueue::Submit, py::arg("inputs"), py::arg("outputs"),
           py::arg("units"), py::arg("timeout") = -1.0, py::arg("token") = py::none(),
           "Admit a request: (0, request), (1, in_flight) when busy, (2, None) when closed.")
      .def("next_batch", &ServingQueue::NextBatch,
           "Wait for and pack the next run; the units filled, or -1 to stop.")
      .def("complete", &ServingQueue::Complete, py::arg("outputs"), py::arg("busy_seconds"),
           "Scatter the run's outputs; the tokens of the requests answered.")
      .def("fail", &ServingQueue::Fail, py::arg("error"), py::arg("busy_seconds"),
           "Fail the run's requests with error; their tokens.")
      .def("fail_pending", &ServingQueue::FailPending, py::arg("error"),
           "Fail every queued request with error; their tokens.")
      .def("close", &ServingQueue::Close, py::arg("cancel") = false)
      .def_property_readonly("closed", &ServingQueue::closed)
      .def_property_readonly("cancelled", &ServingQueue::cancelled)
      .def_property_readonly("in_flight", &ServingQueue::in_flight)
      .def_property_readonly("pending_units", &ServingQueue::pending_units)
      .def_property_readonly("capacity", &ServingQueue::capacity)
      .def("stats", &ServingQueue::Stats);
}

}  // namespace paddle_ipu
