// The shapes of a dynamic model that run without Python (see shape_routes.h).
#include "shape_routes.h"

#include <algorithm>
#include <cstring>

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

// "" when `axes` are sequence axes of a tensor of shape `shape` in the runtime (not
// the batch, in range, `length` there), else why not.
std::string CheckAxes(const std::string& name, const std::vector<int64_t>& axes,
                      const std::vector<int64_t>& shape, int64_t length) {
  for (int64_t a : axes) {
    if (a < 1 || a >= static_cast<int64_t>(shape.size()) || shape[a] != length) {
      return name + ": sequence axis " + std::to_string(a) + " is not an axis of length " +
             std::to_string(length) + " of its shape " + ShapeStr(shape) + " in the runtime";
    }
  }
  return std::string();
}

}  // namespace

void CornerCopy(const char* from, const std::vector<int64_t>& fs, char* to,
                const std::vector<int64_t>& ts, int64_t elem) {
  const size_t n = fs.size();
  std::vector<int64_t> common(n), fstride(n), tstride(n);
  int64_t f = elem, t = elem;
  for (size_t d = n; d-- > 0;) {
    common[d] = std::min(fs[d], ts[d]);
    if (common[d] <= 0) return;
    fstride[d] = f;
    tstride[d] = t;
    f *= fs[d];
    t *= ts[d];
  }
  // The trailing axes both blocks share are one contiguous run, with the axis before.
  size_t j = n;
  int64_t run = elem;
  while (j > 0 && fs[j - 1] == ts[j - 1]) run *= fs[--j];
  if (j == 0) {
    std::memcpy(to, from, static_cast<size_t>(run));
    return;
  }
  run = common[j - 1] * fstride[j - 1];
  const size_t outer = j - 1;  // the axes iterated over
  std::vector<int64_t> idx(outer, 0);
  for (;;) {
    int64_t fo = 0, to_ = 0;
    for (size_t d = 0; d < outer; ++d) {
      fo += idx[d] * fstride[d];
      to_ += idx[d] * tstride[d];
    }
    std::memcpy(to + to_, from + fo, static_cast<size_t>(run));
    size_t d = outer;
    while (d > 0 && ++idx[d - 1] == common[d - 1]) idx[--d] = 0;
    if (d == 0) return;
  }
}

std::string ShapeRoutes::SetBucket(const Bucket& b, Route* r) const {
  const ModelPlan& m = *model_;
  if (b.length < 1) return "a bucket's length must be >= 1, got " + std::to_string(b.length);
  r->length = b.length;
  r->in_axes.assign(m.inputs.size(), {});
  r->in_pad.assign(m.inputs.size(), std::string());
  r->out_axes.assign(m.outputs.size(), {});
  size_t seen = 0;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    auto it = b.inputs.find(m.inputs[k].name);
    if (it == b.inputs.end()) continue;
    seen += 1;
    const TensorPlan& t = r->plan.inputs[r->in_index[k]];
    const std::string name = "input " + Repr(t.name);
    const auto& [axes, pad] = it->second;
    if (t.dtype == DType::kBytes) return name + ": a BYTES sequence input is not padded here";
    if (static_cast<int64_t>(pad.size()) != ElemSize(t.dtype)) {
      return name + ": its pad element has " + std::to_string(pad.size()) + " bytes, its " +
             V2Name(t.dtype) + " elements " + std::to_string(ElemSize(t.dtype));
    }
    std::string why = CheckAxes(name, axes, t.shape, b.length);
    if (!why.empty()) return why;
    r->in_axes[k] = axes;
    r->in_pad[k] = pad;
  }
  if (seen != b.inputs.size() || seen == 0) {
    return "the bucket names " + std::to_string(b.inputs.size()) + " sequence inputs, " +
           std::to_string(seen) + " of them the model's";
  }
  seen = 0;
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    auto it = b.outputs.find(m.outputs[i].name);
    if (it == b.outputs.end()) continue;
    seen += 1;
    const TensorPlan& t = r->plan.outputs[r->out_index[i]];
    std::string why = CheckAxes("output " + Repr(t.name), it->second, t.shape, b.length);
    if (!why.empty()) return why;
    if (t.dtype == DType::kBytes) return "output " + Repr(t.name) + " is BYTES: not cut here";
    r->out_axes[i] = it->second;
  }
  if (seen != b.outputs.size()) return "the bucket names outputs the model does not have";
  return std::string();
}

std::string ShapeRoutes::Add(std::shared_ptr<ServingQueue> queue, ModelPlan route,
                             const Bucket* bucket) {
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
  if (bucket) {
    std::string why = SetBucket(*bucket, r.get());
    if (!why.empty()) return why;
    std::lock_guard<std::mutex> lock(mu_);
    if (!buckets_.empty() && buckets_[0]->in_axes != r->in_axes) {
      return "its sequence axes are not those of the model's other buckets";
    }
    auto at = std::lower_bound(
        buckets_.begin(), buckets_.end(), r->length,
        [](const std::shared_ptr<Route>& x, int64_t length) { return x->length < length; });
    if (at != buckets_.end() && (*at)->length == r->length) {
      return "a bucket of length " + std::to_string(r->length) + " is routed already";
    }
    buckets_.insert(at, std::move(r));
    return std::string();
  }
  std::lock_guard<std::mutex> lock(mu_);
  routes_[Key(shapes)] = std::move(r);
  ever_ = true;
  return std::string();
}

std::string ShapeRoutes::RouteKey(const ModelPlan& route, std::string* why) const {
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorPlan& t : model_->inputs) {
    size_t j = 0;
    *why = Match(t, route.inputs, "input", &j);
    if (!why->empty()) return std::string();
    shapes.emplace_back(route.inputs[j].shape.begin() + 1, route.inputs[j].shape.end());
  }
  return Key(shapes);
}

std::string ShapeRoutes::Remove(const ServingQueue* queue, const ModelPlan& route) {
  std::string why;
  const std::string key = RouteKey(route, &why);
  if (!why.empty()) return why;
  std::shared_ptr<Route> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = routes_.find(key);
    if (it == routes_.end() || it->second->queue.get() != queue) {
      return "no route of input shapes " + key + " to that queue";
    }
    gone = std::move(it->second);
    routes_.erase(it);
  }
  const QueueStats q = StatsOf(gone->queue.get());
  std::lock_guard<std::mutex> lock(mu_);
  retired_.runs += q.runs;
  retired_.requests += q.requests;
  retired_.units += q.units;
  retired_.padded_units += q.padded_units;
  retired_.failed_runs += q.failed_runs;
  retired_.busy_seconds += q.busy_seconds;
  retired_.queue_seconds += q.queue_seconds;
  return std::string();
}

std::shared_ptr<ShapeRoutes::Route> ShapeRoutes::FindBucket(
    const std::vector<std::vector<int64_t>>& shapes, int64_t* length) {
  std::lock_guard<std::mutex> lock(mu_);
  if (buckets_.empty()) return nullptr;
  const Route& first = *buckets_[0];
  int64_t len = -1;  // the length the sequence inputs agree on
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (shapes[k].size() != first.plan.inputs[first.in_index[k]].shape.size()) return nullptr;
    for (int64_t a : first.in_axes[k]) {
      if (len >= 0 && shapes[k][a] != len) return nullptr;
      len = shapes[k][a];
    }
  }
  if (len < 1) return nullptr;
  auto at = std::lower_bound(
      buckets_.begin(), buckets_.end(), len,
      [](const std::shared_ptr<Route>& x, int64_t l) { return x->length < l; });
  if (at == buckets_.end()) return nullptr;  // longer than the longest bucket
  const Route& b = **at;
  for (size_t k = 0; k < shapes.size(); ++k) {  // the other axes: the runtime's
    const std::vector<int64_t>& want = b.plan.inputs[b.in_index[k]].shape;
    const std::vector<int64_t>& axes = b.in_axes[k];
    for (size_t d = 1; d < want.size(); ++d) {
      const bool seq = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
      if (!seq && shapes[k][d] != want[d]) return nullptr;
    }
  }
  *length = len;
  return *at;
}

void ShapeRoutes::Cut(const Routed& routed) {
  const Route& route = *routed.route;
  for (size_t i = 0; i < route.out_axes.size(); ++i) {
    if (route.out_axes[i].empty()) continue;
    OutTensor& o = routed.job->outputs[i];
    std::vector<int64_t> shape = o.shape;
    for (int64_t a : route.out_axes[i]) shape[a] = routed.length;
    const int64_t elem = ElemSize(route.plan.outputs[route.out_index[i]].dtype);
    std::string cut(static_cast<size_t>(Elements(shape) * elem), '\0');
    CornerCopy(o.data.data(), o.shape, cut.data(), shape, elem);
    o.data.swap(cut);
    o.shape = std::move(shape);
  }
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
    auto it = routes_.find(Key(shapes));
    if (it != routes_.end()) route = it->second;
  }
  int64_t length = 0;  // a bucket's request: its sequence length
  if (!route) route = FindBucket(req.in_shapes, &length);
  if (!route) return -1;
  const bool pad = length > 0 && length != route->length;
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
  if (pad) job->padded.assign(m.inputs.size(), std::string());
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    const size_t j = route->in_index[k];
    const TensorPlan& t = p.inputs[j];
    const size_t bytes = static_cast<size_t>(rows * t.unit_bytes);
    if (!pad || route->in_axes[k].empty()) {
      r->in[j] = {const_cast<char*>(req.in[k]), rows * t.unit_bytes};
      continue;
    }
    std::string& padded = job->padded[k];  // the pad element everywhere, then the data
    const std::string& element = route->in_pad[k];
    padded.resize(bytes);
    for (size_t at = 0; at < bytes; at += element.size()) {
      std::memcpy(&padded[at], element.data(), element.size());
    }
    std::vector<int64_t> shape = t.shape;
    shape[0] = rows;
    CornerCopy(req.in[k], req.in_shapes[k], padded.data(), shape, ElemSize(t.dtype));
    r->in[j] = {padded.data(), rows * t.unit_bytes};
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
  Routed routed{own, nullptr, nullptr, length};
  if (pad) {  // kept until delivered or taken back
    routed.job = job;
    routed.route = route;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    routed_[r.get()] = std::move(routed);
    r->sink = this;
  }
  int64_t in_flight = 0;
  const int code = SubmitNative(route->queue.get(), r, &in_flight);
  if (code != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    routed_.erase(r.get());
    r->sink = own;
  }
  if (code == 2) {  // the runtime is closing (its shape leaves memory): the handler's
    job->routes.reset();
    job->outputs.clear();
    job->padded.clear();
    r->in.clear();
    r->out.clear();
    return -1;
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
  std::vector<std::pair<Routed, RequestPtr>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const RequestPtr& r : finished) {
      auto it = routed_.find(r.get());
      if (it == routed_.end()) continue;
      out.emplace_back(std::move(it->second), r);
      routed_.erase(it);
    }
  }
  // Each request to its own sink (the requests of one run may come from several), a
  // padded one's outputs cut back to its length first.
  for (auto& [routed, r] : out) {
    if (routed.job && r->state == RequestState::kDone) Cut(routed);
    routed.job.reset();
    routed.sink->Deliver({r});
  }
}

void ShapeRoutes::AddStats(QueueStats* s) {
  std::vector<std::shared_ptr<Route>> routes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& kv : routes_) routes.push_back(kv.second);
    routes.insert(routes.end(), buckets_.begin(), buckets_.end());
    s->runs += retired_.runs;
    s->requests += retired_.requests;
    s->units += retired_.units;
    s->padded_units += retired_.padded_units;
    s->failed_runs += retired_.failed_runs;
    s->busy_seconds += retired_.busy_seconds;
    s->queue_seconds += retired_.queue_seconds;
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
  return routes_.size() + buckets_.size();
}

bool ShapeRoutes::ever() {
  std::lock_guard<std::mutex> lock(mu_);
  return ever_ || !buckets_.empty();
}

}  // namespace serving
}  // namespace paddle_ipu
