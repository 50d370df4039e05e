// The access log (see access_log.h).
#include "access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

bool Hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Writes all of `data` (retrying short writes and EINTR); false on an error.
bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::string TraceId(std::string_view tp) {
  // version "-" trace-id "-" parent-id "-" flags; a later version may append fields.
  if (tp.size() < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return {};
  if (tp.size() > 55 && (tp.substr(0, 2) == "00" || tp[55] != '-')) return {};
  const std::string_view version = tp.substr(0, 2), trace = tp.substr(3, 32),
                         parent = tp.substr(36, 16), flags = tp.substr(53, 2);
  if (!Hex(version) || version == "ff" || !Hex(trace) || !Hex(parent) || !Hex(flags)) return {};
  if (trace == std::string(32, '0') || parent == std::string(16, '0')) return {};
  return std::string(trace);
}

AccessLog::AccessLog(const std::string& path) {
  if (path == "-") {
    fd_ = 2;
  } else {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw std::runtime_error("cannot open the access log " + path + ": " +
                               std::strerror(errno));
    }
    own_fd_ = true;
  }
  thread_ = std::thread([this] { Loop(); });
}

AccessLog::~AccessLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  Flush();
  if (own_fd_) ::close(fd_);
}

void AccessLog::Write(const AccessEntry& e) {
  char head[48];
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
      1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  const size_t n = std::strftime(head, sizeof(head), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(head + n, sizeof(head) - n, ".%03dZ", ms);
  char num[160];
  std::snprintf(num, sizeof(num), ",\"status\":%d,\"rows\":%lld,\"latency_ms\":%.3f", e.status,
                static_cast<long long>(e.rows), e.latency_s * 1e3);
  std::string line = "{\"time\":\"" + std::string(head) + "\",\"protocol\":\"" + e.protocol +
                     "\",\"id\":" + (e.id.empty() ? "null" : Quote(ValidUtf8(e.id))) +
                     ",\"model\":" + Quote(ValidUtf8(e.model)) + ",\"version\":" +
                     (e.version.empty() ? "null" : Quote(ValidUtf8(e.version))) + num;
  if (e.queue_s >= 0) {
    std::snprintf(num, sizeof(num), ",\"queue_ms\":%.3f,\"compute_ms\":%.3f", e.queue_s * 1e3,
                  e.compute_s * 1e3);
    line += num;
  }
  const std::string trace = TraceId(e.trace);
  line += ",\"trace_id\":" + (trace.empty() ? std::string("null") : "\"" + trace + "\"") + "}\n";
  std::lock_guard<std::mutex> lock(mu_);
  buf_ += line;
}

void AccessLog::Flush() {
  std::lock_guard<std::mutex> order(write_mu_);
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.swap(buf_);
  }
  if (!out.empty() && !WriteAll(fd_, out.data(), out.size())) {
    std::fprintf(stderr, "paddle-ipu: the access log cannot be written: %s\n",
                 std::strerror(errno));
  }
}

void AccessLog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(100));
    if (stop_) break;
    lock.unlock();
    Flush();
    lock.lock();
  }
}

}  // namespace serving
}  // namespace paddle_ipu
