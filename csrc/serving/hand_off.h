// Jobs the IO threads hand to Python threads and take back by id: the repository's
// load / unload requests (repository.cc) and the gRPC calls other than inference
// (grpc_unary.cc). Push() never blocks an IO thread; a Python thread waits in Next()
// (without the GIL), answers, and Take() gives the job back once; Close() refuses new
// jobs and returns those never taken, for the caller to answer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

namespace paddle_ipu {
namespace serving {

template <class Job>  // Job has an `int64_t id`
class HandOff {
 public:
  // Queues `job`, setting its id; false once closed.
  bool Push(std::shared_ptr<Job> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return false;
      job->id = next_++;
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
    return true;
  }

  // The next job (waits at most `timeout` seconds, negative: no limit); null on
  // timeout or once closed.
  std::shared_ptr<Job> Next(double timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return closed_ || !queue_.empty(); };
    if (timeout < 0) {
      cv_.wait(lock, ready);
    } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout), ready)) {
      return nullptr;
    }
    if (closed_ || queue_.empty()) return nullptr;
    std::shared_ptr<Job> job = std::move(queue_.front());
    queue_.pop_front();
    taken_[job->id] = job;
    return job;
  }

  // The job Next() gave with this id, once (null after, or for an unknown id).
  std::shared_ptr<Job> Take(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = taken_.find(id);
    if (it == taken_.end()) return nullptr;
    std::shared_ptr<Job> job = std::move(it->second);
    taken_.erase(it);
    return job;
  }

  // No more jobs; returns those never taken.
  std::deque<std::shared_ptr<Job>> Close() {
    std::deque<std::shared_ptr<Job>> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      left.swap(queue_);
    }
    cv_.notify_all();
    return left;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::map<int64_t, std::shared_ptr<Job>> taken_;
  int64_t next_ = 1;
  bool closed_ = false;
};

}  // namespace serving
}  // namespace paddle_ipu
