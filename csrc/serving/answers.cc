// The infer answers of both protocols, of fixed and dynamic models (see answers.h).
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
void PutOutputHead(const TensorPlan& t, const std::vector<int64_t>& shape, std::string* b) {
  *b += "{\"name\":" + Quote(t.name) + ",\"datatype\":\"" + V2Name(t.dtype) + "\",\"shape\":" +
        ShapeStr(shape);
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

// A ModelInferResponse up to its raw_output_contents: the model, the id, and each
// wanted output's name, datatype and shape (`shape_of`: of model output k).
template <typename ShapeOf>
void PutGrpcHead(const ModelPlan& m, const InferRequest& r, ShapeOf shape_of, std::string* b) {
  b->clear();
  PutBytes(b, 1, m.name);
  PutBytes(b, 2, m.version);
  if (!r.id.empty()) PutBytes(b, 3, r.id);
  for (int idx : r.want) {
    const TensorPlan& t = m.outputs[static_cast<size_t>(idx)];
    std::string o, packed;
    PutBytes(&o, 1, t.name);
    PutBytes(&o, 2, V2Name(t.dtype));
    for (int64_t d : shape_of(static_cast<size_t>(idx))) {
      PutVarint(&packed, static_cast<uint64_t>(d));
    }
    PutBytes(&o, 3, packed);
    PutBytes(b, 5, o);
  }
}

// An output as the run left it: its shape and bytes.
struct Produced {
  std::vector<int64_t> shape;
  std::string_view data;
};

// The HTTP answer rendered after the run, from every model output's Produced (`out`,
// indexed by model output): JSON data, or the binary tensor extension's bytes after
// the JSON header.
void RenderHttpAnswer(const ModelPlan& m, const InferRequest& r, const std::vector<Produced>& out,
                      HttpAnswer* a) {
  std::string& b = a->body;
  StartJsonHead(m, r, &b);
  bool any_binary = false;
  for (size_t i = 0; i < r.want.size(); ++i) {
    const size_t k = static_cast<size_t>(r.want[i]);
    const TensorPlan& t = m.outputs[k];
    const Produced& o = out[k];
    if (i) b += ",";
    PutOutputHead(t, o.shape, &b);
    if (r.binary[i]) {
      any_binary = true;
      b += BinarySize(static_cast<int64_t>(o.data.size()));
    } else {
      b += ",\"data\":";
      if (t.dtype == DType::kBytes) {
        RenderJsonBytes(o.data, &b);
      } else {
        RenderJsonData(t.dtype, o.data.data(),
                       static_cast<int64_t>(o.data.size()) / ElemSize(t.dtype), &b);
      }
      b += "}";
    }
  }
  b += "]}";
  a->header_length = -1;
  if (any_binary) {
    a->header_length = static_cast<int64_t>(b.size());
    for (size_t i = 0; i < r.want.size(); ++i) {
      if (r.binary[i]) b += out[static_cast<size_t>(r.want[i])].data;
    }
  }
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
      PutOutputHead(t, AnswerShape(m, t, r), &b);
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
  // The outputs are in scratch memory (not laid out: none is in the body).
  std::vector<Produced> out(m.outputs.size());
  for (int idx : r.want) {
    const size_t k = static_cast<size_t>(idx);
    out[k] = {AnswerShape(m, m.outputs[k], r),
              std::string_view(a->out[k], static_cast<size_t>(AnswerBytes(m.outputs[k], r)))};
  }
  RenderHttpAnswer(m, r, out, a);
}

void FinishHttpAnswer(const ModelPlan& m, const InferRequest& r,
                      const std::vector<OutTensor>& outputs, HttpAnswer* a) {
  std::vector<Produced> out(m.outputs.size());
  for (int idx : r.want) {
    const size_t k = static_cast<size_t>(idx);
    out[k] = {outputs[k].shape, outputs[k].data};
  }
  RenderHttpAnswer(m, r, out, a);
}

void StartGrpcAnswer(const ModelPlan& m, const InferRequest& r, GrpcAnswer* a) {
  std::string& b = a->body;
  PutGrpcHead(
      m, r, [&](size_t k) { return AnswerShape(m, m.outputs[k], r); }, &b);
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

void FinishGrpcAnswer(const ModelPlan& m, const InferRequest& r,
                      const std::vector<OutTensor>& outputs, GrpcAnswer* a) {
  std::string& b = a->body;
  PutGrpcHead(
      m, r, [&](size_t k) -> const std::vector<int64_t>& { return outputs[k].shape; }, &b);
  for (int idx : r.want) PutBytes(&b, 6, outputs[static_cast<size_t>(idx)].data);
}

}  // namespace serving
}  // namespace paddle_ipu
