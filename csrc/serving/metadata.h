// The JSON of the GET routes that describe the server and the model: server and
// model metadata, Triton's model configuration (the repository index is the
// server's: server.h).
#pragma once

#include <string>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

std::string ServerMetadataJson(const ModelPlan& m);
std::string ModelMetadataJson(const ModelPlan& m);
std::string ModelConfigJson(const ModelPlan& m);

}  // namespace serving
}  // namespace paddle_ipu
