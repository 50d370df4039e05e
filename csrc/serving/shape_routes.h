// The shapes of a dynamic model that run without Python.
//
// A dynamic model over a runtime compiled per input shape
// (paddle_ipu.serving.shaped.ShapeRuntime) makes a fixed model runtime, with its own
// ServingQueue, the first time a request brings a new shape; that first request goes
// through the model's Python handler (it compiles). The runtime is then registered
// here as a route: from then on, a request whose inputs have that shape (besides the
// batch) is checked against the runtime's plan (the index ranges) and admitted to
// its queue on the IO thread, exactly as a fixed model's request is, its outputs
// written by the queue into the request's job (Job::outputs), which the dynamic
// model's answer writers render. No Python object is made or touched for it.
//
// A routed request's sink is this object (it forwards to the request's own sink once
// the queue has finished it), so that Cancel() knows which requests are routed; a
// routed request keeps its ShapeRoutes alive (through its Job) until it is answered.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../core/queue.h"
#include "plan.h"

namespace paddle_ipu {
namespace serving {

struct Job;

class ShapeRoutes : public NativeSink, public std::enable_shared_from_this<ShapeRoutes> {
 public:
  // `model`: the dynamic model's plan (declared tensors, -1 where open).
  explicit ShapeRoutes(const ModelPlan* model) : model_(model) {}

  // Routes requests of the shape of `route` (the plan of a fixed runtime of the model
  // that auto-batches: its inputs' shapes besides the batch) to `queue`. Returns ""
  // when routed, else why not (then the handler keeps taking those requests).
  std::string Add(std::shared_ptr<ServingQueue> queue, ModelPlan route);

  // Admits request `r` of `job` to the runtime of its shape. Returns -1 when no route
  // has its shape (the handler takes it), else as SubmitNative: 0 queued, 1 busy,
  // 2 closed; with 1 (busy) and 4 (bad input: an index out of range), *error says
  // what to answer.
  int Submit(const RequestPtr& r, const std::shared_ptr<Job>& job, Error* error);

  // True when `r` was routed here; then *cancelled says whether it was taken back
  // before it started (it is then never answered through its sink).
  bool Cancel(Request* r, bool* cancelled);

  // The routes' queues' counters, added to `s` (not the fill histogram).
  void AddStats(QueueStats* s);
  size_t size();

  void Deliver(std::vector<RequestPtr>&& finished) override;

 private:
  struct Route {
    std::shared_ptr<ServingQueue> queue;
    ModelPlan plan;
    std::vector<size_t> in_index;   // per model input: the route's input
    std::vector<size_t> out_index;  // per model output: the route's output
  };
  // The key of a request (or route) of these inputs' shapes, besides the batch.
  static std::string Key(const std::vector<std::vector<int64_t>>& shapes);

  const ModelPlan* model_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Route>> routes_;
  std::map<Request*, NativeSink*> routed_;  // in flight: their own sinks
};

}  // namespace serving
}  // namespace paddle_ipu
