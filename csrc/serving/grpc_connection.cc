// A gRPC connection (see grpc_connection.h).
#include "grpc_connection.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "clock.h"
#include "front_end.h"
#include "grpc_call.h"
#include "listener.h"
#include "server.h"
#include "text.h"

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace paddle_ipu {
namespace serving {

namespace {


// The send buffer is flushed to the socket once it holds this much.
constexpr size_t kWriteChunk = 256 * 1024;

// A grpc-message's bytes before percent-encoding (at most three times as many after):
// within a client's metadata limit (gRPC's default: 8 KiB).
constexpr size_t kMessageLimit = 2048;

// Messages of this size or more are parsed on the server's decode threads.
constexpr size_t kDecodeHere = 1 << 20;

nghttp2_nv Header(std::string_view name, std::string_view value) {
  return {reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
          reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(), value.size(),
          NGHTTP2_NV_FLAG_NONE};
}

std::string_view View(const uint8_t* p, size_t n) {
  return {reinterpret_cast<const char*>(p), n};
}

}  // namespace

std::string PercentEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c <= 0x7E && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

double GrpcTimeoutSeconds(const std::string& v) {
  // At most 8 digits, then one unit (gRPC's HTTP/2 mapping).
  if (v.size() < 2 || v.size() > 9) return -1;
  double n = 0;
  for (size_t i = 0; i + 1 < v.size(); ++i) {
    if (v[i] < '0' || v[i] > '9') return -1;
    n = n * 10 + (v[i] - '0');
  }
  switch (v.back()) {
    case 'H': return n * 3600;
    case 'M': return n * 60;
    case 'S': return n;
    case 'm': return n * 1e-3;
    case 'u': return n * 1e-6;
    case 'n': return n * 1e-9;
    default: return -1;
  }
}

GrpcConnection::GrpcConnection(tcp::socket sock, Listener* io, Server* srv)
    : sock_(std::move(sock)), idle_(io->ioc), io_(io), srv_(srv) {
  srv_->connections += 1;
  io_->grpc_connections.insert(this);
}

GrpcConnection::~GrpcConnection() {
  closed_ = true;  // the session's callbacks do nothing from here on
  if (session_) nghttp2_session_del(session_);
  io_->grpc_connections.erase(this);
  srv_->connections -= 1;
  srv_->NotifyDrain();
}

void GrpcConnection::Start() {
  nghttp2_session_callbacks* cbs = nullptr;
  if (nghttp2_session_callbacks_new(&cbs) != 0) return Close();
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &OnBeginHeaders);
  nghttp2_session_callbacks_set_on_header_callback(cbs, &OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &OnDataChunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &OnFrame);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &OnStreamClose);
  const int rv = nghttp2_session_server_new(&session_, cbs, this);
  nghttp2_session_callbacks_del(cbs);
  if (rv != 0) {
    session_ = nullptr;
    return Close();
  }
  // Large windows: a request's message arrives without waiting for WINDOW_UPDATEs.
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1024},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 4 << 20},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
       static_cast<uint32_t>(srv_->limits().max_header_bytes)},
  };
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings,
                          sizeof(settings) / sizeof(settings[0]));
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, 64 << 20);
  last_read_ = std::chrono::steady_clock::now();
  ArmIdle();
  Flush();
  DoRead();
}

void GrpcConnection::ArmIdle() {
  const double idle = srv_->limits().idle_timeout_s;
  if (idle <= 0 || idle_armed_ || closed_) return;
  idle_armed_ = true;
  idle_.expires_at(last_read_ + SteadyDuration(idle));
  idle_.async_wait(
      [self = shared_from_this()](const boost::system::error_code& ec) { self->OnIdle(ec); });
}

bool GrpcConnection::CallsUnderWay() const {
  for (const auto& entry : streams_) {
    const Stream& s = *entry.second;
    if (!s.answered && (s.call || s.python || s.decoding)) return true;
    if (!s.pending.empty()) return true;
  }
  return false;
}

// Nothing came for the idle timeout: unless the server owes the client answers, the
// connection ends (GOAWAY, then closed once that is sent); an answer not taken within
// it closes the connection.
void GrpcConnection::OnIdle(const boost::system::error_code& ec) {
  idle_armed_ = false;
  if (ec || closed_) return;
  const auto now = std::chrono::steady_clock::now();
  const auto idle = SteadyDuration(srv_->limits().idle_timeout_s);
  if (writing_ && now - write_start_ >= idle) {
    srv_->CountTimeout("write");
    return Close();
  }
  if (now - last_read_ < idle || CallsUnderWay() || writing_) {
    if (now - last_read_ >= idle) last_read_ = now;  // the server's own work: look again later
    return ArmIdle();
  }
  srv_->CountTimeout("idle");
  if (close_when_sent_) return Close();  // its GOAWAY was not taken either
  close_when_sent_ = true;
  static const char kWhy[] = "idle";
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        reinterpret_cast<const uint8_t*>(kWhy), sizeof(kWhy) - 1);
  last_read_ = now;
  Flush();
  ArmIdle();
}

GrpcConnection::Stream* GrpcConnection::Find(int32_t id) {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

void GrpcConnection::DoRead() {
  if (closed_) return;
  sock_.async_read_some(asio::buffer(in_), [self = shared_from_this()](
                                               boost::system::error_code ec, size_t n) {
    if (self->closed_) return;
    if (ec) return self->Close();  // the client closed the connection: its calls are cancelled
    self->last_read_ = std::chrono::steady_clock::now();
    try {
      const ssize_t rv = nghttp2_session_mem_recv(
          self->session_, reinterpret_cast<const uint8_t*>(self->in_.data()), n);
      if (rv < 0) {
        // Not HTTP/2 (a bad preface), or a fatal error: GOAWAY if possible, then close.
        nghttp2_session_terminate_session(self->session_, NGHTTP2_PROTOCOL_ERROR);
      }
      self->Flush();
      self->DoRead();
    } catch (const std::exception& e) {  // outside any call's guard: the connection ends
      std::fprintf(stderr, "paddle-ipu: a gRPC connection failed in the server: %s\n", e.what());
      self->Close();
    }
  });
}

void GrpcConnection::Flush() {
  if (writing_ || closed_) return;
  out_.clear();
  while (out_.size() < kWriteChunk) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(session_, &data);
    if (n < 0) return Close();
    if (n == 0) break;
    out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  if (out_.empty()) {
    const bool done =
        !nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_);
    // Draining: closed once every call's status went out (a client that keeps its
    // side of a stream open does not hold the server).
    bool answered = true;
    for (const auto& entry : streams_) answered = answered && entry.second->finished;
    if (done || (draining_ && answered) || close_when_sent_) Close();
    return;
  }
  writing_ = true;
  write_start_ = std::chrono::steady_clock::now();
  asio::async_write(sock_, asio::buffer(out_),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) return self->Close();
                      self->Flush();
                    });
}

void GrpcConnection::Close() {
  if (closed_) return;
  closed_ = true;
  idle_.cancel();
  for (auto& entry : streams_) {
    Stream& s = *entry.second;
    if (s.timer) s.timer->cancel();
    if (s.call) s.call->Cancel();  // a queued request leaves the queue
    CancelAll(s);
  }
  boost::system::error_code ignored;
  sock_.shutdown(tcp::socket::shutdown_both, ignored);
  sock_.close(ignored);
}

void GrpcConnection::OnDrain() {
  if (closed_ || draining_) return;
  draining_ = true;
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
  // Streams that wait for nothing end now; the others once their calls are answered.
  for (auto& entry : streams_) {
    Stream& s = *entry.second;
    if (s.streaming && s.pending.empty() && !s.ending) {
      EndStream(entry.first, s, kUnavailable, kShuttingDown);
    }
  }
  Flush();
}

// -- nghttp2's callbacks --------------------------------------------------------------

int GrpcConnection::OnBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  if (c->closed_) return 0;
  return c->Guard(0, [&] {
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      c->streams_[frame->hd.stream_id] = std::make_unique<Stream>();
    }
    return 0;
  });
}

int GrpcConnection::OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                             size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                             void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  if (c->closed_ || frame->hd.type != NGHTTP2_HEADERS) return 0;
  Stream* s = c->Find(frame->hd.stream_id);
  if (!s) return 0;
  return c->Guard(frame->hd.stream_id, [&] { return c->TakeHeader(*s, name, namelen, value, valuelen); });
}

int GrpcConnection::TakeHeader(Stream& stream, const uint8_t* name, size_t namelen,
                           const uint8_t* value, size_t valuelen) {
  Stream* s = &stream;
  // A header list's size as HTTP/2 counts it (RFC 9113 6.5.2): what is past the
  // limits is not kept, and the call is refused once its headers end (OnFrame).
  s->header_bytes += static_cast<int64_t>(namelen + valuelen) + 32;
  s->headers += 1;
  const ServerLimits& l = srv_->limits();
  if (s->headers_over || s->header_bytes > l.max_header_bytes || s->headers > l.max_headers) {
    s->headers_over = true;
    return 0;
  }
  const std::string_view n = View(name, namelen);
  const std::string_view v = View(value, valuelen);
  if (n == ":path") {
    s->path = v;
  } else if (n == ":method") {
    s->method = v;
  } else if (n == "content-type") {
    s->content_type = v;
  } else if (n == "grpc-timeout") {
    const double t = GrpcTimeoutSeconds(std::string(v));
    if (t < 0) s->bad_timeout = true;
    else s->deadline_s = t;
  } else if (n == "traceparent" && srv_->logging()) {
    s->trace = v;
  }
  return 0;
}

int GrpcConnection::OnDataChunk(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data,
                                size_t len, void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  if (c->closed_) return 0;
  return c->Guard(id, [&] {
    Stream* s = c->Find(id);
    if (!s || (!s->streaming && (s->answered || s->too_large)) || s->ending) return 0;
    // The message's limit (--max-body-mb), and its 5-byte prefix; and what the
    // connection's calls may hold while they arrive: twice that.
    const auto limit = static_cast<size_t>(c->srv_->max_body()) + 5;
    auto crowded_why = [limit] {
      return "the calls of this connection hold more than " + std::to_string(2 * limit) +
             " bytes of messages being received (twice --max-body-mb)";
    };
    if (s->streaming) {
      // Each message's own size is checked by its prefix (StreamMessages).
      s->body.append(reinterpret_cast<const char*>(data), len);
      c->receiving_ += len;
      c->StreamMessages(id, *s);
      if (!s->ending && c->receiving_ > 2 * limit) {
        c->EndStream(id, *s, kResourceExhausted, crowded_why());
      }
      return 0;
    }
    const bool over = s->body.size() + len > limit;
    const bool crowded = !over && c->receiving_ + len > 2 * limit;
    if (over || crowded) {
      s->too_large = true;
      c->Release(*s);
      const std::string why =
          over ? "the request message is larger than the server's limit of " +
                     std::to_string(c->srv_->max_body()) + " bytes (--max-body-mb)"
               : crowded_why();
      if (s->path == kInferPath) {
        // Counted (and logged) as HTTP's 413 is, with the requests no model answered.
        s->call = c->srv_->GrpcRefused({413, why}, s->trace, c->InferCallback(id));
      } else {
        c->Fail(id, *s, kResourceExhausted, why);
      }
      return 0;
    }
    s->body.append(reinterpret_cast<const char*>(data), len);
    c->receiving_ += len;
    return 0;
  });
}

std::string GrpcConnection::Release(Stream& s) {
  std::string body;
  body.swap(s.body);
  receiving_ -= body.size();
  s.parsed = 0;
  return body;
}

int GrpcConnection::OnFrame(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  if (c->closed_) return 0;
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  const int32_t id = frame->hd.stream_id;
  Stream* s = c->Find(id);
  if (!s) return 0;
  return c->Guard(id, [&] {
    const bool end = frame->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (frame->hd.type == NGHTTP2_HEADERS && s->headers_over && !s->answered) {
      const ServerLimits& l = c->srv_->limits();
      c->Fail(id, *s, kResourceExhausted,
              "the call's headers are past the server's limits of " +
                  std::to_string(l.max_headers) + " fields and " +
                  std::to_string(l.max_header_bytes) +
                  " bytes (--max-headers, --max-header-kb)");
      return 0;  // what the client still sends on the stream is dropped
    }
    // A streaming call is answered as its messages come, not at the client's end.
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
        s->path == kStreamPath) {
      c->OpenStream(id, *s);
    }
    if (s->streaming) {
      if (end) {
        s->remote_done = true;
        if (s->parsed < s->body.size() && !s->ending) {
          c->EndStream(id, *s, kInvalidArgument, "the stream ended inside a message");
        }
        c->Resume(id, *s);
      }
      return 0;
    }
    if (end && !s->answered && !s->call && !s->python && !s->decoding) c->Dispatch(id, *s);
    return 0;
  });
}

int GrpcConnection::OnStreamClose(nghttp2_session*, int32_t id, uint32_t, void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  auto it = c->streams_.find(id);
  if (it == c->streams_.end()) return 0;
  Stream& s = *it->second;
  if (s.timer) s.timer->cancel();
  // Reset by the client before its answer: its request leaves the queue (a call
  // already answered finds nothing to cancel).
  try {
    if (s.call) s.call->Cancel();
    CancelAll(s);
  } catch (const std::exception& e) {  // the stream goes all the same
    std::fprintf(stderr, "paddle-ipu: cancelling a gRPC call failed: %s\n", e.what());
  }
  c->Release(s);
  c->streams_.erase(it);
  return 0;
}

ssize_t GrpcConnection::ReadData(nghttp2_session* session, int32_t id, uint8_t* buf,
                                 size_t length, uint32_t* flags, nghttp2_data_source*,
                                 void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  Stream* s = c->Find(id);
  if (!s || !s->payload) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  const size_t total = s->head.size() + s->payload->size();
  size_t n = 0;
  while (n < length && s->sent < total) {
    const bool in_head = s->sent < s->head.size();
    const char* from = in_head ? s->head.data() + s->sent
                               : s->payload->data() + (s->sent - s->head.size());
    const size_t left = in_head ? s->head.size() - s->sent : total - s->sent;
    const size_t k = std::min(length - n, left);
    std::memcpy(buf + n, from, k);
    n += k;
    s->sent += k;
  }
  if (s->sent == total) {
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    const nghttp2_nv trailers[] = {Header("grpc-status", "0")};
    if (nghttp2_submit_trailer(session, id, trailers, 1) != 0) {
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    s->finished = true;
  }
  return static_cast<ssize_t>(n);
}

// -- the calls --------------------------------------------------------------------------

void GrpcConnection::Dispatch(int32_t id, Stream& s) {
  if (s.too_large) return;  // answered already
  std::string body = Release(s);
  if (s.method != "POST") {
    return Fail(id, s, kUnimplemented, "gRPC calls are POST requests, not " + s.method);
  }
  if (s.content_type.rfind("application/grpc", 0) != 0) {
    return Fail(id, s, kInvalidArgument,
                "content-type must be application/grpc, not '" + s.content_type + "'");
  }
  if (s.path.rfind(kService, 0) != 0) {
    return Fail(id, s, kUnimplemented,
                "unknown service or method " + s.path +
                    ": this server offers inference.GRPCInferenceService");
  }
  if (s.bad_timeout) return Fail(id, s, kInvalidArgument, "malformed grpc-timeout header");
  // A unary call: one length-prefixed message.
  if (body.size() < 5) {
    return Fail(id, s, kInvalidArgument, "the call carries no message (5-byte prefix missing)");
  }
  const auto* b = reinterpret_cast<const unsigned char*>(body.data());
  const uint64_t len = (uint64_t{b[1]} << 24) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 8) |
                       uint64_t{b[4]};
  if (b[0] != 0) {
    return Fail(id, s, kUnimplemented, "compressed messages are not supported (grpc-encoding)");
  }
  if (len + 5 != body.size()) {
    return Fail(id, s, kInvalidArgument,
                "a unary call carries one message: its prefix says " + std::to_string(len) +
                    " bytes, the stream carried " + std::to_string(body.size() - 5));
  }
  body.erase(0, 5);
  std::string msg = std::move(body);
  if (s.path == kInferPath) return Infer(id, s, std::move(msg));
  Unary(id, s, std::move(msg));
}

std::function<void(std::shared_ptr<GrpcCall>)> GrpcConnection::InferCallback(int32_t id) {
  std::weak_ptr<GrpcConnection> weak = weak_from_this();
  std::weak_ptr<Listener> wio = io_->weak_from_this();
  return [weak, wio, id](std::shared_ptr<GrpcCall> call) {
    auto io = wio.lock();
    if (!io) return;
    asio::post(io->ioc, [weak, id, call = std::move(call)] {
      auto c = weak.lock();
      auto done = [&] {
        const int code = call->Complete();  // counted even if the client went away
        if (c) c->InferDone(id, call, code);
        return 0;
      };
      if (!c) return (void)done();
      if (c->Guard(id, done) != 0) c->Close();
      c->Flush();
    });
  };
}

void GrpcConnection::Decode(int32_t id, std::string msg, const std::string& trace,
                            std::function<void(std::shared_ptr<GrpcCall>)> done,
                            std::function<void(std::shared_ptr<GrpcCall>)> then) {
  if (msg.size() < kDecodeHere) return then(srv_->GrpcInfer(std::move(msg), trace, std::move(done)));
  // A large message (a typed tensor of tens of MB parses in about a second) is routed,
  // parsed and queued on a decode thread; this IO thread goes on meanwhile.
  srv_->Decode([self = shared_from_this(), id, msg = std::move(msg), trace,
                done = std::move(done), then = std::move(then)]() mutable {
    std::shared_ptr<GrpcCall> call;
    try {
      call = self->srv_->GrpcInfer(std::move(msg), trace, done);
    } catch (const std::exception& e) {  // out of memory routing it
      call = self->srv_->GrpcRefused(
          {500, std::string("the server failed handling the call: ") + e.what()}, trace, done);
    }
    Listener* io = self->io_;
    asio::post(io->ioc, [self = std::move(self), id, call = std::move(call),
                         then = std::move(then)] {
      if (self->Guard(id, [&] { return then(call), 0; }) != 0) self->Close();
      self->Flush();
    });
  });
}

void GrpcConnection::Infer(int32_t id, Stream& s, std::string msg) {
  s.decoding = true;
  Decode(id, std::move(msg), s.trace, InferCallback(id),
         [this, id](std::shared_ptr<GrpcCall> call) { Queued(id, std::move(call)); });
}

void GrpcConnection::Queued(int32_t id, std::shared_ptr<GrpcCall> call) {
  Stream* s = closed_ ? nullptr : Find(id);
  if (!s) {  // the client went away while it was decoded
    call->Cancel();
    return;
  }
  s->decoding = false;
  if (s->answered) return;  // answered already (refused, or done, before this)
  s->call = call;
  // The server's own timeout ends a little before the client's deadline, so that the
  // server answers DEADLINE_EXCEEDED itself rather than racing the client's reset.
  double deadline = 0;
  if (s->deadline_s > 0) {
    deadline = std::max(s->deadline_s - std::min(0.02, 0.1 * s->deadline_s), 1e-6);
  }
  const double t = call->EffectiveTimeout(deadline);
  if (t > 0) {
    s->timer = std::make_unique<asio::steady_timer>(io_->ioc);
    s->timer->expires_after(SteadyDuration(t));
    s->timer->async_wait([call, t](boost::system::error_code ec) {
      if (!ec) call->Expire(t);
    });
  }
}

void GrpcConnection::InferDone(int32_t id, const std::shared_ptr<GrpcCall>& call, int code) {
  if (closed_) return;
  Stream* s = Find(id);
  if (!s || s->answered) return;
  if (s->timer) s->timer->cancel();
  if (code == kOk) {
    s->payload = &call->response();
    Submit(id, *s);
  } else {
    Fail(id, *s, code, call->message(), code == kUnavailable);
  }
  Flush();
}

void GrpcConnection::Unary(int32_t id, Stream& s, std::string msg) {
  // The control calls are answered here, from the server's state (but the
  // repository's load and unload).
  int code = kOk;
  std::string message, answer;
  if (srv_->GrpcControl(std::string_view(s.path).substr(kService.size()), msg, &code, &message,
                        &answer)) {
    if (code == kOk) return Respond(id, s, std::move(answer));
    return Fail(id, s, code, message);
  }
  std::weak_ptr<GrpcConnection> weak = weak_from_this();
  std::weak_ptr<Listener> wio = io_->weak_from_this();
  auto job = std::make_shared<GrpcUnaryJob>();
  job->method = s.path.substr(kService.size());
  job->body = std::move(msg);
  job->done = [weak, wio, id](int code, std::string message, std::string body) {
    auto io = wio.lock();
    if (!io) return;
    asio::post(io->ioc, [weak, id, code, message = std::move(message),
                         body = std::move(body)]() mutable {
      auto c = weak.lock();
      if (!c || c->closed_) return;
      const int rv = c->Guard(id, [&] {
        Stream* s = c->Find(id);
        if (!s || s->answered) return 0;
        if (code == kOk) c->Respond(id, *s, std::move(body));
        else c->Fail(id, *s, code, message);
        return 0;
      });
      if (rv != 0) c->Close();
      c->Flush();
    });
  };
  s.python = true;
  if (!srv_->GrpcUnary(std::move(job))) Fail(id, s, kUnavailable, kShuttingDown);
}

void GrpcConnection::Respond(int32_t id, Stream& s, std::string bytes) {
  s.owned = std::move(bytes);
  s.payload = &s.owned;
  Submit(id, s);
}

void GrpcConnection::Submit(int32_t id, Stream& s) {
  const uint64_t len = s.payload->size();
  s.head = {0, static_cast<char>((len >> 24) & 0xFF), static_cast<char>((len >> 16) & 0xFF),
            static_cast<char>((len >> 8) & 0xFF), static_cast<char>(len & 0xFF)};
  s.sent = 0;
  s.answered = true;
  const nghttp2_nv headers[] = {Header(":status", "200"),
                                Header("content-type", "application/grpc")};
  nghttp2_data_provider data;
  data.source.ptr = nullptr;
  data.read_callback = &ReadData;
  if (nghttp2_submit_response(session_, id, headers, 2, &data) != 0) s.answered = false;
}

void GrpcConnection::Fail(int32_t id, Stream& s, int code, const std::string& message,
                          bool retry) {
  // Trailers-only: the status in the response's one HEADERS frame.
  const std::string status = std::to_string(code);
  const std::string text = PercentEncode(Bounded(message, kMessageLimit));
  const nghttp2_nv headers[] = {Header(":status", "200"),
                                Header("content-type", "application/grpc"),
                                Header("grpc-status", status), Header("grpc-message", text),
                                Header("retry-after", "1")};
  s.answered = true;
  s.finished = true;
  s.code = code;
  nghttp2_submit_response(session_, id, headers, retry ? 5 : 4, nullptr);
}

}  // namespace serving
}  // namespace paddle_ipu
