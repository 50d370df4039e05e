// The gRPC calls the Python side answers (ModelConfig, ModelStatistics, the
// repository's load / unload; see server.h): a queue it
// (paddle_ipu/serving/grpc_service.py) takes them from; each answer is posted back to
// the connection's IO thread by the job's `done`.
#include "server.h"

namespace paddle_ipu {
namespace serving {

namespace {
constexpr int kUnavailable = 14;
}  // namespace

bool Server::GrpcUnary(std::shared_ptr<GrpcUnaryJob> job) {
  return unary_jobs_.Push(std::move(job));
}

std::shared_ptr<GrpcUnaryJob> Server::NextGrpcUnary(double timeout) {
  return unary_jobs_.Next(timeout);
}

void Server::GrpcUnaryDone(int64_t id, int code, std::string message, std::string body) {
  if (auto job = unary_jobs_.Take(id)) job->done(code, std::move(message), std::move(body));
}

void Server::CloseGrpcUnary() {
  for (auto& job : unary_jobs_.Close()) job->done(kUnavailable, kShuttingDown, std::string());
}

}  // namespace serving
}  // namespace paddle_ipu
