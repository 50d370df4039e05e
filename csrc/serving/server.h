// The server: the set of model versions it serves (one FrontEnd each: queue, plan,
// counters, metadata), the HTTP listeners and IO threads they share, the routing of a
// request to its model (HTTP by URL, gRPC by model_name / model_version), and the
// model repository's state (Triton's repository extension): every model version the
// repository knows, with its state (READY, LOADING, UNLOADING, UNAVAILABLE) and the
// reason, and the load / unload requests handed to the Python side (repository.cc).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "decode_pool.h"
#include "front_end.h"
#include "hand_off.h"
#include "metrics.h"

namespace paddle_ipu {
namespace serving {

class Connection;
class GrpcCall;
struct Listener;

// The bounds the server puts on its clients (docs/serving.md lists them, with where
// their defaults come from). A timeout of 0 is none.
struct ServerLimits {
  int64_t max_body = 64 << 20;          // a request's body (HTTP) or message (gRPC)
  double header_timeout_s = 60;         // a request's headers, from its first byte
  double idle_timeout_s = 75;           // no request; a stalled body, message or answer
  int64_t max_connections = 1024;       // open HTTP and gRPC connections
  int64_t max_header_bytes = 64 << 10;  // a request's header block
  int64_t max_headers = 100;            // a request's header fields
};

// One version of a model in the server's repository.
struct ModelEntry {
  std::string name, version;
  std::string state;              // READY, LOADING, UNLOADING or UNAVAILABLE
  std::string reason;             // why it is not READY ("" when it is)
  std::shared_ptr<FrontEnd> fe;   // READY and UNLOADING only
};

// A gRPC call for the Python side (the repository's load or unload): the method's
// name (after the service's), the serialized request, and who is answered.
struct GrpcUnaryJob {
  int64_t id = 0;
  std::string method, body;
  std::function<void(int code, std::string message, std::string body)> done;
};

// A load or unload request of the repository extension, waiting for the Python side
// (HTTP: answered on the connection it came from).
struct ControlJob {
  int64_t id = 0;
  std::string action, model, body;
  std::weak_ptr<Connection> connection;
  std::shared_ptr<Listener> io;
};

class Server {
 public:
  Server(std::string server_version, ServerLimits limits);
  ~Server();

  const ServerLimits& limits() const { return limits_; }
  int64_t max_body() const { return limits_.max_body; }
  const std::string& server_metadata() const { return server_metadata_; }
  bool draining() const { return draining_.load(); }
  bool ready() const;
  void set_ready(bool ready) { ready_ = ready; }
  // The counters of requests no model answered (unknown model or route, malformed
  // HTTP, a body over the limit).
  Counters* unrouted() { return unrouted_.get(); }

  // -- the access log ---------------------------------------------------------------
  // Writes a line per inference request (every model's, and the unrouted ones) to
  // `path` ("-": standard error) from now on; before the listeners start.
  void OpenAccessLog(const std::string& path);
  bool logging() const { return log_ != nullptr; }
  void FlushAccessLog() {
    if (log_) log_->Flush();
  }

  // -- the models ---------------------------------------------------------------
  // Serves `fe` as its plan's name and version (READY), replacing that entry.
  void AddModel(std::shared_ptr<FrontEnd> fe);
  // Sets an entry's state and reason (adding the entry if new); the front end is kept
  // for UNLOADING (requests in flight finish), dropped otherwise.
  void SetState(const std::string& name, const std::string& version, const std::string& state,
                const std::string& reason);
  // Forgets an entry (false: there was none).
  bool Forget(const std::string& name, const std::string& version);
  // The front end serving `name` at `version` ("": the newest READY version), or the
  // error to answer: 404 for a model or version the server does not serve, 503 while
  // it loads. Names are quoted as JSON strings ("m"), or as Python's repr ('m': gRPC's
  // messages, as its parser's).
  std::shared_ptr<FrontEnd> Find(std::string_view name, std::string_view version, Error* error,
                                 bool repr = false) const;
  std::vector<std::shared_ptr<FrontEnd>> Serving() const;
  std::vector<ModelEntry> Entries() const;

  // -- JSON and text of the routes ------------------------------------------------
  // Every entry, or the READY ones.
  std::string IndexJson(bool ready_only = false) const;
  // Model metadata: the version's, with every READY version of the model listed.
  std::string MetadataJson(const FrontEnd& fe) const;
  // Triton's statistics of every model ("" name), of every version of one (""
  // version), or of one version; false with `error` set for an unknown one.
  std::string StatisticsJson(std::string_view name, std::string_view version,
                             Error* error) const;
  // The same as the gRPC service's ModelStatisticsResponse (names in `error` quoted as
  // Python's repr, as gRPC's messages are).
  std::string StatisticsMessage(std::string_view name, std::string_view version,
                                Error* error) const;
  std::string Prometheus() const;

  // -- HTTP (server.cc) -------------------------------------------------------------
  int StartHttp(const std::string& host, int port, int threads, bool reuse_port);
  void StopAccepting();
  // Waits until every model's admitted requests are answered and every connection is
  // closed; false on timeout (negative: no limit).
  bool Drain(double timeout);
  void Shutdown();
  void NotifyDrain();
  int64_t active() const;
  std::atomic<int64_t> connections{0};  // open HTTP and gRPC connections
  // Runs a request's parse on a decode thread (decode_pool.h).
  void Decode(std::function<void()> task) { decode_.Post(std::move(task)); }
  // What the limits did: a connection closed by a timeout ("header", "body", "idle",
  // "write"); one refused (at max_connections, or while accept() failed); an IO
  // thread's handler that threw past its request's guard.
  void CountTimeout(const char* which);
  void CountRefused() { refused_ += 1; }
  void CountIoFailure() { io_failures_ += 1; }

  // -- gRPC -------------------------------------------------------------------------
  // Listens for gRPC (HTTP/2, grpc_connection.h) on host:port on every IO thread of
  // the HTTP front end (started first); returns the port.
  int StartGrpc(const std::string& host, int port, bool reuse_port);
  int grpc_port() const { return grpc_port_; }
  // Routes a serialized ModelInferRequest to its model and queues it there (`trace`:
  // the call's traceparent metadata, for the access log; `done`: see grpc_call.h).
  std::shared_ptr<GrpcCall> GrpcInfer(std::string msg, std::string trace = std::string(),
                                      std::function<void(std::shared_ptr<GrpcCall>)> done =
                                          nullptr);
  // A ModelInfer call answered at once with `e`, counted with the unrouted ones.
  std::shared_ptr<GrpcCall> GrpcRefused(const Error& e, std::string trace,
                                        std::function<void(std::shared_ptr<GrpcCall>)> done);

  // The control RPCs are answered on the IO thread from the server's state
  // (grpc_control.cc): ServerLive, ServerReady, ModelReady, ServerMetadata,
  // ModelMetadata, RepositoryIndex, ModelConfig, ModelStatistics; so are the RPCs the
  // server does not offer, or that the service does not have (UNIMPLEMENTED). Returns
  // false for the repository's load and unload (they go to GrpcUnary); else sets a
  // gRPC code, its message and (code 0) the serialized answer of `method` to the
  // serialized request `msg`.
  bool GrpcControl(std::string_view method, std::string_view msg, int* code,
                   std::string* message, std::string* answer) const;
  // RepositoryModelLoad / Unload go to the Python side (grpc_unary.cc), which drives
  // the model repository and answers them with the GIL; the IO thread never waits for
  // it.
  // Queues a call; false when the server takes none (stopping).
  bool GrpcUnary(std::shared_ptr<GrpcUnaryJob> job);
  // The next call (waits without the GIL at most `timeout` seconds; negative: no
  // limit); null on timeout or once CloseGrpcUnary() was called.
  std::shared_ptr<GrpcUnaryJob> NextGrpcUnary(double timeout);
  // Answers call `id`: a gRPC code, its message, and (code 0) the serialized answer.
  void GrpcUnaryDone(int64_t id, int code, std::string message, std::string body);
  // No more calls: the queued ones are answered UNAVAILABLE.
  void CloseGrpcUnary();

  // -- the repository's load / unload (repository.cc) -------------------------------
  // Whether load / unload requests go to the Python side (else they are refused).
  void EnableControl() { control_ = true; }
  bool control() const { return control_.load(); }
  // Queues a request; an error when the server takes none (stopping).
  Error Control(std::shared_ptr<ControlJob> job);
  // The next request (waits without the GIL at most `timeout` seconds; negative: no
  // limit); null on timeout or once CloseControl() was called.
  std::shared_ptr<ControlJob> NextControl(double timeout);
  // Answers request `id` with an HTTP status and a JSON body.
  void ControlDone(int64_t id, int status, std::string body);
  // No more requests: the queued ones are answered 503.
  void CloseControl();

 private:
  // The front ends whose statistics StatisticsJson / StatisticsMessage report.
  std::vector<std::shared_ptr<FrontEnd>> StatisticsOf(std::string_view name,
                                                      std::string_view version, Error* error,
                                                      bool repr) const;
  // With mu_ held.
  std::vector<ModelEntry>::iterator Locate(const std::string& name, const std::string& version);
  void Deliver(const std::shared_ptr<ControlJob>& job, int status, std::string body);

  std::string server_version_, server_metadata_;
  ServerLimits limits_;
  DecodePool decode_;
  std::atomic<int64_t> refused_{0}, io_failures_{0};
  std::atomic<int64_t> timeouts_[4] = {};  // header, body, idle, write
  std::shared_ptr<Counters> unrouted_;
  std::shared_ptr<AccessLog> log_;  // set before the listeners start, if at all
  mutable std::mutex mu_;
  std::vector<ModelEntry> entries_;  // sorted by name, then version
  std::vector<std::shared_ptr<Listener>> listeners_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> ready_{true};
  std::mutex drain_mu_;
  std::condition_variable drained_;

  std::atomic<bool> control_{false};
  HandOff<ControlJob> control_jobs_;

  int grpc_port_ = -1;
  HandOff<GrpcUnaryJob> unary_jobs_;
};

}  // namespace serving
}  // namespace paddle_ipu
