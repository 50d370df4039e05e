// Kernels of the "ipu" device for Paddle's data transforms in eager mode.
//
// An op with no ipu kernel falls back to Paddle's CPU kernel: Paddle copies its inputs to
// the CPU and the outputs back. Three lookups have no such fallback for custom devices
// (paddle/phi/api/lib/data_transform.cc, Paddle 3.3): making a strided view contiguous
// ("contiguous"), casting an input to the dtype a kernel wants ("cast", whose CPU fallback
// would be called with the ipu device context), and writing into a strided view
// ("strided_copy"). Without them `paddle.concat` of a transposed ipu tensor raised
// "kernel contiguous is not registered".
//
// The emulated IPU's memory is host memory, so each kernel here runs Paddle's own CPU
// kernel on the same memory: its tensors are re-labelled as CPU tensors (an Allocation
// over the same bytes that owns nothing), and the CPU kernel is called with the CPU
// device context. The results are bit for bit those of the CPU.
//
// Built against the installed Paddle's headers and linked to its libphi_core, so this
// library matches exactly one Paddle release; paddle_ipu loads it at import
// (paddle_ipu.device.register_kernels) and reports a clear error if it cannot.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "paddle/phi/backends/context_pool.h"
#include "paddle/phi/backends/custom/custom_context.h"
#include "paddle/phi/core/custom_kernel.h"
#include "paddle/phi/core/kernel_factory.h"
#include "paddle/phi/core/kernel_registry.h"

namespace paddle_ipu {
namespace {

// A DenseTensor over the same bytes as `tensor`, labelled as CPU memory.
phi::DenseTensor OnCpu(const phi::DenseTensor& tensor) {
  const auto& holder = tensor.Holder();
  if (holder == nullptr) {
    phi::DenseTensor empty;
    empty.set_meta(tensor.meta());
    return empty;
  }
  return phi::DenseTensor(
      std::make_shared<phi::Allocation>(holder->ptr(), holder->size(), phi::CPUPlace()),
      tensor.meta());
}

const phi::Kernel& CpuKernel(const char* name, phi::DataType dtype) {
  return phi::KernelFactory::Instance().SelectKernel(
      name, phi::KernelKey(phi::Backend::CPU, phi::DataLayout::ALL_LAYOUT, dtype));
}

phi::DeviceContext& CpuContext() {
  return *phi::DeviceContextPool::Instance().Get(phi::CPUPlace());
}

// After the CPU kernel wrote into `alias` (which shares `out`'s memory), give `out` the
// meta the kernel set. Should the kernel have allocated new memory instead, copy it over.
void Adopt(const phi::DenseTensor& alias, phi::DenseTensor* out) {
  const auto& mine = out->Holder();
  const auto& theirs = alias.Holder();
  if (theirs != nullptr && mine != nullptr && theirs->ptr() != mine->ptr()) {
    PADDLE_ENFORCE_LE(
        theirs->size(), mine->size(),
        common::errors::External("paddle-ipu: the CPU kernel allocated %d bytes, more than "
                                 "the %d of the ipu output",
                                 theirs->size(), mine->size()));
    std::memcpy(mine->ptr(), theirs->ptr(), theirs->size());
  }
  out->set_meta(alias.meta());
}

}  // namespace

template <typename T, typename Context>
void ContiguousKernel(const Context& dev_ctx, const phi::DenseTensor& input,
                      phi::DenseTensor* out) {
  phi::DenseTensorMeta meta = input.meta();
  meta.strides = meta.calc_strides(meta.dims);
  meta.offset = 0;
  out->set_meta(meta);
  dev_ctx.template Alloc<T>(out);
  const phi::Kernel& kernel = CpuKernel("contiguous", input.dtype());
  using Fn = void (*)(const phi::DeviceContext&, const phi::DenseTensor&, phi::DenseTensor*);
  phi::DenseTensor in = OnCpu(input);
  phi::DenseTensor result = OnCpu(*out);
  (*kernel.GetVariadicKernelFn<Fn>())(CpuContext(), in, &result);
  Adopt(result, out);
}

template <typename T, typename Context>
void CastKernel(const Context& dev_ctx, const phi::DenseTensor& x, phi::DataType out_dtype,
                phi::DenseTensor* out) {
  phi::DenseTensorMeta meta(out_dtype, x.dims());
  out->set_meta(meta);
  dev_ctx.Alloc(out, out_dtype);
  const phi::Kernel& kernel = CpuKernel("cast", x.dtype());
  using Fn = void (*)(const phi::DeviceContext&, const phi::DenseTensor&, phi::DataType,
                      phi::DenseTensor*);
  phi::DenseTensor in = OnCpu(x);
  phi::DenseTensor result = OnCpu(*out);
  (*kernel.GetVariadicKernelFn<Fn>())(CpuContext(), in, out_dtype, &result);
  Adopt(result, out);
}

template <typename T, typename Context>
void StridedCopyKernel(const Context& dev_ctx, const phi::DenseTensor& input,
                       const std::vector<int64_t>& dims, const std::vector<int64_t>& out_stride,
                       int64_t offset, phi::DenseTensor* out) {
  if (out->Holder() == nullptr) {
    // Paddle's kernels allocate the output when it has no memory yet; do it on the ipu.
    phi::DenseTensorMeta meta = input.meta();
    meta.dims = common::make_ddim(dims);
    meta.strides = common::make_ddim(out_stride);
    meta.offset = offset;
    out->set_meta(meta);
    dev_ctx.template Alloc<T>(out);
  }
  const phi::Kernel& kernel = CpuKernel("strided_copy", input.dtype());
  using Fn = void (*)(const phi::DeviceContext&, const phi::DenseTensor&,
                      const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t,
                      phi::DenseTensor*);
  phi::DenseTensor in = OnCpu(input);
  phi::DenseTensor result = OnCpu(*out);
  (*kernel.GetVariadicKernelFn<Fn>())(CpuContext(), in, dims, out_stride, offset, &result);
  Adopt(result, out);
}

}  // namespace paddle_ipu

#define PADDLE_IPU_ALL_DTYPES                                                            \
  bool, uint8_t, int8_t, int16_t, int, int64_t, float, double, phi::dtype::float16,      \
      phi::dtype::bfloat16, phi::dtype::complex<float>, phi::dtype::complex<double>

PD_REGISTER_PLUGIN_KERNEL(contiguous, ipu, ALL_LAYOUT, paddle_ipu::ContiguousKernel,
                          PADDLE_IPU_ALL_DTYPES) {}

PD_REGISTER_PLUGIN_KERNEL(cast, ipu, ALL_LAYOUT, paddle_ipu::CastKernel,
                          PADDLE_IPU_ALL_DTYPES) {
  kernel->OutputAt(0).SetDataType(phi::DataType::UNDEFINED);
}

PD_REGISTER_PLUGIN_KERNEL(strided_copy, ipu, ALL_LAYOUT, paddle_ipu::StridedCopyKernel,
                          PADDLE_IPU_ALL_DTYPES) {}

// Moves the kernels registered above from Paddle's pending custom-kernel map into its
// kernel factory (Paddle does this itself only for the libraries it loads from
// CUSTOM_DEVICE_ROOT, at `import paddle`). A kernel Paddle already has for a key is kept.
// Returns how many kernels were added.
extern "C" __attribute__((visibility("default"))) int paddle_ipu_register_kernels() {
  auto& pending = phi::CustomKernelMap::Instance().Kernels();
  auto& kernels = phi::KernelFactory::Instance().kernels();
  int added = 0;
  for (auto& by_name : pending) {
    auto& slot = kernels[by_name.first];
    for (auto& by_key : by_name.second) {
      if (slot.find(by_key.first) == slot.end()) {
        slot[by_key.first] = by_key.second;
        ++added;
      }
    }
  }
  pending.clear();
  return added;
}
