// The KServe v2 datatype table (see dtypes.h).
#include "dtypes.h"

namespace paddle_ipu {
namespace serving {

namespace {

// One row per DType, in its order.
constexpr DTypeInfo kTypes[kDTypeCount] = {
    {"BOOL", "bool", 1},     {"UINT8", "uint8", 1},     {"UINT16", "uint16", 2},
    {"UINT32", "uint32", 4}, {"UINT64", "uint64", 8},   {"INT8", "int8", 1},
    {"INT16", "int16", 2},   {"INT32", "int32", 4},     {"INT64", "int64", 8},
    {"FP16", "float16", 2},  {"FP32", "float32", 4},    {"FP64", "float64", 8},
};

bool Valid(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < kDTypeCount;
}

}  // namespace

const DTypeInfo& Info(DType t) { return kTypes[static_cast<int>(t)]; }

const char* V2Name(DType t) {
  if (t == DType::kBytes) return "BYTES";
  return Valid(t) ? Info(t).v2 : "INVALID";
}
const char* NumpyName(DType t) {
  if (t == DType::kBytes) return "object";
  return Valid(t) ? Info(t).numpy : "invalid";
}
int64_t ElemSize(DType t) { return Valid(t) ? Info(t).size : 0; }

DType FromV2(std::string_view name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    if (name == kTypes[i].v2) return static_cast<DType>(i);
  }
  return name == "BYTES" ? DType::kBytes : DType::kInvalid;
}

std::string ConfigName(DType t) {
  return t == DType::kBytes ? "TYPE_STRING" : std::string("TYPE_") + V2Name(t);
}

int64_t BytesElements(std::string_view data) {
  int64_t n = 0;
  size_t at = 0;
  while (at < data.size()) {
    if (data.size() - at < 4) return -1;
    const uint32_t len = Load<uint32_t>(data.data() + at);
    at += 4;
    if (data.size() - at < len) return -1;
    at += len;
    ++n;
  }
  return n;
}

void PutBytesElement(std::string* out, std::string_view element) {
  const uint32_t len = static_cast<uint32_t>(element.size());
  out->append(reinterpret_cast<const char*>(&len), 4);
  out->append(element);
}

bool IsInt(DType t) {
  return t != DType::kBool && t != DType::kFp16 && t != DType::kFp32 && t != DType::kFp64 &&
         t != DType::kBytes && t != DType::kInvalid;
}

bool SafeCast(DType from, DType to) {
  return from == to || (from == DType::kInt64 && to == DType::kInt32) ||
         (from == DType::kInt32 && to == DType::kInt64) ||
         (from == DType::kBool && to == DType::kInt32) ||
         (from == DType::kFp64 && to == DType::kFp32) ||
         (from == DType::kFp16 && to == DType::kFp32);
}

std::string Accepted(DType model) {
  std::string s = V2Name(model);
  for (int i = 0; i < kDTypeCount; ++i) {
    const DType t = static_cast<DType>(i);
    if (t != model && SafeCast(t, model)) s += std::string(", ") + V2Name(t);
  }
  return s;
}

}  // namespace serving
}  // namespace paddle_ipu
