// The routes of the HTTP front end: a request read by a Connection to its answer
// (the role of handle_request in Beast's examples). Infer admits the request to the
// queue; the answer comes back through Connection::Answer.
#include <cstdio>

#include "clock.h"
#include "connection.h"
#include "front_end.h"
#include "listener.h"
#include "metadata.h"
#include "requests.h"
#include "server.h"
#include "text.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace paddle_ipu {
namespace serving {

namespace {

// Bodies of this size or more are parsed on the server's decode threads, not on the
// IO thread (a MiB of JSON parses in about 10 ms).
constexpr size_t kDecodeHere = 1 << 20;

}  // namespace

void Connection::Route() {
  auto& req = parser_->get();
  std::string_view target;
  if (serving::Error e = TargetPath(std::string_view(req.target().data(), req.target().size()),
                                    &target)) {
    if (req.method() == http::verb::post) Count(e.status, 0);
    return Error(e.status, e.message);
  }
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;
  auto only = [&](bool ok, const char* allow) {
    if (ok) return true;
    const std::string method(req.method_string().data(), req.method_string().size());
    Write(http::status::method_not_allowed,
          ErrorJson("method " + method + " is not allowed on " + std::string(target) +
                    ": use " + allow),
          "application/json", -1, false, allow);
    return false;
  };
  auto json = [&](std::string body) {
    Write(http::status::ok, std::move(body), "application/json");
  };
  // KServe's server answers health with a JSON body, which its clients read.
  if (target == "/v2/health/live") {
    if (only(get, "GET")) json("{\"live\":true}");
    return;
  }
  if (target == "/v2/health/ready") {
    if (!only(get, "GET")) return;
    if (srv_->ready()) return json("{\"ready\":true}");
    return Write(http::status::service_unavailable,
                 "{\"ready\":false,\"error\":\"the server is not ready (warming up, or "
                 "draining before it stops)\"}",
                 "application/json", -1, true);
  }
  if (target == "/v2") {
    if (only(get, "GET")) json(srv_->server_metadata());
    return;
  }
  if (target == "/metrics") {
    if (only(get, "GET")) {
      Write(http::status::ok, srv_->Prometheus(),
            "text/plain; version=0.0.4; charset=utf-8");
    }
    return;
  }
  constexpr std::string_view kRepository = "/v2/repository";
  if (target.substr(0, kRepository.size()) == kRepository &&
      (target.size() == kRepository.size() || target[kRepository.size()] == '/')) {
    if (only(post, "POST")) Repository(req, target.substr(kRepository.size()));
    return;
  }
  if (target == "/v2/models/stats") {
    serving::Error e;
    if (only(get, "GET")) json(srv_->StatisticsJson({}, {}, &e));
    return;
  }
  constexpr std::string_view kModels = "/v2/models/";
  if (target.substr(0, kModels.size()) != kModels) {
    return Error(404, "no route " + std::string(req.method_string()) + " " + std::string(target) +
                          ": this server answers the KServe v2 routes under /v2 and /metrics");
  }
  std::string_view rest = target.substr(kModels.size());
  const size_t slash = rest.find('/');
  const std::string_view name = rest.substr(0, slash);
  rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  std::string_view version;
  constexpr std::string_view kVersions = "/versions/";
  if (rest.substr(0, kVersions.size()) == kVersions) {
    rest = rest.substr(kVersions.size());
    const size_t s2 = rest.find('/');
    version = rest.substr(0, s2);
    rest = s2 == std::string_view::npos ? std::string_view() : rest.substr(s2);
  }
  serving::Error missing;
  if (rest == "/stats") {  // every version of the model, unless one is named
    if (!only(get, "GET")) return;
    std::string stats = srv_->StatisticsJson(name, version, &missing);
    if (missing) return Error(missing.status, missing.message, missing.status == 503);
    return json(std::move(stats));
  }
  model_ = srv_->Find(name, version, &missing);
  if (!model_) {
    if (rest == "/ready" && get && missing.status == 503) {
      return Error(503, missing.message, true);
    }
    if (post) Count(missing.status, 0);
    return Error(missing.status, missing.message, missing.status == 503);
  }
  const ModelPlan& m = model_->plan();
  if (rest.empty()) {
    if (only(get, "GET")) json(srv_->MetadataJson(*model_));
    return;
  }
  if (rest == "/ready") {
    if (!only(get, "GET")) return;
    if (model_->ready()) return json("{\"name\":" + Quote(m.name) + ",\"ready\":true}");
    return Write(http::status::service_unavailable,
                 "{\"name\":" + Quote(m.name) + ",\"ready\":false,\"error\":" +
                     Quote("model " + m.name + " is not ready") + "}",
                 "application/json", -1, true);
  }
  if (rest == "/config") {
    if (only(get, "GET")) json(model_->config());
    return;
  }
  if (rest == "/infer") {
    if (only(post, "POST")) Infer(req);
    return;
  }
  Error(404, "no route " + std::string(req.method_string()) + " " + std::string(target) +
                 ": model routes are /v2/models/{name}[/versions/{v}][/ready|/config|/stats|/infer]");
}

void Connection::Infer(HttpRequest& req) {
  if (srv_->draining()) {
    Count(503, 0);
    return Error(503, kShuttingDown, true);
  }
  auto job = std::make_shared<Job>();
  job->start = start_;
  job->body = std::move(req.body());
  size_t length = 0;
  bool binary = false;
  if (serving::Error e = JsonHeaderLength(req.base(), job->body.size(), &length, &binary)) {
    Count(e.status, 0);
    return Error(e.status, e.message);
  }
  const std::string_view head = std::string_view(job->body).substr(0, length);
  const std::string_view blob = std::string_view(job->body).substr(length);
  if (job->body.size() < kDecodeHere) {
    const serving::Error parsed = ParseHttpInfer(model_->plan(), head, blob, &job->req);
    return Parsed(job, parsed);
  }
  // A large body is parsed on a decode thread (seconds for tens of MB of JSON): this
  // IO thread goes on serving its other connections meanwhile.
  srv_->Decode([self = shared_from_this(), job, head, blob] {
    serving::Error parsed;
    try {
      parsed = ParseHttpInfer(self->model_->plan(), head, blob, &job->req);
    } catch (const std::bad_alloc&) {
      parsed = {500, "the server ran out of memory parsing the request (std::bad_alloc)"};
    } catch (const std::exception& e) {
      parsed = {500, std::string("the server failed parsing the request: ") + e.what()};
    }
    Listener* io = self->io_;
    asio::post(io->ioc, [self = std::move(self), job, parsed = std::move(parsed)] {
      self->Guard([&] { self->Parsed(job, parsed); });
    });
  });
}

void Connection::Parsed(const std::shared_ptr<Job>& job, const serving::Error& parsed) {
  const ModelPlan& m = model_->plan();
  if (srv_->logging()) request_id_ = job->req.id;
  if (parsed) {
    if (parsed.status >= 500) {
      std::fprintf(stderr, "paddle-ipu: an HTTP request failed in the server: %s\n",
                   parsed.message.c_str());
    }
    Count(parsed.status, 0);
    return Error(parsed.status, parsed.message);
  }
  if (!m.dynamic) StartHttpAnswer(m, job->req, &job->http);
  if (job->req.units == 0) {  // nothing to run
    FinishHttpAnswer(m, job->req, &job->http);
    Count(200, 0);
    const bool bin = job->http.header_length >= 0;
    return Write(http::status::ok, std::move(job->http.body),
                 bin ? "application/octet-stream" : "application/json", job->http.header_length);
  }
  job->connection = shared_from_this();
  job->io = io_->shared_from_this();
  RequestPtr r = MakeRequest(m, job, job->http.out, io_, job);
  if (serving::Error e = model_->Admit(r, job)) {
    Count(e.status, 0);
    return Error(e.status, e.message, e.status == 503);
  }
  request_ = std::move(r);
  job_ = job;
  hold_ = shared_from_this();
  timeout_s_ = job_->req.timeout_s >= 0 ? job_->req.timeout_s : m.request_timeout_s;
  if (timeout_s_ > 0) {
    timer_.expires_after(SteadyDuration(timeout_s_));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->OnTimeout(ec); });
  }
  Watch();
}

}  // namespace serving
}  // namespace paddle_ipu
