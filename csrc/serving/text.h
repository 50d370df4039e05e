// The spelling of what messages and answers show: names as Python's repr shows them
// (FeedError's messages), shapes, JSON strings, and the JSON error body.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// A JSON string literal of `s`.
std::string Quote(std::string_view s);
// `s` with every byte that is not part of valid UTF-8 written as \xNN: messages echo
// what a request sent, and JSON and Python strings need text.
std::string ValidUtf8(std::string_view s);
// `message` cut to at most `limit` bytes (at a character's start), saying so: a message
// may echo what a request sent (a name of a megabyte), and an answer's headers have
// limits of their own (a gRPC client's metadata: 8 KiB).
std::string Bounded(std::string_view message, size_t limit);
// {"error": message}: the body of every error answer over HTTP (at most 4 KiB of it).
std::string ErrorJson(std::string_view message);

// Python's repr of a name: 'x'.
std::string Repr(std::string_view s);
// Python's repr of the list of the tensors' names, sorted (as sorted() does) or in
// the model's order.
std::string ReprNames(const std::vector<TensorPlan>& ts, bool sort);
// [2, 3]
std::string ShapeStr(const std::vector<int64_t>& s);

}  // namespace serving
}  // namespace paddle_ipu
