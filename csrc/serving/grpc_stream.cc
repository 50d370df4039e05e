// ModelStreamInfer on a gRPC connection (see grpc_connection.h): the response's
// HEADERS go out at once, then one ModelStreamInferResponse per request message, as
// each call finishes (infer_response, or error_message for a refused or failed
// call), then the status trailers once the client has ended its side and every call
// is answered.
#include <algorithm>
#include <cstring>

#include "clock.h"
#include "front_end.h"
#include "grpc_call.h"
#include "grpc_connection.h"
#include "listener.h"
#include "server.h"
#include "text.h"

namespace asio = boost::asio;

namespace paddle_ipu {
namespace serving {

namespace {

void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// One length-delimited protobuf field.
void Field(std::string* out, int number, std::string_view bytes) {
  Varint(out, (static_cast<uint64_t>(number) << 3) | 2);
  Varint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}

// ModelStreamInferResponse: error_message (1) or infer_response (2), length-prefixed
// as a gRPC message.
void AppendResponse(std::string* out, int field, std::string_view bytes) {
  std::string msg;
  Field(&msg, field, bytes);
  const uint64_t len = msg.size();
  const char head[5] = {0, static_cast<char>((len >> 24) & 0xFF),
                        static_cast<char>((len >> 16) & 0xFF),
                        static_cast<char>((len >> 8) & 0xFF), static_cast<char>(len & 0xFF)};
  out->append(head, 5);
  out->append(msg);
}

}  // namespace

void GrpcConnection::OpenStream(int32_t id, Stream& s) {
  if (s.streaming || s.answered) return;
  std::string why;
  int code = kInvalidArgument;
  if (s.method != "POST") {
    why = "gRPC calls are POST requests, not " + s.method;
    code = kUnimplemented;
  } else if (s.content_type.rfind("application/grpc", 0) != 0) {
    why = "content-type must be application/grpc, not '" + s.content_type + "'";
  } else if (s.bad_timeout) {
    why = "malformed grpc-timeout header";
  }
  if (!why.empty()) {
    Fail(id, s, code, why);
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
    return;
  }
  s.streaming = true;
  s.answered = true;
  const nghttp2_nv headers[] = {
      {reinterpret_cast<uint8_t*>(const_cast<char*>(":status")),
       reinterpret_cast<uint8_t*>(const_cast<char*>("200")), 7, 3, NGHTTP2_NV_FLAG_NONE},
      {reinterpret_cast<uint8_t*>(const_cast<char*>("content-type")),
       reinterpret_cast<uint8_t*>(const_cast<char*>("application/grpc")), 12, 16,
       NGHTTP2_NV_FLAG_NONE}};
  nghttp2_data_provider data;
  data.source.ptr = nullptr;
  data.read_callback = &ReadStream;
  nghttp2_submit_response(session_, id, headers, 2, &data);
}

void GrpcConnection::StreamMessages(int32_t id, Stream& s) {
  const auto limit = static_cast<uint64_t>(srv_->max_body());
  while (!s.ending && s.body.size() - s.parsed >= 5) {
    const auto* b = reinterpret_cast<const unsigned char*>(s.body.data() + s.parsed);
    const uint64_t len = (uint64_t{b[1]} << 24) | (uint64_t{b[2]} << 16) |
                         (uint64_t{b[3]} << 8) | uint64_t{b[4]};
    if (b[0] != 0) {
      return EndStream(id, s, kUnimplemented,
                       "compressed messages are not supported (grpc-encoding)");
    }
    if (len > limit) {
      return EndStream(id, s, kResourceExhausted,
                       "a request message is larger than the server's limit of " +
                           std::to_string(limit) + " bytes (--max-body-mb)");
    }
    if (s.body.size() - s.parsed < 5 + len) break;  // the rest is still coming
    StreamInfer(id, s, s.body.substr(s.parsed + 5, len));
    s.parsed += 5 + len;
  }
  if (s.parsed == s.body.size() || s.parsed > (1u << 20)) {
    s.body.erase(0, s.parsed);
    receiving_ -= s.parsed;
    s.parsed = 0;
  }
}

void GrpcConnection::StreamInfer(int32_t id, Stream& s, std::string msg) {
  const uint64_t seq = s.next_seq++;
  std::weak_ptr<GrpcConnection> weak = weak_from_this();
  std::weak_ptr<Listener> wio = io_->weak_from_this();
  auto done = [weak, wio, id, seq](std::shared_ptr<GrpcCall> call) {
    auto io = wio.lock();
    if (!io) return;
    asio::post(io->ioc, [weak, id, seq, call = std::move(call)] {
      auto c = weak.lock();
      auto done = [&] {
        const int code = call->Complete();  // counted even if the client went away
        if (c) c->StreamDone(id, seq, call, code);
        return 0;
      };
      if (!c) return (void)done();
      if (c->Guard(id, done) != 0) c->Close();
      c->Flush();
    });
  };
  s.pending[seq];  // under way; its call once decoded
  Decode(id, std::move(msg), s.trace, std::move(done),
         [this, id, seq](std::shared_ptr<GrpcCall> call) {
           Stream* st = closed_ ? nullptr : Find(id);
           Stream::Pending* pending = nullptr;
           if (st) {
             auto it = st->pending.find(seq);
             if (it != st->pending.end()) pending = &it->second;
           }
           if (!pending) {  // the stream ended, or the call was answered already
             call->Cancel();
             return;
           }
           Stream::Pending& p = *pending;
           p.call = call;
           // The request's timeout parameter, or the server's request timeout (the
           // stream's own deadline ends the stream: the client resets it).
           const double t = call->EffectiveTimeout(0);
           if (t > 0) {
             p.timer = std::make_unique<asio::steady_timer>(io_->ioc);
             p.timer->expires_after(SteadyDuration(t));
             p.timer->async_wait([call, t](boost::system::error_code ec) {
               if (!ec) call->Expire(t);
             });
           }
         });
}

void GrpcConnection::StreamDone(int32_t id, uint64_t seq, const std::shared_ptr<GrpcCall>& call,
                                int code) {
  if (closed_) return;
  Stream* s = Find(id);
  if (!s) return;
  auto it = s->pending.find(seq);
  if (it == s->pending.end()) return;  // the stream ended before it
  if (it->second.timer) it->second.timer->cancel();
  s->pending.erase(it);
  if (code == kOk) {
    AppendResponse(&s->owned, 2, call->response());
  } else {
    AppendResponse(&s->owned, 1, call->message());
  }
  if (draining_ && s->pending.empty() && !s->ending) {
    EndStream(id, *s, kUnavailable, kShuttingDown);
  }
  Resume(id, *s);
  Flush();
}

void GrpcConnection::EndStream(int32_t id, Stream& s, int code, std::string message) {
  s.ending = true;
  s.code = code;
  s.message = std::move(message);
  Release(s);
  CancelAll(s);
  Resume(id, s);
}

void GrpcConnection::Resume(int32_t id, Stream& s) {
  if (!s.deferred) return;
  s.deferred = false;
  nghttp2_session_resume_data(session_, id);
}

void GrpcConnection::CancelAll(Stream& s) {
  // Cancel() may answer at once (posted): take the calls out first.
  std::unordered_map<uint64_t, Stream::Pending> calls;
  calls.swap(s.pending);
  for (auto& entry : calls) {
    if (entry.second.timer) entry.second.timer->cancel();
    if (entry.second.call) entry.second.call->Cancel();  // (none while decoded)
  }
}

ssize_t GrpcConnection::ReadStream(nghttp2_session* session, int32_t id, uint8_t* buf,
                                   size_t length, uint32_t* flags, nghttp2_data_source*,
                                   void* self) {
  auto* c = static_cast<GrpcConnection*>(self);
  Stream* s = c->Find(id);
  if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (s->sent < s->owned.size()) {
    const size_t n = std::min(length, s->owned.size() - s->sent);
    std::memcpy(buf, s->owned.data() + s->sent, n);
    s->sent += n;
    if (s->sent == s->owned.size()) {
      s->owned.clear();
      s->sent = 0;
    }
    return static_cast<ssize_t>(n);
  }
  if (s->ending || (s->remote_done && s->pending.empty())) {
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    std::string status, text;
    try {
      status = std::to_string(s->ending ? s->code : kOk);
      text = PercentEncode(Bounded(s->message, 2048));  // (as Fail's, grpc_connection.cc)
    } catch (const std::exception&) {  // out of memory: the stream is reset instead
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    const nghttp2_nv trailers[] = {
        {reinterpret_cast<uint8_t*>(const_cast<char*>("grpc-status")),
         reinterpret_cast<uint8_t*>(const_cast<char*>(status.data())), 11, status.size(),
         NGHTTP2_NV_FLAG_NONE},
        {reinterpret_cast<uint8_t*>(const_cast<char*>("grpc-message")),
         reinterpret_cast<uint8_t*>(const_cast<char*>(text.data())), 12, text.size(),
         NGHTTP2_NV_FLAG_NONE}};
    if (nghttp2_submit_trailer(session, id, trailers, text.empty() ? 1 : 2) != 0) {
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    s->finished = true;
    return 0;
  }
  s->deferred = true;
  return NGHTTP2_ERR_DEFERRED;
}

}  // namespace serving
}  // namespace paddle_ipu
