// JSON tensors (see json_tensors.h). Boost.JSON is compiled here, once
// (boost/json/src.hpp: header-only, no Boost library to link).
#include "json_tensors.h"

#include "text.h"

#include <boost/json/src.hpp>

#include <charconv>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "../core/fp16.h"

namespace json = boost::json;

namespace paddle_ipu {
namespace serving {

namespace {

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

// The elements of `v`, flattened, read as T and appended to `out` as Stored values
// (`Convert` turns one T into one Stored: fp16's bits from a float).
template <typename T, typename Stored = T, typename Convert>
bool Flatten(const json::value& v, std::string* out, int64_t* count, const json::value** bad,
             Convert convert) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      if (!Flatten<T, Stored>(e, out, count, bad, convert)) return false;
    }
    return true;
  }
  T x{};
  if (!FromJson<T>(v, &x)) {
    *bad = &v;
    return false;
  }
  const Stored s = convert(x);
  out->append(reinterpret_cast<const char*>(&s), sizeof(Stored));
  ++*count;
  return true;
}

template <typename T>
bool FlattenAs(const json::value& v, std::string* out, int64_t* count, const json::value** bad) {
  return Flatten<T>(v, out, count, bad, [](T x) { return x; });
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

// BYTES: the strings of `v`, flattened, each as a length-prefixed element.
bool FlattenStrings(const json::value& v, std::string* out, int64_t* count,
                    const json::value** bad) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      if (!FlattenStrings(e, out, count, bad)) return false;
    }
    return true;
  }
  if (!v.is_string()) {
    *bad = &v;
    return false;
  }
  const json::string& s = v.get_string();
  PutBytesElement(out, std::string_view(s.data(), s.size()));
  ++*count;
  return true;
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

bool JsonTensor(DType t, const json::value& v, std::string* out, int64_t* count,
                const json::value** bad) {
  switch (t) {
    case DType::kBool:  // one byte each, 1 or 0
      return Flatten<bool, char>(v, out, count, bad, [](bool x) { return x ? '\1' : '\0'; });
    case DType::kUint8: return FlattenAs<uint8_t>(v, out, count, bad);
    case DType::kUint16: return FlattenAs<uint16_t>(v, out, count, bad);
    case DType::kUint32: return FlattenAs<uint32_t>(v, out, count, bad);
    case DType::kUint64: return FlattenAs<uint64_t>(v, out, count, bad);
    case DType::kInt8: return FlattenAs<int8_t>(v, out, count, bad);
    case DType::kInt16: return FlattenAs<int16_t>(v, out, count, bad);
    case DType::kInt32: return FlattenAs<int32_t>(v, out, count, bad);
    case DType::kInt64: return FlattenAs<int64_t>(v, out, count, bad);
    case DType::kFp16:
      return Flatten<float, uint16_t>(v, out, count, bad, [](float x) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        return fp16::FloatBitsToHalfBits(bits);
      });
    case DType::kFp32: return FlattenAs<float>(v, out, count, bad);
    case DType::kFp64: return FlattenAs<double>(v, out, count, bad);
    case DType::kBytes: return FlattenStrings(v, out, count, bad);
    default: return false;
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
