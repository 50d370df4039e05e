// The gRPC calls other than ModelInfer (see server.h): a queue the Python side
// (paddle_ipu/serving/grpc_service.py) takes them from; each answer is posted back to
// the connection's IO thread by the job's `done`.
#include "server.h"

namespace paddle_ipu {
namespace serving {

namespace {
constexpr int kUnavailable = 14;
}  // namespace

bool Server::GrpcUnary(std::shared_ptr<GrpcUnaryJob> job) {
  {
    std::lock_guard<std::mutex> lock(unary_mu_);
    if (unary_closed_) return false;
    job->id = unary_next_++;
    unary_queue_.push_back(std::move(job));
  }
  unary_cv_.notify_one();
  return true;
}

std::shared_ptr<GrpcUnaryJob> Server::NextGrpcUnary(double timeout) {
  std::unique_lock<std::mutex> lock(unary_mu_);
  auto ready = [this] { return unary_closed_ || !unary_queue_.empty(); };
  if (timeout < 0) {
    unary_cv_.wait(lock, ready);
  } else if (!unary_cv_.wait_for(lock, std::chrono::duration<double>(timeout), ready)) {
    return nullptr;
  }
  if (unary_queue_.empty()) return nullptr;  // closed
  std::shared_ptr<GrpcUnaryJob> job = std::move(unary_queue_.front());
  unary_queue_.pop_front();
  unary_taken_[job->id] = job;
  return job;
}

void Server::GrpcUnaryDone(int64_t id, int code, std::string message, std::string body) {
  std::shared_ptr<GrpcUnaryJob> job;
  {
    std::lock_guard<std::mutex> lock(unary_mu_);
    auto it = unary_taken_.find(id);
    if (it == unary_taken_.end()) return;
    job = std::move(it->second);
    unary_taken_.erase(it);
  }
  job->done(code, std::move(message), std::move(body));
}

void Server::CloseGrpcUnary() {
  std::deque<std::shared_ptr<GrpcUnaryJob>> left;
  {
    std::lock_guard<std::mutex> lock(unary_mu_);
    unary_closed_ = true;
    left.swap(unary_queue_);
  }
  unary_cv_.notify_all();
  for (auto& job : left) job->done(kUnavailable, kShuttingDown, std::string());
}

}  // namespace serving
}  // namespace paddle_ipu
