// The gRPC infer request (see requests.h): inference.ModelInferRequest read at the
// protobuf wire level (protobuf.h), its tensors from raw_input_contents or from the
// typed InferTensorContents.
#include <cstring>
#include <vector>

#include "checks.h"
#include "protobuf.h"
#include "requests.h"
#include "sizes.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

struct PbInput {
  std::string_view name, datatype, contents;
  std::vector<int64_t> shape;
};

// The field of InferTensorContents that holds elements of `t`; 0 for none (FP16
// travels as raw_input_contents only).
int ContentsField(DType t) {
  switch (t) {
    case DType::kBool: return 1;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32: return 2;
    case DType::kInt64: return 3;
    case DType::kUint8:
    case DType::kUint16:
    case DType::kUint32: return 4;
    case DType::kUint64: return 5;
    case DType::kFp32: return 6;
    case DType::kFp64: return 7;
    default: return 0;
  }
}

// A repeated scalar field of InferTensorContents, packed or not, into `out` as
// elements of `t`; false when a value does not fit `t`.
bool PbContents(std::string_view msg, DType t, std::string* out, int64_t* count) {
  if (t == DType::kBytes) {  // bytes_contents: one field per element
    Wire w(msg);
    while (w.ok && !w.done()) {
      const uint64_t tag = w.Varint();
      if (static_cast<int>(tag >> 3) == 8 && (tag & 7) == 2) {
        PutBytesElement(out, w.Bytes());
        ++*count;
      } else {
        w.Skip(static_cast<int>(tag & 7));
      }
    }
    return w.ok;
  }
  const int field = ContentsField(t);
  if (field == 0) return false;
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
  const bool fixed = t == DType::kFp32 || t == DType::kFp64;
  auto put_fixed = [&](const uint8_t* at) {
    if (at) out->append(reinterpret_cast<const char*>(at), static_cast<size_t>(size)), ++*count;
  };
  Wire w(msg);
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    const int f = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    if (f != field) {
      w.Skip(wt);
      continue;
    }
    if (wt == 2) {  // packed
      Wire s(w.Bytes());
      while (w.ok && s.ok && !s.done()) {
        if (fixed) {
          put_fixed(s.Fixed(static_cast<int>(size)));
        } else if (!put_int(s.Varint())) {
          return false;
        }
      }
      w.ok &= s.ok;
    } else if (fixed && wt == (size == 4 ? 5 : 1)) {
      put_fixed(w.Fixed(static_cast<int>(size)));
    } else if (!fixed && wt == 0) {
      if (!put_int(w.Varint())) return false;
    } else {
      w.ok = false;
    }
  }
  return w.ok;
}

// One entry of ModelInferRequest.parameters (map<string, InferParameter>): "timeout"
// (int64_param, in microseconds), "binary_data_output" (outputs are always raw
// here), any other refused by name (OtherParameter).
Error ReadParameter(Wire* w, InferRequest* r) {
  Wire e(w->Bytes());
  std::string_view key, value;
  while (e.ok && !e.done()) {
    const uint64_t t = e.Varint();
    if ((t >> 3) == 1 && (t & 7) == 2) key = e.Bytes();
    else if ((t >> 3) == 2 && (t & 7) == 2) value = e.Bytes();
    else e.Skip(static_cast<int>(t & 7));
  }
  w->ok &= e.ok;
  // The value: bool_param 1, int64_param 2, string_param 3, double_param 4,
  // uint64_param 5; the default when every field is its zero.
  Wire v(value);
  bool is_default = true, is_int = false;
  int64_t i64 = 0;
  while (v.ok && !v.done()) {
    const uint64_t t = v.Varint();
    const int f = static_cast<int>(t >> 3), wt = static_cast<int>(t & 7);
    if (wt == 0 && (f == 1 || f == 2 || f == 5)) {
      const uint64_t x = v.Varint();
      is_default &= x == 0;
      if (f == 2) is_int = true, i64 = static_cast<int64_t>(x);
    } else if (f == 3 && wt == 2) {
      is_default &= v.Bytes().empty();
    } else if (f == 4 && wt == 1) {
      const uint8_t* d = v.Fixed(8);
      double x = 0;
      if (d) std::memcpy(&x, d, sizeof(x));
      is_default &= x == 0.0;
    } else {
      v.Skip(wt);
    }
  }
  w->ok &= v.ok;
  if (!w->ok) return {};
  if (key == "binary_data_output") return {};
  if (key == "timeout") {
    if (!is_default && (!is_int || i64 < 0)) {
      return {400, "parameter 'timeout' must be an int64_param of microseconds >= 0"};
    }
    if (i64 > 0) r->timeout_s = static_cast<double>(i64) * 1e-6;
    return {};
  }
  return OtherParameter(ValidUtf8(key), is_default);
}

// One InferInputTensor.
PbInput ReadInput(Wire* w) {
  PbInput p;
  Wire in(w->Bytes());
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
  w->ok &= in.ok;
  return p;
}

// One InferRequestedOutputTensor's name; false when it has none.
bool ReadOutputName(Wire* w, std::string_view* name) {
  Wire o(w->Bytes());
  bool named = false;
  while (o.ok && !o.done()) {
    const uint64_t t = o.Varint();
    if ((t >> 3) == 1 && (t & 7) == 2) *name = o.Bytes(), named = true;
    else o.Skip(static_cast<int>(t & 7));
  }
  w->ok &= o.ok;
  return named;
}

}  // namespace

Error ParseGrpcInfer(const ModelPlan& m, std::string_view msg, InferRequest* r) {
  Wire w(msg);
  std::vector<PbInput> inputs;
  std::vector<std::string_view> raw;
  std::vector<std::string_view> out_names;
  std::string_view model_name, version;
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    const int f = static_cast<int>(tag >> 3), wt = static_cast<int>(tag & 7);
    std::string_view name;
    if (f == 1 && wt == 2) {
      model_name = r->model = w.Bytes();
    } else if (f == 2 && wt == 2) {
      version = r->version = w.Bytes();
    } else if (f == 3 && wt == 2) {
      r->id = ValidUtf8(w.Bytes());  // a protobuf string is text: it is sent back
    } else if (f == 4 && wt == 2) {  // parameters: map<string, InferParameter>
      if (Error e = ReadParameter(&w, r)) return e;
    } else if (f == 5 && wt == 2) {
      inputs.push_back(ReadInput(&w));
    } else if (f == 6 && wt == 2) {
      if (ReadOutputName(&w, &name)) out_names.push_back(name);
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
  StartRequest(m, r);
  std::vector<char> seen(m.inputs.size(), 0);
  std::string first;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const PbInput& in = inputs[i];
    size_t k = 0;
    if (Error e = ClaimInput(m, in.name, &seen, &k)) return e;
    const TensorPlan& t = m.inputs[k];
    const DType d = FromV2(in.datatype);
    if (d == DType::kInvalid || !SafeCast(d, t.dtype)) return DatatypeError(t, in.datatype);
    for (int64_t dim : in.shape) {
      if (dim < 0) {
        return {400, "input " + Repr(t.name) + ": shape must be a list of ints >= 0, got " +
                         ShapeStr(in.shape)};
      }
    }
    int64_t count = 0, bytes = 0;
    if (Error e = TensorSize(t.name, in.shape, d, m.max_body, &count, &bytes)) return e;
    if (Error e = CheckShape(m, t, in.shape, r, &first)) return e;
    r->in_shapes[k] = in.shape;
    std::string_view data;
    std::string typed;
    if (!raw.empty()) {
      data = raw[i];
    } else {
      // A typed element takes one byte of the message at least.
      if (Error e = ElementsFit(t.name, in.shape, count, 1,
                                static_cast<int64_t>(in.contents.size()))) {
        return e;
      }
      int64_t n = 0;
      if (!PbContents(in.contents, d, &typed, &n)) {
        return {400, "input " + Repr(t.name) + ": its contents are not " + V2Name(d) +
                         " values (FP16 travels in raw_input_contents)"};
      }
      if (d != DType::kBytes && n != count) {
        return {400, "input " + Repr(t.name) + ": shape " + ShapeStr(in.shape) + " has " +
                         std::to_string(count) + " elements, its contents hold " +
                         std::to_string(n)};
      }
      data = typed;
    }
    if (d == DType::kBytes) {
      if (Error e = ElementsFit(t.name, in.shape, count, 4, static_cast<int64_t>(data.size()))) {
        return e;
      }
      const int64_t n = BytesElements(data);
      if (n != count) {
        return {400, "input " + Repr(t.name) + ": shape " + ShapeStr(in.shape) + " has " +
                         std::to_string(count) + " elements, its BYTES data holds " +
                         (n < 0 ? std::string("no whole number of length-prefixed elements")
                                : std::to_string(n))};
      }
    } else if (static_cast<int64_t>(data.size()) != bytes) {
      return {400, "input " + Repr(t.name) + ": shape " + ShapeStr(in.shape) + " of " +
                       V2Name(d) + " takes " + std::to_string(bytes) + " bytes, received " +
                       std::to_string(data.size())};
    }
    if (!typed.empty() && d == t.dtype) {
      r->owned[k] = std::move(typed);
      data = r->owned[k];
    }
    if (Error e = FinishInput(t, d, data.data(), k, r)) return e;
  }
  if (Error e = MissingInputs(m, seen)) return e;
  r->want.clear();
  r->binary.clear();
  for (std::string_view name : out_names) {
    const size_t idx = FindTensor(m.outputs, name);
    if (idx == m.outputs.size()) return UnknownOutput(m, Repr(name));
    if (Error e = WantOutput(m, idx, true, r)) return e;
  }
  if (r->want.empty()) WantAll(m, true, r);
  return {};
}


bool ParseGrpcControl(std::string_view msg, ControlFields* f, std::string* why) {
  Wire w(msg);
  while (w.ok && !w.done()) {
    const uint64_t tag = w.Varint();
    const uint64_t field = tag >> 3;
    const int wt = static_cast<int>(tag & 7);
    if (!w.ok) break;
    if (field == 0) {
      *why = "field number 0";
      return false;
    }
    if (field <= 2 && wt == 2) {
      f->text[field] = w.Bytes();
      if (w.ok && ValidUtf8(f->text[field]) != f->text[field]) {
        *why = "field " + std::to_string(field) + " is a string but not valid UTF-8";
        return false;
      }
    } else if (field <= 2 && wt == 0) {
      f->number[field] = w.Varint();
    } else {
      w.Skip(wt);
    }
  }
  if (!w.ok) *why = "truncated or invalid wire format";
  return w.ok;
}

}  // namespace serving
}  // namespace paddle_ipu
