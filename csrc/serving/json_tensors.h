// The JSON wire codec of tensors (KServe v2's "data": nested lists of numbers or
// booleans): reading them as the model's bytes, and writing bytes back as JSON.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtypes.h"

namespace paddle_ipu {
namespace serving {

// The elements of `v`, the data of a tensor of shape `shape` with `count` elements (a
// flat list of them, lists nested as the shape -- the innermost holding the rest of it
// --, or one value for one element), appended to `out` as elements of `t`. "" when
// they were, else what is wrong (ragged lists, a nesting that is not the shape's, a
// value of another type or outside `t`'s range), for the caller to prefix with the
// input's name.
std::string JsonTensor(DType t, const boost::json::value& v, const std::vector<int64_t>& shape,
                       int64_t count, std::string* out);

// Appends the `n` elements of `t` at `p` to `out` as a flat JSON list, written as
// Python's json writes them (NaN, Infinity).
void RenderJsonData(DType t, const char* p, int64_t n, std::string* out);
// A BYTES tensor (length-prefixed elements) as a flat JSON list of strings (bytes
// that are not UTF-8 replaced).
void RenderJsonBytes(std::string_view data, std::string* out);

}  // namespace serving
}  // namespace paddle_ipu
