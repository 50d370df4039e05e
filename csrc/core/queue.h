// ServingQueue: the request queue of the model runtime (paddle_ipu.serving).
//
// Requests hold zero-copy views (Py_buffer) of their inputs and of the output
// arrays they will be answered in. One worker thread takes micro-batches of
// rows from the queue, packing them straight into preallocated step buffers
// (zero-padded), runs the graph in Python, and scatters the rows of the outputs
// back. Waiting and copying happen without the GIL.
//
// Requests come from Python (ModelRuntime.run/submit: Py_buffer views, answered
// through a token) or from C++ (the serving front ends in csrc/serving: spans of
// memory the front end owns, answered through a NativeSink, no Python object and
// no GIL anywhere on their path).
//
// Locking rule: code that holds the queue mutex never takes the GIL, and a
// Request (whose destructor releases Python buffers) is never destroyed while
// the mutex is held or the GIL is released: dropped requests go to a local
// vector that is destroyed after the GIL is taken back.
#pragma once

#include <Python.h>
#include <pybind11/pytypes.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace paddle_ipu {

using Clock = std::chrono::steady_clock;

enum class RequestState : int { kQueued = 0, kStarted = 1, kDone = 2, kFailed = 3, kCancelled = 4 };

class ServingQueue;
struct Request;
using RequestPtr = std::shared_ptr<Request>;

// Answers native requests. Called by the worker without the queue mutex (with or
// without the GIL: an implementation must take neither), once per run and sink,
// with the requests of that sink the run finished.
struct NativeSink {
  virtual ~NativeSink() = default;
  virtual void Deliver(std::vector<RequestPtr>&& finished) = 0;
};

// Where a request's units are read from or written to.
struct Span {
  char* buf;
  int64_t len;
};

// One request: `units` units (rows when auto-batching, else micro-batches) of
// every input, answered into `outputs` (the same number of units).
struct Request {
  std::vector<Py_buffer> inputs;  // Python requests: the views (released with the GIL)
  std::vector<Py_buffer> outputs;
  std::vector<Span> in;  // every request: its inputs and outputs
  std::vector<Span> out;
  NativeSink* sink = nullptr;     // native requests: who answers
  std::shared_ptr<void> owner;    // native requests: keeps the spans' memory alive
  std::string error_message;      // native requests: why they failed
  int64_t units = 0;
  int64_t taken = 0;  // units already put into runs
  int64_t done = 0;   // units whose outputs were written
  RequestState state = RequestState::kQueued;
  Clock::time_point arrived;
  Clock::time_point started{};  // put into its first run (state kStarted)
  double compute_seconds = 0;   // the graph runs it was part of, summed
  PyObject* error = nullptr;  // owned; set (with the GIL) when failed
  PyObject* token = nullptr;  // owned; handed back to Python when finished
  // Its caller waits on the request's own mutex, not the queue's: the callers of a
  // run, woken together, do not then queue for one mutex (taken after the queue's,
  // never with the GIL wanted).
  std::mutex wait_mu;
  std::condition_variable finished;
  bool signalled = false;  // under wait_mu: finished (done, failed or cancelled)
  bool waiting = false;    // under wait_mu: a caller is blocked in Wait
  std::shared_ptr<ServingQueue> queue;  // for wait() and cancel()

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();  // takes the GIL to release the buffers

  bool Finished() const {
    return state == RequestState::kDone || state == RequestState::kFailed ||
           state == RequestState::kCancelled;
  }

  // With the queue's mutex held, once the state is final: wakes the waiters.
  void Signal() {
    {
      std::lock_guard<std::mutex> lock(wait_mu);
      signalled = true;
    }
    finished.notify_all();
  }
};

struct Piece {
  RequestPtr request;
  int64_t start;   // first unit of the request in this run
  int64_t offset;  // its unit in the run
  int64_t count;
};

// The queue's counters, as Python (ServingQueue.stats) and the front ends in
// csrc/serving (statistics, /metrics) report them.
struct QueueStats {
  int64_t runs = 0;
  int64_t requests = 0;
  int64_t units = 0;
  int64_t padded_units = 0;
  int64_t failed_runs = 0;
  double busy_seconds = 0.0;
  double queue_seconds = 0.0;  // summed over requests: arrival to first run
  std::vector<int64_t> fill_histogram;  // runs by units filled, 0..capacity
  std::vector<double> fill_seconds;     // busy seconds of those runs, by units filled
  int64_t in_flight = 0;  // in a copy (StatsOf): units admitted, not yet answered
};

// The native interface of the queue, for the front ends in csrc/serving.
// Admits a request whose units, in/out spans, sink and owner the caller set: never
// blocks, needs no GIL. 0 queued, 1 busy (no space now), 2 closed, 3 sizes wrong.
int SubmitNative(ServingQueue* queue, const RequestPtr& request, int64_t* in_flight);
// Cancels a request that has not started (it is then never computed); false once it has.
bool CancelNative(Request* request);
// The queue of a Python ServingQueue object (with the GIL), kept alive by the pointer.
std::shared_ptr<ServingQueue> QueueOf(pybind11::handle obj);
// A copy of the counters, in_flight included, taken at one instant.
QueueStats StatsOf(ServingQueue* queue);
bool ClosedOf(ServingQueue* queue);
int64_t CapacityOf(ServingQueue* queue);

}  // namespace paddle_ipu
