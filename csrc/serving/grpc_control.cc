// The control calls of inference.GRPCInferenceService but the repository's load and
// unload, answered on the IO thread from the server's state (see Server::GrpcControl
// in server.h): their requests are read and their answers written with protobuf.h,
// as tritonclient's generated messages (service_pb2, model_config_pb2) spell them.
#include <algorithm>

#include "metadata.h"
#include "protobuf.h"
#include "requests.h"
#include "server.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

constexpr int kOk = 0, kInvalidArgument = 3, kNotFound = 5, kUnimplemented = 12,
              kInternal = 13, kUnavailable = 14;

// RPCs of the service this server does not offer.
constexpr std::string_view kUnoffered[] = {
    "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",   "CudaSharedMemoryRegister",   "CudaSharedMemoryUnregister",
    "TraceSetting",             "LogSettings"};
// RPCs the Python side answers (paddle_ipu/serving/grpc_service.py): they drive its
// model repository.
constexpr std::string_view kPython[] = {"RepositoryModelLoad", "RepositoryModelUnload"};

// A model's error as gRPC's code: 503 (loading) UNAVAILABLE, else (404) NOT_FOUND.
int ModelCode(const Error& e) { return e.status == 503 ? kUnavailable : kNotFound; }

}  // namespace

bool Server::GrpcControl(std::string_view method, std::string_view msg, int* code,
                         std::string* message, std::string* answer) const {
  *code = kOk;
  message->clear();
  answer->clear();
  if (std::find(std::begin(kPython), std::end(kPython), method) != std::end(kPython)) {
    return false;
  }
  if (std::find(std::begin(kUnoffered), std::end(kUnoffered), method) != std::end(kUnoffered)) {
    *code = kUnimplemented;
    *message = std::string(method) +
               " is not offered by paddle-ipu's server (no shared memory, trace or log "
               "settings)";
    return true;
  }
  const bool known = method == "ServerLive" || method == "ServerReady" ||
                     method == "ModelReady" || method == "ServerMetadata" ||
                     method == "ModelMetadata" || method == "RepositoryIndex" ||
                     method == "ModelConfig" || method == "ModelStatistics";
  if (!known) {
    *code = kUnimplemented;
    *message = "inference.GRPCInferenceService has no method " + Repr(ValidUtf8(method));
    return true;
  }
  ControlFields f;
  std::string why;
  if (!ParseGrpcControl(msg, &f, &why)) {
    *code = kInvalidArgument;
    *message = "malformed " + std::string(method) + " request: " + why;
    return true;
  }
  if (method == "ServerLive") {
    PutBool(answer, 1, true);
  } else if (method == "ServerReady") {
    PutBool(answer, 1, ready());
  } else if (method == "ModelReady") {
    Error e;
    const std::shared_ptr<FrontEnd> fe = Find(f.text[1], f.text[2], &e, true);
    PutBool(answer, 1, fe && fe->ready());
  } else if (method == "ServerMetadata") {
    *answer = ServerMetadataMessage(server_version_);
  } else if (method == "ModelMetadata") {
    Error e;
    const std::shared_ptr<FrontEnd> fe = Find(f.text[1], f.text[2], &e, true);
    if (!fe) {
      *code = ModelCode(e);
      *message = e.message;
      return true;
    }
    // Every READY version of the model is listed (as MetadataJson does).
    std::vector<std::string> versions;
    for (const ModelEntry& entry : Entries()) {
      if (entry.name == fe->plan().name && entry.state == "READY") {
        versions.push_back(entry.version);
      }
    }
    if (versions.empty()) versions.push_back(fe->plan().version);
    *answer = ModelMetadataMessage(fe->plan(), versions);
  } else if (method == "ModelConfig") {  // ModelConfigResponse: the config (1)
    Error e;
    const std::shared_ptr<FrontEnd> fe = Find(f.text[1], f.text[2], &e, true);
    if (!fe) {
      *code = ModelCode(e);
      *message = e.message;
    } else if (!fe->config_refused().empty()) {
      *code = kInternal;
      *message = "ModelConfig of " + Repr(fe->plan().name) + ": " + fe->config_refused();
    } else {
      PutBytes(answer, 1, fe->config_message());
    }
  } else if (method == "ModelStatistics") {
    // Every model's ("" name), every version's ("" version), or one version's.
    Error e;
    *answer = StatisticsMessage(f.text[1], f.text[2], &e);
    if (e) {
      *code = ModelCode(e);
      *message = e.message;
    }
  } else {  // RepositoryIndex: every entry, or (ready) the READY ones
    for (const ModelEntry& entry : Entries()) {
      if (f.number[2] && entry.state != "READY") continue;
      std::string model;
      PutString(&model, 1, entry.name);
      PutString(&model, 2, entry.version);
      PutString(&model, 3, entry.state);
      PutString(&model, 4, entry.reason);
      PutBytes(answer, 1, model);
    }
  }
  return true;
}

}  // namespace serving
}  // namespace paddle_ipu
