// The HTTP infer request (see requests.h): a JSON header (Boost.JSON), with JSON
// tensors or the binary tensor extension's raw bytes after it.
#include <boost/json.hpp>

#include "checks.h"
#include "json_tensors.h"
#include "requests.h"
#include "sizes.h"
#include "text.h"

namespace json = boost::json;

namespace paddle_ipu {
namespace serving {

namespace {

const json::value* Member(const json::object* o, std::string_view key) {
  return o ? o->if_contains(json::string_view(key.data(), key.size())) : nullptr;
}

// A member's object, or nullptr.
const json::object* ObjectMember(const json::object* o, std::string_view key) {
  const json::value* v = Member(o, key);
  return v ? v->if_object() : nullptr;
}

std::string_view Str(const json::string& s) { return std::string_view(s.data(), s.size()); }

// A JSON value in a message: at most 40 characters of it.
std::string Short(const json::value& v) {
  std::string s = json::serialize(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// The shape of an input: a list of ints >= 0.
bool ReadShape(const json::value* sv, std::vector<int64_t>* dims) {
  if (!sv || !sv->is_array()) return false;
  for (const json::value& e : sv->get_array()) {
    if (!e.is_int64() || e.get_int64() < 0) return false;
    dims->push_back(e.get_int64());
  }
  return true;
}

// A parameter's value is its type's zero: 0, "", false (or null).
bool IsDefault(const json::value& v) {
  if (v.is_null()) return true;
  if (v.is_bool()) return !v.get_bool();
  if (v.is_string()) return v.get_string().empty();
  if (v.is_int64()) return v.get_int64() == 0;
  if (v.is_uint64()) return v.get_uint64() == 0;
  return v.is_double() && v.get_double() == 0.0;
}

// The request's parameters: binary_data_output and Triton's per-request timeout;
// any other is refused by name (OtherParameter).
Error ReadParameters(const json::object* obj, bool* binary_default, InferRequest* r) {
  const json::value* pv = Member(obj, "parameters");
  if (!pv) return {};
  const json::object* p = pv->if_object();
  if (!p) return {400, "\"parameters\" must be an object, got " + Short(*pv)};
  for (const auto& kv : *p) {
    const std::string_view key(kv.key().data(), kv.key().size());
    const json::value& v = kv.value();
    if (key == "binary_data_output") {
      *binary_default = v.is_bool() && v.get_bool();
    } else if (key == "timeout") {  // in microseconds
      if (!v.is_int64() || v.get_int64() < 0) {
        return {400,
                "parameter 'timeout' must be an integer number of microseconds >= 0, got " +
                    Short(v)};
      }
      if (v.get_int64() > 0) r->timeout_s = static_cast<double>(v.get_int64()) * 1e-6;
    } else if (Error e = OtherParameter(key, IsDefault(v))) {
      return e;
    }
  }
  return {};
}

// The outputs asked for: the "outputs" list, or every output.
Error ReadOutputs(const ModelPlan& m, const json::object* obj, bool binary_default,
                  InferRequest* r) {
  r->want.clear();
  r->binary.clear();
  const json::value* outs = Member(obj, "outputs");
  if (!outs) {
    WantAll(m, binary_default, r);
    return {};
  }
  if (!outs->is_array()) return {400, "\"outputs\" must be a list"};
  for (const json::value& ov : outs->get_array()) {
    const json::object* oo = ov.if_object();
    const json::value* on = Member(oo, "name");
    const bool named = on && on->is_string();
    const size_t idx = named ? FindTensor(m.outputs, Str(on->get_string())) : m.outputs.size();
    if (idx == m.outputs.size()) {
      return UnknownOutput(m, named ? Repr(Str(on->get_string()))
                                    : (on ? Short(*on) : std::string("None")));
    }
    bool bin = binary_default;
    if (const json::object* p = ObjectMember(oo, "parameters")) {
      if (const json::value* b = Member(p, "binary_data")) bin = b->is_bool() && b->get_bool();
    }
    if (Error e = WantOutput(m, idx, bin, r)) return e;
  }
  return {};
}

}  // namespace

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
  if (const json::value* id = Member(obj, "id"); id && id->is_string()) {
    r->id = std::string(Str(id->get_string()));
  }
  if (!inputs) return {400, "the request must be a JSON object with an \"inputs\" list"};
  const size_t nin = m.inputs.size();
  StartRequest(m, r);
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
    size_t k = 0;
    if (Error e = ClaimInput(m, name, &seen, &k)) return e;
    const TensorPlan& t = m.inputs[k];
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
    if (!ReadShape(sv, &dims)) {
      return {400, "input " + Repr(name) + ": shape must be a list of ints >= 0, got " +
                       (sv ? Short(*sv) : "None")};
    }
    int64_t count = 0, bytes = 0;
    if (Error e = TensorSize(name, dims, d, m.max_body, &count, &bytes)) return e;
    if (Error e = CheckShape(m, t, dims, r, &first)) return e;
    r->in_shapes[k] = dims;
    const json::object* params = ObjectMember(o, "parameters");
    const json::value* size = Member(params, "binary_data_size");
    const size_t left = blob.size() - offset;  // the binary data not claimed yet
    if (size && !size->is_null()) {
      if (d == DType::kBytes) {
        // Elements of any length: the size says where the tensor ends, then its
        // elements are counted.
        bytes = size->is_int64() ? size->get_int64() : -1;
        if (bytes < 0) {
          return {400, "input " + Repr(name) + ": binary_data_size must be an int >= 0, got " +
                           Short(*size)};
        }
      } else if (!size->is_int64() || size->get_int64() != bytes) {
        return {400, "input " + Repr(name) + ": binary_data_size is " + Short(*size) +
                         ", but shape " + ShapeStr(dims) + " of " + V2Name(d) + " takes " +
                         std::to_string(bytes) + " bytes"};
      }
      if (static_cast<uint64_t>(bytes) > left) {
        return {400, "input " + Repr(name) + ": the body ends " +
                         std::to_string(static_cast<uint64_t>(bytes) - left) +
                         " bytes before this input's binary data"};
      }
      const std::string_view data = blob.substr(offset, static_cast<size_t>(bytes));
      if (d == DType::kBytes) {
        if (Error e = ElementsFit(name, dims, count, 4, bytes)) return e;
        const int64_t n = BytesElements(data);
        if (n != count) {
          return {400, "input " + Repr(name) + ": shape " + ShapeStr(dims) + " has " +
                           std::to_string(count) + " elements, its " + std::to_string(bytes) +
                           " bytes of BYTES data hold " +
                           (n < 0 ? std::string("no whole number of length-prefixed elements")
                                  : std::to_string(n))};
        }
      }
      data_at[k] = data.data();
      offset += static_cast<size_t>(bytes);
    } else {
      const json::value* data = Member(o, "data");
      if (!data) return {400, "input " + Repr(name) + " has neither data nor binary_data_size"};
      // A JSON value takes one character at least: the elements must fit the header.
      if (Error e = ElementsFit(name, dims, count, 1, static_cast<int64_t>(head.size()))) {
        return e;
      }
      std::string& raw = json_raw[k];
      raw.reserve(static_cast<size_t>(bytes));
      std::string why = JsonTensor(d, *data, dims, count, &raw);
      if (!why.empty()) return {400, "input " + Repr(name) + ": " + why};
      data_at[k] = raw.data();
    }
  }
  if (offset != blob.size()) {
    return {400, "the body has " + std::to_string(blob.size() - offset) +
                     " bytes of binary data that no input claims"};
  }
  if (Error e = MissingInputs(m, seen)) return e;
  for (size_t k = 0; k < nin; ++k) {
    if (!json_raw[k].empty() && given[k] == m.inputs[k].dtype) {
      r->owned[k] = std::move(json_raw[k]);
      data_at[k] = r->owned[k].data();
    }
    if (Error e = FinishInput(m.inputs[k], given[k], data_at[k], k, r)) return e;
  }
  bool binary_default = false;
  if (Error e = ReadParameters(obj, &binary_default, r)) return e;
  if (Error e = ReadOutputs(m, obj, binary_default, r)) return e;
  return {};
}

}  // namespace serving
}  // namespace paddle_ipu
