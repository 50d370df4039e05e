// Triton's model repository extension over HTTP: the index (answered here, from the
// server's entries), and load / unload, which the IO thread hands to the Python side
// (paddle_ipu/serving/repository.py: compiling and starting a model takes the GIL and
// seconds) through a queue of ControlJobs; the answer comes back to the connection's
// IO thread. The IO thread never waits for it.
#include "connection.h"
#include "listener.h"
#include "server.h"
#include "text.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace paddle_ipu {
namespace serving {

void Connection::Repository(HttpRequest& req, std::string_view rest) {
  if (rest == "/index") return Write(http::status::ok, srv_->IndexJson(), "application/json");
  constexpr std::string_view kModels = "/models/";
  std::string_view action;
  std::string_view model;
  if (rest.substr(0, kModels.size()) == kModels) {
    rest = rest.substr(kModels.size());
    const size_t slash = rest.rfind('/');
    if (slash != std::string_view::npos && slash > 0) {
      model = rest.substr(0, slash);
      action = rest.substr(slash + 1);
    }
  }
  if ((action != "load" && action != "unload") || model.find('/') != std::string_view::npos) {
    return Error(404, "no route POST /v2/repository" + std::string(rest) +
                          ": the repository routes are /v2/repository/index and "
                          "/v2/repository/models/{name}/load|unload");
  }
  if (!srv_->control()) {
    return Error(400, "this server has no model repository to load from or unload to: "
                      "serve one with paddle-ipu serve --model-repository DIR "
                      "--model-control-mode explicit");
  }
  auto job = std::make_shared<ControlJob>();
  job->action = std::string(action);
  job->model = std::string(model);
  job->body = std::move(req.body());
  job->connection = shared_from_this();
  job->io = io_->shared_from_this();
  if (serving::Error e = srv_->Control(job)) return Error(e.status, e.message, e.status == 503);
  hold_ = shared_from_this();  // until ControlAnswer
}

void Connection::ControlAnswer(int status, std::string body) {
  auto self = shared_from_this();
  hold_.reset();
  if (gone_) return;
  Write(static_cast<http::status>(status), std::move(body), "application/json", -1,
        status == 503);
}

Error Server::Control(std::shared_ptr<ControlJob> job) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (control_closed_ || draining_) return {503, kShuttingDown};
  job->id = control_next_++;
  control_queue_.push_back(std::move(job));
  control_cv_.notify_one();
  return {};
}

std::shared_ptr<ControlJob> Server::NextControl(double timeout) {
  std::unique_lock<std::mutex> lock(control_mu_);
  auto ready = [this] { return control_closed_ || !control_queue_.empty(); };
  if (timeout < 0) {
    control_cv_.wait(lock, ready);
  } else if (!control_cv_.wait_for(lock, std::chrono::duration<double>(timeout), ready)) {
    return nullptr;
  }
  if (control_closed_ || control_queue_.empty()) return nullptr;
  std::shared_ptr<ControlJob> job = std::move(control_queue_.front());
  control_queue_.pop_front();
  control_taken_[job->id] = job;
  return job;
}

void Server::Deliver(const std::shared_ptr<ControlJob>& job, int status, std::string body) {
  if (!job->io) return;  // a gRPC request: its answer went back in Python
  asio::post(job->io->ioc, [job, status, body = std::move(body)]() mutable {
    if (auto c = job->connection.lock()) c->ControlAnswer(status, std::move(body));
  });
}

void Server::ControlDone(int64_t id, int status, std::string body) {
  std::shared_ptr<ControlJob> job;
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    auto it = control_taken_.find(id);
    if (it == control_taken_.end()) return;
    job = std::move(it->second);
    control_taken_.erase(it);
  }
  Deliver(job, status, std::move(body));
}

void Server::CloseControl() {
  std::deque<std::shared_ptr<ControlJob>> left;
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    control_closed_ = true;
    left.swap(control_queue_);
    control_cv_.notify_all();
  }
  for (const auto& job : left) Deliver(job, 503, ErrorJson(kShuttingDown));
}

}  // namespace serving
}  // namespace paddle_ipu
