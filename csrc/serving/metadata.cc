// Server and model metadata, the model configuration (see metadata.h).
#include "metadata.h"

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
      std::string tensor, shape;
      PutString(&tensor, 1, t.name);
      PutString(&tensor, 2, V2Name(t.dtype));
      for (int64_t d : t.shape) PutVarint(&shape, static_cast<uint64_t>(d));
      if (!shape.empty()) PutBytes(&tensor, 3, shape);  // packed, as proto3 writes it
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
  s += ",\"instance_group\":[{\"name\":" + Quote(m.name) + ",\"count\":" + std::to_string(m.instance_count) +
       ",\"kind\":" + Quote(m.instance_kind) + "}]";
  s += ",\"parameters\":{\"micro_batch_size\":{\"string_value\":\"" +
       std::to_string(m.micro_batch_size) + "\"},\"auto_batching\":{\"string_value\":\"" +
       (m.auto_batch ? "true" : "false") + "\"}}";
  return s + "}";
}

}  // namespace serving
}  // namespace paddle_ipu
