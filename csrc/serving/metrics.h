// The front ends' counters (HTTP and gRPC together) and what reports them with the
// queue's (QueueStats, csrc/core/queue.h): Triton's statistics JSON and the
// Prometheus text of /metrics.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../core/queue.h"
#include "plan.h"

namespace paddle_ipu {
namespace serving {

// The values of the counters, as one copy.
struct CounterValues {
  int64_t success = 0;
  int64_t success_ns = 0;
  int64_t success_rows = 0;
  int64_t fail = 0;
  int64_t fail_ns = 0;
  int64_t last_inference_ms = 0;
  std::vector<std::pair<int, int64_t>> by_status;  // (status, count)
  double duration_s = 0;
  int64_t rejected_busy = 0;   // 503: the queue was full
  int64_t timed_out = 0;       // 504: not started within the request's timeout
  int64_t disconnected = 0;    // the client went away before its request ran
};

// The counters, updated by the IO threads and the gRPC server's threads.
class Counters {
 public:
  // A request answered with `status`.
  void Done(int status, int64_t rows, std::chrono::steady_clock::duration took);
  // Adds one to a refusal's counter (rejected_busy, timed_out or disconnected).
  void Add(int64_t CounterValues::*counter);
  CounterValues Copy();

 private:
  std::mutex mu_;
  CounterValues v_;
};

std::string StatisticsJson(const ModelPlan& m, const CounterValues& c, const QueueStats& s);
std::string Prometheus(const ModelPlan& m, const CounterValues& c, const QueueStats& s);

}  // namespace serving
}  // namespace paddle_ipu
