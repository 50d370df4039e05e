// The decode threads (see decode_pool.h).
#include "decode_pool.h"

#include <cstdio>
#include <exception>

namespace paddle_ipu {
namespace serving {

void DecodePool::Start(int threads) {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

void DecodePool::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void DecodePool::Stop() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropped.swap(tasks_);
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void DecodePool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (stop_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "paddle-ipu: a request's decode failed: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "paddle-ipu: a request's decode failed (an unknown exception)\n");
    }
  }
}

}  // namespace serving
}  // namespace paddle_ipu
