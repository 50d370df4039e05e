// The front ends' counters (HTTP and gRPC together) and what reports them with the
// queue's (QueueStats, csrc/core/queue.h): Triton's statistics JSON, the same as
// gRPC's ModelStatistics message, and the Prometheus text of /metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../core/queue.h"
#include "access_log.h"
#include "plan.h"

namespace paddle_ipu {
namespace serving {

// A Prometheus histogram of seconds: buckets from 100 us to 10 s in 1-2-5 steps.
struct Histogram {
  static constexpr int kBounds = 16;
  static const double kBound[kBounds];
  int64_t counts[kBounds + 1] = {};  // per bucket (not cumulative); the last: above 10 s
  double sum = 0;
  int64_t count = 0;
  void Observe(double seconds);
};

// A request's time in the queue and in graph runs, in seconds; -1 when it never ran.
void RanTimes(const Request& r, double* queue_s, double* compute_s);

// The values of the counters, as one copy.
struct CounterValues {
  int64_t success = 0;
  int64_t success_ns = 0;
  int64_t success_rows = 0;
  int64_t fail = 0;
  int64_t fail_ns = 0;
  int64_t last_inference_ms = 0;
  std::vector<std::pair<int, int64_t>> by_status;  // (status, count)
  int64_t rejected_busy = 0;   // 503: the queue was full
  int64_t timed_out = 0;       // 504: not started within the request's timeout
  int64_t disconnected = 0;    // the client went away before its request ran
  Histogram request_seconds;   // every answered request: arrival to answer
  Histogram queue_seconds;     // requests that ran: arrival to their first run
  Histogram compute_seconds;   // requests that ran: the graph runs they were part of
};

// The counters, updated by the IO threads and the gRPC server's threads.
class Counters {
 public:
  // A request answered with `status`, after `took`; `queue_s` and `compute_s`: its
  // time in the queue and in graph runs when it ran (else < 0).
  void Done(int status, int64_t rows, std::chrono::steady_clock::duration took,
            double queue_s = -1, double compute_s = -1);
  // An inference request was answered: Done(), and the access log's line when there
  // is a log (latency from `start`; `ran`: the queue's request when it ran, else its
  // times are e.queue_s and e.compute_s).
  void Record(AccessEntry e, std::chrono::steady_clock::time_point start, const Request* ran);
  // The access log this model's requests (or the unrouted ones) are written to.
  void set_log(std::shared_ptr<AccessLog> log) { log_ = std::move(log); }
  // Adds one to a refusal's counter (rejected_busy, timed_out or disconnected).
  void Add(int64_t CounterValues::*counter);
  CounterValues Copy();

 private:
  std::mutex mu_;
  CounterValues v_;
  std::shared_ptr<AccessLog> log_;  // set before requests come, if at all
};

// A model compiled per input shape: its specialisations in memory and what happened
// to them (paddle_ipu.executor.specialised.SpecialisationStats, set from Python).
struct SpecialisationValues {
  bool set = false;
  int64_t resident = 0;        // in memory
  int64_t resident_bytes = 0;  // their measured memory
  int64_t bound_bytes = 0;     // the bound on it
  int64_t max_count = 0;       // the bound on their number (0: none)
  int64_t made = 0;            // made the first time (compiled, or from the open graph)
  int64_t restored = 0;        // made again after they left memory
  int64_t evicted = 0;         // left memory
  int64_t making = 0;          // makes under way
  double make_seconds = 0;     // time spent making them
};

// `v`: a model compiled per input shape (its "memory_usage" and "specialisations").
std::string StatisticsJson(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                           const SpecialisationValues* v = nullptr);
// The same statistics as the gRPC service's ModelStatistics message (tritonclient's
// service_pb2): every field StatisticsJson writes that the message has ("specialisations"
// is an extension of the JSON only).
std::string StatisticsMessage(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                              const SpecialisationValues* v = nullptr);
// `requests_in_flight`: requests admitted to the queue, not answered.
std::string Prometheus(const ModelPlan& m, const CounterValues& c, const QueueStats& s,
                       int64_t requests_in_flight, const SpecialisationValues* v = nullptr);

}  // namespace serving
}  // namespace paddle_ipu
