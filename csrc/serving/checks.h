// The checks of an infer request against the model's plan, shared by the HTTP and
// the gRPC parsers, as the model runtime checks a feed: input and output names,
// datatypes (and the casts a feed may take), shapes, the int32 fit and index ranges.
//
// Every error message names the input (or output) and says what was expected and
// what was received, as paddle_ipu.errors.FeedError does.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "plan.h"

namespace paddle_ipu {
namespace serving {

// The index of the tensor called `name`, or ts.size().
size_t FindTensor(const std::vector<TensorPlan>& ts, std::string_view name);

// Sizes the request's per-input vectors for the model's inputs.
void StartRequest(const ModelPlan& m, InferRequest* r);
// Input `name` of a request: its index in the model's inputs, seen once.
Error ClaimInput(const ModelPlan& m, std::string_view name, std::vector<char>* seen, size_t* k);
// Every input of the model was given.
Error MissingInputs(const ModelPlan& m, const std::vector<char>& seen);
// The error of a datatype `given` that input `t` does not take.
Error DatatypeError(const TensorPlan& t, std::string_view given);

// The shape check of one input; sets the request's units and rows. `first` names
// the first input checked (empty before it).
Error CheckShape(const ModelPlan& m, const TensorPlan& t, const std::vector<int64_t>& dims,
                 InferRequest* r, std::string* first);
// After the bytes of input k (of dtype `from`) are at `data`: the cast, the int32
// fit and the index ranges; sets r->in[k].
Error FinishInput(const TensorPlan& t, DType from, const char* data, size_t k, InferRequest* r);

// The error of an output the model does not have, shown as `shown`.
Error UnknownOutput(const ModelPlan& m, const std::string& shown);
// Asks for output `idx` of the model (once).
Error WantOutput(const ModelPlan& m, size_t idx, bool binary, InferRequest* r);
// Asks for every output of the model.
void WantAll(const ModelPlan& m, bool binary, InferRequest* r);

// A request-level parameter other than the ones the parsers implement (timeout,
// binary_data_output): Triton's reserved ones (priority, sequence_id,
// sequence_start, sequence_end) pass only with their default value (`is_default`:
// 0, "" or false, which asks for what this server does); any other name is refused,
// as there is no backend to hand a custom parameter to.
Error OtherParameter(std::string_view name, bool is_default);

}  // namespace serving
}  // namespace paddle_ipu
