// Dynamic models: requests of any shape (within the model's declared dims, -1 open)
// handed to a Python handler (paddle_ipu/serving/dynamic.py's DynamicModel) instead
// of a ServingQueue's step buffers.
//
// The IO thread parses and checks a request as for a fixed model (requests.h) and
// admits it to the model's DynamicQueue: bounded (a request over its limit is
// refused, 503), never blocking an IO thread. A worker thread of the queue takes the
// GIL, makes the request's numpy arrays, calls the handler's submit(feed) and hangs a
// callback on the future it returns; the callback copies the outputs out (with the
// GIL) and hands the request back to its sink (its IO thread, or its gRPC call),
// which renders the answer in C++. Python runs once per request here, except for
// the shapes (and buckets of sequence lengths) routed to a fixed runtime
// (shape_routes.h): those run without Python.
//
// Cancel() takes a request back when its client goes away or its timeout passes: one
// still queued is dropped; one handed to the handler has its future cancelled (by a
// worker, with the GIL) and its outputs, if they come, are dropped.
#pragma once

#include <pybind11/pytypes.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../core/queue.h"
#include "answers.h"
#include "plan.h"
#include "shape_routes.h"

namespace paddle_ipu {
namespace serving {

struct Job;

class DynamicQueue : public std::enable_shared_from_this<DynamicQueue> {
 public:
  // `model`: the handler (with the GIL); `limit`: requests in flight at most.
  DynamicQueue(pybind11::object model, const ModelPlan* plan, int64_t limit, int workers);
  ~DynamicQueue();

  void Start();
  // As SubmitNative: 0 queued, 1 busy, 2 closed; a request of a routed shape goes to
  // its runtime's queue (then 4: bad input; with 1 and 4, *error is the answer).
  int Submit(const RequestPtr& r, std::shared_ptr<Job> job, int64_t* in_flight, Error* error);
  // True: the request will not be answered through its sink (taken out of the queue,
  // or its future cancelled); false once its answer is on its way.
  bool Cancel(Request* r);
  // No new requests; the workers stop once those queued were handed over (Stop()
  // waits for them, call without the GIL).
  void Stop();
  bool closed() const;
  QueueStats Stats();
  ShapeRoutes* routes() { return routes_.get(); }

 private:
  struct Item {
    RequestPtr r;
    std::shared_ptr<Job> job;
    pybind11::object future;  // set and released with the GIL
    std::chrono::steady_clock::time_point arrived, started;
  };
  void Loop();
  void Handle(const std::shared_ptr<Item>& item);  // with the GIL
  void Done(const std::shared_ptr<Item>& item, pybind11::handle future);  // with the GIL
  void Finish(const std::shared_ptr<Item>& item, RequestState state);

  pybind11::object model_;
  const ModelPlan* plan_;
  std::shared_ptr<ShapeRoutes> routes_;
  int64_t limit_;
  int workers_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> queued_;
  std::map<Request*, std::shared_ptr<Item>> started_;
  std::vector<std::shared_ptr<Item>> cancels_;  // futures to cancel
  std::vector<std::thread> threads_;
  bool closed_ = false;
  int64_t in_flight_ = 0;
  QueueStats stats_;
};

}  // namespace serving
}  // namespace paddle_ipu
