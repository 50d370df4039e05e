// The routes of the HTTP front end: a request read by a Connection to its answer
// (the role of handle_request in Beast's examples). Infer admits the request to the
// queue; the answer comes back through Connection::Answer.
#include <charconv>

#include "connection.h"
#include "front_end.h"
#include "listener.h"
#include "metadata.h"
#include "requests.h"
#include "text.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace paddle_ipu {
namespace serving {

void Connection::Route() {
  auto& req = parser_->get();
  const ModelPlan& m = fe_->plan();
  std::string_view target(req.target().data(), req.target().size());
  if (const size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
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
    if (fe_->ready()) return json("{\"ready\":true}");
    return Write(http::status::service_unavailable,
                 "{\"ready\":false,\"error\":\"the server is not ready (warming up, or "
                 "draining before it stops)\"}",
                 "application/json", -1, true);
  }
  if (target == "/v2") {
    if (only(get, "GET")) json(fe_->server_metadata());
    return;
  }
  if (target == "/metrics") {
    if (only(get, "GET")) {
      Write(http::status::ok, fe_->Prometheus(),
            "text/plain; version=0.0.4; charset=utf-8");
    }
    return;
  }
  if (target == "/v2/repository/index") {
    if (only(post, "POST")) json(RepositoryIndexJson(m, fe_->ready()));
    return;
  }
  if (target == "/v2/models/stats") {
    if (only(get, "GET")) json(fe_->StatisticsJson());
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
  if (name != m.name) {
    if (post) Count(404, 0);
    return Error(404, "unknown model " + Quote(name) + ": this server serves " + Quote(m.name));
  }
  constexpr std::string_view kVersions = "/versions/";
  if (rest.substr(0, kVersions.size()) == kVersions) {
    rest = rest.substr(kVersions.size());
    const size_t s2 = rest.find('/');
    const std::string_view v = rest.substr(0, s2);
    if (v != m.version) {
      if (post) Count(404, 0);
      return Error(404, "model " + Quote(m.name) + " has no version " + Quote(v) +
                            ": it has version " + Quote(m.version));
    }
    rest = s2 == std::string_view::npos ? std::string_view() : rest.substr(s2);
  }
  if (rest.empty()) {
    if (only(get, "GET")) json(fe_->metadata());
    return;
  }
  if (rest == "/ready") {
    if (!only(get, "GET")) return;
    if (fe_->ready()) return json("{\"name\":" + Quote(m.name) + ",\"ready\":true}");
    return Write(http::status::service_unavailable,
                 "{\"name\":" + Quote(m.name) + ",\"ready\":false,\"error\":" +
                     Quote("model " + m.name + " is not ready") + "}",
                 "application/json", -1, true);
  }
  if (rest == "/config") {
    if (only(get, "GET")) json(fe_->config());
    return;
  }
  if (rest == "/stats") {
    if (only(get, "GET")) json(fe_->StatisticsJson());
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
  const ModelPlan& m = fe_->plan();
  if (fe_->draining()) {
    Count(503, 0);
    return Error(503, kShuttingDown, true);
  }
  auto job = std::make_shared<Job>();
  job->start = start_;
  job->body = std::move(req.body());
  std::string_view head(job->body), blob;
  auto it = req.find(kHeaderLength);
  if (it != req.end()) {
    const std::string_view v(it->value().data(), it->value().size());
    int64_t n = -1;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) {
      Count(400, 0);
      return Error(400, std::string(kHeaderLength) + " must be an integer, got " + Quote(v));
    }
    if (n < 0 || n > static_cast<int64_t>(job->body.size())) {
      Count(400, 0);
      return Error(400, std::string(kHeaderLength) + " is " + std::to_string(n) +
                            ", but the body has " + std::to_string(job->body.size()) + " bytes");
    }
    head = head.substr(0, static_cast<size_t>(n));
    blob = std::string_view(job->body).substr(static_cast<size_t>(n));
  }
  serving::Error parsed = ParseHttpInfer(m, head, blob, &job->req);
  if (fe_->logging()) request_id_ = job->req.id;
  if (parsed) {
    Count(parsed.status, 0);
    return Error(parsed.status, parsed.message);
  }
  StartHttpAnswer(m, job->req, &job->http);
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
  if (serving::Error e = fe_->Admit(r)) {
    Count(e.status, 0);
    return Error(e.status, e.message, e.status == 503);
  }
  request_ = std::move(r);
  job_ = std::move(job);
  hold_ = shared_from_this();
  timeout_s_ = job_->req.timeout_s >= 0 ? job_->req.timeout_s : m.request_timeout_s;
  if (timeout_s_ > 0) {
    timer_.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(
        std::chrono::duration<double>(timeout_s_)));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->OnTimeout(ec); });
  }
  Watch();
}

}  // namespace serving
}  // namespace paddle_ipu
