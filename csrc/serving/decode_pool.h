// The threads that parse requests too large to parse on an IO thread (tens of MB of
// JSON take seconds): an IO thread hands the parse over and goes on serving its other
// connections; the parse posts its result back to that IO thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace paddle_ipu {
namespace serving {

class DecodePool {
 public:
  ~DecodePool() { Stop(); }
  void Start(int threads);
  // Runs `task` on a pool thread (a task must not throw: one that does is logged).
  void Post(std::function<void()> task);
  // Drops the tasks not started and joins the threads (after the IO threads stopped:
  // a dropped task's captures are released on the caller's thread).
  void Stop();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

}  // namespace serving
}  // namespace paddle_ipu
