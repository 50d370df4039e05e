// The JSON of the GET routes that describe the server and the model: server and
// model metadata, Triton's model configuration (the repository index is the
// server's: server.h); and the same as the gRPC service's messages
// (ServerMetadataResponse, ModelMetadataResponse, model_config.proto's ModelConfig:
// grpc_control.cc answers with them).
#pragma once

#include <string>
#include <vector>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

std::string ServerMetadataJson(const std::string& server_version);
std::string ServerMetadataMessage(const std::string& server_version);
// `versions`: what the answer lists (the model's READY versions).
std::string ModelMetadataMessage(const ModelPlan& m, const std::vector<std::string>& versions);
std::string ModelMetadataJson(const ModelPlan& m);
std::string ModelConfigJson(const ModelPlan& m);
// The same configuration as model_config.proto's ModelConfig (tritonclient's
// model_config_pb2): every field ModelConfigJson writes that the message has, from the
// same plan; "" with `why` set when a value does not fit its field (an int32 or
// uint32 of the message).
std::string ModelConfigMessage(const ModelPlan& m, std::string* why);

}  // namespace serving
}  // namespace paddle_ipu
