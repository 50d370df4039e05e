// Names, shapes and JSON strings in messages and answers (see text.h).
#include "text.h"

#include <boost/json.hpp>

#include <algorithm>
#include <cstdio>

namespace json = boost::json;

namespace paddle_ipu {
namespace serving {

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

std::string Bounded(std::string_view message, size_t limit) {
  if (message.size() <= limit) return std::string(message);
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return std::string(message.substr(0, cut)) + "... (cut: the message has " +
         std::to_string(message.size()) + " bytes)";
}

std::string ErrorJson(std::string_view message) {
  return "{\"error\":" + Quote(ValidUtf8(Bounded(message, 4096))) + "}";
}

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

std::string ReprNames(const std::vector<TensorPlan>& ts, bool sort) {
  std::vector<std::string> names;
  for (const TensorPlan& t : ts) names.push_back(t.name);
  if (sort) std::sort(names.begin(), names.end());
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + Repr(names[i]);
  return s + "]";
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

}  // namespace serving
}  // namespace paddle_ipu
