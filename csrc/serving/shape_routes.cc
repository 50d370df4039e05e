// The shapes of a dynamic model that run without Python (see shape_routes.h).
#include "shape_routes.h"

#include "checks.h"
#include "front_end.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

std::string ShapeRoutes::Key(const std::vector<std::vector<int64_t>>& shapes) {
  std::string key;
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (k) key += ';';
    for (size_t d = 0; d < shapes[k].size(); ++d) {
      if (d) key += 'x';
      key += std::to_string(shapes[k][d]);
    }
  }
  return key;
}

namespace {

// Where tensor `t` of the dynamic model is in the route's tensors (`what`: "input" or
// "output"), checked: same datatype, a batch dimension, the rest fixed and admitted
// by the declared shape. "" when it fits, else why not.
std::string Match(const TensorPlan& t, const std::vector<TensorPlan>& route, const char* what,
                  size_t* index) {
  *index = FindTensor(route, t.name);
  if (*index == route.size()) return std::string("the runtime has no ") + what + " " + Repr(t.name);
  const TensorPlan& r = route[*index];
  const std::string name = std::string(what) + " " + Repr(t.name);
  if (r.dtype != t.dtype) {
    return name + " is " + V2Name(r.dtype) + " in the runtime, " + V2Name(t.dtype) +
           " in the model";
  }
  if (r.shape.empty() || r.shape[0] != -1 || r.shape.size() != t.shape.size()) {
    return name + " has shape " + ShapeStr(r.shape) + " in the runtime (rows first, -1), " +
           ShapeStr(t.shape) + " in the model";
  }
  for (size_t d = 1; d < r.shape.size(); ++d) {
    if (r.shape[d] < 0 || (t.shape[d] >= 0 && t.shape[d] != r.shape[d])) {
      return name + " has shape " + ShapeStr(r.shape) + " in the runtime, which the model's " +
             ShapeStr(t.shape) + " does not fix";
    }
  }
  return std::string();
}

}  // namespace

std::string ShapeRoutes::Add(std::shared_ptr<ServingQueue> queue, ModelPlan route) {
  const ModelPlan& m = *model_;
  if (!route.auto_batch) {
    return "its runtime does not batch rows (timeout_ms 0): a request is a whole micro-batch";
  }
  if (route.inputs.size() != m.inputs.size() || route.outputs.size() != m.outputs.size()) {
    return "the runtime has " + std::to_string(route.inputs.size()) + " inputs and " +
           std::to_string(route.outputs.size()) + " outputs, the model " +
           std::to_string(m.inputs.size()) + " and " + std::to_string(m.outputs.size());
  }
  auto r = std::make_shared<Route>();
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorPlan& t : m.inputs) {
    size_t j = 0;
    std::string why = Match(t, route.inputs, "input", &j);
    if (!why.empty()) return why;
    r->in_index.push_back(j);
    shapes.emplace_back(route.inputs[j].shape.begin() + 1, route.inputs[j].shape.end());
  }
  for (const TensorPlan& t : m.outputs) {
    size_t j = 0;
    std::string why = Match(t, route.outputs, "output", &j);
    if (!why.empty()) return why;
    r->out_index.push_back(j);
  }
  r->queue = std::move(queue);
  r->plan = std::move(route);
  std::lock_guard<std::mutex> lock(mu_);
  routes_[Key(shapes)] = std::move(r);
  return std::string();
}

int ShapeRoutes::Submit(const RequestPtr& r, const std::shared_ptr<Job>& job, Error* error) {
  const ModelPlan& m = *model_;
  InferRequest& req = job->req;
  if (m.inputs.empty() || req.in_shapes.size() != m.inputs.size()) return -1;
  std::vector<std::vector<int64_t>> shapes;
  int64_t rows = -1;
  for (const std::vector<int64_t>& s : req.in_shapes) {
    if (s.empty() || (rows >= 0 && s[0] != rows)) return -1;
    rows = s[0];
    shapes.emplace_back(s.begin() + 1, s.end());
  }
  std::shared_ptr<Route> route;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (routes_.empty()) return -1;
    auto it = routes_.find(Key(shapes));
    if (it == routes_.end()) return -1;
    route = it->second;
  }
  const ModelPlan& p = route->plan;
  // A request the runtime would take in several pieces, or refuse: the handler's.
  if (rows < 1 || rows > p.max_rows) return -1;
  for (size_t k = 0; k < m.inputs.size(); ++k) {  // the index ranges, as a fixed model's
    const TensorPlan& t = p.inputs[route->in_index[k]];
    if (t.ranges.empty()) continue;
    if (Error e = FinishInput(t, t.dtype, req.in[k], k, &req)) {
      *error = std::move(e);
      return 4;
    }
  }
  r->units = rows;
  r->in.assign(p.inputs.size(), Span{nullptr, 0});
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    const size_t j = route->in_index[k];
    r->in[j] = {const_cast<char*>(req.in[k]), rows * p.inputs[j].unit_bytes};
  }
  job->outputs.assign(m.outputs.size(), OutTensor{});
  r->out.assign(p.outputs.size(), Span{nullptr, 0});
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    const size_t j = route->out_index[i];
    const TensorPlan& t = p.outputs[j];
    OutTensor& o = job->outputs[i];
    o.shape = t.shape;
    o.shape[0] = rows;
    o.data.assign(static_cast<size_t>(rows * t.unit_bytes), '\0');
    r->out[j] = {o.data.data(), rows * t.unit_bytes};
  }
  NativeSink* own = r->sink;
  job->routes = shared_from_this();  // the request's owner keeps its job
  {
    std::lock_guard<std::mutex> lock(mu_);
    routed_[r.get()] = own;
    r->sink = this;
  }
  int64_t in_flight = 0;
  const int code = SubmitNative(route->queue.get(), r, &in_flight);
  if (code != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    routed_.erase(r.get());
    r->sink = own;
  }
  if (code == 1) {
    *error = {503, "the server is busy: " + std::to_string(in_flight) + " of " +
                       std::to_string(p.limit) +
                       " rows of this input shape in flight (num_buffers); retry later"};
  } else if (code == 3) {
    *error = {500, "internal error: the request's sizes do not match its shape's queue"};
    return 4;
  }
  return code;
}

bool ShapeRoutes::Cancel(Request* r, bool* cancelled) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (routed_.find(r) == routed_.end()) return false;
  }
  *cancelled = CancelNative(r);
  if (*cancelled) {
    std::lock_guard<std::mutex> lock(mu_);
    routed_.erase(r);
  }
  return true;
}

void ShapeRoutes::Deliver(std::vector<RequestPtr>&& finished) {
  std::vector<std::pair<NativeSink*, RequestPtr>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const RequestPtr& r : finished) {
      auto it = routed_.find(r.get());
      if (it == routed_.end()) continue;
      out.emplace_back(it->second, r);
      routed_.erase(it);
    }
  }
  // Each request to its own sink (the requests of one run may come from several).
  for (auto& [sink, r] : out) sink->Deliver({r});
}

void ShapeRoutes::AddStats(QueueStats* s) {
  std::vector<std::shared_ptr<Route>> routes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : routes_) routes.push_back(kv.second);
  }
  for (const auto& route : routes) {
    const QueueStats q = StatsOf(route->queue.get());
    s->runs += q.runs;
    s->requests += q.requests;
    s->units += q.units;
    s->padded_units += q.padded_units;
    s->failed_runs += q.failed_runs;
    s->busy_seconds += q.busy_seconds;
    s->queue_seconds += q.queue_seconds;
  }
}

size_t ShapeRoutes::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return routes_.size();
}

}  // namespace serving
}  // namespace paddle_ipu
