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
// A route is removed when its runtime has closed (its specialisation left memory, see
// paddle_ipu.serving.shaped): its queue's counters stay in the statistics, and its
// shape's requests go to the handler again. A request that meets a route whose queue
// is closed (the runtime is closing) goes to the handler too.
//
// A routed request's sink is this object (it forwards to the request's own sink once
// the queue has finished it), so that Cancel() knows which requests are routed; a
// routed request keeps its ShapeRoutes alive (through its Job) until it is answered.
//
// A package of sequence buckets (paddle_ipu.serving.bucketed_runtime.BucketedRuntime)
// registers every bucket's runtime as a route with its Bucket: the sequence axes of
// the inputs and outputs, each sequence input's pad element and the bucket's length.
// A request of no routed shape whose sequence inputs agree on a length L up to the
// longest bucket goes to the shortest bucket B >= L: its sequence inputs are copied,
// padded to B, into its job (Job::padded), its outputs are written bucket-sized into
// Job::outputs and cut back to L on their sequence axes when the run delivers them
// (here, before the request's own sink renders them). Anything else (lengths that
// disagree, L beyond the longest bucket) is the handler's, which says what is wrong.
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

// The sequence description of a bucket's route, by tensor name (from Python).
struct Bucket {
  int64_t length = 0;
  // sequence input -> (its sequence axes, batch = 0; one pad element's bytes)
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> inputs;
  std::map<std::string, std::vector<int64_t>> outputs;  // output -> its sequence axes
};

// Copies the leading corner that blocks `from` (shape `fs`) and `to` (shape `ts`, the
// same rank) have in common, row-major, `elem` bytes an element: a smaller block into
// the corner of a larger one (padding) or the corner of a larger one out (cutting).
void CornerCopy(const char* from, const std::vector<int64_t>& fs, char* to,
                const std::vector<int64_t>& ts, int64_t elem);

class ShapeRoutes : public NativeSink, public std::enable_shared_from_this<ShapeRoutes> {
 public:
  // `model`: the dynamic model's plan (declared tensors, -1 where open).
  explicit ShapeRoutes(const ModelPlan* model) : model_(model) {}

  // Routes requests of the shape of `route` (the plan of a fixed runtime of the model
  // that auto-batches: its inputs' shapes besides the batch) to `queue`. Returns ""
  // when routed, else why not (then the handler keeps taking those requests).
  // With `bucket`: the route of a bucket of sequence lengths (see above), taking the
  // requests of every length up to its own that no shorter bucket holds.
  std::string Add(std::shared_ptr<ServingQueue> queue, ModelPlan route,
                  const Bucket* bucket = nullptr);

  // Stops routing the shape of `route` to `queue` (given to Add, not a bucket's; a
  // route of that shape to another queue, made since, stays); the queue's counters are
  // kept. Returns "" when removed, else why not.
  std::string Remove(const ServingQueue* queue, const ModelPlan& route);

  // Admits request `r` of `job` to the runtime of its shape (or bucket). Returns -1
  // when no route takes it (the handler takes it), else as SubmitNative: 0 queued, 1 busy,
  // 2 closed; with 1 (busy) and 4 (bad input: an index out of range), *error says
  // what to answer.
  int Submit(const RequestPtr& r, const std::shared_ptr<Job>& job, Error* error);

  // True when `r` was routed here; then *cancelled says whether it was taken back
  // before it started (it is then never answered through its sink).
  bool Cancel(Request* r, bool* cancelled);

  // The routes' (and buckets') queues' counters, added to `s` (not the fill histogram).
  void AddStats(QueueStats* s);
  size_t size();  // the shapes and buckets routed
  bool ever();    // whether a shape or bucket was ever routed

  void Deliver(std::vector<RequestPtr>&& finished) override;

 private:
  struct Route {
    std::shared_ptr<ServingQueue> queue;
    ModelPlan plan;
    std::vector<size_t> in_index;   // per model input: the route's input
    std::vector<size_t> out_index;  // per model output: the route's output
    int64_t length = 0;             // a bucket's sequence length (0: one shape)
    std::vector<std::vector<int64_t>> in_axes, out_axes;  // per model tensor
    std::vector<std::string> in_pad;                      // per model input
  };
  // A request on its way: its own sink; a padded one's job, route and length, for
  // cutting its outputs back.
  struct Routed {
    NativeSink* sink = nullptr;
    std::shared_ptr<Job> job;
    std::shared_ptr<Route> route;
    int64_t length = 0;
  };
  // The key of a request (or route) of these inputs' shapes, besides the batch.
  static std::string Key(const std::vector<std::vector<int64_t>>& shapes);
  // The key of the shape of `route` (a fixed runtime's plan), or "" with *why set.
  std::string RouteKey(const ModelPlan& route, std::string* why) const;
  // Checks `bucket` against the model and sets the route's sequence fields.
  std::string SetBucket(const Bucket& bucket, Route* r) const;
  // The shortest bucket that holds a request of `shapes` (null: none), its length *length.
  std::shared_ptr<Route> FindBucket(const std::vector<std::vector<int64_t>>& shapes,
                                    int64_t* length);
  // A finished padded request's outputs, cut back to its length.
  static void Cut(const Routed& routed);

  const ModelPlan* model_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Route>> routes_;
  std::vector<std::shared_ptr<Route>> buckets_;  // the buckets' routes, shortest first
  std::map<Request*, Routed> routed_;            // in flight
  QueueStats retired_;  // the counters of the routes removed
  bool ever_ = false;
};

}  // namespace serving
}  // namespace paddle_ipu
