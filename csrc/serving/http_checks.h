// The checks of an HTTP/1.1 request's head that come before its route, apart from the
// socket (so that a fuzz harness runs them on bytes): the number of its header fields,
// the framing headers it may carry once only, its target's path, and the binary
// tensor extension's split of the body.
#pragma once

#include <boost/beast/http/message.hpp>

#include <cstdint>
#include <string_view>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// The binary tensor extension's header: the length of the JSON part of a body.
constexpr const char* kHeaderLength = "Inference-Header-Content-Length";

using HttpHead = boost::beast::http::request_header<>;

// 431 when the request has more than `max_headers` header fields; 400 when a header
// that frames the request (Content-Length, Transfer-Encoding, Host, the binary
// extension's length) comes more than once: two values of one frame leave the
// message's extent to whoever reads it.
Error CheckHead(const HttpHead& head, int64_t max_headers);

// The target's path (before any '?'), or a 400: not a path (origin form), or a path
// with an empty segment ("/v2/models/m/versions//infer": which version?).
Error TargetPath(std::string_view target, std::string_view* path);

// The length of the JSON header of a body of `body_size` bytes: the binary
// extension's header when the request has it, else the whole body (`*binary` false).
Error JsonHeaderLength(const HttpHead& head, size_t body_size, size_t* length, bool* binary);

}  // namespace serving
}  // namespace paddle_ipu
