// libFuzzer: an HTTP/1.1 request as a connection reads it: Beast's parser with the
// server's default limits (connection.cc), the checks of its head and target
// (http_checks.cc), and, for an infer route (/v2/models/{m|d}/infer), the body's
// decode as the binary extension or JSON (http_request.cc). Input: the request's bytes.
#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>

#include "../serving/http_checks.h"
#include "../serving/requests.h"
#include "fuzz_plans.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paddle_ipu::serving;
  http::request_parser<http::string_body> parser;
  parser.header_limit(64 << 10);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  size_t at = 0;
  while (at < size && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(data + at, size - at), ec);
    if (ec == http::error::need_more) break;
    if (ec) return 0;
    at += n;
    if (n == 0) break;
  }
  if (!parser.is_done()) {  // the client ended its side (a connection reads end_of_stream)
    if (!parser.got_some()) return 0;
    parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;
  }
  const auto& req = parser.get();
  if (CheckHead(req.base(), 100)) return 0;
  std::string_view path;
  if (TargetPath(std::string_view(req.target().data(), req.target().size()), &path)) return 0;
  const ModelPlan* m = path == "/v2/models/m/infer"   ? &fuzz::Plan(0)
                       : path == "/v2/models/d/infer" ? &fuzz::Plan(2)
                                                      : nullptr;
  if (!m || req.method() != http::verb::post) return 0;
  size_t length = 0;
  bool binary = false;
  const std::string& body = req.body();
  if (JsonHeaderLength(req.base(), body.size(), &length, &binary)) return 0;
  InferRequest r;
  const std::string_view all(body);
  if (!ParseHttpInfer(*m, all.substr(0, length), all.substr(length), &r)) fuzz::Touch(*m, r);
  return 0;
}
