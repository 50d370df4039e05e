// The KServe v2 datatypes: the one table of their names (the protocol's, numpy's,
// Triton's model configuration's) and sizes, which the Python side reads too
// (paddle_ipu._core.kserve_datatypes), the casts a feed may take, and the access to
// one element of a tensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace paddle_ipu {
namespace serving {

// KServe v2 datatypes, in the order of the table's rows; BYTES (variable-size
// elements, which only dynamic models take: dynamic.h) is after the table.
enum class DType : int {
  kBool = 0,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFp16,
  kFp32,
  kFp64,
  kBytes,
  kInvalid
};

// The fixed-size datatypes (the table's rows).
constexpr int kDTypeCount = static_cast<int>(DType::kBytes);

// One row of the table.
struct DTypeInfo {
  const char* v2;     // the protocol's name ("FP32")
  const char* numpy;  // numpy's ("float32"): the names FeedError uses
  int64_t size;       // bytes of one element
};

// The row of `t` (t != kInvalid).
const DTypeInfo& Info(DType t);

const char* V2Name(DType t);
int64_t ElemSize(DType t);
DType FromV2(std::string_view name);
const char* NumpyName(DType t);
// Triton's model configuration name ("TYPE_FP32").
std::string ConfigName(DType t);

bool IsInt(DType t);

// BYTES tensors travel as their elements one after the other, each a 4-byte
// little-endian length and that many bytes (the binary extension's, raw contents').
// The number of elements of `data` in that form, or -1 when it is not in that form.
int64_t BytesElements(std::string_view data);
void PutBytesElement(std::string* out, std::string_view element);
// The casts a feed may take (IpuExecutor.feed_cast's _SAFE_CASTS): the model's
// dtype `to` from the request's `from`.
bool SafeCast(DType from, DType to);
// "INT32, INT64, BOOL": what a model input of `model` accepts, for messages.
std::string Accepted(DType model);

// -- element access (unaligned, native byte order: little-endian on every target) --

template <typename T>
T Load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

template <typename T>
void Store(char* p, T x) {
  std::memcpy(p, &x, sizeof(T));
}

}  // namespace serving
}  // namespace paddle_ipu
