// The serving front ends of paddle_ipu._core: KServe v2 over HTTP/1.1 (Boost.Beast on
// Boost.Asio) and the ModelInfer path of KServe v2 over gRPC (the call's bytes, from
// the gRPC server in paddle_ipu/serving/grpc_service.py), both feeding the model
// runtime's ServingQueue (csrc/core/queue.h) without the GIL.
//
// A request is parsed, checked (requests.h), and admitted to the queue on an IO
// thread; its inputs are read by the queue straight from the request body, and its
// outputs are written straight into the response body. The Python worker
// (ModelRuntime._loop) takes the GIL once per run, not per request; a finished run's
// requests come back to their IO thread in one post. No Python object is made or
// touched per request.
//
// Policies: the queue's bound answers 503 with Retry-After at once (never blocks an
// IO thread); a request not started within its timeout is taken out of the queue and
// answered 504; a request whose client closed the connection is taken out of the
// queue before it runs; stop_accepting() + drain() answer what is in flight and
// close idle connections.
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_set>

#include "../core/bindings.h"
#include "../core/queue.h"
#include "answers.h"
#include "metadata.h"
#include "metrics.h"
#include "requests.h"
#include "text.h"

namespace py = pybind11;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace paddle_ipu {
namespace serving {

namespace {

constexpr const char* kHeaderLength = "Inference-Header-Content-Length";
// Seconds a client is told to wait before retrying a busy or draining server.
constexpr const char* kRetryAfter = "1";

class FrontEnd;
class Session;
struct IoThread;

// What a native request owns: the body its inputs point into, the converted
// inputs, and the answer its outputs are written into.
struct Job {
  std::string body;
  InferRequest req;
  HttpAnswer http;
  GrpcAnswer grpc;
  std::chrono::steady_clock::time_point start;
  std::weak_ptr<Session> session;  // HTTP: who answers
  // HTTP: the request's sink. A request outlives its front end when a stop gave up
  // waiting for it: the worker still delivers it, to a sink that must still exist.
  std::shared_ptr<IoThread> io;
};

RequestPtr MakeRequest(const ModelPlan& m, const std::shared_ptr<Job>& job,
                       const std::vector<char*>& out, NativeSink* sink,
                       std::shared_ptr<void> owner) {
  auto r = std::make_shared<Request>();
  r->units = job->req.units;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    r->in.push_back({const_cast<char*>(job->req.in[k]), r->units * m.inputs[k].unit_bytes});
  }
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    r->out.push_back({out[i], r->units * m.outputs[i].unit_bytes});
  }
  r->sink = sink;
  r->owner = std::move(owner);
  return r;
}

// The gRPC status code of an HTTP status.
int GrpcCode(int status) {
  switch (status) {
    case 200: return 0;     // OK
    case 400: return 3;     // INVALID_ARGUMENT
    case 413: return 3;
    case 404: return 5;     // NOT_FOUND
    case 503: return 14;    // UNAVAILABLE
    case 504: return 4;     // DEADLINE_EXCEEDED
    case 499: return 1;     // CANCELLED
    default: return 13;     // INTERNAL
  }
}

std::string ShortMs(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", seconds * 1e3);
  return buf;
}

struct IoThread : NativeSink, std::enable_shared_from_this<IoThread> {
  asio::io_context ioc{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{ioc.get_executor()};
  std::optional<tcp::acceptor> acceptor;
  std::thread thread;
  std::unordered_set<Session*> sessions;  // touched on this thread only
  void Deliver(std::vector<RequestPtr>&& finished) override;
};

// The answer of a gRPC ModelInfer call, waited for by a thread of the gRPC server.
class GrpcCall : public NativeSink, public std::enable_shared_from_this<GrpcCall> {
 public:
  void Deliver(std::vector<RequestPtr>&& finished) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const RequestPtr& r : finished) {
      if (r == request_) Finish(*r);
    }
    cv_.notify_all();
  }

  // With mu_ held.
  void Finish(const Request& r) {
    if (r.state == RequestState::kDone) {
      status_ = 200;
    } else if (r.state == RequestState::kCancelled ||
               r.error_message.find("closed") != std::string::npos) {
      status_ = 503;
      message_ = r.error_message.empty() ? "the model runtime is closed" : r.error_message;
    } else {
      status_ = 500;
      message_ = "inference failed: " + r.error_message;
    }
    done_ = true;
    request_.reset();  // the request owns this call: break the cycle
  }

  void Fail(int status, std::string message) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    message_ = std::move(message);
    done_ = true;
    request_.reset();
    cv_.notify_all();
  }

  // Waits (without the GIL) for the answer, at most `timeout` seconds for the
  // request to start (then it is cancelled: 504).
  void Wait(double timeout, Counters* counters) {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeout > 0) {
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(timeout));
      if (!cv_.wait_until(lock, deadline, [this] { return done_; })) {
        RequestPtr r = request_;
        lock.unlock();
        const bool cancelled = r && CancelNative(r.get());
        lock.lock();
        if (cancelled && !done_) {
          status_ = 504;
          message_ = "the request was not started within its timeout of " + ShortMs(timeout) +
                     " ms: the server is busy; retry later or allow a longer timeout";
          done_ = true;
          request_.reset();
          std::lock_guard<std::mutex> c(counters->mu);
          counters->timed_out += 1;
        }
      }
    }
    cv_.wait(lock, [this] { return done_; });
  }

  // The client went away (the gRPC server's callback): drop the request if queued.
  bool Cancel(Counters* counters) {
    RequestPtr r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return false;
      r = request_;
    }
    if (!r || !CancelNative(r.get())) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      status_ = 499;
      message_ = "the client cancelled the call";
      done_ = true;
      request_.reset();
      cv_.notify_all();
      std::lock_guard<std::mutex> c(counters->mu);
      counters->disconnected += 1;
    }
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int status_ = 0;
  std::string message_;
  RequestPtr request_;
  std::shared_ptr<Job> job_;
  bool admitted_ = false;  // counted in FrontEnd::active until result() returns
};

class FrontEnd {
 public:
  FrontEnd(py::object queue, ModelPlan plan)
      : queue_obj_(queue), queue_(QueueOf(queue)), plan_(std::move(plan)) {
    metadata_ = ModelMetadataJson(plan_);
    server_metadata_ = ServerMetadataJson(plan_);
    config_ = ModelConfigJson(plan_);
  }
  ~FrontEnd() { Shutdown(); }

  const ModelPlan& plan() const { return plan_; }
  ServingQueue* queue() { return queue_.get(); }
  Counters* counters() { return &counters_; }
  const std::string& metadata() const { return metadata_; }
  const std::string& server_metadata() const { return server_metadata_; }
  const std::string& config() const { return config_; }
  bool draining() const { return draining_.load(); }
  bool ready() const { return ready_.load() && !draining_.load() && !ClosedOf(queue_.get()); }
  void set_ready(bool ready) { ready_ = ready; }

  QueueStats Stats() { return StatsOf(queue_.get()); }

  int StartHttp(const std::string& host, int port, int threads, bool reuse_port);
  void StopAccepting();
  bool Drain(double timeout);
  void Shutdown();

  std::shared_ptr<GrpcCall> GrpcInfer(std::string msg);

  std::atomic<int64_t> active{0};    // requests admitted, not answered
  std::atomic<int64_t> sessions{0};  // open HTTP connections

 private:
  void Accept(IoThread* io);

  py::object queue_obj_;
  std::shared_ptr<ServingQueue> queue_;
  ModelPlan plan_;
  Counters counters_;
  std::string metadata_, server_metadata_, config_;
  std::vector<std::shared_ptr<IoThread>> ios_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> ready_{true};
  std::mutex drain_mu_;
  std::condition_variable drained_;
  friend class Session;

 public:
  void NotifyDrain() {
    std::lock_guard<std::mutex> lock(drain_mu_);
    drained_.notify_all();
  }
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, IoThread* io, FrontEnd* fe)
      : sock_(std::move(sock)), timer_(io->ioc), io_(io), fe_(fe) {
    fe_->sessions += 1;
    io_->sessions.insert(this);
  }
  ~Session() {
    io_->sessions.erase(this);
    fe_->sessions -= 1;
    fe_->NotifyDrain();
  }

  void Start() { DoRead(); }

  // Drain: close the connection unless a request is under way (answered first).
  void OnDrain() {
    if (!busy_) Close();
  }

  void Answer(const RequestPtr& r);

 private:
  void Close() {
    beast::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_both, ignored);
    sock_.close(ignored);
  }

  void DoRead() {
    busy_ = false;
    if (fe_->draining()) return Close();
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(fe_->plan().max_body));
    parser_->header_limit(64 * 1024);
    http::async_read_header(
        sock_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // A client that asks before it sends its body (curl does for bodies over 1 KiB) is
  // told to go on, unless the body is already known to be too large.
  void OnHeader(beast::error_code ec) {
    if (ec) return OnRead(ec);
    auto& req = parser_->get();
    const auto expect = req[http::field::expect];
    const bool too_large = parser_->content_length() &&
                           *parser_->content_length() > static_cast<uint64_t>(fe_->plan().max_body);
    if (too_large) return OnRead(http::error::body_limit);
    if (!beast::iequals(expect, "100-continue") || parser_->is_done()) return ReadBody();
    continue_.version(11);
    continue_.result(http::status::continue_);
    http::async_write(sock_, continue_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      self->ReadBody();
    });
  }

  void ReadBody() {
    http::async_read(sock_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec);
  void Route();
  void Infer(http::request<http::string_body>& req);

  void Write(http::status status, std::string body, const char* type, int64_t header_length = -1,
             bool retry = false, const char* allow = nullptr) {
    busy_ = true;
    res_ = {};
    res_.version(11);
    res_.result(status);
    const bool keep = keep_alive_ && !fe_->draining() && !close_after_;
    res_.keep_alive(keep);
    res_.set(http::field::server, "paddle-ipu");
    if (type) res_.set(http::field::content_type, type);
    if (header_length >= 0) res_.set(kHeaderLength, std::to_string(header_length));
    if (retry) res_.set(http::field::retry_after, kRetryAfter);
    if (allow) res_.set(http::field::allow, allow);
    res_.body() = std::move(body);
    res_.prepare_payload();
    http::async_write(sock_, res_, [self = shared_from_this(), keep](beast::error_code ec, size_t) {
      if (ec || !keep) return self->Close();
      self->DoRead();
    });
  }

  void Error(int status, const std::string& message, bool retry = false) {
    Write(static_cast<http::status>(status), ErrorJson(message), "application/json", -1, retry);
  }

  void Count(int status, int64_t rows) {
    fe_->counters()->Done(status, rows, std::chrono::steady_clock::now() - start_);
  }

  void Watch() {
    watching_ = true;
    sock_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this()](beast::error_code ec) { self->OnReadable(ec); });
  }

  // The socket turned readable (or failed) while the request waits: a client that
  // closed its connection loses its request before it is computed.
  void OnReadable(beast::error_code ec) {
    watching_ = false;
    if (ec == asio::error::operation_aborted || !request_) return;
    if (!ec) {
      char c;
      const ssize_t n = ::recv(sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // a pipelined request: read after this answer
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return Watch();
    }
    gone_ = true;
    Close();
    if (CancelNative(request_.get())) {
      {
        std::lock_guard<std::mutex> lock(fe_->counters()->mu);
        fe_->counters()->disconnected += 1;
      }
      Finished();
    }
    // Otherwise it has started: Answer() drops the result.
  }

  void OnTimeout(beast::error_code ec) {
    if (ec || !request_) return;
    if (!CancelNative(request_.get())) return;  // under way: answered when it is done
    {
      std::lock_guard<std::mutex> lock(fe_->counters()->mu);
      fe_->counters()->timed_out += 1;
    }
    const double t = timeout_s_;
    Finished();
    Count(504, 0);
    Error(504, "the request was not started within its timeout of " + ShortMs(t) +
                   " ms: the server is busy; retry later or allow a longer timeout");
  }

  // The request left the queue: release what held the session and the counters.
  void Finished() {
    request_.reset();
    job_.reset();
    timer_.cancel();
    if (watching_) {
      beast::error_code ignored;
      sock_.cancel(ignored);
    }
    fe_->active -= 1;
    fe_->NotifyDrain();
    hold_.reset();  // last: may destroy this session
  }

  tcp::socket sock_;
  asio::steady_timer timer_;
  IoThread* io_;
  FrontEnd* fe_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  http::response<http::empty_body> continue_;
  bool keep_alive_ = true;
  bool close_after_ = false;
  bool busy_ = false;
  bool watching_ = false;
  bool gone_ = false;
  double timeout_s_ = 0;
  std::chrono::steady_clock::time_point start_;
  RequestPtr request_;
  std::shared_ptr<Job> job_;
  std::shared_ptr<Session> hold_;  // itself, while a request waits in the queue
};

void IoThread::Deliver(std::vector<RequestPtr>&& finished) {
  asio::post(ioc, [done = std::move(finished)] {
    for (const RequestPtr& r : done) {
      auto job = std::static_pointer_cast<Job>(r->owner);
      if (auto s = job->session.lock()) s->Answer(r);
    }
  });
}

void Session::OnRead(beast::error_code ec) {
  busy_ = true;
  if (ec) {
    close_after_ = true;
    if (ec == http::error::body_limit) {
      Count(413, 0);
      return Error(413, "the request body is larger than the server's limit of " +
                            std::to_string(fe_->plan().max_body) + " bytes (--max-body-mb)");
    }
    if (ec == http::error::header_limit) {
      Count(431, 0);
      return Error(431, "the request's headers are larger than 64 KiB");
    }
    if (ec.category() == beast::error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      Count(400, 0);
      return Error(400, "malformed HTTP request: " + ec.message());
    }
    return Close();  // the client closed the connection, or a socket error
  }
  start_ = std::chrono::steady_clock::now();
  keep_alive_ = parser_->get().keep_alive();
  Route();
}

void Session::Route() {
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
  if (target == "/v2/health/live") {
    if (only(get, "GET")) Write(http::status::ok, std::string(), nullptr);
    return;
  }
  if (target == "/v2/health/ready") {
    if (!only(get, "GET")) return;
    if (fe_->ready()) return Write(http::status::ok, std::string(), nullptr);
    return Error(503, "the server is not ready (starting, or draining before it stops)", true);
  }
  if (target == "/v2") {
    if (only(get, "GET")) Write(http::status::ok, fe_->server_metadata(), "application/json");
    return;
  }
  if (target == "/metrics") {
    if (only(get, "GET")) {
      Write(http::status::ok, Prometheus(m, fe_->counters(), fe_->Stats()),
            "text/plain; version=0.0.4; charset=utf-8");
    }
    return;
  }
  if (target == "/v2/repository/index") {
    if (only(post, "POST")) {
      Write(http::status::ok, RepositoryIndexJson(m, fe_->ready()), "application/json");
    }
    return;
  }
  if (target == "/v2/models/stats") {
    if (only(get, "GET")) {
      Write(http::status::ok, StatisticsJson(m, fe_->counters(), fe_->Stats()), "application/json");
    }
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
    if (only(get, "GET")) Write(http::status::ok, fe_->metadata(), "application/json");
    return;
  }
  if (rest == "/ready") {
    if (!only(get, "GET")) return;
    if (fe_->ready()) return Write(http::status::ok, std::string(), nullptr);
    return Error(503, "model " + Quote(m.name) + " is not ready", true);
  }
  if (rest == "/config") {
    if (only(get, "GET")) Write(http::status::ok, fe_->config(), "application/json");
    return;
  }
  if (rest == "/stats") {
    if (only(get, "GET")) {
      Write(http::status::ok, StatisticsJson(m, fe_->counters(), fe_->Stats()), "application/json");
    }
    return;
  }
  if (rest == "/infer") {
    if (only(post, "POST")) Infer(req);
    return;
  }
  Error(404, "no route " + std::string(req.method_string()) + " " + std::string(target) +
                 ": model routes are /v2/models/{name}[/versions/{v}][/ready|/config|/stats|/infer]");
}

void Session::Infer(http::request<http::string_body>& req) {
  const ModelPlan& m = fe_->plan();
  if (fe_->draining()) {
    Count(503, 0);
    return Error(503, "the server is shutting down: no new requests are accepted", true);
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
  if (serving::Error e = ParseHttpInfer(m, head, blob, &job->req)) {
    Count(e.status, 0);
    return Error(e.status, e.message);
  }
  StartHttpAnswer(m, job->req, &job->http);
  if (job->req.units == 0) {  // nothing to run
    FinishHttpAnswer(m, job->req, &job->http);
    Count(200, 0);
    const bool bin = job->http.header_length >= 0;
    return Write(http::status::ok, std::move(job->http.body),
                 bin ? "application/octet-stream" : "application/json", job->http.header_length);
  }
  job->session = shared_from_this();
  job->io = io_->shared_from_this();
  RequestPtr r = MakeRequest(m, job, job->http.out, io_, job);
  int64_t in_flight = 0;
  const int st = SubmitNative(fe_->queue(), r, &in_flight);
  if (st != 0) {
    if (st == 1) {
      std::lock_guard<std::mutex> lock(fe_->counters()->mu);
      fe_->counters()->rejected_busy += 1;
    }
    Count(st == 3 ? 500 : 503, 0);
    if (st == 1) {
      return Error(503,
                   "the server is busy: " + std::to_string(in_flight) + " of " +
                       std::to_string(m.limit) + (m.auto_batch ? " rows" : " micro-batches") +
                       " in flight (num_buffers); retry later",
                   true);
    }
    if (st == 2) return Error(503, "the model runtime is closed: no new requests are accepted", true);
    return Error(500, "internal error: the request's sizes do not match the queue's");
  }
  fe_->active += 1;
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

void Session::Answer(const RequestPtr& r) {
  if (r != request_) return;  // cancelled and answered already
  std::shared_ptr<Job> job = job_;
  auto self = shared_from_this();
  Finished();
  const ModelPlan& m = fe_->plan();
  if (gone_) return;  // the client went away while it ran
  if (r->state == RequestState::kDone) {
    FinishHttpAnswer(m, job->req, &job->http);
    Count(200, job->req.rows);
    const bool bin = job->http.header_length >= 0;
    return Write(http::status::ok, std::move(job->http.body),
                 bin ? "application/octet-stream" : "application/json", job->http.header_length);
  }
  const bool closed = r->state == RequestState::kCancelled ||
                      r->error_message.find("closed") != std::string::npos;
  const int status = closed ? 503 : 500;
  Count(status, 0);
  Error(status, closed ? (r->error_message.empty() ? "the model runtime is closed" : r->error_message)
                       : "inference failed: " + r->error_message,
        closed);
}

int FrontEnd::StartHttp(const std::string& host, int port, int threads, bool reuse_port) {
  if (!ios_.empty()) throw std::runtime_error("the HTTP front end is already started");
  if (threads < 1) throw std::invalid_argument("threads must be >= 1");
  const auto addr = asio::ip::make_address(host);
  for (int i = 0; i < threads; ++i) {
    auto io = std::make_shared<IoThread>();
    io->acceptor.emplace(io->ioc);
    tcp::endpoint ep(addr, static_cast<unsigned short>(port));
    io->acceptor->open(ep.protocol());
    io->acceptor->set_option(asio::socket_base::reuse_address(true));
    // Every IO thread accepts on its own socket, and so does every worker process
    // (--workers): the kernel spreads the connections. Only then: otherwise a second
    // server on the same port would silently take half of the traffic.
    if (threads > 1 || reuse_port) {
      int one = 1;
      ::setsockopt(io->acceptor->native_handle(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    }
    boost::system::error_code ec;
    io->acceptor->bind(ep, ec);
    if (ec) {
      throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " +
                               ec.message());
    }
    io->acceptor->listen(asio::socket_base::max_listen_connections);
    if (port == 0) port = io->acceptor->local_endpoint().port();
    ios_.push_back(std::move(io));
  }
  for (auto& io : ios_) {
    IoThread* p = io.get();
    Accept(p);
    p->thread = std::thread([p] { p->ioc.run(); });
  }
  return port;
}

void FrontEnd::Accept(IoThread* io) {
  io->acceptor->async_accept([this, io](beast::error_code ec, tcp::socket s) {
    if (ec == asio::error::operation_aborted || !io->acceptor->is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(s), io, this)->Start();
    }
    Accept(io);
  });
}

void FrontEnd::StopAccepting() {
  draining_ = true;
  for (auto& io : ios_) {
    IoThread* p = io.get();
    asio::post(p->ioc, [p] {
      beast::error_code ignored;
      if (p->acceptor) p->acceptor->close(ignored);
      std::vector<Session*> all(p->sessions.begin(), p->sessions.end());
      for (Session* s : all) s->OnDrain();
    });
  }
}

bool FrontEnd::Drain(double timeout) {
  std::unique_lock<std::mutex> lock(drain_mu_);
  auto done = [this] { return active.load() == 0 && sessions.load() == 0; };
  if (timeout < 0) {
    drained_.wait(lock, done);
    return true;
  }
  return drained_.wait_for(lock, std::chrono::duration<double>(timeout), done);
}

void FrontEnd::Shutdown() {
  draining_ = true;
  for (auto& io : ios_) {
    io->guard.reset();
    io->ioc.stop();
  }
  for (auto& io : ios_) {
    if (io->thread.joinable()) io->thread.join();
  }
  ios_.clear();  // destroys what was left pending (sessions, answers)
}

std::shared_ptr<GrpcCall> FrontEnd::GrpcInfer(std::string msg) {
  auto call = std::make_shared<GrpcCall>();
  auto job = std::make_shared<Job>();
  job->start = std::chrono::steady_clock::now();
  job->body = std::move(msg);
  call->job_ = job;
  const ModelPlan& m = plan_;
  if (draining_) {
    call->Fail(503, "the server is shutting down: no new requests are accepted");
    return call;
  }
  if (serving::Error e = ParseGrpcInfer(m, job->body, &job->req)) {
    call->Fail(e.status, e.message);
    return call;
  }
  StartGrpcAnswer(m, job->req, &job->grpc);
  if (job->req.units == 0) {
    call->Fail(200, std::string());
    return call;
  }
  RequestPtr r = MakeRequest(m, job, job->grpc.out, call.get(), call);
  {
    std::lock_guard<std::mutex> lock(call->mu_);
    call->request_ = r;
  }
  int64_t in_flight = 0;
  const int st = SubmitNative(queue_.get(), r, &in_flight);
  if (st == 1) {
    {
      std::lock_guard<std::mutex> lock(counters_.mu);
      counters_.rejected_busy += 1;
    }
    call->Fail(503, "the server is busy: " + std::to_string(in_flight) + " of " +
                        std::to_string(m.limit) +
                        (m.auto_batch ? " rows" : " micro-batches") +
                        " in flight (num_buffers); retry later");
  } else if (st == 2) {
    call->Fail(503, "the model runtime is closed: no new requests are accepted");
  } else if (st == 3) {
    call->Fail(500, "internal error: the request's sizes do not match the queue's");
  } else {
    active += 1;
    call->admitted_ = true;
  }
  return call;
}

// -- Python ---------------------------------------------------------------------------

TensorPlan TensorFrom(const py::dict& d) {
  TensorPlan t;
  t.name = d["name"].cast<std::string>();
  const std::string dt = d["datatype"].cast<std::string>();
  t.dtype = FromV2(dt);
  if (t.dtype == DType::kInvalid) throw py::value_error("unknown KServe datatype " + dt);
  t.shape = d["shape"].cast<std::vector<int64_t>>();
  t.unit_bytes = d["unit_bytes"].cast<int64_t>();
  t.unit_elems = t.unit_bytes / ElemSize(t.dtype);
  if (d.contains("ranges")) {
    for (const py::handle h : d["ranges"]) {
      const py::dict r = h.cast<py::dict>();
      IndexRange b;
      b.low = r["low"].cast<int64_t>();
      b.high = r["high"].cast<int64_t>();
      b.allowed = r["allowed"].cast<std::vector<int64_t>>();
      b.column = r["column"].is_none() ? -1 : r["column"].cast<int64_t>();
      b.describe = r["describe"].cast<std::string>();
      t.ranges.push_back(std::move(b));
    }
  }
  return t;
}

ModelPlan PlanFrom(const py::dict& d) {
  ModelPlan m;
  m.name = d["name"].cast<std::string>();
  m.version = d["version"].cast<std::string>();
  m.server_version = d["server_version"].cast<std::string>();
  m.auto_batch = d["auto_batch"].cast<bool>();
  m.max_rows = d["max_rows"].cast<int64_t>();
  m.capacity = d["capacity"].cast<int64_t>();
  m.limit = d["limit"].cast<int64_t>();
  m.micro_batch_size = d["micro_batch_size"].cast<int64_t>();
  m.batch_timeout_us = d["batch_timeout_us"].cast<double>();
  m.request_timeout_s = d["request_timeout_s"].cast<double>();
  m.max_body = d["max_body"].cast<int64_t>();
  for (const py::handle h : d["inputs"]) m.inputs.push_back(TensorFrom(h.cast<py::dict>()));
  for (const py::handle h : d["outputs"]) m.outputs.push_back(TensorFrom(h.cast<py::dict>()));
  return m;
}

py::tuple ParsedTuple(const ModelPlan& m, const serving::Error& e, const InferRequest& r) {
  if (e) return py::make_tuple(e.status, ValidUtf8(e.message), py::none());
  py::list inputs;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    inputs.append(py::bytes(r.in[k], static_cast<size_t>(r.units * m.inputs[k].unit_bytes)));
  }
  py::dict out;
  out["units"] = r.units;
  out["rows"] = r.rows;
  out["inputs"] = inputs;
  out["want"] = r.want;
  out["binary"] = std::vector<bool>(r.binary.begin(), r.binary.end());
  out["id"] = r.id;
  out["timeout_s"] = r.timeout_s;
  return py::make_tuple(0, std::string(), out);
}

}  // namespace

void RegisterServing(py::module_& m) {
  py::class_<GrpcCall, std::shared_ptr<GrpcCall>>(
      m, "GrpcInferCall", "A ModelInfer call in the serving queue (made by ServingFrontEnd.grpc_infer).")
      .def(
          "result",
          [](GrpcCall& c, double timeout, FrontEnd& fe) -> py::tuple {
            // The first of: the call's deadline, the request's timeout parameter, the
            // server's request timeout.
            double t = timeout;
            for (double other : {c.job_->req.timeout_s, fe.plan().request_timeout_s}) {
              if (other > 0 && (t <= 0 || other < t)) t = other;
            }
            {
              py::gil_scoped_release nogil;
              c.Wait(t, fe.counters());
            }
            const int status = c.status_;
            const int64_t rows = status == 200 && c.job_ ? c.job_->req.rows : 0;
            fe.counters()->Done(status, rows, std::chrono::steady_clock::now() - c.job_->start);
            if (c.admitted_) {  // it left the queue: one less in flight
              c.admitted_ = false;
              fe.active -= 1;
              fe.NotifyDrain();
            }
            if (status == 200) return py::make_tuple(0, py::bytes(c.job_->grpc.body));
            return py::make_tuple(GrpcCode(status), py::str(ValidUtf8(c.message_)));
          },
          py::arg("timeout"), py::arg("front_end"),
          "Wait for the answer (without the GIL); a request not started within timeout\n"
          "seconds (> 0) is taken out of the queue. (0, response bytes) or (gRPC code, message).")
      .def(
          "cancel", [](GrpcCall& c, FrontEnd& fe) { return c.Cancel(fe.counters()); },
          py::arg("front_end"), "Drop the request if it has not started (the client went away).");

  py::class_<FrontEnd>(m, "ServingFrontEnd",
                       "The KServe v2 front ends over a ServingQueue: HTTP (Boost.Beast) and the\n"
                       "gRPC ModelInfer path; requests never touch Python (see csrc/serving).")
      .def(py::init([](py::object queue, const py::dict& plan) {
             return std::make_unique<FrontEnd>(queue, PlanFrom(plan));
           }),
           py::arg("queue"), py::arg("plan"))
      .def("start_http", &FrontEnd::StartHttp, py::arg("host"), py::arg("port"),
           py::arg("threads") = 1, py::arg("reuse_port") = false,
           py::call_guard<py::gil_scoped_release>(),
           "Listen on host:port with `threads` IO threads; returns the port.")
      .def("stop_accepting", &FrontEnd::StopAccepting,
           "Drain: close the listening sockets and idle connections; answer what is in flight.")
      .def("drain", &FrontEnd::Drain, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Wait until every admitted request is answered and every connection closed;\n"
           "False on timeout (negative: no limit).")
      .def("shutdown", &FrontEnd::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def("set_ready", &FrontEnd::set_ready, py::arg("ready"))
      .def_property_readonly("ready", &FrontEnd::ready)
      .def_property_readonly("active", [](FrontEnd& f) { return f.active.load(); })
      .def(
          "grpc_infer",
          [](FrontEnd& f, py::bytes msg) {
            std::string data = msg;  // a copy: no Python object stays with the request
            py::gil_scoped_release nogil;
            return f.GrpcInfer(std::move(data));
          },
          py::arg("message"), "Parse, check and queue a serialized ModelInferRequest.")
      .def("server_metadata_json", [](FrontEnd& f) { return f.server_metadata(); })
      .def("metadata_json", [](FrontEnd& f) { return f.metadata(); })
      .def("config_json", [](FrontEnd& f) { return f.config(); })
      .def("index_json", [](FrontEnd& f) { return RepositoryIndexJson(f.plan(), f.ready()); })
      .def("stats_json",
           [](FrontEnd& f) { return StatisticsJson(f.plan(), f.counters(), f.Stats()); })
      .def("prometheus", [](FrontEnd& f) { return Prometheus(f.plan(), f.counters(), f.Stats()); })
      .def(
          "parse_http",
          [](FrontEnd& f, py::bytes head, py::bytes blob) {
            const std::string h = head, b = blob;
            InferRequest r;
            const serving::Error e = ParseHttpInfer(f.plan(), h, b, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("head"), py::arg("blob") = py::bytes(),
          "Parse and check an HTTP infer request without queueing it (for tests):\n"
          "(0, '', dict) or (HTTP status, message, None).")
      .def(
          "parse_grpc",
          [](FrontEnd& f, py::bytes msg) {
            const std::string s = msg;
            InferRequest r;
            const serving::Error e = ParseGrpcInfer(f.plan(), s, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("message"), "As parse_http, for a serialized ModelInferRequest.");
}

}  // namespace serving
}  // namespace paddle_ipu
