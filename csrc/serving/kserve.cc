// The KServe v2 protocol pieces (see kserve.h). JSON is Boost.JSON, compiled here
// once (boost/json/src.hpp: header-only, no Boost library to link).
#include "kserve.h"

#include <boost/json/src.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../core/fp16.h"

namespace json = boost::json;

namespace paddle_ipu {
namespace serving {

namespace {

struct DTypeInfo {
  const char* v2;
  const char* numpy;
  int64_t size;
};

constexpr DTypeInfo kTypes[] = {
    {"BOOL", "bool", 1},     {"UINT8", "uint8", 1},     {"UINT16", "uint16", 2},
    {"UINT32", "uint32", 4}, {"UINT64", "uint64", 8},   {"INT8", "int8", 1},
    {"INT16", "int16", 2},   {"INT32", "int32", 4},     {"INT64", "int64", 8},
    {"FP16", "float16", 2},  {"FP32", "float32", 4},    {"FP64", "float64", 8},
};

bool IsInt(DType t) {
  return t != DType::kBool && t != DType::kFp16 && t != DType::kFp32 && t != DType::kFp64 &&
         t != DType::kInvalid;
}

// The casts a feed may take (IpuExecutor.feed_cast's _SAFE_CASTS): the model's
// dtype from the request's.
bool SafeCast(DType from, DType to) {
  return from == to || (from == DType::kInt64 && to == DType::kInt32) ||
         (from == DType::kInt32 && to == DType::kInt64) ||
         (from == DType::kBool && to == DType::kInt32) ||
         (from == DType::kFp64 && to == DType::kFp32) ||
         (from == DType::kFp16 && to == DType::kFp32);
}

std::string Accepted(DType model) {
  std::string s = V2Name(model);
  for (int i = 0; i < static_cast<int>(DType::kInvalid); ++i) {
    const DType t = static_cast<DType>(i);
    if (t != model && SafeCast(t, model)) s += std::string(", ") + V2Name(t);
  }
  return s;
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// Python's repr of a name (what FeedError's messages show): 'x'.
std::string Repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
      continue;
    }
    out.push_back(c);
  }
  out.push_back(q);
  return out;
}

std::string ReprList(const std::vector<TensorPlan>& ts) {
  std::vector<std::string> names;
  for (const TensorPlan& t : ts) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + Repr(names[i]);
  return s + "]";
}

std::string Short(const json::value& v) {
  std::string s = json::serialize(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

int64_t Product(const std::vector<int64_t>& dims, size_t from = 0) {
  int64_t n = 1;
  for (size_t i = from; i < dims.size(); ++i) n *= dims[i];
  return n;
}

// -- element access -------------------------------------------------------------

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

// -- JSON tensors -----------------------------------------------------------------

template <typename T>
bool FromJson(const json::value& v, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_bool()) return *out = v.get_bool(), true;
    if (v.is_int64()) return *out = v.get_int64() != 0, true;
    if (v.is_uint64()) return *out = v.get_uint64() != 0, true;
    if (v.is_double()) return *out = v.get_double() != 0.0, true;
    return false;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_double()) return *out = static_cast<T>(v.get_double()), true;
    if (v.is_int64()) return *out = static_cast<T>(v.get_int64()), true;
    if (v.is_uint64()) return *out = static_cast<T>(v.get_uint64()), true;
    if (v.is_bool()) return *out = static_cast<T>(v.get_bool()), true;
    return false;
  } else {
    using L = std::numeric_limits<T>;
    if (v.is_int64()) {
      const int64_t x = v.get_int64();
      if constexpr (std::is_signed_v<T>) {
        if (x < static_cast<int64_t>(L::min()) || x > static_cast<int64_t>(L::max())) return false;
      } else {
        if (x < 0 || static_cast<uint64_t>(x) > static_cast<uint64_t>(L::max())) return false;
      }
      return *out = static_cast<T>(x), true;
    }
    if (v.is_uint64()) {
      const uint64_t x = v.get_uint64();
      if (x > static_cast<uint64_t>(L::max())) return false;
      return *out = static_cast<T>(x), true;
    }
    if (v.is_bool()) return *out = static_cast<T>(v.get_bool()), true;
    if (v.is_double()) {  // an integral double (1.0) is the integer; 1.5 is not
      const double d = v.get_double();
      if (!(d == std::floor(d)) || d < static_cast<double>(L::min()) ||
          d > static_cast<double>(L::max())) {
        return false;
      }
      return *out = static_cast<T>(d), true;
    }
    return false;
  }
}

template <typename T>
bool FlattenJson(const json::value& v, std::string* out, int64_t* count, const json::value** bad) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      if (!FlattenJson<T>(e, out, count, bad)) return false;
    }
    return true;
  }
  T x{};
  if (!FromJson<T>(v, &x)) {
    *bad = &v;
    return false;
  }
  out->append(reinterpret_cast<const char*>(&x), sizeof(T));
  ++*count;
  return true;
}

bool FlattenHalf(const json::value& v, std::string* out, int64_t* count, const json::value** bad) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      if (!FlattenHalf(e, out, count, bad)) return false;
    }
    return true;
  }
  float x = 0;
  if (!FromJson<float>(v, &x)) {
    *bad = &v;
    return false;
  }
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint16_t h = fp16::FloatBitsToHalfBits(bits);
  out->append(reinterpret_cast<const char*>(&h), 2);
  ++*count;
  return true;
}

bool JsonTensor(DType t, const json::value& v, std::string* out, int64_t* count,
                const json::value** bad) {
  switch (t) {
    case DType::kBool: {
      std::string tmp;
      if (!FlattenJson<bool>(v, &tmp, count, bad)) return false;
      for (char c : tmp) out->push_back(c ? 1 : 0);
      return true;
    }
    case DType::kUint8: return FlattenJson<uint8_t>(v, out, count, bad);
    case DType::kUint16: return FlattenJson<uint16_t>(v, out, count, bad);
    case DType::kUint32: return FlattenJson<uint32_t>(v, out, count, bad);
    case DType::kUint64: return FlattenJson<uint64_t>(v, out, count, bad);
    case DType::kInt8: return FlattenJson<int8_t>(v, out, count, bad);
    case DType::kInt16: return FlattenJson<int16_t>(v, out, count, bad);
    case DType::kInt32: return FlattenJson<int32_t>(v, out, count, bad);
    case DType::kInt64: return FlattenJson<int64_t>(v, out, count, bad);
    case DType::kFp16: return FlattenHalf(v, out, count, bad);
    case DType::kFp32: return FlattenJson<float>(v, out, count, bad);
    case DType::kFp64: return FlattenJson<double>(v, out, count, bad);
    default: return false;
  }
}

template <typename T>
void RenderNumbers(const char* p, int64_t n, std::string* out) {
  char buf[64];
  out->push_back('[');
  for (int64_t i = 0; i < n; ++i) {
    if (i) out->push_back(',');
    const T x = Load<T>(p + i * static_cast<int64_t>(sizeof(T)));
    if constexpr (std::is_floating_point_v<T>) {
      // What Python's json writes (and tritonclient's json.loads reads).
      if (std::isnan(x)) {
        out->append("NaN");
        continue;
      }
      if (std::isinf(x)) {
        out->append(x > 0 ? "Infinity" : "-Infinity");
        continue;
      }
    }
    auto r = std::to_chars(buf, buf + sizeof(buf), x);
    out->append(buf, r.ptr);
  }
  out->push_back(']');
}

void RenderJsonData(DType t, const char* p, int64_t n, std::string* out) {
  switch (t) {
    case DType::kBool:
      out->push_back('[');
      for (int64_t i = 0; i < n; ++i) out->append(i ? (p[i] ? ",true" : ",false") : (p[i] ? "true" : "false"));
      out->push_back(']');
      return;
    case DType::kUint8: return RenderNumbers<uint8_t>(p, n, out);
    case DType::kUint16: return RenderNumbers<uint16_t>(p, n, out);
    case DType::kUint32: return RenderNumbers<uint32_t>(p, n, out);
    case DType::kUint64: return RenderNumbers<uint64_t>(p, n, out);
    case DType::kInt8: return RenderNumbers<int8_t>(p, n, out);
    case DType::kInt16: return RenderNumbers<int16_t>(p, n, out);
    case DType::kInt32: return RenderNumbers<int32_t>(p, n, out);
    case DType::kInt64: return RenderNumbers<int64_t>(p, n, out);
    case DType::kFp16: {
      std::vector<float> f(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = fp16::HalfBitsToFloatBits(Load<uint16_t>(p + 2 * i));
        std::memcpy(&f[static_cast<size_t>(i)], &bits, 4);
      }
      return RenderNumbers<float>(reinterpret_cast<const char*>(f.data()), n, out);
    }
    case DType::kFp32: return RenderNumbers<float>(p, n, out);
    case DType::kFp64: return RenderNumbers<double>(p, n, out);
    default: out->append("[]");
  }
}

// -- the checks of a feed (after its bytes are known) ------------------------------

// Casts `count` elements of `from` at `src` to the model's dtype `to` into `out`.
Error CastInput(const TensorPlan& t, DType from, const char* src, int64_t count,
                std::string* out) {
  const DType to = t.dtype;
  out->resize(static_cast<size_t>(count * ElemSize(to)));
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
      Store<float>(dst + 4 * i, static_cast<float>(Load<double>(src + 8 * i)));
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
  const int64_t count = Product(shape);
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
    std::vector<int64_t> where(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
      where[d] = first % shape[d];
      first /= shape[d];
    }
    return {400, "input " + Repr(t.name) + ": value " + std::to_string(value) + " at index " +
                     ShapeStr(where) + " is out of range; valid values are " + b.describe + "; " +
                     std::to_string(bad) + " value(s) of the input are outside it"};
  }
  return {};
}

// The shape check of one input; sets the request's units and rows.
Error CheckShape(const ModelPlan& m, const TensorPlan& t, const std::vector<int64_t>& dims,
                 InferRequest* r, std::string* first) {
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

// After the bytes of input k (of dtype `from`) are at `data`: the cast, the int32
// fit and the index ranges, as the runtime checks a feed.
Error FinishInput(const TensorPlan& t, DType from, const char* data, size_t k, InferRequest* r) {
  const std::vector<int64_t>& shape = r->in_shapes[k];
  const int64_t count = Product(shape);
  if (from != t.dtype) {
    std::string cast;
    if (Error e = CastInput(t, from, data, count, &cast)) return e;
    r->owned[k] = std::move(cast);
    data = r->owned[k].data();
  }
  r->in[k] = data;
  return CheckRanges(t, data, shape);
}

size_t FindTensor(const std::vector<TensorPlan>& ts, std::string_view name) {
  size_t k = 0;
  while (k < ts.size() && ts[k].name != name) ++k;
  return k;
}

Error DatatypeError(const TensorPlan& t, std::string_view given) {
  const DType d = FromV2(given);
  if (d == DType::kInvalid) {
    std::string all;
    for (const DTypeInfo& i : kTypes) all += (all.empty() ? "" : ", ") + Repr(i.v2);
    return {400, "input " + Repr(t.name) + ": datatype " + Repr(given) + " is not supported; use " +
                     V2Name(t.dtype) + " (one of [" + all + "])"};
  }
  return {400, "input " + Repr(t.name) + ": expected datatype " + std::string(V2Name(t.dtype)) +
                   ", received " + V2Name(d) + " (the model takes " + Accepted(t.dtype) + ")"};
}

const json::value* Member(const json::object* o, std::string_view key) {
  return o ? o->if_contains(json::string_view(key.data(), key.size())) : nullptr;
}

std::string_view Str(const json::string& s) { return std::string_view(s.data(), s.size()); }

// -- protobuf wire format ------------------------------------------------------------

struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  explicit Wire(std::string_view s)
      : p(reinterpret_cast<const uint8_t*>(s.data())),
        end(reinterpret_cast<const uint8_t*>(s.data()) + s.size()) {}
  bool done() const { return p >= end; }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int s = 0; s < 64 && p < end; s += 7) {
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << s;
      if (!(b & 0x80)) return v;
    }
    ok = false;
    return 0;
  }
  std::string_view Bytes() {
    const uint64_t n = Varint();
    if (!ok || n > static_cast<uint64_t>(end - p)) {
      ok = false;
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  const uint8_t* Fixed(int n) {
    if (end - p < n) {
      ok = false;
      return nullptr;
    }
    const uint8_t* at = p;
    p += n;
    return at;
  }
  void Skip(int wt) {
    switch (wt) {
      case 0: Varint(); break;
      case 1: Fixed(8); break;
      case 2: Bytes(); break;
      case 5: Fixed(4); break;
      default: ok = false;
    }
  }
};

void PutVarint(std::string* o, uint64_t v) {
  while (v >= 0x80) {
    o->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  o->push_back(static_cast<char>(v));
}
void PutTag(std::string* o, int field, int wt) {
  PutVarint(o, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wt));
}
void PutBytes(std::string* o, int field, std::string_view s) {
  PutTag(o, field, 2);
  PutVarint(o, s.size());
  o->append(s.data(), s.size());
}

struct PbInput {
  std::string_view name, datatype, contents;
  std::vector<int64_t> shape;
};

// A repeated scalar field of InferTensorContents, packed or not, into `out` as
// elements of `t`; false when a value does not fit `t`.
bool PbContents(std::string_view msg, DType t, std::string* out, int64_t* count) {
  int field = 0;
  switch (t) {
    case DType::kBool: field = 1; break;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32: field = 2; break;
    case DType::kInt64: field = 3; break;
    case DType::kUint8:
    case DType::kUint16:
    case DType::kUint32: field = 4; break;
    case DType::kUint64: field = 5; break;
    case DType::kFp32: field = 6; break;
    case DType::kFp64: field = 7; break;
    default: return false;  // FP16 travels as raw_input_contents only
  }
  const int64_t size = ElemSize(t);
  auto put_int = [&](uint64_t raw) {
    int64_t v = static_cast<int64_t>(raw);
    if (t == DType::kInt8 || t == DType::kInt16 || t == DType::kInt32) {
      v = static_cast<int32_t>(raw);  // int32 varints are sign-extended
      const int64_t lo = t == DType::kInt8 ? INT8_MIN : t == DType::kInt16 ? INT16_MIN : INT32_MIN;
      const int64_t hi = t == DType::kInt8 ? INT8_MAX : t == DType::kInt16 ? INT16_MAX : INT32_MAX;
      if (v < lo || v > hi) return false;
    } else if (t == DType::kUint8 || t == DType::kUint16 || t == DType::kUint32) {
      const uint64_t hi = t == DType::kUint8 ? 0xff : t == DType::kUint16 ? 0xffff : 0xffffffffu;
      if (static_cast<uint32_t>(raw) > hi) return false;
      v = static_cast<int64_t>(static_cast<uint32_t>(raw));
    } else if (t == DType::kBool) {
      v = raw != 0;
    }
    const size_t at = out->size();
    out->resize(at + static_cast<size_t>(size));
    std::memcpy(out->data() + at, &v, static_cast<size_t>(size));  // little-endian
    ++*count;
    return true;
  };
  Wire w(msg);
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    const int f = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    if (f != field) {
      w.Skip(wt);
      continue;
    }
    const bool fixed = t == DType::kFp32 || t == DType::kFp64;
    if (wt == 2) {  // packed
      Wire s(w.Bytes());
      while (w.ok && s.ok && !s.done()) {
        if (fixed) {
          const uint8_t* at = s.Fixed(static_cast<int>(size));
          if (at) out->append(reinterpret_cast<const char*>(at), static_cast<size_t>(size)), ++*count;
        } else if (!put_int(s.Varint())) {
          return false;
        }
      }
      w.ok &= s.ok;
    } else if (fixed && wt == (size == 4 ? 5 : 1)) {
      const uint8_t* at = w.Fixed(static_cast<int>(size));
      if (at) out->append(reinterpret_cast<const char*>(at), static_cast<size_t>(size)), ++*count;
    } else if (!fixed && wt == 0) {
      if (!put_int(w.Varint())) return false;
    } else {
      w.ok = false;
    }
  }
  return w.ok;
}

void PutTensorHead(std::string* o, const TensorPlan& t, const std::vector<int64_t>& shape) {
  PutBytes(o, 1, t.name);
  PutBytes(o, 2, V2Name(t.dtype));
  std::string packed;
  for (int64_t d : shape) PutVarint(&packed, static_cast<uint64_t>(d));
  PutBytes(o, 3, packed);
}

std::vector<int64_t> AnswerShape(const ModelPlan& m, const TensorPlan& t, const InferRequest& r) {
  std::vector<int64_t> shape = t.shape;
  if (m.auto_batch && !shape.empty()) shape[0] = r.rows;
  return shape;
}

int64_t AnswerBytes(const ModelPlan&, const TensorPlan& t, const InferRequest& r) {
  return r.units * t.unit_bytes;
}

std::string TensorsJson(const std::vector<TensorPlan>& ts) {
  std::string s = "[";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ",";
    s += "{\"name\":" + Quote(ts[i].name) + ",\"datatype\":\"" + V2Name(ts[i].dtype) +
         "\",\"shape\":[";
    for (size_t k = 0; k < ts[i].shape.size(); ++k) {
      s += (k ? "," : "") + std::to_string(ts[i].shape[k]);
    }
    s += "]}";
  }
  return s + "]";
}

std::string ConfigTensors(const ModelPlan& m, const std::vector<TensorPlan>& ts) {
  std::string s = "[";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ",";
    s += "{\"name\":" + Quote(ts[i].name) + ",\"data_type\":\"" + ConfigName(ts[i].dtype) +
         "\",\"dims\":[";
    // With max_batch_size > 0 Triton's dims leave out the batch dimension.
    for (size_t k = m.auto_batch ? 1 : 0, n = 0; k < ts[i].shape.size(); ++k, ++n) {
      s += (n ? "," : "") + std::to_string(ts[i].shape[k]);
    }
    s += "]}";
  }
  return s + "]";
}

std::string Duration(int64_t count, double seconds) {
  return "{\"count\":" + std::to_string(count) +
         ",\"ns\":" + std::to_string(static_cast<int64_t>(seconds * 1e9)) + "}";
}

std::string Seconds(double s) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6f", s);
  return buf;
}

}  // namespace

// -- public ---------------------------------------------------------------------------

const char* V2Name(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(DType::kInvalid) ? kTypes[i].v2 : "INVALID";
}
const char* NumpyName(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(DType::kInvalid) ? kTypes[i].numpy : "invalid";
}
int64_t ElemSize(DType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(DType::kInvalid) ? kTypes[i].size : 0;
}
DType FromV2(std::string_view name) {
  for (int i = 0; i < static_cast<int>(DType::kInvalid); ++i) {
    if (name == kTypes[i].v2) return static_cast<DType>(i);
  }
  return DType::kInvalid;
}
std::string ConfigName(DType t) { return std::string("TYPE_") + V2Name(t); }

int GrpcCode(int status) {
  switch (status) {
    case 200: return 0;     // OK
    case 400: return 3;     // INVALID_ARGUMENT
    case 413: return 3;
    case 404: return 5;     // NOT_FOUND
    case 503: return 14;    // UNAVAILABLE
    case 504: return 4;     // DEADLINE_EXCEEDED
    case 499: return 1;     // CANCELLED
    default: return 13;     // INTERNAL
  }
}

std::string Quote(std::string_view s) {
  return json::serialize(json::string_view(s.data(), s.size()));
}

std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok) {
      out.append(s.data() + i, n);
      i += n;
    } else {  // bytes of the request that are no text: shown, not passed on
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
      i += 1;
    }
  }
  return out;
}

std::string ErrorJson(std::string_view message) {
  return "{\"error\":" + Quote(ValidUtf8(message)) + "}";
}

Error ParseHttpInfer(const ModelPlan& m, std::string_view head, std::string_view blob,
                     InferRequest* r) {
  unsigned char scratch[4096];
  json::monotonic_resource mr(scratch, sizeof(scratch));
  std::error_code ec;
  json::value doc = json::parse(json::string_view(head.data(), head.size()), ec, &mr);
  if (ec) return {400, "the request is not valid JSON: " + ec.message()};
  const json::object* obj = doc.if_object();
  const json::value* inputs_v = Member(obj, "inputs");
  const json::array* inputs = inputs_v ? inputs_v->if_array() : nullptr;
  if (!inputs) return {400, "the request must be a JSON object with an \"inputs\" list"};
  const size_t nin = m.inputs.size();
  r->in.assign(nin, nullptr);
  r->owned.assign(nin, std::string());
  r->in_shapes.assign(nin, {});
  std::vector<char> seen(nin, 0);
  std::vector<DType> given(nin, DType::kInvalid);
  std::vector<std::string> json_raw(nin);
  std::vector<const char*> data_at(nin, nullptr);
  std::string first;
  size_t offset = 0;
  for (const json::value& item : *inputs) {
    const json::object* o = item.if_object();
    const json::value* nv = Member(o, "name");
    if (!nv || !nv->is_string()) return {400, "every input must be an object with a \"name\""};
    const std::string_view name = Str(nv->get_string());
    const size_t k = FindTensor(m.inputs, name);
    if (k == nin) {
      return {400, "unknown input " + Repr(name) + ": the model takes " + ReprList(m.inputs)};
    }
    const TensorPlan& t = m.inputs[k];
    if (seen[k]) return {400, "input " + Repr(name) + " is given twice"};
    seen[k] = 1;
    const json::value* dv = Member(o, "datatype");
    const std::string_view dname = dv && dv->is_string() ? Str(dv->get_string()) : "";
    const DType d = FromV2(dname);
    if (!dv || !dv->is_string() || d == DType::kInvalid || !SafeCast(d, t.dtype)) {
      if (!dv || !dv->is_string()) {
        return {400, "input " + Repr(name) + ": datatype " + (dv ? Short(*dv) : "None") +
                         " is not supported; use " + V2Name(t.dtype)};
      }
      return DatatypeError(t, dname);
    }
    given[k] = d;
    const json::value* sv = Member(o, "shape");
    std::vector<int64_t> dims;
    bool ok = sv && sv->is_array();
    if (ok) {
      for (const json::value& e : sv->get_array()) {
        if (e.is_int64() && e.get_int64() >= 0) {
          dims.push_back(e.get_int64());
        } else {
          ok = false;
          break;
        }
      }
    }
    if (!ok) {
      return {400, "input " + Repr(name) + ": shape must be a list of ints >= 0, got " +
                       (sv ? Short(*sv) : "None")};
    }
    if (Error e = CheckShape(m, t, dims, r, &first)) return e;
    r->in_shapes[k] = dims;
    const int64_t count = Product(dims);
    const int64_t bytes = count * ElemSize(d);
    const json::value* params = Member(o, "parameters");
    const json::value* size =
        params && params->is_object() ? Member(&params->get_object(), "binary_data_size") : nullptr;
    if (size && !size->is_null()) {
      if (!size->is_int64() || size->get_int64() != bytes) {
        return {400, "input " + Repr(name) + ": binary_data_size is " + Short(*size) +
                         ", but shape " + ShapeStr(dims) + " of " + V2Name(d) + " takes " +
                         std::to_string(bytes) + " bytes"};
      }
      if (offset + static_cast<size_t>(bytes) > blob.size()) {
        return {400, "input " + Repr(name) + ": the body ends " +
                         std::to_string(offset + static_cast<size_t>(bytes) - blob.size()) +
                         " bytes before this input's binary data"};
      }
      data_at[k] = blob.data() + offset;
      offset += static_cast<size_t>(bytes);
    } else {
      const json::value* data = Member(o, "data");
      if (!data) return {400, "input " + Repr(name) + " has neither data nor binary_data_size"};
      std::string& raw = json_raw[k];
      raw.reserve(static_cast<size_t>(bytes));
      int64_t n = 0;
      const json::value* bad = nullptr;
      if (!JsonTensor(d, *data, &raw, &n, &bad)) {
        return {400, "input " + Repr(name) + ": data is not " + V2Name(d) + ": " +
                         (bad ? Short(*bad) : Short(*data)) + " is not a " + NumpyName(d) +
                         " value"};
      }
      if (n != count) {
        return {400, "input " + Repr(name) + ": shape " + ShapeStr(dims) + " has " +
                         std::to_string(count) + " elements, data has " + std::to_string(n)};
      }
      data_at[k] = raw.data();
    }
  }
  if (offset != blob.size()) {
    return {400, "the body has " + std::to_string(blob.size() - offset) +
                     " bytes of binary data that no input claims"};
  }
  std::string missing;
  for (size_t k = 0; k < nin; ++k) {
    if (!seen[k]) missing += (missing.empty() ? "" : ", ") + Repr(m.inputs[k].name);
  }
  if (!missing.empty()) return {400, "missing input " + missing};
  for (size_t k = 0; k < nin; ++k) {
    if (!json_raw[k].empty() && given[k] == m.inputs[k].dtype) {
      r->owned[k] = std::move(json_raw[k]);
      data_at[k] = r->owned[k].data();
    }
    if (Error e = FinishInput(m.inputs[k], given[k], data_at[k], k, r)) return e;
  }
  bool binary_default = false;
  if (const json::value* p = Member(obj, "parameters"); p && p->is_object()) {
    if (const json::value* b = Member(&p->get_object(), "binary_data_output")) {
      binary_default = b->is_bool() && b->get_bool();
    }
    if (const json::value* t = Member(&p->get_object(), "timeout")) {
      // Triton's per-request timeout, in microseconds.
      if (!t->is_int64() || t->get_int64() < 0) {
        return {400, "parameter 'timeout' must be an integer number of microseconds >= 0, got " +
                         Short(*t)};
      }
      if (t->get_int64() > 0) r->timeout_s = static_cast<double>(t->get_int64()) * 1e-6;
    }
  }
  r->want.clear();
  r->binary.clear();
  if (const json::value* outs = Member(obj, "outputs")) {
    if (!outs->is_array()) return {400, "\"outputs\" must be a list"};
    std::vector<std::string> names;
    for (const TensorPlan& t : m.outputs) names.push_back(t.name);
    for (const json::value& ov : outs->get_array()) {
      const json::object* oo = ov.if_object();
      const json::value* on = Member(oo, "name");
      const size_t idx =
          on && on->is_string() ? FindTensor(m.outputs, Str(on->get_string())) : m.outputs.size();
      if (idx == m.outputs.size()) {
        std::string list = "[";
        for (size_t i = 0; i < names.size(); ++i) list += (i ? ", " : "") + Repr(names[i]);
        return {400, "unknown output " +
                         (on && on->is_string() ? Repr(Str(on->get_string()))
                                                : (on ? Short(*on) : std::string("None"))) +
                         ": the model gives " + list + "]"};
      }
      if (std::find(r->want.begin(), r->want.end(), static_cast<int>(idx)) != r->want.end()) {
        return {400, "output " + Repr(m.outputs[idx].name) + " is asked for twice"};
      }
      bool bin = binary_default;
      if (const json::value* p = Member(oo, "parameters"); p && p->is_object()) {
        if (const json::value* b = Member(&p->get_object(), "binary_data")) {
          bin = b->is_bool() && b->get_bool();
        }
      }
      r->want.push_back(static_cast<int>(idx));
      r->binary.push_back(bin);
    }
  } else {
    for (size_t i = 0; i < m.outputs.size(); ++i) {
      r->want.push_back(static_cast<int>(i));
      r->binary.push_back(binary_default);
    }
  }
  if (const json::value* id = Member(obj, "id"); id && id->is_string()) {
    r->id = std::string(Str(id->get_string()));
  }
  return {};
}

Error ParseGrpcInfer(const ModelPlan& m, std::string_view msg, InferRequest* r) {
  Wire w(msg);
  std::vector<PbInput> inputs;
  std::vector<std::string_view> raw;
  std::vector<std::string_view> out_names;
  std::string_view model_name, version;
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    const int f = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    if (f == 1 && wt == 2) {
      model_name = w.Bytes();
    } else if (f == 2 && wt == 2) {
      version = w.Bytes();
    } else if (f == 3 && wt == 2) {
      r->id = ValidUtf8(w.Bytes());  // a protobuf string is text: it is sent back
    } else if (f == 4 && wt == 2) {  // parameters: map<string, InferParameter>
      Wire e(w.Bytes());
      std::string_view key, value;
      while (e.ok && !e.done()) {
        const uint64_t t = e.Varint();
        if ((t >> 3) == 1 && (t & 7) == 2) key = e.Bytes();
        else if ((t >> 3) == 2 && (t & 7) == 2) value = e.Bytes();
        else e.Skip(static_cast<int>(t & 7));
      }
      w.ok &= e.ok;
      if (key == "timeout") {  // InferParameter.int64_param (2), in microseconds
        Wire v(value);
        while (v.ok && !v.done()) {
          const uint64_t t = v.Varint();
          if ((t >> 3) == 2 && (t & 7) == 0) {
            const int64_t us = static_cast<int64_t>(v.Varint());
            if (us > 0) r->timeout_s = static_cast<double>(us) * 1e-6;
          } else {
            v.Skip(static_cast<int>(t & 7));
          }
        }
        w.ok &= v.ok;
      }
    } else if (f == 5 && wt == 2) {
      inputs.emplace_back();
      Wire in(w.Bytes());
      PbInput& p = inputs.back();
      while (in.ok && !in.done()) {
        const uint64_t t = in.Varint();
        const int g = static_cast<int>(t >> 3), gt = static_cast<int>(t & 7);
        if (g == 1 && gt == 2) {
          p.name = in.Bytes();
        } else if (g == 2 && gt == 2) {
          p.datatype = in.Bytes();
        } else if (g == 3 && gt == 2) {
          Wire s(in.Bytes());
          while (s.ok && !s.done()) p.shape.push_back(static_cast<int64_t>(s.Varint()));
          in.ok &= s.ok;
        } else if (g == 3 && gt == 0) {
          p.shape.push_back(static_cast<int64_t>(in.Varint()));
        } else if (g == 5 && gt == 2) {
          p.contents = in.Bytes();
        } else {
          in.Skip(gt);
        }
      }
      w.ok &= in.ok;
    } else if (f == 6 && wt == 2) {
      Wire o(w.Bytes());
      std::string_view name;
      bool named = false;
      while (o.ok && !o.done()) {
        const uint64_t t = o.Varint();
        if ((t >> 3) == 1 && (t & 7) == 2) name = o.Bytes(), named = true;
        else o.Skip(static_cast<int>(t & 7));
      }
      w.ok &= o.ok;
      if (named) out_names.push_back(name);
    } else if (f == 7 && wt == 2) {
      raw.push_back(w.Bytes());
    } else {
      w.Skip(wt);
    }
  }
  if (!w.ok) return {400, "the ModelInferRequest is not a valid protobuf message"};
  if (model_name != m.name) {
    return {404, "unknown model " + Repr(model_name) + ": this server serves " + Repr(m.name)};
  }
  if (!version.empty() && version != m.version) {
    return {404, "model " + Repr(m.name) + " has no version " + Repr(version) +
                     ": it has version " + Repr(m.version)};
  }
  if (!raw.empty() && raw.size() != inputs.size()) {
    return {400, "raw_input_contents has " + std::to_string(raw.size()) + " entries for " +
                     std::to_string(inputs.size()) + " inputs"};
  }
  const size_t nin = m.inputs.size();
  r->in.assign(nin, nullptr);
  r->owned.assign(nin, std::string());
  r->in_shapes.assign(nin, {});
  std::vector<char> seen(nin, 0);
  std::string first;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const PbInput& in = inputs[i];
    const size_t k = FindTensor(m.inputs, in.name);
    if (k == nin) {
      return {400, "unknown input " + Repr(in.name) + ": the model takes " + ReprList(m.inputs)};
    }
    const TensorPlan& t = m.inputs[k];
    if (seen[k]) return {400, "input " + Repr(t.name) + " is given twice"};
    seen[k] = 1;
    const DType d = FromV2(in.datatype);
    if (d == DType::kInvalid || !SafeCast(d, t.dtype)) return DatatypeError(t, in.datatype);
    for (int64_t dim : in.shape) {
      if (dim < 0) {
        return {400, "input " + Repr(t.name) + ": shape must be a list of ints >= 0, got " +
                         ShapeStr(in.shape)};
      }
    }
    if (Error e = CheckShape(m, t, in.shape, r, &first)) return e;
    r->in_shapes[k] = in.shape;
    const int64_t count = Product(in.shape);
    const int64_t bytes = count * ElemSize(d);
    std::string_view data;
    std::string typed;
    if (!raw.empty()) {
      data = raw[i];
    } else {
      int64_t n = 0;
      if (!PbContents(in.contents, d, &typed, &n)) {
        return {400, "input " + Repr(t.name) + ": its contents are not " + V2Name(d) +
                         " values (FP16 travels in raw_input_contents)"};
      }
      data = typed;
    }
    if (static_cast<int64_t>(data.size()) != bytes) {
      return {400, "input " + Repr(t.name) + ": shape " + ShapeStr(in.shape) + " of " +
                       V2Name(d) + " takes " + std::to_string(bytes) + " bytes, received " +
                       std::to_string(data.size())};
    }
    if (!typed.empty() && d == t.dtype) {
      r->owned[k] = std::move(typed);
      data = r->owned[k];
      if (Error e = FinishInput(t, d, data.data(), k, r)) return e;
    } else if (!typed.empty()) {
      if (Error e = FinishInput(t, d, typed.data(), k, r)) return e;
    } else {
      if (Error e = FinishInput(t, d, data.data(), k, r)) return e;
    }
  }
  std::string missing;
  for (size_t k = 0; k < nin; ++k) {
    if (!seen[k]) missing += (missing.empty() ? "" : ", ") + Repr(m.inputs[k].name);
  }
  if (!missing.empty()) return {400, "missing input " + missing};
  r->want.clear();
  r->binary.clear();
  for (std::string_view name : out_names) {
    const size_t idx = FindTensor(m.outputs, name);
    if (idx == m.outputs.size()) {
      std::string list = "[";
      for (size_t i = 0; i < m.outputs.size(); ++i) {
        list += (i ? ", " : "") + Repr(m.outputs[i].name);
      }
      return {400, "unknown output " + Repr(name) + ": the model gives " + list + "]"};
    }
    if (std::find(r->want.begin(), r->want.end(), static_cast<int>(idx)) != r->want.end()) {
      return {400, "output " + Repr(name) + " is asked for twice"};
    }
    r->want.push_back(static_cast<int>(idx));
    r->binary.push_back(1);
  }
  if (r->want.empty()) {
    for (size_t i = 0; i < m.outputs.size(); ++i) {
      r->want.push_back(static_cast<int>(i));
      r->binary.push_back(1);
    }
  }
  return {};
}

void StartHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a) {
  const size_t nout = m.outputs.size();
  a->out.assign(nout, nullptr);
  a->scratch.assign(nout, {});
  bool all_binary = true;
  for (char b : r.binary) all_binary &= b != 0;
  a->laid_out = all_binary;
  std::vector<char> wanted(nout, 0);
  for (int i : r.want) wanted[static_cast<size_t>(i)] = 1;
  if (all_binary) {
    std::string& b = a->body;
    b.clear();
    b += "{\"model_name\":" + Quote(m.name) + ",\"model_version\":" + Quote(m.version);
    if (!r.id.empty()) b += ",\"id\":" + Quote(r.id);
    b += ",\"outputs\":[";
    int64_t total = 0;
    std::vector<int64_t> rel(nout, -1);
    for (size_t i = 0; i < r.want.size(); ++i) {
      const TensorPlan& t = m.outputs[static_cast<size_t>(r.want[i])];
      const int64_t bytes = AnswerBytes(m, t, r);
      if (i) b += ",";
      b += "{\"name\":" + Quote(t.name) + ",\"datatype\":\"" + V2Name(t.dtype) + "\",\"shape\":" +
           ShapeStr(AnswerShape(m, t, r)) + ",\"parameters\":{\"binary_data_size\":" +
           std::to_string(bytes) + "}}";
      rel[static_cast<size_t>(r.want[i])] = total;
      total += bytes;
    }
    b += "]}";
    a->header_length = static_cast<int64_t>(b.size());
    b.resize(b.size() + static_cast<size_t>(total));
    for (size_t i = 0; i < nout; ++i) {
      if (rel[i] >= 0) a->out[i] = b.data() + a->header_length + rel[i];
    }
  }
  for (size_t i = 0; i < nout; ++i) {
    if (a->out[i] == nullptr) {
      a->scratch[i].resize(static_cast<size_t>(AnswerBytes(m, m.outputs[i], r)));
      a->out[i] = a->scratch[i].data();
    }
  }
}

void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a) {
  if (a->laid_out) return;
  std::string& b = a->body;
  b.clear();
  b += "{\"model_name\":" + Quote(m.name) + ",\"model_version\":" + Quote(m.version);
  if (!r.id.empty()) b += ",\"id\":" + Quote(r.id);
  b += ",\"outputs\":[";
  bool any_binary = false;
  for (size_t i = 0; i < r.want.size(); ++i) {
    const TensorPlan& t = m.outputs[static_cast<size_t>(r.want[i])];
    const int64_t bytes = AnswerBytes(m, t, r);
    if (i) b += ",";
    b += "{\"name\":" + Quote(t.name) + ",\"datatype\":\"" + V2Name(t.dtype) + "\",\"shape\":" +
         ShapeStr(AnswerShape(m, t, r));
    if (r.binary[i]) {
      any_binary = true;
      b += ",\"parameters\":{\"binary_data_size\":" + std::to_string(bytes) + "}}";
    } else {
      b += ",\"data\":";
      RenderJsonData(t.dtype, a->out[static_cast<size_t>(r.want[i])], bytes / ElemSize(t.dtype),
                     &b);
      b += "}";
    }
  }
  b += "]}";
  a->header_length = -1;
  if (any_binary) {
    a->header_length = static_cast<int64_t>(b.size());
    for (size_t i = 0; i < r.want.size(); ++i) {
      if (!r.binary[i]) continue;
      const size_t k = static_cast<size_t>(r.want[i]);
      b.append(a->out[k], static_cast<size_t>(AnswerBytes(m, m.outputs[k], r)));
    }
  }
}

void StartGrpcAnswer(const ModelPlan& m, const InferRequest& r, GrpcAnswer* a) {
  const size_t nout = m.outputs.size();
  std::string& b = a->body;
  b.clear();
  PutBytes(&b, 1, m.name);
  PutBytes(&b, 2, m.version);
  if (!r.id.empty()) PutBytes(&b, 3, r.id);
  for (int idx : r.want) {
    const TensorPlan& t = m.outputs[static_cast<size_t>(idx)];
    std::string o;
    PutTensorHead(&o, t, AnswerShape(m, t, r));
    PutBytes(&b, 5, o);
  }
  std::vector<int64_t> at(nout, -1);
  int64_t total = 0;
  std::string heads;
  for (int idx : r.want) {
    total += AnswerBytes(m, m.outputs[static_cast<size_t>(idx)], r) + 16;
  }
  b.reserve(b.size() + static_cast<size_t>(total));
  for (int idx : r.want) {
    const int64_t n = AnswerBytes(m, m.outputs[static_cast<size_t>(idx)], r);
    PutTag(&b, 6, 2);
    PutVarint(&b, static_cast<uint64_t>(n));
    at[static_cast<size_t>(idx)] = static_cast<int64_t>(b.size());
    b.resize(b.size() + static_cast<size_t>(n));
  }
  a->out.assign(nout, nullptr);
  a->scratch.assign(nout, {});
  for (size_t i = 0; i < nout; ++i) {
    if (at[i] >= 0) {
      a->out[i] = b.data() + at[i];
    } else {
      a->scratch[i].resize(static_cast<size_t>(AnswerBytes(m, m.outputs[i], r)));
      a->out[i] = a->scratch[i].data();
    }
  }
}

void Counters::Done(int status, int64_t rows, std::chrono::steady_clock::duration took) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
  std::lock_guard<std::mutex> lock(mu);
  if (status == 200) {
    success += 1;
    success_ns += ns;
    success_rows += rows;
    last_inference_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  } else {
    fail += 1;
    fail_ns += ns;
  }
  duration_s += static_cast<double>(ns) * 1e-9;
  for (auto& p : by_status) {
    if (p.first == status) {
      p.second += 1;
      return;
    }
  }
  by_status.push_back({status, 1});
  std::sort(by_status.begin(), by_status.end());
}

std::string ServerMetadataJson(const ModelPlan& m) {
  return "{\"name\":\"paddle-ipu\",\"version\":" + Quote(m.server_version) +
         ",\"extensions\":[\"binary_tensor_data\",\"statistics\",\"model_configuration\","
         "\"model_repository\"]}";
}

std::string ModelMetadataJson(const ModelPlan& m) {
  return "{\"name\":" + Quote(m.name) + ",\"versions\":[" + Quote(m.version) +
         "],\"platform\":\"paddle_ipu\",\"inputs\":" + TensorsJson(m.inputs) +
         ",\"outputs\":" + TensorsJson(m.outputs) + "}";
}

std::string ModelConfigJson(const ModelPlan& m) {
  std::string s = "{\"name\":" + Quote(m.name) +
                  ",\"platform\":\"paddle_ipu\",\"backend\":\"paddle_ipu\",\"max_batch_size\":" +
                  std::to_string(m.auto_batch ? m.max_rows : 0) +
                  ",\"input\":" + ConfigTensors(m, m.inputs) +
                  ",\"output\":" + ConfigTensors(m, m.outputs);
  // The queue's bound and the request timeout are Triton's default queue policy.
  std::string policy = "{\"timeout_action\":\"REJECT\",\"default_timeout_microseconds\":" +
                       std::to_string(static_cast<int64_t>(m.request_timeout_s * 1e6)) +
                       ",\"allow_timeout_override\":true,\"max_queue_size\":" +
                       std::to_string(m.limit) + "}";
  if (m.auto_batch) {
    s += ",\"dynamic_batching\":{\"preferred_batch_size\":[" + std::to_string(m.capacity) +
         "],\"max_queue_delay_microseconds\":" +
         std::to_string(static_cast<int64_t>(m.batch_timeout_us)) +
         ",\"default_queue_policy\":" + policy + "}";
  }
  s += ",\"instance_group\":[{\"name\":" + Quote(m.name) + ",\"count\":1,\"kind\":\"KIND_CPU\"}]";
  s += ",\"parameters\":{\"micro_batch_size\":{\"string_value\":\"" +
       std::to_string(m.micro_batch_size) + "\"},\"auto_batching\":{\"string_value\":\"" +
       (m.auto_batch ? "true" : "false") + "\"}}";
  return s + "}";
}

std::string RepositoryIndexJson(const ModelPlan& m, bool ready) {
  return "[{\"name\":" + Quote(m.name) + ",\"version\":" + Quote(m.version) + ",\"state\":\"" +
         (ready ? "READY" : "UNAVAILABLE") + "\",\"reason\":\"\"}]";
}

std::string StatisticsJson(const ModelPlan& m, Counters* c, const QueueStats& s) {
  int64_t success, success_ns, fail, fail_ns, rows, last;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    success = c->success;
    success_ns = c->success_ns;
    fail = c->fail;
    fail_ns = c->fail_ns;
    rows = c->success_rows;
    last = c->last_inference_ms;
  }
  std::string out = "{\"model_stats\":[{\"name\":" + Quote(m.name) + ",\"version\":" +
                    Quote(m.version) + ",\"last_inference\":" + std::to_string(last) +
                    ",\"inference_count\":" + std::to_string(rows) +
                    ",\"execution_count\":" + std::to_string(s.runs) +
                    ",\"inference_stats\":{\"success\":" +
                    Duration(success, static_cast<double>(success_ns) * 1e-9) +
                    ",\"fail\":" + Duration(fail, static_cast<double>(fail_ns) * 1e-9) +
                    ",\"queue\":" + Duration(s.requests, s.queue_seconds) +
                    ",\"compute_input\":" + Duration(0, 0) +
                    ",\"compute_infer\":" + Duration(s.runs, s.busy_seconds) +
                    ",\"compute_output\":" + Duration(0, 0) + "},\"batch_stats\":[";
  bool first = true;
  for (size_t k = 0; k < s.fill_histogram.size(); ++k) {
    if (s.fill_histogram[k] == 0) continue;
    out += std::string(first ? "" : ",") + "{\"batch_size\":" + std::to_string(k) +
           ",\"compute_input\":" + Duration(0, 0) + ",\"compute_infer\":" +
           Duration(s.fill_histogram[k], k < s.fill_seconds.size() ? s.fill_seconds[k] : 0.0) +
           ",\"compute_output\":" + Duration(0, 0) + "}";
    first = false;
  }
  return out + "]}]}";
}

std::string Prometheus(const ModelPlan& m, Counters* c, const QueueStats& s) {
  std::vector<std::pair<int, int64_t>> by_status;
  int64_t rows, busy, timed_out, gone;
  double duration;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    by_status = c->by_status;
    rows = c->success_rows;
    duration = c->duration_s;
    busy = c->rejected_busy;
    timed_out = c->timed_out;
    gone = c->disconnected;
  }
  const std::string label = "model=" + Quote(m.name) + ",version=" + Quote(m.version);
  std::string o;
  auto metric = [&](const char* name, const char* type, const char* help) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  metric("paddle_ipu_requests_total", "counter", "Inference requests by outcome (HTTP status).");
  bool has_200 = false;
  int64_t total = 0;
  for (const auto& p : by_status) has_200 |= p.first == 200;
  if (!has_200) by_status.insert(by_status.begin(), {200, 0});
  for (const auto& p : by_status) {
    o += "paddle_ipu_requests_total{" + label + ",status=\"" + std::to_string(p.first) + "\"} " +
         std::to_string(p.second) + "\n";
    total += p.second;
  }
  metric("paddle_ipu_request_rows_total", "counter", "Rows of successful requests.");
  o += "paddle_ipu_request_rows_total{" + label + "} " + std::to_string(rows) + "\n";
  metric("paddle_ipu_request_duration_seconds", "summary", "Time in the server per request.");
  o += "paddle_ipu_request_duration_seconds_sum{" + label + "} " + Seconds(duration) + "\n";
  o += "paddle_ipu_request_duration_seconds_count{" + label + "} " + std::to_string(total) + "\n";
  metric("paddle_ipu_rejected_total", "counter",
         "Requests refused because the queue was full (503 / UNAVAILABLE).");
  o += "paddle_ipu_rejected_total{" + label + "} " + std::to_string(busy) + "\n";
  metric("paddle_ipu_timed_out_total", "counter",
         "Requests not started within their timeout (504 / DEADLINE_EXCEEDED).");
  o += "paddle_ipu_timed_out_total{" + label + "} " + std::to_string(timed_out) + "\n";
  metric("paddle_ipu_disconnected_total", "counter",
         "Requests dropped before they ran because the client went away.");
  o += "paddle_ipu_disconnected_total{" + label + "} " + std::to_string(gone) + "\n";
  metric("paddle_ipu_in_flight", "gauge", "Units (rows, or micro-batches) admitted, not answered.");
  o += "paddle_ipu_in_flight{" + label + "} " + std::to_string(s.in_flight) + "\n";
  metric("paddle_ipu_queue_seconds_total", "counter", "Time requests waited in the queue, summed.");
  o += "paddle_ipu_queue_seconds_total{" + label + "} " + Seconds(s.queue_seconds) + "\n";
  metric("paddle_ipu_compute_seconds_total", "counter", "Time the worker spent running the graph.");
  o += "paddle_ipu_compute_seconds_total{" + label + "} " + Seconds(s.busy_seconds) + "\n";
  metric("paddle_ipu_runs_total", "counter", "Graph runs (failed ones included).");
  o += "paddle_ipu_runs_total{" + label + "} " + std::to_string(s.runs) + "\n";
  metric("paddle_ipu_failed_runs_total", "counter", "Graph runs that raised.");
  o += "paddle_ipu_failed_runs_total{" + label + "} " + std::to_string(s.failed_runs) + "\n";
  metric("paddle_ipu_padded_units_total", "counter", "Units of zero padding fed.");
  o += "paddle_ipu_padded_units_total{" + label + "} " + std::to_string(s.padded_units) + "\n";
  metric("paddle_ipu_batch_size", "histogram", "Units (rows) per graph run.");
  int64_t cumulative = 0, units = 0;
  for (size_t k = 0; k < s.fill_histogram.size(); ++k) {
    cumulative += s.fill_histogram[k];
    units += static_cast<int64_t>(k) * s.fill_histogram[k];
    o += "paddle_ipu_batch_size_bucket{" + label + ",le=\"" + std::to_string(k) + "\"} " +
         std::to_string(cumulative) + "\n";
  }
  o += "paddle_ipu_batch_size_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(cumulative) +
       "\n";
  o += "paddle_ipu_batch_size_sum{" + label + "} " + std::to_string(units) + "\n";
  o += "paddle_ipu_batch_size_count{" + label + "} " + std::to_string(cumulative) + "\n";
  return o;
}

}  // namespace serving
}  // namespace paddle_ipu
