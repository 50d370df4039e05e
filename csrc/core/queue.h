// ServingQueue: the request queue of the model runtime (paddle_ipu.serving).
//
// Requests hold zero-copy views (Py_buffer) of their inputs and of the output
// arrays they will be answered in. One worker thread takes micro-batches of
// rows from the queue, packing them straight into preallocated step buffers
// (zero-padded), runs the graph in Python, and scatters the rows of the outputs
// back. Waiting and copying happen without the GIL.
//
// Locking rule: code that holds the queue mutex never takes the GIL, and a
// Request (whose destructor releases Python buffers) is never destroyed while
// the mutex is held or the GIL is released: dropped requests go to a local
// vector that is destroyed after the GIL is taken back.
#pragma once

#include <Python.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace paddle_ipu {

using Clock = std::chrono::steady_clock;

enum class RequestState : int { kQueued = 0, kStarted = 1, kDone = 2, kFailed = 3, kCancelled = 4 };

class ServingQueue;

// One request: `units` units (rows when auto-batching, else micro-batches) of
// every input, answered into `outputs` (the same number of units).
struct Request {
  std::vector<Py_buffer> inputs;
  std::vector<Py_buffer> outputs;
  int64_t units = 0;
  int64_t taken = 0;  // units already put into runs
  int64_t done = 0;   // units whose outputs were written
  RequestState state = RequestState::kQueued;
  Clock::time_point arrived;
  PyObject* error = nullptr;  // owned; set (with the GIL) when failed
  PyObject* token = nullptr;  // owned; handed back to Python when finished
  std::condition_variable finished;
  std::shared_ptr<ServingQueue> queue;  // for wait() and cancel()

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();  // takes the GIL to release the buffers

  bool Finished() const {
    return state == RequestState::kDone || state == RequestState::kFailed ||
           state == RequestState::kCancelled;
  }
};

using RequestPtr = std::shared_ptr<Request>;

struct Piece {
  RequestPtr request;
  int64_t start;   // first unit of the request in this run
  int64_t offset;  // its unit in the run
  int64_t count;
};

struct QueueStats {
  int64_t runs = 0;
  int64_t requests = 0;
  int64_t units = 0;
  int64_t padded_units = 0;
  int64_t failed_runs = 0;
  double busy_seconds = 0.0;
  double queue_seconds = 0.0;  // summed over requests: arrival to first run
  std::vector<int64_t> fill_histogram;  // runs by units filled, 0..capacity
};

}  // namespace paddle_ipu
