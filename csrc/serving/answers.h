// The answers to an infer request, the one place KServe answers are written: the HTTP
// response body (a JSON header, with JSON tensors or the binary tensor extension) and
// the serialized ModelInferResponse. A fixed model's are laid out before the run where
// they can be, so that the queue writes the outputs straight into them; a dynamic
// model's (dynamic.h) are rendered after it, from the outputs its handler gave.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// A body and, per model output, where the queue writes it: into the body, or into
// scratch memory for outputs the body does not hold (yet, or at all).
struct Answer {
  std::string body;
  std::vector<char*> out;
  std::vector<std::vector<char>> scratch;
};

// The response body of an HTTP infer request, laid out before the run when every
// wanted output is binary.
struct HttpAnswer : Answer {
  int64_t header_length = -1;  // Inference-Header-Content-Length; -1: all JSON
  bool laid_out = false;
};
void StartHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a);
// After the run, when the answer was not laid out before it: render it.
void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a);

// The serialized inference.ModelInferResponse, always laid out before the run
// (outputs go to raw_output_contents).
using GrpcAnswer = Answer;
void StartGrpcAnswer(const ModelPlan& m, const InferRequest& r, GrpcAnswer* a);

// A dynamic model's answers, from its handler's outputs (one per model output, of the
// shapes the handler gave).
void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r,
                      const std::vector<OutTensor>& outputs, HttpAnswer* a);
void FinishGrpcAnswer(const ModelPlan& m, const InferRequest& r,
                      const std::vector<OutTensor>& outputs, GrpcAnswer* a);

}  // namespace serving
}  // namespace paddle_ipu
