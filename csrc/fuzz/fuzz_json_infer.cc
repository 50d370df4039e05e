// libFuzzer: the HTTP infer request's JSON decoder (http_request.cc, json_tensors.cc,
// checks.cc). Input: one byte choosing the plan (fuzz_plans.h), then the JSON body.
#include "../serving/requests.h"
#include "fuzz_plans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paddle_ipu::serving;
  if (size < 1) return 0;
  const ModelPlan& m = fuzz::Plan(data[0]);
  const std::string head(reinterpret_cast<const char*>(data + 1), size - 1);
  InferRequest r;
  if (!ParseHttpInfer(m, head, std::string_view(), &r)) fuzz::Touch(m, r);
  return 0;
}
