// The infer request parsers of the two protocols: HTTP (a JSON header, with JSON
// tensors or the binary tensor extension) and gRPC (ModelInferRequest at the
// protobuf wire level). Both check the request against the model's plan
// (checks.h) and leave it ready for the queue.
#pragma once

#include <string_view>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// `head` is the JSON header, `blob` the binary tensors after it (empty without the
// binary extension). Inputs may point into blob: keep it alive.
Error ParseHttpInfer(const ModelPlan& m, std::string_view head, std::string_view blob,
                     InferRequest* r);
// A serialized inference.ModelInferRequest. Inputs may point into msg.
Error ParseGrpcInfer(const ModelPlan& m, std::string_view msg, InferRequest* r);

}  // namespace serving
}  // namespace paddle_ipu
