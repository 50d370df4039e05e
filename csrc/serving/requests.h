// The infer request parsers of the two protocols: HTTP (a JSON header, with JSON
// tensors or the binary tensor extension) and gRPC (ModelInferRequest at the
// protobuf wire level). Both check the request against the model's plan
// (checks.h) and leave it ready for the queue.
#pragma once

#include <cstdint>
#include <string>
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

// A gRPC control request's fields (ServerLive ... ModelStatistics: see
// Server::GrpcControl): its strings (wire type 2) and integers (wire type 0) by field
// number, 1 and 2 (every such request has at most two); other fields are passed over,
// as protobuf's parsers do. The strings point into the message.
struct ControlFields {
  std::string_view text[3];
  uint64_t number[3] = {0, 0, 0};
};
// False (with `why`) when the bytes are no message, or a string field is not UTF-8.
bool ParseGrpcControl(std::string_view msg, ControlFields* f, std::string* why);

}  // namespace serving
}  // namespace paddle_ipu
