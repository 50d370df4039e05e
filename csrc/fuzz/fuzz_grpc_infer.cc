// libFuzzer: the gRPC ModelInferRequest decoder (grpc_request.cc, protobuf.h): typed
// contents and raw_input_contents. Input: one byte choosing the plan (fuzz_plans.h),
// then the serialized message (model_name "m" for the fixed plans, "d" the dynamic).
#include "../serving/requests.h"
#include "fuzz_plans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paddle_ipu::serving;
  if (size < 1) return 0;
  const ModelPlan& m = fuzz::Plan(data[0]);
  const std::string msg(reinterpret_cast<const char*>(data + 1), size - 1);
  InferRequest r;
  if (!ParseGrpcInfer(m, msg, &r)) fuzz::Touch(m, r);
  return 0;
}
