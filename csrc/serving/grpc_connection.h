// One gRPC connection: HTTP/2 (nghttp2's server session, fed from and flushed to the
// socket on the connection's IO thread) carrying KServe v2's
// inference.GRPCInferenceService. ModelInfer is answered here without Python:
// its message goes to Server::GrpcInfer (grpc_call.h), and the answer is posted
// back to this IO thread. ModelStreamInfer likewise (grpc_stream.cc): every request
// message on the stream is one ModelInfer call, answered on the stream as it finishes
// (decoupled: in the order the calls finish). The control RPCs (health, metadata,
// the repository's index, the model configuration and statistics) are answered here
// too, from the server's state (Server::GrpcControl); the repository's load and
// unload go to the Python side (Server::GrpcUnary).
//
// A call's deadline (grpc-timeout) bounds its wait in the queue: the server's own
// timeout ends a little before it, so that the server answers DEADLINE_EXCEEDED
// itself. A stream the client resets, or a connection it closes, cancels its call (a
// queued request leaves the queue). A drain sends GOAWAY, answers the calls under
// way, then closes.
//
// The server's limits (server.h): a connection on which nothing arrives for the idle
// timeout while none of its calls is under way is sent GOAWAY and closed (one whose
// answers are not taken within it, closed); a call's headers are bounded in size and
// number (RESOURCE_EXHAUSTED). nghttp2's callbacks are C: every one runs under a guard,
// so that an exception (std::bad_alloc included) answers its call INTERNAL naming the
// cause instead of unwinding through nghttp2.
#pragma once

#include <nghttp2/nghttp2.h>

#include <boost/asio.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>

namespace paddle_ipu {
namespace serving {

class GrpcCall;
class Server;
struct Listener;

// The service's path prefix, and the gRPC status codes answered here.
constexpr std::string_view kService = "/inference.GRPCInferenceService/";
constexpr std::string_view kInferPath = "/inference.GRPCInferenceService/ModelInfer";
constexpr std::string_view kStreamPath = "/inference.GRPCInferenceService/ModelStreamInfer";
constexpr int kOk = 0, kInvalidArgument = 3, kResourceExhausted = 8, kUnimplemented = 12,
              kInternal = 13, kUnavailable = 14;

// "grpc-message": percent-encoded as gRPC's HTTP/2 mapping says (bytes outside
// 0x20-0x7E, and '%').
std::string PercentEncode(const std::string& s);
// A grpc-timeout header ("100m", "5S", ...) in seconds; < 0 when malformed.
double GrpcTimeoutSeconds(const std::string& value);

class GrpcConnection : public std::enable_shared_from_this<GrpcConnection> {
 public:
  GrpcConnection(boost::asio::ip::tcp::socket sock, Listener* io, Server* srv);
  ~GrpcConnection();

  void Start();
  // Drain: GOAWAY; close once the calls under way are answered.
  void OnDrain();

 private:
  struct Stream {
    std::string path, content_type, method, trace;
    double deadline_s = 0;  // the client's grpc-timeout (0: none)
    bool bad_timeout = false;
    int64_t header_bytes = 0, headers = 0;  // as HTTP/2 counts a header list's size
    bool headers_over = false;              // past the server's limits
    std::string body;
    bool too_large = false;
    bool answered = false;  // a response was submitted
    bool finished = false;  // its status (trailers) was submitted
    std::shared_ptr<GrpcCall> call;  // ModelInfer, while queued or running
    bool decoding = false;           // ModelInfer, while a decode thread parses it
    bool python = false;             // handed to the Python side
    std::unique_ptr<boost::asio::steady_timer> timer;
    // The response's one message: its 5-byte prefix and its bytes (`owned`, or the
    // call's answer).
    std::array<char, 5> head{};
    std::string owned;
    const std::string* payload = nullptr;
    size_t sent = 0;
    int code = 0;
    // ModelStreamInfer: the calls under way (by sequence number), the answers not
    // sent yet, and how the stream ends.
    bool streaming = false;
    bool remote_done = false;  // the client ended its side
    bool deferred = false;     // the data provider waits for answers
    bool ending = false;       // end now with `code` / `message`
    std::string message;
    size_t parsed = 0;         // bytes of `body` taken as messages
    uint64_t next_seq = 0;
    struct Pending {
      std::shared_ptr<GrpcCall> call;
      std::unique_ptr<boost::asio::steady_timer> timer;
    };
    std::unordered_map<uint64_t, Pending> pending;
  };

  // nghttp2's callbacks (user data: this connection).
  static int OnBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* self);
  static int OnDataChunk(nghttp2_session*, uint8_t flags, int32_t id, const uint8_t* data,
                         size_t len, void* self);
  static int OnFrame(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int OnStreamClose(nghttp2_session*, int32_t id, uint32_t error_code, void* self);
  static ssize_t ReadData(nghttp2_session*, int32_t id, uint8_t* buf, size_t length,
                          uint32_t* flags, nghttp2_data_source* source, void* self);

  Stream* Find(int32_t id);
  // One header of a request (OnHeader), within the server's limits.
  int TakeHeader(Stream& s, const uint8_t* name, size_t namelen, const uint8_t* value,
             size_t valuelen);
  // Runs a callback's work: an exception answers stream `id`'s call INTERNAL (0), or,
  // when that fails too, is a fatal error of the session (nghttp2 closes it).
  template <typename F>
  int Guard(int32_t id, F&& f);
  // The idle timer (see above): armed from the last bytes read.
  void ArmIdle();
  void OnIdle(const boost::system::error_code& ec);
  bool CallsUnderWay() const;
  // Takes a stream's message bytes out of it (and out of receiving_).
  std::string Release(Stream& s);
  void DoRead();
  // Sends what the session has to send; closes when it has nothing more to do.
  void Flush();
  void Close();

  // A request is complete (its END_STREAM came): route it.
  void Dispatch(int32_t id, Stream& s);
  void Infer(int32_t id, Stream& s, std::string msg);
  // Routes, parses and queues a ModelInfer message (Server::GrpcInfer; `done`: the
  // call's callback), on a decode thread when it is large, then runs `then` with the
  // call on this IO thread (stream `id` may be gone by then).
  void Decode(int32_t id, std::string msg, const std::string& trace,
              std::function<void(std::shared_ptr<GrpcCall>)> done,
              std::function<void(std::shared_ptr<GrpcCall>)> then);
  // A unary call was queued (or refused): its deadline's timer.
  void Queued(int32_t id, std::shared_ptr<GrpcCall> call);
  // A ModelInfer call's `done`: posts its answer to InferDone on this IO thread.
  std::function<void(std::shared_ptr<GrpcCall>)> InferCallback(int32_t id);
  void Unary(int32_t id, Stream& s, std::string msg);
  // The answers (on this IO thread).
  void InferDone(int32_t id, const std::shared_ptr<GrpcCall>& call, int code);
  void Respond(int32_t id, Stream& s, std::string bytes);
  void Fail(int32_t id, Stream& s, int code, const std::string& message, bool retry = false);
  void Submit(int32_t id, Stream& s);

  // ModelStreamInfer (grpc_stream.cc).
  static ssize_t ReadStream(nghttp2_session*, int32_t id, uint8_t* buf, size_t length,
                            uint32_t* flags, nghttp2_data_source* source, void* self);
  void OpenStream(int32_t id, Stream& s);
  // Takes the complete messages of `s.body` (new data came).
  void StreamMessages(int32_t id, Stream& s);
  void StreamInfer(int32_t id, Stream& s, std::string msg);
  void StreamDone(int32_t id, uint64_t seq, const std::shared_ptr<GrpcCall>& call, int code);
  // Ends the stream with a status once what is queued was sent.
  void EndStream(int32_t id, Stream& s, int code, std::string message);
  // Lets the data provider send what was queued (after an answer or the client's end).
  void Resume(int32_t id, Stream& s);
  // Cancels a stream's calls under way (the client went away).
  static void CancelAll(Stream& s);

  boost::asio::ip::tcp::socket sock_;
  boost::asio::steady_timer idle_;
  std::chrono::steady_clock::time_point last_read_, write_start_;
  bool idle_armed_ = false;
  bool close_when_sent_ = false;  // GOAWAY for an idle connection: close once it is sent
  Listener* io_;
  Server* srv_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<Stream>> streams_;
  std::array<char, 16 * 1024> in_{};
  std::string out_;
  size_t receiving_ = 0;  // bytes of messages held while they arrive, every stream's
  bool writing_ = false;
  bool closed_ = false;
  bool draining_ = false;
};

template <typename F>
int GrpcConnection::Guard(int32_t id, F&& f) {
  std::string cause;
  try {
    return f();
  } catch (const std::bad_alloc&) {
    cause = "the server ran out of memory handling the call (std::bad_alloc)";
  } catch (const std::exception& e) {
    cause = std::string("the server failed handling the call: ") + e.what();
  } catch (...) {
    cause = "the server failed handling the call (an unknown exception)";
  }
  std::fprintf(stderr, "paddle-ipu: a gRPC call failed in the server: %s\n", cause.c_str());
  try {
    Stream* s = id > 0 ? Find(id) : nullptr;
    if (s && !s->answered) {
      Fail(id, *s, kInternal, cause);
      return 0;
    }
    if (s && s->streaming && !s->ending) EndStream(id, *s, kInternal, cause);
    if (s) return 0;
  } catch (...) {
  }
  return NGHTTP2_ERR_CALLBACK_FAILURE;
}

}  // namespace serving
}  // namespace paddle_ipu
