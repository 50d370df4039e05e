// The checks of an infer request against the model's plan (see checks.h).
#include "checks.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>

#include "../core/fp16.h"
#include "sizes.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

// An integer element as int64 (uint64 values above INT64_MAX saturate: no index
// range reaches them).
int64_t IntAt(DType t, const char* base, int64_t i) {
  switch (t) {
    case DType::kBool:
    case DType::kUint8: return Load<uint8_t>(base + i);
    case DType::kUint16: return Load<uint16_t>(base + 2 * i);
    case DType::kUint32: return Load<uint32_t>(base + 4 * i);
    case DType::kUint64: {
      const uint64_t v = Load<uint64_t>(base + 8 * i);
      return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
    }
    case DType::kInt8: return Load<int8_t>(base + i);
    case DType::kInt16: return Load<int16_t>(base + 2 * i);
    case DType::kInt32: return Load<int32_t>(base + 4 * i);
    case DType::kInt64: return Load<int64_t>(base + 8 * i);
    default: return 0;
  }
}

// The index in `shape` of the element at flat index `flat`.
std::vector<int64_t> IndexOf(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> where(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    where[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return where;
}

// FP32's largest finite value plus half its last step: doubles from here on round to
// infinity (and casting them is undefined).
constexpr double kFloatOverflow = 0x1.ffffffp127;

// Casts the elements of `from` of shape `shape` at `src` to the model's dtype into
// `out`: a value the model's dtype cannot hold is refused, as numpy's casting="safe"
// would have refused the dtype.
Error CastInput(const TensorPlan& t, DType from, const char* src,
                const std::vector<int64_t>& shape, std::string* out) {
  const DType to = t.dtype;
  const int64_t count = Elements(shape);
  int64_t bytes = 0;
  if (!MulSize(count, ElemSize(to), &bytes)) {
    return {400, "input " + Repr(t.name) + ": shape " + ShapeStr(shape) + " of " + V2Name(to) +
                     " is larger than a 64-bit size can count"};
  }
  out->resize(static_cast<size_t>(bytes));
  char* dst = out->data();
  if (from == DType::kInt64 && to == DType::kInt32) {
    int64_t lo = 0, hi = 0;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t v = Load<int64_t>(src + 8 * i);
      if (i == 0 || v < lo) lo = v;
      if (i == 0 || v > hi) hi = v;
    }
    if (count > 0 && (lo < INT32_MIN || hi > INT32_MAX)) {
      return {400, "input " + Repr(t.name) + ": INT64 values in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "] do not fit the model's INT32"};
    }
    for (int64_t i = 0; i < count; ++i) {
      Store<int32_t>(dst + 4 * i, static_cast<int32_t>(Load<int64_t>(src + 8 * i)));
    }
  } else if (from == DType::kInt32 && to == DType::kInt64) {
    for (int64_t i = 0; i < count; ++i) Store<int64_t>(dst + 8 * i, Load<int32_t>(src + 4 * i));
  } else if (from == DType::kBool && to == DType::kInt32) {
    for (int64_t i = 0; i < count; ++i) Store<int32_t>(dst + 4 * i, src[i] ? 1 : 0);
  } else if (from == DType::kFp64 && to == DType::kFp32) {
    for (int64_t i = 0; i < count; ++i) {
      const double v = Load<double>(src + 8 * i);
      if (std::isfinite(v) && std::fabs(v) >= kFloatOverflow) {
        char text[32];
        std::snprintf(text, sizeof(text), "%.17g", v);
        return {400, "input " + Repr(t.name) + ": FP64 value " + text + " at index " +
                         ShapeStr(IndexOf(i, shape)) +
                         " does not fit the model's FP32 (largest finite value 3.4028235e+38)"};
      }
      Store<float>(dst + 4 * i, static_cast<float>(v));
    }
  } else if (from == DType::kFp16 && to == DType::kFp32) {
    for (int64_t i = 0; i < count; ++i) {
      Store<uint32_t>(dst + 4 * i, fp16::HalfBitsToFloatBits(Load<uint16_t>(src + 2 * i)));
    }
  } else {
    return {500, "no cast from " + std::string(V2Name(from)) + " to " + V2Name(to)};
  }
  return {};
}

Error CheckRanges(const TensorPlan& t, const char* data, const std::vector<int64_t>& shape) {
  if (t.ranges.empty() || !IsInt(t.dtype)) return {};
  const int64_t count = Elements(shape);
  const int64_t last = shape.empty() ? 1 : shape.back();
  for (const IndexRange& b : t.ranges) {
    if (b.column >= 0 && (shape.empty() || last <= b.column)) continue;
    int64_t bad = 0, first = -1, value = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (b.column >= 0 && i % last != b.column) continue;
      const int64_t v = IntAt(t.dtype, data, i);
      if (v >= b.low && v < b.high) continue;
      if (std::find(b.allowed.begin(), b.allowed.end(), v) != b.allowed.end()) continue;
      if (bad++ == 0) first = i, value = v;
    }
    if (!bad) continue;
    return {400, "input " + Repr(t.name) + ": value " + std::to_string(value) + " at index " +
                     ShapeStr(IndexOf(first, shape)) + " is out of range; valid values are " + b.describe + "; " +
                     std::to_string(bad) + " value(s) of the input are outside it"};
  }
  return {};
}

}  // namespace

size_t FindTensor(const std::vector<TensorPlan>& ts, std::string_view name) {
  size_t k = 0;
  while (k < ts.size() && ts[k].name != name) ++k;
  return k;
}

void StartRequest(const ModelPlan& m, InferRequest* r) {
  const size_t nin = m.inputs.size();
  r->in.assign(nin, nullptr);
  r->owned.assign(nin, std::string());
  r->in_shapes.assign(nin, {});
}

Error ClaimInput(const ModelPlan& m, std::string_view name, std::vector<char>* seen, size_t* k) {
  *k = FindTensor(m.inputs, name);
  if (*k == m.inputs.size()) {
    return {400, "unknown input " + Repr(name) + ": the model takes " + ReprNames(m.inputs, true)};
  }
  if ((*seen)[*k]) return {400, "input " + Repr(name) + " is given twice"};
  (*seen)[*k] = 1;
  return {};
}

Error MissingInputs(const ModelPlan& m, const std::vector<char>& seen) {
  std::string missing;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    if (!seen[k]) missing += (missing.empty() ? "" : ", ") + Repr(m.inputs[k].name);
  }
  if (!missing.empty()) return {400, "missing input " + missing};
  return {};
}

Error DatatypeError(const TensorPlan& t, std::string_view given) {
  const DType d = FromV2(given);
  if (d == DType::kInvalid) {
    std::string all;
    for (int i = 0; i < kDTypeCount; ++i) {
      all += (all.empty() ? "" : ", ") + Repr(V2Name(static_cast<DType>(i)));
    }
    return {400, "input " + Repr(t.name) + ": datatype " + Repr(given) + " is not supported; use " +
                     V2Name(t.dtype) + " (one of [" + all + "])"};
  }
  return {400, "input " + Repr(t.name) + ": expected datatype " + std::string(V2Name(t.dtype)) +
                   ", received " + V2Name(d) + " (the model takes " + Accepted(t.dtype) + ")"};
}

Error CheckShape(const ModelPlan& m, const TensorPlan& t, const std::vector<int64_t>& dims,
                 InferRequest* r, std::string* first) {
  if (m.dynamic) {  // one request, one unit; -1: any size on that axis
    bool fits = dims.size() == t.shape.size();
    for (size_t i = 0; fits && i < dims.size(); ++i) fits = t.shape[i] < 0 || dims[i] == t.shape[i];
    if (!fits) {
      return {400, "input " + Repr(t.name) + ": expected shape " + ShapeStr(t.shape) +
                       " (-1: any size), received " + ShapeStr(dims)};
    }
    r->units = 1;
    if (first->empty()) {
      *first = t.name;
      r->rows = dims.empty() ? 1 : dims[0];
    }
    return {};
  }
  if (m.auto_batch) {
    bool fits = dims.size() == t.shape.size() && !dims.empty();
    for (size_t i = 1; fits && i < dims.size(); ++i) fits = dims[i] == t.shape[i];
    if (!fits) {
      std::string want = "[rows";
      for (size_t i = 1; i < t.shape.size(); ++i) want += ", " + std::to_string(t.shape[i]);
      return {400, "input " + Repr(t.name) + ": expected shape " + want +
                       "] (any number of rows; auto-batching packs them into micro-batches of " +
                       std::to_string(m.micro_batch_size) + "), received " + ShapeStr(dims)};
    }
    const int64_t rows = dims[0];
    if (rows > m.max_rows) {
      return {400, "input " + Repr(t.name) + ": a request may have at most " +
                       std::to_string(m.max_rows) + " rows (max_request_rows), received " +
                       std::to_string(rows) + "; split it into smaller requests"};
    }
    if (first->empty()) {
      *first = t.name;
      r->rows = r->units = rows;
    } else if (rows != r->rows) {
      return {400, "inputs " + Repr(*first) + " and " + Repr(t.name) + " have " +
                       std::to_string(r->rows) + " and " + std::to_string(rows) +
                       " rows: every input of a request must have the same number of rows"};
    }
    return {};
  }
  if (dims != t.shape) {
    bool rows_only = dims.size() == t.shape.size() && !dims.empty();
    for (size_t i = 1; rows_only && i < dims.size(); ++i) rows_only = dims[i] == t.shape[i];
    if (rows_only) {
      return {400, "input " + Repr(t.name) +
                       ": without auto-batching (timeout_ms=0) a request is exactly one "
                       "micro-batch: expected " + std::to_string(t.shape[0]) + " rows, received " +
                       std::to_string(dims[0]) + " (shape " + ShapeStr(dims) +
                       "); set timeout_ms > 0 to auto-batch requests of any size"};
    }
    return {400, "input " + Repr(t.name) + ": expected shape " + ShapeStr(t.shape) +
                     " (one micro-batch), received " + ShapeStr(dims)};
  }
  r->units = 1;
  r->rows = t.shape.empty() ? 1 : t.shape[0];
  if (first->empty()) *first = t.name;
  return {};
}

Error FinishInput(const TensorPlan& t, DType from, const char* data, size_t k, InferRequest* r) {
  const std::vector<int64_t>& shape = r->in_shapes[k];
  if (from == DType::kBool) {  // raw bytes (binary extension, raw contents): 0 or 1 only
    const int64_t count = Elements(shape);
    for (int64_t i = 0; i < count; ++i) {
      const auto v = static_cast<unsigned char>(data[i]);
      if (v > 1) {
        return {400, "input " + Repr(t.name) + ": BOOL value " + std::to_string(v) +
                         " at index " + ShapeStr(IndexOf(i, shape)) +
                         " is neither 0 (false) nor 1 (true)"};
      }
    }
  }
  if (from != t.dtype) {
    std::string cast;
    if (Error e = CastInput(t, from, data, shape, &cast)) return e;
    r->owned[k] = std::move(cast);
    data = r->owned[k].data();
  }
  r->in[k] = data;
  return CheckRanges(t, data, shape);
}

Error UnknownOutput(const ModelPlan& m, const std::string& shown) {
  return {400, "unknown output " + shown + ": the model gives " + ReprNames(m.outputs, false)};
}

Error WantOutput(const ModelPlan& m, size_t idx, bool binary, InferRequest* r) {
  if (std::find(r->want.begin(), r->want.end(), static_cast<int>(idx)) != r->want.end()) {
    return {400, "output " + Repr(m.outputs[idx].name) + " is asked for twice"};
  }
  r->want.push_back(static_cast<int>(idx));
  r->binary.push_back(binary);
  return {};
}

void WantAll(const ModelPlan& m, bool binary, InferRequest* r) {
  for (size_t i = 0; i < m.outputs.size(); ++i) {
    r->want.push_back(static_cast<int>(i));
    r->binary.push_back(binary);
  }
}

Error OtherParameter(std::string_view name, bool is_default) {
  if (name == "priority") {
    if (is_default) return {};
    return {400, "parameter 'priority' is not implemented: this server has one priority "
                 "level (only 0, the default, is accepted)"};
  }
  if (name == "sequence_id" || name == "sequence_start" || name == "sequence_end") {
    if (is_default) return {};
    return {400, "parameter " + Repr(name) +
                     " is not implemented: this server serves stateless models (no sequence "
                     "batching; only the default, 0, \"\" or false, is accepted)"};
  }
  return {400, "parameter " + Repr(name) +
                   " is not implemented: this server implements the request parameters "
                   "'timeout' and 'binary_data_output' (and 'priority', 'sequence_id', "
                   "'sequence_start', 'sequence_end' at their defaults)"};
}

}  // namespace serving
}  // namespace paddle_ipu
