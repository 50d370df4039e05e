// The infer answers of both protocols (see answers.h).
#include "answers.h"

#include "json_tensors.h"
#include "protobuf.h"
#include "text.h"

namespace paddle_ipu {
namespace serving {

namespace {

std::vector<int64_t> AnswerShape(const ModelPlan& m, const TensorPlan& t, const InferRequest& r) {
  std::vector<int64_t> shape = t.shape;
  if (m.auto_batch && !shape.empty()) shape[0] = r.rows;
  return shape;
}

int64_t AnswerBytes(const TensorPlan& t, const InferRequest& r) { return r.units * t.unit_bytes; }

// The JSON header up to its outputs' list: {"model_name":...,"outputs":[
void StartJsonHead(const ModelPlan& m, const InferRequest& r, std::string* b) {
  b->clear();
  *b += "{\"model_name\":" + Quote(m.name) + ",\"model_version\":" + Quote(m.version);
  if (!r.id.empty()) *b += ",\"id\":" + Quote(r.id);
  *b += ",\"outputs\":[";
}

// One output's object in the JSON header, up to its shape: {"name":...,"shape":[...]
void PutOutputHead(const ModelPlan& m, const TensorPlan& t, const InferRequest& r,
                   std::string* b) {
  *b += "{\"name\":" + Quote(t.name) + ",\"datatype\":\"" + V2Name(t.dtype) + "\",\"shape\":" +
        ShapeStr(AnswerShape(m, t, r));
}

std::string BinarySize(int64_t bytes) {
  return ",\"parameters\":{\"binary_data_size\":" + std::to_string(bytes) + "}}";
}

// Scratch memory for the outputs that have no place in the body (`at`: their offset
// in the body, or -1).
void PlaceOutputs(const ModelPlan& m, const InferRequest& r, const std::vector<int64_t>& at,
                  Answer* a) {
  const size_t nout = m.outputs.size();
  a->out.assign(nout, nullptr);
  a->scratch.assign(nout, {});
  for (size_t i = 0; i < nout; ++i) {
    if (at[i] >= 0) {
      a->out[i] = a->body.data() + at[i];
    } else {
      a->scratch[i].resize(static_cast<size_t>(AnswerBytes(m.outputs[i], r)));
      a->out[i] = a->scratch[i].data();
    }
  }
}

void PutTensorHead(std::string* o, const TensorPlan& t, const std::vector<int64_t>& shape) {
  PutBytes(o, 1, t.name);
  PutBytes(o, 2, V2Name(t.dtype));
  std::string packed;
  for (int64_t d : shape) PutVarint(&packed, static_cast<uint64_t>(d));
  PutBytes(o, 3, packed);
}

}  // namespace

void StartHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a) {
  const size_t nout = m.outputs.size();
  bool all_binary = true;
  for (char b : r.binary) all_binary &= b != 0;
  a->laid_out = all_binary;
  std::vector<int64_t> at(nout, -1);
  if (all_binary) {
    std::string& b = a->body;
    StartJsonHead(m, r, &b);
    int64_t total = 0;
    for (size_t i = 0; i < r.want.size(); ++i) {
      const TensorPlan& t = m.outputs[static_cast<size_t>(r.want[i])];
      const int64_t bytes = AnswerBytes(t, r);
      if (i) b += ",";
      PutOutputHead(m, t, r, &b);
      b += BinarySize(bytes);
      at[static_cast<size_t>(r.want[i])] = total;
      total += bytes;
    }
    b += "]}";
    a->header_length = static_cast<int64_t>(b.size());
    b.resize(b.size() + static_cast<size_t>(total));
    for (int64_t& x : at) {
      if (x >= 0) x += a->header_length;
    }
  }
  PlaceOutputs(m, r, at, a);
}

void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r, HttpAnswer* a) {
  if (a->laid_out) return;
  std::string& b = a->body;
  StartJsonHead(m, r, &b);
  bool any_binary = false;
  for (size_t i = 0; i < r.want.size(); ++i) {
    const TensorPlan& t = m.outputs[static_cast<size_t>(r.want[i])];
    const int64_t bytes = AnswerBytes(t, r);
    if (i) b += ",";
    PutOutputHead(m, t, r, &b);
    if (r.binary[i]) {
      any_binary = true;
      b += BinarySize(bytes);
    } else {
      b += ",\"data\":";
      RenderJsonData(t.dtype, a->out[static_cast<size_t>(r.want[i])], bytes / ElemSize(t.dtype),
                     &b);
      b += "}";
    }
  }
  b += "]}";
  a->header_length = -1;
  if (any_binary) {
    a->header_length = static_cast<int64_t>(b.size());
    for (size_t i = 0; i < r.want.size(); ++i) {
      if (!r.binary[i]) continue;
      const size_t k = static_cast<size_t>(r.want[i]);
      b.append(a->out[k], static_cast<size_t>(AnswerBytes(m.outputs[k], r)));
    }
  }
}

void StartGrpcAnswer(const ModelPlan& m, const InferRequest& r, GrpcAnswer* a) {
  std::string& b = a->body;
  b.clear();
  PutBytes(&b, 1, m.name);
  PutBytes(&b, 2, m.version);
  if (!r.id.empty()) PutBytes(&b, 3, r.id);
  for (int idx : r.want) {
    const TensorPlan& t = m.outputs[static_cast<size_t>(idx)];
    std::string o;
    PutTensorHead(&o, t, AnswerShape(m, t, r));
    PutBytes(&b, 5, o);
  }
  std::vector<int64_t> at(m.outputs.size(), -1);
  int64_t total = 0;
  for (int idx : r.want) total += AnswerBytes(m.outputs[static_cast<size_t>(idx)], r) + 16;
  b.reserve(b.size() + static_cast<size_t>(total));
  for (int idx : r.want) {
    const int64_t n = AnswerBytes(m.outputs[static_cast<size_t>(idx)], r);
    PutTag(&b, 6, 2);
    PutVarint(&b, static_cast<uint64_t>(n));
    at[static_cast<size_t>(idx)] = static_cast<int64_t>(b.size());
    b.resize(b.size() + static_cast<size_t>(n));
  }
  PlaceOutputs(m, r, at, a);
}

}  // namespace serving
}  // namespace paddle_ipu
