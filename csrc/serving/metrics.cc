// Counters, statistics and Prometheus text (see metrics.h).
#include "metrics.h"

#include <algorithm>
#include <cstdio>

#include "protobuf.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

int64_t Nanos(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

std::string Duration(int64_t count, double seconds) {
  return "{\"count\":" + std::to_string(count) + ",\"ns\":" + std::to_string(Nanos(seconds)) +
         "}";
}

// A StatisticDuration (count 1, ns 2) as field `field` of `o`: written even when both
// are 0 (an empty message), as the JSON writes every duration.
void PutDuration(std::string* o, int field, int64_t count, double seconds) {
  std::string d;
  PutUint(&d, 1, static_cast<uint64_t>(count));
  PutUint(&d, 2, static_cast<uint64_t>(Nanos(seconds)));
  PutBytes(o, field, d);
}

std::string Seconds(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f", s);
  return buf;
}

}  // namespace

const double Histogram::kBound[Histogram::kBounds] = {
    1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10};

void Histogram::Observe(double seconds) {
  int k = 0;
  while (k < kBounds && seconds > kBound[k]) ++k;  // le: the first bound >= seconds
  counts[k] += 1;
  sum += seconds;
  count += 1;
}

void RanTimes(const Request& r, double* queue_s, double* compute_s) {
  if (r.started == Clock::time_point{}) {
    *queue_s = *compute_s = -1;
    return;
  }
  *queue_s = std::chrono::duration<double>(r.started - r.arrived).count();
  *compute_s = r.compute_seconds;
}

void Counters::Done(int status, int64_t rows, std::chrono::steady_clock::duration took,
                    double queue_s, double compute_s) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
  std::lock_guard<std::mutex> lock(mu_);
  v_.request_seconds.Observe(static_cast<double>(ns) * 1e-9);
  if (queue_s >= 0) {
    v_.queue_seconds.Observe(queue_s);
    v_.compute_seconds.Observe(compute_s);
  }
  if (status == 200) {
    v_.success += 1;
    v_.success_ns += ns;
    v_.success_rows += rows;
    v_.last_inference_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  } else {
    v_.fail += 1;
    v_.fail_ns += ns;
  }
  for (auto& p : v_.by_status) {
    if (p.first == status) {
      p.second += 1;
      return;
    }
  }
  v_.by_status.push_back({status, 1});
  std::sort(v_.by_status.begin(), v_.by_status.end());
}

void Counters::Record(AccessEntry e, std::chrono::steady_clock::time_point start,
                      const Request* ran) {
  const auto took = std::chrono::steady_clock::now() - start;
  if (ran) RanTimes(*ran, &e.queue_s, &e.compute_s);
  Done(e.status, e.rows, took, e.queue_s, e.compute_s);
  if (!log_) return;
  e.latency_s = std::chrono::duration<double>(took).count();
  log_->Write(e);
}

void Counters::Add(int64_t CounterValues::*counter) {
  std::lock_guard<std::mutex> lock(mu_);
  v_.*counter += 1;
}

CounterValues Counters::Copy() {
  std::lock_guard<std::mutex> lock(mu_);
  return v_;
}

std::string StatisticsJson(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                           const SpecialisationValues* v) {
  std::string out = "{\"model_stats\":[{\"name\":" + Quote(m.name) + ",\"version\":" +
                    Quote(m.version) + ",\"last_inference\":" +
                    std::to_string(c.last_inference_ms) +
                    ",\"inference_count\":" + std::to_string(c.success_rows) +
                    ",\"execution_count\":" + std::to_string(s.runs) +
                    ",\"inference_stats\":{\"success\":" +
                    Duration(c.success, static_cast<double>(c.success_ns) * 1e-9) +
                    ",\"fail\":" + Duration(c.fail, static_cast<double>(c.fail_ns) * 1e-9) +
                    ",\"queue\":" + Duration(s.requests, s.queue_seconds) +
                    ",\"compute_input\":" + Duration(0, 0) +
                    ",\"compute_infer\":" + Duration(s.runs, s.busy_seconds) +
                    ",\"compute_output\":" + Duration(0, 0) + "},\"batch_stats\":[";
  bool first = true;
  for (size_t k = 0; k < s.fill_histogram.size(); ++k) {
    if (s.fill_histogram[k] == 0) continue;
    out += std::string(first ? "" : ",") + "{\"batch_size\":" + std::to_string(k) +
           ",\"compute_input\":" + Duration(0, 0) + ",\"compute_infer\":" +
           Duration(s.fill_histogram[k], k < s.fill_seconds.size() ? s.fill_seconds[k] : 0.0) +
           ",\"compute_output\":" + Duration(0, 0) + "}";
    first = false;
  }
  out += "]";
  if (v && v->set) {  // Triton's memory_usage; the shapes' counters (an extension)
    out += ",\"memory_usage\":[{\"type\":\"CPU\",\"id\":0,\"byte_size\":" +
           std::to_string(v->resident_bytes) + "}],\"specialisations\":{\"resident\":" +
           std::to_string(v->resident) + ",\"resident_bytes\":" +
           std::to_string(v->resident_bytes) + ",\"bound_bytes\":" +
           std::to_string(v->bound_bytes) + ",\"max_count\":" + std::to_string(v->max_count) +
           ",\"made\":" + std::to_string(v->made) + ",\"restored\":" +
           std::to_string(v->restored) + ",\"evicted\":" + std::to_string(v->evicted) +
           ",\"making\":" + std::to_string(v->making) + ",\"make_seconds\":" +
           Seconds(v->make_seconds) + "}";
  }
  return out + "}]}";
}

std::string StatisticsMessage(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                              const SpecialisationValues* v) {
  std::string o, infer;
  PutString(&o, 1, m.name);
  PutString(&o, 2, m.version);
  PutUint(&o, 3, static_cast<uint64_t>(c.last_inference_ms));
  PutUint(&o, 4, static_cast<uint64_t>(c.success_rows));
  PutUint(&o, 5, static_cast<uint64_t>(s.runs));
  PutDuration(&infer, 1, c.success, static_cast<double>(c.success_ns) * 1e-9);
  PutDuration(&infer, 2, c.fail, static_cast<double>(c.fail_ns) * 1e-9);
  PutDuration(&infer, 3, s.requests, s.queue_seconds);
  PutDuration(&infer, 4, 0, 0);
  PutDuration(&infer, 5, s.runs, s.busy_seconds);
  PutDuration(&infer, 6, 0, 0);
  PutBytes(&o, 6, infer);
  for (size_t k = 0; k < s.fill_histogram.size(); ++k) {
    if (s.fill_histogram[k] == 0) continue;
    std::string batch;
    PutUint(&batch, 1, k);
    PutDuration(&batch, 2, 0, 0);
    PutDuration(&batch, 3, s.fill_histogram[k],
                k < s.fill_seconds.size() ? s.fill_seconds[k] : 0.0);
    PutDuration(&batch, 4, 0, 0);
    PutBytes(&o, 7, batch);
  }
  if (v && v->set) {  // memory_usage (type 1, id 2: 0, byte_size 3); no field for the rest
    std::string memory;
    PutString(&memory, 1, "CPU");
    PutUint(&memory, 3, static_cast<uint64_t>(v->resident_bytes));
    PutBytes(&o, 8, memory);
  }
  return o;
}

std::string Prometheus(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                       int64_t requests_in_flight, const SpecialisationValues* v) {
  std::vector<std::pair<int, int64_t>> by_status = c.by_status;
  const std::string label = "model=" + Quote(m.name) + ",version=" + Quote(m.version);
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  // A metric of one sample.
  auto one = [&](const char* name, const char* type, const char* help, const std::string& value) {
    metric(name, type, help);
    o += std::string(name) + "{" + label + "} " + value + "\n";
  };
  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    metric(name, "histogram", help);
    int64_t cumulative = 0;
    char le[32];
    for (int k = 0; k <= Histogram::kBounds; ++k) {
      cumulative += h.counts[k];
      if (k < Histogram::kBounds) std::snprintf(le, sizeof(le), "%g", Histogram::kBound[k]);
      o += std::string(name) + "_bucket{" + label + ",le=\"" +
           (k < Histogram::kBounds ? le : "+Inf") + "\"} " + std::to_string(cumulative) + "\n";
    }
    o += std::string(name) + "_sum{" + label + "} " + Seconds(h.sum) + "\n";
    o += std::string(name) + "_count{" + label + "} " + std::to_string(h.count) + "\n";
  };
  metric("paddle_ipu_requests_total", "counter", "Inference requests by outcome (HTTP status).");
  bool has_200 = false;
  for (const auto& p : by_status) has_200 |= p.first == 200;
  if (!has_200) by_status.insert(by_status.begin(), {200, 0});
  for (const auto& p : by_status) {
    o += "paddle_ipu_requests_total{" + label + ",status=\"" + std::to_string(p.first) + "\"} " +
         std::to_string(p.second) + "\n";
  }
  one("paddle_ipu_request_rows_total", "counter", "Rows of successful requests.",
      std::to_string(c.success_rows));
  histogram("paddle_ipu_request_duration_seconds",
            "Time in the server per inference request (every outcome): arrival to answer.",
            c.request_seconds);
  histogram("paddle_ipu_queue_duration_seconds",
            "Time a request that ran waited in the queue: arrival to its first graph run.",
            c.queue_seconds);
  histogram("paddle_ipu_compute_duration_seconds",
            "Graph run time of a request that ran (the runs it was part of, summed).",
            c.compute_seconds);
  one("paddle_ipu_rejected_total", "counter",
      "Requests refused because the queue was full (503 / UNAVAILABLE).", std::to_string(c.rejected_busy));
  one("paddle_ipu_timed_out_total", "counter",
      "Requests not started within their timeout (504 / DEADLINE_EXCEEDED).",
      std::to_string(c.timed_out));
  one("paddle_ipu_disconnected_total", "counter",
      "Requests dropped before they ran because the client went away.", std::to_string(c.disconnected));
  one("paddle_ipu_in_flight_requests", "gauge", "Inference requests admitted, not answered.",
      std::to_string(requests_in_flight));
  one("paddle_ipu_in_flight_units", "gauge",
      "Queue units admitted, not answered: rows when batching, else micro-batches.",
      std::to_string(s.in_flight));
  one("paddle_ipu_queue_seconds_total", "counter", "Time requests waited in the queue, summed.",
      Seconds(s.queue_seconds));
  one("paddle_ipu_compute_seconds_total", "counter", "Time the worker spent running the graph.",
      Seconds(s.busy_seconds));
  one("paddle_ipu_runs_total", "counter", "Graph runs (failed ones included).",
      std::to_string(s.runs));
  one("paddle_ipu_failed_runs_total", "counter", "Graph runs that raised.",
      std::to_string(s.failed_runs));
  one("paddle_ipu_padded_units_total", "counter", "Units of zero padding fed.",
      std::to_string(s.padded_units));
  metric("paddle_ipu_batch_size", "histogram", "Units (rows) per graph run.");
  int64_t cumulative = 0, units = 0;
  for (size_t k = 0; k < s.fill_histogram.size(); ++k) {
    cumulative += s.fill_histogram[k];
    units += static_cast<int64_t>(k) * s.fill_histogram[k];
    o += "paddle_ipu_batch_size_bucket{" + label + ",le=\"" + std::to_string(k) + "\"} " +
         std::to_string(cumulative) + "\n";
  }
  o += "paddle_ipu_batch_size_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(cumulative) +
       "\n";
  o += "paddle_ipu_batch_size_sum{" + label + "} " + std::to_string(units) + "\n";
  o += "paddle_ipu_batch_size_count{" + label + "} " + std::to_string(cumulative) + "\n";
  if (v && v->set) {
    one("paddle_ipu_specialisations", "gauge",
        "Input shapes of a model compiled per input shape in memory.", std::to_string(v->resident));
    one("paddle_ipu_specialisation_bytes", "gauge",
        "Memory those input shapes hold, as measured when each was made.",
        std::to_string(v->resident_bytes));
    one("paddle_ipu_specialisation_bound_bytes", "gauge",
        "The bound on that memory: beyond it the least recently used shape leaves.",
        std::to_string(v->bound_bytes));
    one("paddle_ipu_specialisations_made_total", "counter",
        "Input shapes made the first time (compiled, or made from the open graph).",
        std::to_string(v->made));
    one("paddle_ipu_specialisations_restored_total", "counter",
        "Input shapes made again after they left memory.", std::to_string(v->restored));
    one("paddle_ipu_specialisations_evicted_total", "counter",
        "Input shapes that left memory (least recently used, beyond the bound).",
        std::to_string(v->evicted));
    one("paddle_ipu_specialisation_seconds_total", "counter",
        "Time spent making input shapes.", Seconds(v->make_seconds));
  }
  return o;
}

}  // namespace serving
}  // namespace paddle_ipu
