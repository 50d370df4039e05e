// The JSON of the GET routes that describe the server and the model: server and
// model metadata, Triton's model configuration (the repository index is the
// server's: server.h); and the same metadata as the gRPC service's messages
// (ServerMetadataResponse, ModelMetadataResponse: grpc_control.cc answers with them).
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

}  // namespace serving
}  // namespace paddle_ipu
