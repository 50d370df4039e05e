// libFuzzer: the reader of the gRPC control requests answered in C++ (ServerLive,
// ModelReady, ModelMetadata, RepositoryIndex, ModelConfig, ModelStatistics, ...:
// ParseGrpcControl in grpc_request.cc, protobuf.h).
// Input: the serialized message. A message read is answered as Server::GrpcControl
// answers RepositoryIndex, from the strings it read.
#include "../serving/protobuf.h"
#include "../serving/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace paddle_ipu::serving;
  const std::string msg(reinterpret_cast<const char*>(data), size);
  ControlFields f;
  std::string why;
  if (!ParseGrpcControl(msg, &f, &why)) {
    if (why.empty()) __builtin_trap();  // a refusal says why
    return 0;
  }
  std::string model, answer;
  PutString(&model, 1, f.text[1]);
  PutString(&model, 2, f.text[2]);
  PutBool(&model, 3, f.number[2] != 0);
  PutBytes(&answer, 1, model);
  // the answer reads back as the strings written
  ControlFields back;
  if (!ParseGrpcControl(model, &back, &why) || back.text[1] != f.text[1] ||
      back.text[2] != f.text[2]) {
    __builtin_trap();
  }
  return 0;
}
