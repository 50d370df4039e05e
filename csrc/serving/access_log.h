// The access log (paddle-ipu serve --access-log): one JSON line per inference request,
// HTTP and gRPC, written from C++ without Python. Lines are appended to a buffer under
// a mutex by whichever thread answers (an IO thread, a gRPC server thread); a thread
// of the log's own writes the buffer out every 100 ms (and at Close), whole lines per
// write(2) on a file opened O_APPEND, so that --workers processes may share a file.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace paddle_ipu {
namespace serving {

// The trace id (32 lowercase hex digits) of a W3C traceparent header
// ("00-<trace-id>-<parent-id>-<flags>"), or "" when the header is not one.
std::string TraceId(std::string_view traceparent);

// What one line says.
struct AccessEntry {
  const char* protocol = "http";
  std::string_view id;       // the request's id ("" when it has none)
  std::string_view model;    // as the request named it
  std::string_view version;  // "" when the request named none
  int status = 0;            // HTTP status (gRPC: the status its code corresponds to)
  int64_t rows = 0;
  double latency_s = 0;      // arrival to answer
  double queue_s = -1;       // -1: it did not run
  double compute_s = -1;
  std::string_view trace;    // traceparent header / metadata, as received
};

class AccessLog {
 public:
  // `path`: a file (created, appended to), or "-" for standard error.
  explicit AccessLog(const std::string& path);
  ~AccessLog();
  void Write(const AccessEntry& e);
  // Writes out what is buffered (also done every 100 ms).
  void Flush();

 private:
  void Loop();

  int fd_ = -1;
  bool own_fd_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  std::string buf_;
  bool stop_ = false;
  std::mutex write_mu_;  // one write-out at a time, in order
  std::thread thread_;
};

}  // namespace serving
}  // namespace paddle_ipu
