// An HTTP connection (see connection.h); its routes are in routes.cc.
#include "connection.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>

#include "clock.h"
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

// Seconds as a message shows them.
std::string SecondsText(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", s);
  return text;
}

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
    : sock_(std::move(sock)),
      timer_(io->ioc),
      io_timer_(io->ioc),
      io_(io),
      srv_(srv),
      // What waits to be parsed: a header block, or a chunk's header line (which no
      // other limit bounds), and a read's worth past it.
      buf_(static_cast<size_t>(srv->limits().max_header_bytes) + 65536) {
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
  wait_ = Wait::kNone;
  io_timer_.cancel();
  beast::error_code ignored;
  sock_.shutdown(tcp::socket::shutdown_both, ignored);
  sock_.close(ignored);
}

void Connection::Await(Wait w) {
  const ServerLimits& l = srv_->limits();
  wait_ = w;
  wait_start_ = progress_ = std::chrono::steady_clock::now();
  // A new request's headers are timed from its first byte: until it comes, the timer
  // fires at the earlier of the two timeouts (and is re-armed to the idle one).
  double s = w == Wait::kHeader ? l.header_timeout_s : l.idle_timeout_s;
  if (w == Wait::kIdle && l.header_timeout_s > 0 && (s <= 0 || l.header_timeout_s < s)) {
    s = l.header_timeout_s;
  }
  if (s <= 0) return;  // no limit
  const auto at = wait_start_ + SteadyDuration(s);
  if (io_armed_ && io_expiry_ <= at) return;  // it fires first, and looks again then
  io_armed_ = true;
  io_expiry_ = at;
  io_timer_.expires_at(at);
  io_timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->OnTimer(ec); });
}

void Connection::OnTimer(beast::error_code ec) {
  if (ec) return;  // re-armed, or the connection closed
  io_armed_ = false;
  if (wait_ == Wait::kNone || !sock_.is_open()) return;
  const ServerLimits& l = srv_->limits();
  const bool header = wait_ == Wait::kHeader;
  const double s = header ? l.header_timeout_s : l.idle_timeout_s;
  if (s <= 0) return;
  const auto from = wait_ == Wait::kBody || wait_ == Wait::kWrite ? progress_ : wait_start_;
  const auto deadline = from + SteadyDuration(s);
  if (std::chrono::steady_clock::now() < deadline) {
    io_armed_ = true;
    io_expiry_ = deadline;
    io_timer_.expires_at(deadline);
    io_timer_.async_wait([self = shared_from_this()](beast::error_code e) { self->OnTimer(e); });
    return;
  }
  const Wait w = wait_;
  wait_ = Wait::kNone;
  srv_->CountTimeout(header ? "header" : w == Wait::kBody ? "body" : w == Wait::kWrite ? "write"
                                                                                       : "idle");
  // An idle connection, or one that does not take its answer, just closes; a request
  // under way is answered 408 once its read is cancelled (OnRead).
  if (w == Wait::kIdle || w == Wait::kWrite) return Close();
  timed_out_ = w;
  beast::error_code ignored;
  sock_.cancel(ignored);
}

void Connection::DoRead() {
  busy_ = false;
  timed_out_ = Wait::kNone;
  model_.reset();
  if (srv_->draining()) return Close();
  const ServerLimits& l = srv_->limits();
  parser_.emplace();
  parser_->body_limit(static_cast<uint64_t>(l.max_body));
  parser_->header_limit(static_cast<uint32_t>(l.max_header_bytes));
  if (buf_.size() > 0) return ReadHeader();  // a pipelined request's bytes are here
  // Its first bytes (then its headers are timed).
  Await(Wait::kIdle);
  sock_.async_read_some(buf_.prepare(beast::read_size(buf_, 65536)),
                        [self = shared_from_this()](beast::error_code ec, size_t n) {
                          if (ec) return self->OnRead(ec);
                          self->buf_.commit(n);
                          self->ReadHeader();
                        });
}

void Connection::ReadHeader() {
  Await(Wait::kHeader);
  http::async_read_header(
      sock_, buf_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

// A client that asks before it sends its body (curl does for bodies over 1 KiB) is
// told to go on, unless the body is already known to be too large.
void Connection::OnHeader(beast::error_code ec) {
  if (ec) return OnRead(ec);
  wait_ = Wait::kNone;
  auto& req = parser_->get();
  if (serving::Error e = CheckHead(req.base(), srv_->limits().max_headers)) {
    busy_ = true;
    start_ = std::chrono::steady_clock::now();
    close_after_ = true;  // the rest of the message has no trusted extent
    Count(e.status, 0);
    return Error(e.status, e.message);
  }
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

// The body, a part at a time: each part must come within the idle timeout.
void Connection::ReadBody() {
  if (parser_->is_done()) return OnRead({});
  Await(Wait::kBody);
  http::async_read_some(sock_, buf_, *parser_,
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->OnRead(ec);
                          self->ReadBody();
                        });
}

void Connection::OnRead(beast::error_code ec) {
  wait_ = Wait::kNone;
  busy_ = true;
  start_ = std::chrono::steady_clock::now();
  request_id_.clear();
  if (ec) {
    close_after_ = true;
    const ServerLimits& l = srv_->limits();
    if (timed_out_ != Wait::kNone) {
      const bool header = timed_out_ == Wait::kHeader;
      timed_out_ = Wait::kNone;
      Count(408, 0);
      return Error(408, header ? "the request's headers did not arrive within " +
                                     SecondsText(l.header_timeout_s) + " s (--header-timeout-s)"
                               : "no bytes of the request's body arrived for " +
                                     SecondsText(l.idle_timeout_s) + " s (--idle-timeout-s)");
    }
    if (ec == http::error::body_limit) {
      Count(413, 0);
      return Error(413, "the request body is larger than the server's limit of " +
                            std::to_string(srv_->max_body()) + " bytes (--max-body-mb)");
    }
    if (ec == http::error::header_limit) {
      Count(431, 0);
      return Error(431, "the request's headers are larger than the server's limit of " +
                            std::to_string(l.max_header_bytes) + " bytes (--max-header-kb)");
    }
    if (ec.category() == beast::error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      Count(400, 0);
      return Error(400, "malformed HTTP request: " + ec.message());
    }
    return Close();  // the client closed the connection, or a socket error
  }
  keep_alive_ = parser_->get().keep_alive();
  Guard([this] { Route(); });
}

void Connection::Internal(const std::string& cause) {
  std::fprintf(stderr, "paddle-ipu: an HTTP request failed in the server: %s\n", cause.c_str());
  if (writing_ || !sock_.is_open()) return Close();  // its answer is (partly) sent
  if (request_) {  // admitted: taken back as a client that went away is
    gone_ = true;
    Close();
    if (model_->Cancel(request_.get())) Finished();
    return;
  }
  try {
    close_after_ = true;
    Count(500, 0);
    Error(500, cause);
  } catch (...) {
    Close();
  }
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
  writing_ = true;
  sr_.emplace(res_);
  Await(Wait::kWrite);
  WriteSome(keep);
}

// The answer, a part at a time: each part must be taken within the idle timeout.
void Connection::WriteSome(bool keep) {
  http::async_write_some(sock_, *sr_, [self = shared_from_this(), keep](beast::error_code ec,
                                                                         size_t) {
    if (!ec && !self->sr_->is_done()) {
      self->Progress();
      return self->WriteSome(keep);
    }
    self->writing_ = false;
    self->wait_ = Wait::kNone;
    self->sr_.reset();
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
  Guard([&] {
    Count(504, 0);
    Error(504, TimeoutMessage(t, model_->dynamic()));
  });
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
  Guard([&] {
    if (r->state == RequestState::kDone) {
      if (m.dynamic) {
        FinishHttpAnswer(m, job->req, job->outputs, &job->http);
      } else {
        FinishHttpAnswer(m, job->req, &job->http);
      }
      Count(200, job->req.rows, r.get());
      const bool bin = job->http.header_length >= 0;
      return Write(http::status::ok, std::move(job->http.body),
                   bin ? "application/octet-stream" : "application/json",
                   job->http.header_length);
    }
    const serving::Error e = model_->Failure(*r, *job);
    Count(e.status, 0, r.get());
    Error(e.status, e.message, e.status == 503);
  });
}

}  // namespace serving
}  // namespace paddle_ipu
