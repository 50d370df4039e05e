// JSON tensors (see json_tensors.h). Boost.JSON is compiled here, once
// (boost/json/src.hpp: header-only, no Boost library to link).
#include "json_tensors.h"

#include "text.h"

#include <boost/json/src.hpp>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../core/fp16.h"

namespace json = boost::json;

namespace paddle_ipu {
namespace serving {

namespace {

// Why a JSON value is no element of a datatype.
enum class Fit { kOk, kType, kRange };

// FP16's largest finite value plus half its last step: floats from here on round to
// infinity.
constexpr float kHalfOverflow = 65520.0f;

// One JSON value as a T, as strictly as Triton reads it, and stricter where Triton
// lets a value change: a boolean only for BOOL; integers only for the integer types
// (never 1.0), within their range; numbers for the float types, finite and within
// their range (JSON has no infinity: 1e400 overflowed the parser's double).
template <typename T>
Fit FromJson(const json::value& v, T* out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_bool()) return Fit::kType;
    *out = v.get_bool();
    return Fit::kOk;
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = 0;
    if (v.is_double()) {
      d = v.get_double();
    } else if (v.is_int64()) {
      d = static_cast<double>(v.get_int64());
    } else if (v.is_uint64()) {
      d = static_cast<double>(v.get_uint64());
    } else {
      return Fit::kType;
    }
    if (!std::isfinite(d)) return Fit::kRange;
    if constexpr (std::is_same_v<T, float>) {
      if (std::fabs(d) >= 0x1.ffffffp127) return Fit::kRange;
    }
    *out = static_cast<T>(d);
    return Fit::kOk;
  } else {
    using L = std::numeric_limits<T>;
    if (v.is_int64()) {
      const int64_t x = v.get_int64();
      if constexpr (std::is_signed_v<T>) {
        if (x < static_cast<int64_t>(L::min()) || x > static_cast<int64_t>(L::max())) {
          return Fit::kRange;
        }
      } else {
        if (x < 0 || static_cast<uint64_t>(x) > static_cast<uint64_t>(L::max())) {
          return Fit::kRange;
        }
      }
      *out = static_cast<T>(x);
      return Fit::kOk;
    }
    if (v.is_uint64()) {
      const uint64_t x = v.get_uint64();
      if (x > static_cast<uint64_t>(L::max())) return Fit::kRange;
      *out = static_cast<T>(x);
      return Fit::kOk;
    }
    return Fit::kType;
  }
}

// What is wrong with value `v` as an element of `t`.
std::string NotAn(DType t, const json::value& v, Fit fit) {
  const std::string head = "data is not " + std::string(V2Name(t)) + ": ";
  std::string shown;
  if (v.is_double()) {  // as Python shows a float: shortest, with a point or exponent
    const double d = v.get_double();
    if (!std::isfinite(d)) return head + "a number is too large for any float (even float64)";
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof(buf), d);
    shown.assign(buf, r.ptr);
    if (shown.find_first_of(".e") == std::string::npos) shown += ".0";
  } else {
    shown = json::serialize(v);
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
  }
  const std::string type = t == DType::kBytes ? "string" : NumpyName(t);
  if (fit == Fit::kRange) return head + shown + " is outside " + type + "'s range";
  return head + shown + " is not a " + type + " value";
}

// The elements of `v` (a rectangular nest, see Nesting), read as T and appended to `out`
// as Stored values (`convert` turns one T into one Stored, or fails: fp16's range).
template <typename T, typename Stored = T, typename Convert>
std::string Flatten(DType t, const json::value& v, std::string* out, Convert convert) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      std::string why = Flatten<T, Stored>(t, e, out, convert);
      if (!why.empty()) return why;
    }
    return {};
  }
  T x{};
  Fit fit = FromJson<T>(v, &x);
  Stored s{};
  if (fit == Fit::kOk && !convert(x, &s)) fit = Fit::kRange;
  if (fit != Fit::kOk) return NotAn(t, v, fit);
  out->append(reinterpret_cast<const char*>(&s), sizeof(Stored));
  return {};
}

template <typename T>
std::string FlattenAs(DType t, const json::value& v, std::string* out) {
  return Flatten<T>(t, v, out, [](T x, T* s) { return *s = x, true; });
}

// The shape of a nest of JSON lists: the lengths of its lists by depth, and "" when it
// is rectangular (every list at one depth as long as the others, every value at one
// depth), else why not.
struct Nest {
  std::vector<int64_t> dims;
  int64_t leaf = -1;  // the depth of the values (-1: none seen)
  std::string ragged;
};

void Walk(const json::value& v, int64_t depth, Nest* n) {
  if (!n->ragged.empty()) return;
  const std::string at = " at depth " + std::to_string(depth);
  if (!v.is_array()) {
    if (n->leaf < 0) n->leaf = depth;
    if (n->leaf != depth || static_cast<int64_t>(n->dims.size()) > depth) {
      n->ragged = "data is ragged: it mixes lists and values" + at;
    }
    return;
  }
  const json::array& a = v.get_array();
  const auto len = static_cast<int64_t>(a.size());
  if (n->leaf >= 0 && depth >= n->leaf) {
    n->ragged = "data is ragged: it mixes lists and values" + at;
    return;
  }
  if (depth < static_cast<int64_t>(n->dims.size())) {
    if (n->dims[static_cast<size_t>(depth)] != len) {
      n->ragged = "data is ragged: its lists" + at + " have " +
                  std::to_string(n->dims[static_cast<size_t>(depth)]) + " and " +
                  std::to_string(len) + " elements";
      return;
    }
  } else {
    n->dims.push_back(len);
  }
  for (const json::value& e : a) Walk(e, depth + 1, n);
}

// "" when data of nest `n` holds a tensor of `shape` (`count` elements): a flat list
// of them, lists nested as the shape (the innermost holding the rest of it), or one
// value for one element.
std::string FitShape(const json::value& v, const Nest& n, const std::vector<int64_t>& shape,
                     int64_t count) {
  const size_t d = n.dims.size();
  const int64_t given = !v.is_array() ? 1 : d == 1 ? n.dims[0] : -1;
  if (given >= 0) {
    if (given == count) return {};
    return "shape " + ShapeStr(shape) + " has " + std::to_string(count) + " elements, data has " +
           std::to_string(given);
  }
  bool fits = d <= shape.size();
  for (size_t i = 0; fits && i + 1 < d; ++i) fits = n.dims[i] == shape[i];
  if (fits) {
    int64_t rest = 1;  // fits int64: TensorSize checked the shape
    for (size_t i = d - 1; i < shape.size(); ++i) rest *= shape[i];
    fits = n.dims[d - 1] == rest;
  }
  if (fits) return {};
  return "data nested as " + ShapeStr(n.dims) + " does not fit shape " + ShapeStr(shape) +
         " (give a flat list of its " + std::to_string(count) +
         " elements, or lists nested as the shape)";
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

// BYTES: the strings of `v` (a rectangular nest), each as a length-prefixed element.
std::string FlattenStrings(const json::value& v, std::string* out) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      std::string why = FlattenStrings(e, out);
      if (!why.empty()) return why;
    }
    return {};
  }
  if (!v.is_string()) return NotAn(DType::kBytes, v, Fit::kType);
  const json::string& s = v.get_string();
  PutBytesElement(out, std::string_view(s.data(), s.size()));
  return {};
}

}  // namespace

void RenderJsonBytes(std::string_view data, std::string* out) {
  out->push_back('[');
  size_t at = 0;
  for (bool first = true; at + 4 <= data.size(); first = false) {
    const uint32_t len = Load<uint32_t>(data.data() + at);
    if (!first) out->push_back(',');
    *out += Quote(ValidUtf8(std::string(data.substr(at + 4, len))));
    at += 4 + len;
  }
  out->push_back(']');
}

std::string JsonTensor(DType t, const json::value& v, const std::vector<int64_t>& shape,
                       int64_t count, std::string* out) {
  Nest nest;
  Walk(v, 0, &nest);
  if (!nest.ragged.empty()) return nest.ragged;
  std::string why = FitShape(v, nest, shape, count);
  if (!why.empty()) return why;
  switch (t) {
    case DType::kBool:  // one byte each, 1 or 0
      return Flatten<bool, char>(t, v, out, [](bool x, char* s) { return *s = x, true; });
    case DType::kUint8: return FlattenAs<uint8_t>(t, v, out);
    case DType::kUint16: return FlattenAs<uint16_t>(t, v, out);
    case DType::kUint32: return FlattenAs<uint32_t>(t, v, out);
    case DType::kUint64: return FlattenAs<uint64_t>(t, v, out);
    case DType::kInt8: return FlattenAs<int8_t>(t, v, out);
    case DType::kInt16: return FlattenAs<int16_t>(t, v, out);
    case DType::kInt32: return FlattenAs<int32_t>(t, v, out);
    case DType::kInt64: return FlattenAs<int64_t>(t, v, out);
    case DType::kFp16:
      return Flatten<float, uint16_t>(t, v, out, [](float x, uint16_t* s) {
        if (std::fabs(x) >= kHalfOverflow) return false;
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        *s = fp16::FloatBitsToHalfBits(bits);
        return true;
      });
    case DType::kFp32: return FlattenAs<float>(t, v, out);
    case DType::kFp64: return FlattenAs<double>(t, v, out);
    case DType::kBytes: return FlattenStrings(v, out);
    default: return "datatype " + std::string(V2Name(t)) + " has no JSON form";
  }
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

}  // namespace serving
}  // namespace paddle_ipu
