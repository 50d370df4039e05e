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

const char* V2Name(DType t) { return Valid(t) ? Info(t).v2 : "INVALID"; }
const char* NumpyName(DType t) { return Valid(t) ? Info(t).numpy : "invalid"; }
int64_t ElemSize(DType t) { return Valid(t) ? Info(t).size : 0; }

DType FromV2(std::string_view name) {
  for (int i = 0; i < kDTypeCount; ++i) {
    if (name == kTypes[i].v2) return static_cast<DType>(i);
  }
  return DType::kInvalid;
}

std::string ConfigName(DType t) { return std::string("TYPE_") + V2Name(t); }

bool IsInt(DType t) {
  return t != DType::kBool && t != DType::kFp16 && t != DType::kFp32 && t != DType::kFp64 &&
         t != DType::kInvalid;
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
