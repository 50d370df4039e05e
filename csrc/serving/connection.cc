// An HTTP connection (see connection.h); its routes are in routes.cc.
#include "connection.h"

#include <sys/socket.h>

#include <cerrno>

#include "dynamic.h"
#include "front_end.h"
#include "listener.h"
#include "server.h"
#include "text.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace paddle_ipu {
namespace serving {

namespace {

// Seconds a client is told to wait before retrying a busy or draining server.
constexpr const char* kRetryAfter = "1";

// The model and version an infer URL names: /v2/models/{m}[/versions/{v}]/infer.
void ModelOfTarget(std::string_view t, std::string_view* model, std::string_view* version) {
  constexpr std::string_view kModels = "/v2/models/", kVersions = "/versions/";
  if (const size_t q = t.find('?'); q != std::string_view::npos) t = t.substr(0, q);
  if (t.substr(0, kModels.size()) != kModels) return;
  t = t.substr(kModels.size());
  const size_t slash = t.find('/');
  *model = t.substr(0, slash);
  if (slash == std::string_view::npos) return;
  t = t.substr(slash);
  if (t.substr(0, kVersions.size()) == kVersions) {
    t = t.substr(kVersions.size());
    *version = t.substr(0, t.find('/'));
  }
}

}  // namespace

Connection::Connection(tcp::socket sock, Listener* io, Server* srv)
    : sock_(std::move(sock)), timer_(io->ioc), io_(io), srv_(srv) {
  srv_->connections += 1;
  io_->connections.insert(this);
}

Connection::~Connection() {
  io_->connections.erase(this);
  srv_->connections -= 1;
  srv_->NotifyDrain();
}

void Connection::OnDrain() {
  if (!busy_) Close();
}

void Connection::Close() {
  beast::error_code ignored;
  sock_.shutdown(tcp::socket::shutdown_both, ignored);
  sock_.close(ignored);
}

void Connection::DoRead() {
  busy_ = false;
  model_.reset();
  if (srv_->draining()) return Close();
  parser_.emplace();
  parser_->body_limit(static_cast<uint64_t>(srv_->max_body()));
  parser_->header_limit(64 * 1024);
  http::async_read_header(
      sock_, buf_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

// A client that asks before it sends its body (curl does for bodies over 1 KiB) is
// told to go on, unless the body is already known to be too large.
void Connection::OnHeader(beast::error_code ec) {
  if (ec) return OnRead(ec);
  auto& req = parser_->get();
  const auto expect = req[http::field::expect];
  const bool too_large = parser_->content_length() &&
                         *parser_->content_length() > static_cast<uint64_t>(srv_->max_body());
  if (too_large) return OnRead(http::error::body_limit);
  if (!beast::iequals(expect, "100-continue") || parser_->is_done()) return ReadBody();
  continue_.version(11);
  continue_.result(http::status::continue_);
  http::async_write(sock_, continue_, [self = shared_from_this()](beast::error_code ec, size_t) {
    if (ec) return self->Close();
    self->ReadBody();
  });
}

void Connection::ReadBody() {
  http::async_read(sock_, buf_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

void Connection::OnRead(beast::error_code ec) {
  busy_ = true;
  start_ = std::chrono::steady_clock::now();
  request_id_.clear();
  if (ec) {
    close_after_ = true;
    if (ec == http::error::body_limit) {
      Count(413, 0);
      return Error(413, "the request body is larger than the server's limit of " +
                            std::to_string(srv_->max_body()) + " bytes (--max-body-mb)");
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
  keep_alive_ = parser_->get().keep_alive();
  Route();
}

void Connection::Write(http::status status, std::string body, const char* type,
                       int64_t header_length, bool retry, const char* allow) {
  busy_ = true;
  res_ = {};
  res_.version(11);
  res_.result(status);
  const bool keep = keep_alive_ && !srv_->draining() && !close_after_;
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

void Connection::Error(int status, const std::string& message, bool retry) {
  Write(static_cast<http::status>(status), ErrorJson(message), "application/json", -1, retry);
}

void Connection::Count(int status, int64_t rows, const Request* ran) {
  AccessEntry e;
  e.status = status;
  e.rows = rows;
  if (srv_->logging() && parser_) {
    const auto& req = parser_->get();
    ModelOfTarget(std::string_view(req.target().data(), req.target().size()), &e.model,
                  &e.version);
    if (e.version.empty() && model_) e.version = model_->plan().version;  // the one served
    e.id = request_id_;
    if (auto it = req.find("traceparent"); it != req.end()) {
      e.trace = std::string_view(it->value().data(), it->value().size());
    }
  }
  (model_ ? model_->counters() : srv_->unrouted())->Record(e, start_, ran);
}

void Connection::Watch() {
  watching_ = true;
  sock_.async_wait(tcp::socket::wait_read,
                   [self = shared_from_this()](beast::error_code ec) { self->OnReadable(ec); });
}

// The socket turned readable (or failed) while the request waits: a client that
// closed its connection loses its request before it is computed.
void Connection::OnReadable(beast::error_code ec) {
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
  if (model_->Cancel(request_.get())) {
    model_->counters()->Add(&CounterValues::disconnected);
    Finished();
  }
  // Otherwise it has started: Answer() drops the result.
}

void Connection::OnTimeout(beast::error_code ec) {
  if (ec || !request_) return;
  if (!model_->Cancel(request_.get())) return;  // under way: answered when it is done
  model_->counters()->Add(&CounterValues::timed_out);
  const double t = timeout_s_;
  Finished();
  Count(504, 0);
  Error(504, TimeoutMessage(t, model_->dynamic()));
}

// The request left the queue: release what held the connection and the counters.
void Connection::Finished() {
  request_.reset();
  job_.reset();
  timer_.cancel();
  if (watching_) {
    beast::error_code ignored;
    sock_.cancel(ignored);
  }
  model_->Answered();
  hold_.reset();  // last: may destroy this connection
}

void Connection::Answer(const RequestPtr& r) {
  if (r != request_) return;  // cancelled and answered already
  std::shared_ptr<Job> job = job_;
  auto self = shared_from_this();
  Finished();
  const ModelPlan& m = model_->plan();
  if (gone_) return;  // the client went away while it ran
  if (r->state == RequestState::kDone) {
    if (m.dynamic) {
      DynamicHttpAnswer(m, job.get(), &job->http);
    } else {
      FinishHttpAnswer(m, job->req, &job->http);
    }
    Count(200, job->req.rows, r.get());
    const bool bin = job->http.header_length >= 0;
    return Write(http::status::ok, std::move(job->http.body),
                 bin ? "application/octet-stream" : "application/json", job->http.header_length);
  }
  const serving::Error e = model_->Failure(*r, *job);
  Count(e.status, 0, r.get());
  Error(e.status, e.message, e.status == 503);
}

}  // namespace serving
}  // namespace paddle_ipu
