// Server and model metadata, the model configuration (see metadata.h).
#include "metadata.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "protobuf.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

// The tensors' list: names, datatypes (`type_key`: `type_name`(dtype)) and shapes
// from their dimension `skip` on (`shape_key`).
template <typename TypeName>
std::string TensorList(const std::vector<TensorPlan>& ts, const char* type_key,
                       TypeName type_name, const char* shape_key, size_t skip) {
  std::string s = "[";
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ",";
    s += "{\"name\":" + Quote(ts[i].name) + ",\"" + type_key + "\":\"" + type_name(ts[i].dtype) +
         "\",\"" + shape_key + "\":[";
    for (size_t k = skip, n = 0; k < ts[i].shape.size(); ++k, ++n) {
      s += (n ? "," : "") + std::to_string(ts[i].shape[k]);
    }
    s += "]}";
  }
  return s + "]";
}

std::string TensorsJson(const std::vector<TensorPlan>& ts) {
  return TensorList(ts, "datatype", V2Name, "shape", 0);
}

// With max_batch_size > 0 Triton's dims leave out the batch dimension.
std::string ConfigTensors(const ModelPlan& m, const std::vector<TensorPlan>& ts) {
  return TensorList(ts, "data_type", ConfigName, "dims", m.auto_batch ? 1 : 0);
}

// The numbers of the model configuration that are not the plan's own, for both its
// JSON and its message.
struct ConfigNumbers {
  int64_t max_batch_size;        // 0: no batching (the shapes are whole requests)
  int64_t queue_delay_us;        // dynamic_batching.max_queue_delay_microseconds
  int64_t default_timeout_us;    // the default queue policy's timeout (0: none)
};

ConfigNumbers Numbers(const ModelPlan& m) {
  return {m.auto_batch ? m.max_rows : 0, static_cast<int64_t>(m.batch_timeout_us),
          static_cast<int64_t>(m.request_timeout_s * 1e6)};
}

// model_config.proto's enums: their names in the order of their numbers.
constexpr std::string_view kDataTypes[] = {
    "TYPE_INVALID", "TYPE_BOOL",  "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32",
    "TYPE_UINT64",  "TYPE_INT8",  "TYPE_INT16", "TYPE_INT32",  "TYPE_INT64",
    "TYPE_FP16",    "TYPE_FP32",  "TYPE_FP64",  "TYPE_STRING", "TYPE_BF16"};
constexpr std::string_view kKinds[] = {"KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"};

template <size_t N>
int64_t EnumNumber(const std::string_view (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i) {
    if (names[i] == name) return static_cast<int64_t>(i);
  }
  return -1;
}

// The protocol's extensions the server offers (server metadata).
constexpr const char* kExtensions[] = {"binary_tensor_data", "statistics", "model_configuration",
                                       "model_repository"};

}  // namespace

std::string ServerMetadataJson(const std::string& server_version) {
  std::string s = "{\"name\":\"paddle-ipu\",\"version\":" + Quote(server_version) +
                  ",\"extensions\":[";
  bool first = true;
  for (const char* e : kExtensions) {
    s += std::string(first ? "" : ",") + Quote(e);
    first = false;
  }
  return s + "]}";
}

std::string ServerMetadataMessage(const std::string& server_version) {
  std::string o;
  PutString(&o, 1, "paddle-ipu");
  PutString(&o, 2, server_version);
  for (const char* e : kExtensions) PutBytes(&o, 3, e);
  return o;
}

std::string ModelMetadataMessage(const ModelPlan& m, const std::vector<std::string>& versions) {
  std::string o;
  PutString(&o, 1, m.name);
  for (const std::string& v : versions) PutBytes(&o, 2, v);
  PutString(&o, 3, "paddle_ipu");
  for (int field : {4, 5}) {
    for (const TensorPlan& t : field == 4 ? m.inputs : m.outputs) {
      std::string tensor;
      PutString(&tensor, 1, t.name);
      PutString(&tensor, 2, V2Name(t.dtype));
      PutPacked(&tensor, 3, t.shape);
      PutBytes(&o, field, tensor);
    }
  }
  return o;
}

std::string ModelMetadataJson(const ModelPlan& m) {
  return "{\"name\":" + Quote(m.name) + ",\"versions\":[" + Quote(m.version) +
         "],\"platform\":\"paddle_ipu\",\"inputs\":" + TensorsJson(m.inputs) +
         ",\"outputs\":" + TensorsJson(m.outputs) + "}";
}

std::string ModelConfigJson(const ModelPlan& m) {
  const ConfigNumbers n = Numbers(m);
  std::string s = "{\"name\":" + Quote(m.name) +
                  ",\"platform\":\"paddle_ipu\",\"backend\":\"paddle_ipu\",\"max_batch_size\":" +
                  std::to_string(n.max_batch_size) + ",\"input\":" + ConfigTensors(m, m.inputs) +
                  ",\"output\":" + ConfigTensors(m, m.outputs);
  // The queue's bound and the request timeout are Triton's default queue policy.
  std::string policy = "{\"timeout_action\":\"REJECT\",\"default_timeout_microseconds\":" +
                       std::to_string(n.default_timeout_us) +
                       ",\"allow_timeout_override\":true,\"max_queue_size\":" +
                       std::to_string(m.limit) + "}";
  if (m.auto_batch) {
    s += ",\"dynamic_batching\":{\"preferred_batch_size\":[" + std::to_string(m.capacity) +
         "],\"max_queue_delay_microseconds\":" + std::to_string(n.queue_delay_us) +
         ",\"default_queue_policy\":" + policy + "}";
  }
  s += ",\"instance_group\":[{\"name\":" + Quote(m.name) + ",\"count\":" + std::to_string(m.instance_count) +
       ",\"kind\":" + Quote(m.instance_kind) + "}]";
  s += ",\"parameters\":{\"micro_batch_size\":{\"string_value\":\"" +
       std::to_string(m.micro_batch_size) + "\"},\"auto_batching\":{\"string_value\":\"" +
       (m.auto_batch ? "true" : "false") + "\"}}";
  return s + "}";
}

std::string ModelConfigMessage(const ModelPlan& m, std::string* why) {
  const ConfigNumbers n = Numbers(m);
  // A value its field cannot hold would be read back as another: refused instead.
  auto fits = [why](const char* field, int64_t v, int64_t low, int64_t high) {
    if (v >= low && v <= high) return true;
    if (why->empty()) {
      *why = std::string("the model configuration's ") + field + " (" + std::to_string(v) +
             ") does not fit model_config.proto's field (" + std::to_string(low) + " to " +
             std::to_string(high) + ")";
    }
    return false;
  };
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  constexpr int64_t kUint32 = std::numeric_limits<uint32_t>::max();
  constexpr int64_t kInt64 = std::numeric_limits<int64_t>::max();
  why->clear();
  const int64_t kind = EnumNumber(kKinds, m.instance_kind);
  bool ok = fits("max_batch_size", n.max_batch_size, 0, kInt32) &&
            fits("instance_group.count", m.instance_count, 0, kInt32) &&
            fits("instance_group.kind", kind, 0, kInt64) &&
            fits("default_queue_policy.default_timeout_microseconds", n.default_timeout_us, 0,
                 kInt64);
  if (m.auto_batch) {
    ok = ok && fits("preferred_batch_size", m.capacity, 0, kInt32) &&
         fits("max_queue_delay_microseconds", n.queue_delay_us, 0, kInt64) &&
         fits("max_queue_size", m.limit, 0, kUint32);
  }
  if (!ok) return {};
  std::string o;
  PutString(&o, 1, m.name);
  PutString(&o, 2, "paddle_ipu");
  PutString(&o, 17, "paddle_ipu");
  PutInt(&o, 4, n.max_batch_size);
  // ModelInput (dims: 4) and ModelOutput (dims: 3); with max_batch_size > 0 the dims
  // leave out the batch dimension, as ConfigTensors does.
  for (int field : {5, 6}) {
    for (const TensorPlan& t : field == 5 ? m.inputs : m.outputs) {
      std::string tensor;
      PutString(&tensor, 1, t.name);
      PutInt(&tensor, 2, std::max<int64_t>(EnumNumber(kDataTypes, ConfigName(t.dtype)), 0));
      const size_t skip = m.auto_batch && !t.shape.empty() ? 1 : 0;
      PutPacked(&tensor, field == 5 ? 4 : 3, {t.shape.begin() + skip, t.shape.end()});
      PutBytes(&o, field, tensor);
    }
  }
  if (m.auto_batch) {
    std::string policy, batching;
    // timeout_action REJECT is the enum's 0: not written
    PutUint(&policy, 2, static_cast<uint64_t>(n.default_timeout_us));
    PutBool(&policy, 3, true);
    PutUint(&policy, 4, static_cast<uint64_t>(m.limit));
    PutPacked(&batching, 1, {m.capacity});
    PutUint(&batching, 2, static_cast<uint64_t>(n.queue_delay_us));
    PutBytes(&batching, 6, policy);
    PutBytes(&o, 11, batching);
  }
  std::string group;
  PutString(&group, 1, m.name);
  PutInt(&group, 2, m.instance_count);
  PutInt(&group, 4, kind);
  PutBytes(&o, 7, group);
  // parameters: a map<string, ModelParameter>, each entry a message (key 1, value 2)
  const std::pair<std::string, std::string> parameters[] = {
      {"micro_batch_size", std::to_string(m.micro_batch_size)},
      {"auto_batching", m.auto_batch ? "true" : "false"}};
  for (const auto& [key, value] : parameters) {
    std::string parameter, entry;
    PutString(&parameter, 1, value);
    PutString(&entry, 1, key);
    PutBytes(&entry, 2, parameter);
    PutBytes(&o, 14, entry);
  }
  return o;
}

}  // namespace serving
}  // namespace paddle_ipu
