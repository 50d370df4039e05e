// The checks of an HTTP request's head (see http_checks.h).
#include "http_checks.h"

#include <charconv>
#include <iterator>
#include <string>

#include "text.h"

namespace http = boost::beast::http;

namespace paddle_ipu {
namespace serving {

Error CheckHead(const HttpHead& head, int64_t max_headers) {
  const auto fields = static_cast<int64_t>(std::distance(head.begin(), head.end()));
  if (fields > max_headers) {
    return {431, "the request has " + std::to_string(fields) +
                     " header fields, more than the server's limit of " +
                     std::to_string(max_headers) + " (--max-headers)"};
  }
  for (const char* name : {"Content-Length", "Transfer-Encoding", "Host", kHeaderLength}) {
    const size_t n = head.count(name);
    if (n > 1) {
      return {400, "the request has " + std::to_string(n) + " " + name +
                       " headers: a header that frames the request comes once"};
    }
  }
  return {};
}

Error TargetPath(std::string_view target, std::string_view* path) {
  std::string_view p = target.substr(0, target.find('?'));
  if (p.empty() || p.front() != '/') {
    return {400, "the request target " + Quote(ValidUtf8(target.substr(0, 200))) +
                     " is not a path: this server takes origin-form targets (/v2/...)"};
  }
  for (size_t at = 0; p.size() > 1 && at < p.size(); at = p.find('/', at + 1)) {
    if (at + 1 == p.size() || p[at + 1] == '/') {
      return {400, "the path " + Quote(ValidUtf8(p.substr(0, 200))) +
                       " has an empty segment (at character " + std::to_string(at + 1) +
                       "): no route has one"};
    }
  }
  *path = p;
  return {};
}

Error JsonHeaderLength(const HttpHead& head, size_t body_size, size_t* length, bool* binary) {
  *length = body_size;
  *binary = false;
  auto it = head.find(kHeaderLength);
  if (it == head.end()) return {};
  const std::string_view v(it->value().data(), it->value().size());
  uint64_t n = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size()) {
    return {400, std::string(kHeaderLength) + " must be an integer >= 0, got " +
                     Quote(ValidUtf8(v.substr(0, 100)))};
  }
  if (n > body_size) {
    return {400, std::string(kHeaderLength) + " is " + std::to_string(n) +
                     ", but the body has " + std::to_string(body_size) + " bytes"};
  }
  *length = static_cast<size_t>(n);
  *binary = true;
  return {};
}

}  // namespace serving
}  // namespace paddle_ipu
