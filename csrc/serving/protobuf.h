// The protobuf wire format, as much of it as KServe v2's messages need (ModelInfer's,
// and the control calls' of grpc_control.cc: health, metadata, the index, the model
// configuration and statistics): a reader over a message's bytes and the writers of
// varints, tags and length-delimited fields. No generated code, no libprotobuf.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace paddle_ipu {
namespace serving {

// Reads one message; `ok` turns false at the first malformed field and stays so.
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
  // Passes over a field of wire type `wt`.
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

inline void PutVarint(std::string* o, uint64_t v) {
  while (v >= 0x80) {
    o->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  o->push_back(static_cast<char>(v));
}
inline void PutTag(std::string* o, int field, int wt) {
  PutVarint(o, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wt));
}
inline void PutBytes(std::string* o, int field, std::string_view s) {
  PutTag(o, field, 2);
  PutVarint(o, s.size());
  o->append(s.data(), s.size());
}

// proto3's scalars: a field at its default value (false, "") is not written.
inline void PutString(std::string* o, int field, std::string_view s) {
  if (!s.empty()) PutBytes(o, field, s);
}
inline void PutBool(std::string* o, int field, bool v) {
  if (!v) return;
  PutTag(o, field, 0);
  o->push_back(1);
}
// uint32 / uint64.
inline void PutUint(std::string* o, int field, uint64_t v) {
  if (!v) return;
  PutTag(o, field, 0);
  PutVarint(o, v);
}
// int32 / int64 (and enums): a negative value is its 64-bit two's complement, as
// protobuf writes both.
inline void PutInt(std::string* o, int field, int64_t v) {
  PutUint(o, field, static_cast<uint64_t>(v));
}
// A repeated int32 / int64, packed (as proto3 writes it); nothing when empty.
inline void PutPacked(std::string* o, int field, const std::vector<int64_t>& vs) {
  std::string packed;
  for (int64_t v : vs) PutVarint(&packed, static_cast<uint64_t>(v));
  if (!packed.empty()) PutBytes(o, field, packed);
}

}  // namespace serving
}  // namespace paddle_ipu
