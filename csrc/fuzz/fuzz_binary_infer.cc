// libFuzzer: the binary tensor extension (http_request.cc): a JSON header, then raw
// tensors. Input: one byte choosing the plan (fuzz_plans.h), two bytes (big-endian)
// the JSON header's length (Inference-Header-Content-Length), then the body.
#include <algorithm>

#include "../serving/requests.h"
#include "fuzz_plans.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paddle_ipu::serving;
  if (size < 3) return 0;
  const ModelPlan& m = fuzz::Plan(data[0]);
  // A copy of exactly the body: a read past it is ASan's to see.
  const std::string body(reinterpret_cast<const char*>(data + 3), size - 3);
  const size_t length = std::min<size_t>((size_t{data[1]} << 8) | data[2], body.size());
  InferRequest r;
  const std::string_view all(body);
  if (!ParseHttpInfer(m, all.substr(0, length), all.substr(length), &r)) fuzz::Touch(m, r);
  return 0;
}
