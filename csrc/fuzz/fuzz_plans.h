// What the fuzz harnesses of the serving decoders share: the model plans a request is
// decoded for (chosen by the input's first byte), and the reading of every byte a
// decoded request says it holds, so that AddressSanitizer sees a size that is wrong.
//
// Plans: 0, auto-batching: x FP32 [-1, 4], ids INT32 [-1, 2] (index range [0, 5) or
// -100); 1, one micro-batch of 8 rows, no batching (the same tensors); 2, dynamic,
// open dimensions: x FP32 [-1, -1], s BYTES [-1], u UINT8 [-1], b BOOL [-1],
// h FP16 [-1, 2].
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "../serving/plan.h"

namespace paddle_ipu {
namespace serving {
namespace fuzz {

inline TensorPlan Tensor(const char* name, DType t, std::vector<int64_t> shape, int64_t unit) {
  TensorPlan p;
  p.name = name;
  p.dtype = t;
  p.shape = std::move(shape);
  p.unit_bytes = unit * ElemSize(t);
  p.unit_elems = unit;
  return p;
}

inline ModelPlan Fixed(bool auto_batch) {
  ModelPlan m;
  m.name = "m";
  m.auto_batch = auto_batch;
  m.micro_batch_size = 8;
  m.max_rows = auto_batch ? 32 : 8;
  m.capacity = auto_batch ? 8 : 1;
  m.limit = 4 * m.capacity;
  const int64_t lead = auto_batch ? -1 : 8, rows = auto_batch ? 1 : 8;
  m.inputs.push_back(Tensor("x", DType::kFp32, {lead, 4}, 4 * rows));
  m.inputs.push_back(Tensor("ids", DType::kInt32, {lead, 2}, 2 * rows));
  IndexRange r;
  r.low = 0;
  r.high = 5;
  r.allowed = {-100};
  r.describe = "[0, 5)";
  m.inputs.back().ranges.push_back(r);
  m.outputs.push_back(Tensor("y", DType::kFp32, {lead, 3}, 3 * rows));
  return m;
}

inline ModelPlan Dynamic() {
  ModelPlan m;
  m.name = "d";
  m.dynamic = true;
  m.inputs.push_back(Tensor("x", DType::kFp32, {-1, -1}, 0));
  m.inputs.push_back(Tensor("s", DType::kBytes, {-1}, 0));
  m.inputs.push_back(Tensor("u", DType::kUint8, {-1}, 0));
  m.inputs.push_back(Tensor("b", DType::kBool, {-1}, 0));
  m.inputs.push_back(Tensor("h", DType::kFp16, {-1, 2}, 0));
  m.outputs.push_back(Tensor("y", DType::kFp32, {-1, -1}, 0));
  return m;
}

inline const ModelPlan& Plan(uint8_t which) {
  static const ModelPlan plans[3] = {Fixed(true), Fixed(false), Dynamic()};
  return plans[which % 3];
}

// Reads every byte of every input of a decoded request (fixed plans: its units; a
// dynamic plan: its shapes, BYTES element by element) and checks what the queue and
// the handler rely on; a violation traps.
inline void Touch(const ModelPlan& m, const InferRequest& r) {
  static volatile uint8_t sink;
  uint8_t acc = 0;
  auto read = [&](const char* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc ^= static_cast<uint8_t>(p[i]);
  };
  if (r.in.size() != m.inputs.size() || r.in_shapes.size() != m.inputs.size()) __builtin_trap();
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    const TensorPlan& t = m.inputs[k];
    if (!r.in[k]) __builtin_trap();
    if (!m.dynamic) {
      if (r.units < 0 || r.units * t.unit_bytes > (int64_t{1} << 32)) __builtin_trap();
      read(r.in[k], r.units * t.unit_bytes);
      continue;
    }
    const int64_t n = Elements(r.in_shapes[k]);
    if (t.dtype != DType::kBytes) {
      read(r.in[k], n * ElemSize(t.dtype));
      continue;
    }
    const char* p = r.in[k];
    for (int64_t i = 0; i < n; ++i) {  // as the handler's BytesArray walks them
      uint32_t len;
      std::memcpy(&len, p, 4);
      read(p, 4 + static_cast<int64_t>(len));
      p += 4 + len;
    }
  }
  if (!m.dynamic && m.auto_batch && (r.units != r.rows || r.rows > m.max_rows)) __builtin_trap();
  sink = acc;
}

}  // namespace fuzz
}  // namespace serving
}  // namespace paddle_ipu
