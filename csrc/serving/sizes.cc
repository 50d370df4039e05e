// Sizes from what a client sent, checked (see sizes.h).
#include "sizes.h"

#include <string>

#include "text.h"

namespace paddle_ipu {
namespace serving {

Error TensorSize(std::string_view name, const std::vector<int64_t>& dims, DType dtype,
                 int64_t max_body, int64_t* count, int64_t* bytes) {
  const int64_t elem = ElemSize(dtype);
  int64_t nonzero = elem > 0 ? elem : 1;  // the bytes the dims would take without zeros
  bool empty = false;
  for (int64_t d : dims) {
    if (d == 0) {
      empty = true;
    } else if (d < 0 || !MulSize(nonzero, d, &nonzero)) {
      return {400, "input " + Repr(name) + ": shape " + ShapeStr(dims) + " of " +
                       V2Name(dtype) + " is larger than a 64-bit size can count"};
    }
  }
  if (empty && nonzero > max_body) {
    return {400, "input " + Repr(name) + ": shape " + ShapeStr(dims) + " of " +
                     V2Name(dtype) + " has no elements, but its other dims take " +
                     std::to_string(nonzero) + " bytes, more than a request may hold (" +
                     std::to_string(max_body) + ", --max-body-mb)"};
  }
  *count = empty ? 0 : (elem > 0 ? nonzero / elem : nonzero);
  *bytes = *count * elem;
  return {};
}

Error ElementsFit(std::string_view name, const std::vector<int64_t>& dims, int64_t count,
                  int64_t min_bytes, int64_t have) {
  int64_t need = 0;
  if (MulSize(count, min_bytes, &need) && need <= have) return {};
  return {400, "input " + Repr(name) + ": shape " + ShapeStr(dims) + " has " +
                   std::to_string(count) + " elements, but the request holds " +
                   std::to_string(have) + " bytes of data for it (at least " +
                   std::to_string(min_bytes) + " an element)"};
}

}  // namespace serving
}  // namespace paddle_ipu
