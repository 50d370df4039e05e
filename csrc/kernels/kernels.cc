// The "ipu" device's kernels: Paddle's CPU kernels, run on the same memory (forward.h).
//
// Which kernels, and why:
// - Data transforms. Paddle looks these up on the tensor's own device with no CPU
//   fallback for custom devices (Paddle 3.3: data_transform.cc Trans2Contiguous and
//   TransDataType, api_gen_utils.cc TransStride, kernels/funcs/strided_utils.h):
//   contiguous, cast, strided_copy, fill. Without contiguous, `paddle.concat` of a
//   transposed ipu tensor raised "kernel contiguous is not registered".
// - Ops that write in place. Paddle's fallback runs a CPU kernel on a copy and gives
//   the output new memory, so `v = x[1]; v.add_(1)` left x unchanged on the ipu. Every
//   op with an in-place form in Paddle's eager API whose kernel is declared in the
//   installed headers is here, the optimizers' update ops included (rmsprop_ refused the
//   copies: "Param and ParamOut must be the same Tensor").
// - embedding_grad: Paddle's hand-written embedding backward never moves the fallback's
//   CPU result back to the device.
//
// Kernels an older release does not have (its headers declare no such function) are left
// out of the build for that release and reported as skipped (PADDLE_IPU_PADDLE_MINOR, 100
// x major + minor, comes from cmake/paddle.cmake).
//
// Registered at `import paddle_ipu` (paddle_ipu.device.register_kernels) for every dtype
// and layout Paddle has a CPU kernel of that name for, after checking that the CPU
// kernel's arguments are those of the declaration the forwarder was built from.

#ifndef PADDLE_IPU_PADDLE_MINOR
#error "PADDLE_IPU_PADDLE_MINOR (100 x major + minor of the PaddlePaddle built against) is unset: build through CMake"
#endif

#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include "forward.h"
#include "paddle/phi/kernels/abs_kernel.h"
#include "paddle/phi/kernels/accuracy_kernel.h"
#include "paddle/phi/kernels/activation_kernel.h"
#include "paddle/phi/kernels/adadelta_kernel.h"
#include "paddle/phi/kernels/adagrad_kernel.h"
#include "paddle/phi/kernels/adam_kernel.h"
#include "paddle/phi/kernels/adamax_kernel.h"
#include "paddle/phi/kernels/adamw_kernel.h"
#include "paddle/phi/kernels/asgd_kernel.h"
#include "paddle/phi/kernels/bitwise_kernel.h"
#include "paddle/phi/kernels/cast_kernel.h"
#include "paddle/phi/kernels/clip_kernel.h"
#include "paddle/phi/kernels/compare_kernel.h"
#include "paddle/phi/kernels/contiguous_kernel.h"
#include "paddle/phi/kernels/cum_kernel.h"
#include "paddle/phi/kernels/cumprod_kernel.h"
#include "paddle/phi/kernels/digamma_kernel.h"
#include "paddle/phi/kernels/elementwise_add_kernel.h"
#include "paddle/phi/kernels/elementwise_divide_kernel.h"
#include "paddle/phi/kernels/elementwise_kernel.h"
#include "paddle/phi/kernels/elementwise_multiply_kernel.h"
#include "paddle/phi/kernels/elementwise_subtract_kernel.h"
#include "paddle/phi/kernels/embedding_grad_kernel.h"
#include "paddle/phi/kernels/erf_kernel.h"
#include "paddle/phi/kernels/erfinv_kernel.h"
#include "paddle/phi/kernels/exponential_kernel.h"
#include "paddle/phi/kernels/fill_diagonal_kernel.h"
#include "paddle/phi/kernels/fill_diagonal_tensor_kernel.h"
#include "paddle/phi/kernels/fill_kernel.h"
#include "paddle/phi/kernels/gammaln_kernel.h"
#include "paddle/phi/kernels/gaussian_kernel.h"
#include "paddle/phi/kernels/i0_kernel.h"
#include "paddle/phi/kernels/index_add_kernel.h"
#include "paddle/phi/kernels/index_put_kernel.h"
#include "paddle/phi/kernels/lamb_kernel.h"
#include "paddle/phi/kernels/lerp_kernel.h"
#include "paddle/phi/kernels/lgamma_kernel.h"
#include "paddle/phi/kernels/logical_kernel.h"
#if PADDLE_IPU_PADDLE_MINOR >= 301
#include "paddle/phi/kernels/masked_fill_kernel.h"
#endif
#include "paddle/phi/kernels/momentum_kernel.h"
#include "paddle/phi/kernels/polygamma_kernel.h"
#include "paddle/phi/kernels/put_along_axis_kernel.h"
#include "paddle/phi/kernels/renorm_kernel.h"
#include "paddle/phi/kernels/rmsprop_kernel.h"
#include "paddle/phi/kernels/rprop_kernel.h"
#include "paddle/phi/kernels/scale_kernel.h"
#include "paddle/phi/kernels/scatter_kernel.h"
#include "paddle/phi/kernels/selected_rows/adam_kernel.h"
#include "paddle/phi/kernels/selected_rows/adamw_kernel.h"
#include "paddle/phi/kernels/set_value_kernel.h"
#include "paddle/phi/kernels/sgd_kernel.h"
#include "paddle/phi/kernels/strided_copy_kernel.h"
#include "paddle/phi/kernels/tril_triu_kernel.h"
#include "paddle/phi/kernels/trunc_kernel.h"
#include "paddle/phi/kernels/uniform_inplace_kernel.h"
#include "paddle/phi/kernels/where_kernel.h"

namespace paddle_ipu {
namespace {

// What a registration did, for paddle_ipu.device.kernel_report().
struct Report {
  int added = 0;
  std::vector<std::string> skipped;  // "name: why"
};

Report& TheReport() {
  static Report report;
  return report;
}

template <typename T>
constexpr bool kIsInput = Map<T>::kInputs == 1;
template <typename T>
constexpr bool kIsOutput = Map<T>::kOutputs == 1;

template <typename... Args>
struct ArgTypes;

template <typename... Args>
struct ArgTypes<void (*)(const phi::CPUContext&, Args...)> {
  static std::vector<std::type_index> Inputs() {
    std::vector<std::type_index> types;
    ((kIsInput<Args> ? (void)types.emplace_back(typeid(Args)) : void()), ...);
    return types;
  }
  static std::vector<std::type_index> Outputs() {
    std::vector<std::type_index> types;
    ((kIsOutput<Args> ? (void)types.emplace_back(typeid(Args)) : void()), ...);
    return types;
  }
};

// The type a kernel argument definition records: phi's KernelArgsParseFunctor stores
// typeid of the parameter type, which for an output `DenseTensor*` is the pointer type.
template <typename Defs>
bool SameTypes(const Defs& defs, const std::vector<std::type_index>& ours) {
  if (defs.size() != ours.size()) return false;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (defs[i].type_index != ours[i]) return false;
  }
  return true;
}

template <typename Entry, typename Signature>
void Register(phi::Backend ipu) {
  using Fwd = Forward<Entry, Signature>;
  Report& report = TheReport();
  auto& kernels = phi::KernelFactory::Instance().kernels();
  auto by_name = kernels.find(Entry::kName);
  if (by_name == kernels.end()) {
    report.skipped.push_back(std::string(Entry::kName) + ": Paddle has no kernel of that name");
    return;
  }
  std::vector<std::pair<phi::KernelKey, phi::Kernel>> additions;
  bool mismatch = false;
  for (const auto& [key, cpu] : by_name->second) {
    if (key.backend() != phi::Backend::CPU || key.layout() == phi::DataLayout::STRIDED) {
      continue;
    }
    phi::KernelKey ipu_key(ipu, key.layout(), key.dtype());
    if (by_name->second.count(ipu_key) != 0) continue;
    const phi::KernelArgsDef& def = cpu.args_def();
    if (def.attribute_defs().size() != static_cast<size_t>(Fwd::kAttrs) ||
        !SameTypes(def.input_defs(), ArgTypes<Signature>::Inputs()) ||
        !SameTypes(def.output_defs(), ArgTypes<Signature>::Outputs())) {
      mismatch = true;
      continue;
    }
    phi::Kernel kernel(&Fwd::Impl::Compute, reinterpret_cast<void*>(&Fwd::Impl::VariadicCompute));
    *kernel.mutable_args_def() = def;
    for (auto& input : kernel.mutable_args_def()->input_defs()) {
      if (input.backend == phi::Backend::CPU) input.backend = ipu;
    }
    for (auto& output : kernel.mutable_args_def()->output_defs()) {
      if (output.backend == phi::Backend::CPU) output.backend = ipu;
    }
    kernel.get_kerneltype_forvar_fn_ = cpu.get_kerneltype_forvar_fn_;
    additions.emplace_back(ipu_key, std::move(kernel));
  }
  if (mismatch) {
    report.skipped.push_back(std::string(Entry::kName) +
                             ": the CPU kernel's arguments differ from its declaration");
  }
  for (auto& [key, kernel] : additions) {
    by_name->second.emplace(key, std::move(kernel));
    ++report.added;
  }
}

}  // namespace
}  // namespace paddle_ipu

// One entry per kernel: Paddle's kernel name, its C++ function, and which tensor input's
// dtype selects the CPU kernel (Paddle's kernel key; 0 is the first).
#define PADDLE_IPU_KERNEL(kernel_name, function, key)                            \
  namespace paddle_ipu {                                                         \
  struct Entry_##kernel_name {                                                   \
    static constexpr const char* kName = #kernel_name;                           \
    static constexpr int kKey = key;                                             \
    using Signature = decltype(&phi::function<float, phi::CPUContext>);          \
  };                                                                             \
  }

#define PADDLE_IPU_KERNELS(X)                                                    \
  /* data transforms */                                                          \
  X(contiguous, ContiguousKernel, 0)                                             \
  X(cast, CastKernel, 0)                                                         \
  X(strided_copy, StridedCopyKernel, 0)                                          \
  X(fill, FillKernel, 0)                                                         \
  /* elementwise binary */                                                       \
  X(add, AddKernel, 0)                                                           \
  X(subtract, SubtractKernel, 0)                                                 \
  X(multiply, MultiplyKernel, 0)                                                 \
  X(divide, DivideKernel, 0)                                                     \
  X(floor_divide, FloorDivideKernel, 0)                                          \
  X(remainder, RemainderKernel, 0)                                               \
  X(elementwise_pow, ElementwisePowKernel, 0)                                    \
  X(copysign, CopySignKernel, 0)                                                 \
  X(bitwise_and, BitwiseAndKernel, 0)                                            \
  X(bitwise_or, BitwiseOrKernel, 0)                                              \
  X(bitwise_xor, BitwiseXorKernel, 0)                                            \
  X(bitwise_not, BitwiseNotKernel, 0)                                            \
  X(bitwise_left_shift, BitwiseLeftShiftKernel, 0)                               \
  X(bitwise_right_shift, BitwiseRightShiftKernel, 0)                             \
  X(logical_and, LogicalAndKernel, 0)                                            \
  X(logical_or, LogicalOrKernel, 0)                                              \
  X(logical_xor, LogicalXorKernel, 0)                                            \
  X(logical_not, LogicalNotKernel, 0)                                            \
  X(equal, EqualKernel, 0)                                                       \
  X(not_equal, NotEqualKernel, 0)                                                \
  X(greater_than, GreaterThanKernel, 0)                                          \
  X(greater_equal, GreaterEqualKernel, 0)                                        \
  X(less_than, LessThanKernel, 0)                                                \
  X(less_equal, LessEqualKernel, 0)                                              \
  X(lerp, LerpKernel, 0)                                                         \
  X(where, WhereKernel, 1)                                                       \
  /* unary math and activations */                                               \
  X(abs, AbsKernel, 0)                                                           \
  X(sin, SinKernel, 0)                                                           \
  X(cos, CosKernel, 0)                                                           \
  X(tan, TanKernel, 0)                                                           \
  X(asin, AsinKernel, 0)                                                         \
  X(acos, AcosKernel, 0)                                                         \
  X(atan, AtanKernel, 0)                                                         \
  X(sinh, SinhKernel, 0)                                                         \
  X(cosh, CoshKernel, 0)                                                         \
  X(asinh, AsinhKernel, 0)                                                       \
  X(acosh, AcoshKernel, 0)                                                       \
  X(atanh, AtanhKernel, 0)                                                       \
  X(tanh, TanhKernel, 0)                                                         \
  X(relu, ReluKernel, 0)                                                         \
  X(silu, SiluKernel, 0)                                                         \
  X(sigmoid, SigmoidKernel, 0)                                                   \
  X(exp, ExpKernel, 0)                                                           \
  X(expm1, Expm1Kernel, 0)                                                       \
  X(reciprocal, ReciprocalKernel, 0)                                             \
  X(square, SquareKernel, 0)                                                     \
  X(sqrt, SqrtKernel, 0)                                                         \
  X(rsqrt, RsqrtKernel, 0)                                                       \
  X(log, LogKernel, 0)                                                           \
  X(log2, Log2Kernel, 0)                                                         \
  X(log10, Log10Kernel, 0)                                                       \
  X(log1p, Log1pKernel, 0)                                                       \
  X(floor, FloorKernel, 0)                                                       \
  X(ceil, CeilKernel, 0)                                                         \
  X(round, RoundKernel, 0)                                                       \
  X(trunc, TruncKernel, 0)                                                       \
  X(erf, ErfKernel, 0)                                                           \
  X(erfinv, ErfinvKernel, 0)                                                     \
  X(digamma, DigammaKernel, 0)                                                   \
  X(lgamma, LgammaKernel, 0)                                                     \
  X(gammaln, GammalnKernel, 0)                                                   \
  X(polygamma, PolygammaKernel, 0)                                               \
  X(i0, I0Kernel, 0)                                                             \
  X(leaky_relu, LeakyReluKernel, 0)                                              \
  X(elu, EluKernel, 0)                                                           \
  X(hardtanh, HardTanhKernel, 0)                                                 \
  X(thresholded_relu, ThresholdedReluKernel, 0)                                  \
  X(logit, LogitKernel, 0)                                                       \
  X(pow, PowKernel, 0)                                                           \
  X(scale, ScaleKernel, 0)                                                       \
  X(clip, ClipKernel, 0)                                                         \
  X(renorm, RenormKernel, 0)                                                     \
  /* writes into part of a tensor */                                             \
  X(set_value, SetValueKernel, 0)                                                \
  X(set_value_with_tensor, SetTensorValueKernel, 0)                              \
  X(index_put, IndexPutKernel, 0)                                                \
  X(index_add, IndexAddKernel, 0)                                                \
  X(put_along_axis, PutAlongAxisKernel, 0)                                       \
  X(scatter, ScatterKernel, 0)                                                   \
  X(fill_diagonal, FillDiagonalKernel, 0)                                        \
  X(fill_diagonal_tensor, FillDiagonalTensorKernel, 0)                           \
  X(tril, TrilKernel, 0)                                                         \
  X(triu, TriuKernel, 0)                                                         \
  X(cumsum, CumsumKernel, 0)                                                     \
  X(cumprod, CumprodKernel, 0)                                                   \
  /* random fills */                                                             \
  X(uniform_inplace, UniformInplaceKernel, 0)                                    \
  X(gaussian_inplace, GaussianInplaceKernel, 0)                                  \
  X(exponential, ExponentialKernel, 0)                                           \
  /* optimizer updates */                                                        \
  X(sgd, SGDDenseKernel, 0)                                                      \
  X(momentum, MomentumDenseKernel, 0)                                            \
  X(adam, AdamDenseKernel, 0)                                                    \
  X(adamw, AdamwDenseKernel, 0)                                                  \
  X(adamax, AdamaxKernel, 0)                                                     \
  X(lamb, LambKernel, 0)                                                         \
  X(adagrad, AdagradDenseKernel, 0)                                              \
  X(adadelta, AdadeltaKernel, 0)                                                 \
  X(rmsprop, RmspropDenseKernel, 0)                                              \
  X(rprop, RpropKernel, 0)                                                       \
  X(asgd, ASGDKernel, 0)                                                         \
  /* ... with sparse gradients (paddle.nn.Embedding(sparse=True)) */             \
  X(sgd_dense_param_sparse_grad, SGDDenseParamSparseGradKernel, 0)               \
  X(sgd_sparse_param_sparse_grad, SGDSparseParamSparseGradKernel, 0)             \
  X(momentum_dense_param_sparse_grad, MomentumSparseKernel, 0)                   \
  X(adam_dense_param_sparse_grad, sr::AdamDenseParamSparseGradKernel, 0)         \
  X(adamw_dense_param_sparse_grad, sr::AdamwDenseParamSparseGradKernel, 0)       \
  X(adagrad_dense_param_sparse_grad, AdagradSparseKernel, 0)                     \
  X(rmsprop_dense_param_sparse_grad, RmspropSparseKernel, 0)                     \
  /* legacy eager ops (_legacy_C_ops): their CPU fallback leaves the output on the CPU */ \
  X(accuracy, AccuracyKernel, 0)                                                 \
  /* backward */                                                                 \
  X(embedding_grad, EmbeddingGradKernel, 1)                                      \
  X(embedding_sparse_grad, EmbeddingSparseGradKernel, 1)

// Kernels by the release whose headers first declare them.
#define PADDLE_IPU_KERNELS_SINCE_3_1(X) X(masked_fill, MaskedFillKernel, 0)
#define PADDLE_IPU_KERNELS_SINCE_3_3(X) X(trunc_divide, TruncDivideKernel, 0)

#if PADDLE_IPU_PADDLE_MINOR >= 301
#define PADDLE_IPU_KERNELS_3_1(X) PADDLE_IPU_KERNELS_SINCE_3_1(X)
#define PADDLE_IPU_ABSENT_3_1(X)
#else
#define PADDLE_IPU_KERNELS_3_1(X)
#define PADDLE_IPU_ABSENT_3_1(X) PADDLE_IPU_KERNELS_SINCE_3_1(X)
#endif
#if PADDLE_IPU_PADDLE_MINOR >= 303
#define PADDLE_IPU_KERNELS_3_3(X) PADDLE_IPU_KERNELS_SINCE_3_3(X)
#define PADDLE_IPU_ABSENT_3_3(X)
#else
#define PADDLE_IPU_KERNELS_3_3(X)
#define PADDLE_IPU_ABSENT_3_3(X) PADDLE_IPU_KERNELS_SINCE_3_3(X)
#endif

PADDLE_IPU_KERNELS(PADDLE_IPU_KERNEL)
PADDLE_IPU_KERNELS_3_1(PADDLE_IPU_KERNEL)
PADDLE_IPU_KERNELS_3_3(PADDLE_IPU_KERNEL)

#define PADDLE_IPU_REGISTER(kernel_name, function, key) \
  paddle_ipu::Register<paddle_ipu::Entry_##kernel_name,   \
                       paddle_ipu::Entry_##kernel_name::Signature>(ipu);
#define PADDLE_IPU_ABSENT(kernel_name, function, key)                                      \
  paddle_ipu::TheReport().skipped.push_back(#kernel_name                                   \
                                            ": not in the headers of PaddlePaddle "        \
                                            PADDLE_IPU_PADDLE_VERSION ", this build's");

// Adds the ipu kernels to Paddle's kernel factory (a key Paddle already has is kept).
// Returns how many kernels were added; call once, after the ipu device is registered.
extern "C" __attribute__((visibility("default"))) int paddle_ipu_register_kernels() {
  phi::Backend ipu = phi::TransToPhiBackend(phi::CustomPlace("ipu", 0));
  PADDLE_IPU_KERNELS(PADDLE_IPU_REGISTER)
  PADDLE_IPU_KERNELS_3_1(PADDLE_IPU_REGISTER)
  PADDLE_IPU_KERNELS_3_3(PADDLE_IPU_REGISTER)
  PADDLE_IPU_ABSENT_3_1(PADDLE_IPU_ABSENT)
  PADDLE_IPU_ABSENT_3_3(PADDLE_IPU_ABSENT)
  return paddle_ipu::TheReport().added;
}

// The kernels that were not registered, one "name: reason" per line.
extern "C" __attribute__((visibility("default"))) const char* paddle_ipu_kernels_skipped() {
  static std::string text;
  text.clear();
  for (const auto& line : paddle_ipu::TheReport().skipped) text += line + "\n";
  return text.c_str();
}
