// Triton's model repository extension over HTTP: the index (answered here, from the
// server's entries), and load / unload, which the IO thread hands to the Python side
// (paddle_ipu/serving/repository.py: compiling and starting a model takes the GIL and
// seconds) through a queue of ControlJobs; the answer comes back to the connection's
// IO thread. The IO thread never waits for it.
#include <boost/json/parse.hpp>

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
  if (rest == "/index") {
    // An empty body, or {"ready": bool}: true keeps the READY versions.
    bool ready_only = false;
    if (req.body().find_first_not_of(" \t\r\n") != std::string::npos) {
      boost::system::error_code ec;
      const boost::json::value doc = boost::json::parse(req.body(), ec);
      const boost::json::object* o = ec ? nullptr : doc.if_object();
      const boost::json::value* r = o ? o->if_contains("ready") : nullptr;
      if (!o || (r && !r->is_bool())) {
        return Error(400, "the index request's body must be a JSON object, with \"ready\" a "
                          "boolean if given");
      }
      ready_only = r && r->get_bool();
    }
    return Write(http::status::ok, srv_->IndexJson(ready_only), "application/json");
  }
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
  Guard([&] {
    Write(static_cast<http::status>(status), std::move(body), "application/json", -1,
          status == 503);
  });
}

Error Server::Control(std::shared_ptr<ControlJob> job) {
  if (draining_ || !control_jobs_.Push(std::move(job))) return {503, kShuttingDown};
  return {};
}

std::shared_ptr<ControlJob> Server::NextControl(double timeout) {
  return control_jobs_.Next(timeout);
}

void Server::Deliver(const std::shared_ptr<ControlJob>& job, int status, std::string body) {
  if (!job->io) return;  // a gRPC request: its answer went back in Python
  asio::post(job->io->ioc, [job, status, body = std::move(body)]() mutable {
    if (auto c = job->connection.lock()) c->ControlAnswer(status, std::move(body));
  });
}

void Server::ControlDone(int64_t id, int status, std::string body) {
  if (auto job = control_jobs_.Take(id)) Deliver(job, status, std::move(body));
}

void Server::CloseControl() {
  for (const auto& job : control_jobs_.Close()) Deliver(job, 503, ErrorJson(kShuttingDown));
}

}  // namespace serving
}  // namespace paddle_ipu
