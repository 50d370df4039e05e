// The JSON wire codec of tensors (KServe v2's "data": nested lists of numbers or
// booleans): reading them as the model's bytes, and writing bytes back as JSON.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "dtypes.h"

namespace paddle_ipu {
namespace serving {

// Appends the elements of `v` (a nested list, or one value), flattened, to `out` as
// elements of `t` and counts them; false, with `*bad` at the first value that is no
// `t` value, when one does not fit.
bool JsonTensor(DType t, const boost::json::value& v, std::string* out, int64_t* count,
                const boost::json::value** bad);

// Appends the `n` elements of `t` at `p` to `out` as a flat JSON list, written as
// Python's json writes them (NaN, Infinity).
void RenderJsonData(DType t, const char* p, int64_t n, std::string* out);
// A BYTES tensor (length-prefixed elements) as a flat JSON list of strings (bytes
// that are not UTF-8 replaced).
void RenderJsonBytes(std::string_view data, std::string* out);

}  // namespace serving
}  // namespace paddle_ipu
