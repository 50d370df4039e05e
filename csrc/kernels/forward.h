// Running Paddle's CPU kernels on the memory of the emulated IPU.
//
// The "ipu" device's memory is host memory. An ipu kernel registered here calls
// Paddle's CPU kernel of the same name directly on that memory: every tensor argument is
// re-labelled as a CPU tensor (an Allocation over the same bytes that owns nothing), the
// CPU kernel runs with the CPU device context, and each output keeps its ipu place.
// Writes land where the caller's tensor (or view) lives, so in-place ops on views behave
// as on the CPU, which Paddle's own fallback does not do: it runs the CPU kernel on a
// copy and gives the output new memory, losing writes through views.
//
// Forward<Entry, Signature>::Call has the exact parameter list of the CPU kernel (taken
// from its declaration in Paddle's headers), so Paddle calls it as it calls any kernel,
// through the variadic entry of phi::KernelImpl or through a KernelContext.

#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include "paddle/phi/backends/context_pool.h"
#include "paddle/phi/backends/custom/custom_context.h"
#include "paddle/phi/core/dense_tensor.h"
#include "paddle/phi/core/kernel_factory.h"
#include "paddle/phi/core/kernel_registry.h"
#include "paddle/phi/core/kernel_utils.h"
#include "paddle/phi/core/selected_rows.h"

namespace paddle_ipu {

// An allocation that hands out memory another allocation owns, under another place: the
// output of a CPU kernel, given to the ipu tensor without a copy.
class Borrowed : public phi::Allocation {
 public:
  Borrowed(std::shared_ptr<phi::Allocation> owner, const phi::Place& place)
      : phi::Allocation(owner->ptr(), owner->size(), place), owner_(std::move(owner)) {}

 private:
  std::shared_ptr<phi::Allocation> owner_;
};

// The CPU-labelled twins of one call's tensors. A tensor passed twice (an in-place op's
// input and output) has one twin, and tensors sharing memory get twins sharing memory.
class Twins {
 public:
  const phi::DenseTensor& In(const phi::DenseTensor& tensor) {
    return *Twin(const_cast<phi::DenseTensor*>(&tensor), false);
  }

  phi::DenseTensor* Out(phi::DenseTensor* tensor) {
    return tensor == nullptr ? nullptr : Twin(tensor, true);
  }

  // SelectedRows (sparse gradients): a twin holding the rows and a twin of the value.
  const phi::SelectedRows& In(const phi::SelectedRows& rows) {
    rows_arena_.emplace_back(rows.rows(), rows.height());
    *rows_arena_.back().mutable_value() = In(rows.value());
    return rows_arena_.back();
  }

  phi::SelectedRows* Out(phi::SelectedRows* rows) {
    if (rows == nullptr) return nullptr;
    rows_arena_.emplace_back(rows->rows(), rows->height());
    *rows_arena_.back().mutable_value() = *Twin(rows->mutable_value(), false);
    row_outputs_.emplace_back(rows, &rows_arena_.back());
    return &rows_arena_.back();
  }

  // After the CPU kernel: every output gets the meta the kernel set, and the memory it
  // wrote to, when that is not the output's own (the kernel allocated it).
  void Adopt(const phi::Place& place) {
    for (auto& [original, twin] : row_outputs_) {
      original->set_rows(twin->rows());
      original->set_height(twin->height());
      outputs_.emplace_back(original->mutable_value(), twin->mutable_value());
    }
    for (auto& [original, twin] : outputs_) {
      const auto& theirs = twin->Holder();
      const auto& mine = original->Holder();
      phi::DenseTensorMeta meta = twin->meta();
      if (theirs == nullptr) {
        original->set_meta(meta);
        continue;
      }
      bool same_memory = mine != nullptr && theirs->ptr() == mine->ptr();
      if (!same_memory) {
        // Paddle resets a holder only at offset 0 (DenseTensor::ResetHolder).
        phi::DenseTensorMeta at_zero = meta;
        at_zero.offset = 0;
        original->set_meta(at_zero);
        auto found = borrowed_.find(theirs.get());
        if (found != borrowed_.end()) {
          original->ResetHolder(found->second);  // a twin of another input's memory
        } else {
          original->ResetHolder(std::make_shared<Borrowed>(theirs, place));
        }
      }
      original->set_meta(meta);
    }
  }

 private:
  phi::DenseTensor* Twin(phi::DenseTensor* tensor, bool output) {
    auto found = twins_.find(tensor);
    phi::DenseTensor* twin = nullptr;
    if (found != twins_.end()) {
      twin = found->second;
    } else {
      arena_.emplace_back();
      twin = &arena_.back();
      const auto& holder = tensor->Holder();
      if (holder != nullptr) {
        auto& alias = aliases_[holder.get()];
        if (alias == nullptr) {
          alias = std::make_shared<phi::Allocation>(holder->ptr(), holder->size(),
                                                    phi::CPUPlace());
          borrowed_[alias.get()] = holder;
        }
        *twin = phi::DenseTensor(alias, tensor->meta());
      } else {
        twin->set_meta(tensor->meta());
      }
      twins_[tensor] = twin;
    }
    if (output) {
      for (auto& pair : outputs_) {
        if (pair.first == tensor) return twin;
      }
      outputs_.emplace_back(tensor, twin);
    }
    return twin;
  }

  std::deque<phi::DenseTensor> arena_;
  std::map<phi::DenseTensor*, phi::DenseTensor*> twins_;
  std::map<phi::Allocation*, std::shared_ptr<phi::Allocation>> aliases_;
  // CPU alias -> the ipu allocation it stands for
  std::map<phi::Allocation*, std::shared_ptr<phi::Allocation>> borrowed_;
  std::vector<std::pair<phi::DenseTensor*, phi::DenseTensor*>> outputs_;
  std::deque<phi::SelectedRows> rows_arena_;
  std::vector<std::pair<phi::SelectedRows*, phi::SelectedRows*>> row_outputs_;
  std::deque<paddle::optional<phi::DenseTensor>> optionals_;
  std::deque<std::vector<const phi::DenseTensor*>> lists_;
  std::deque<paddle::optional<std::vector<const phi::DenseTensor*>>> optional_lists_;

  template <typename T>
  friend struct Map;
};

// How one argument of the CPU kernel is passed: tensors as their twins, the rest as is.
template <typename T>
struct Map {
  static T Do(Twins&, T value) { return std::forward<T>(value); }
  static constexpr int kInputs = 0, kOutputs = 0, kAttrs = 1;
};

template <>
struct Map<const phi::DenseTensor&> {
  static const phi::DenseTensor& Do(Twins& t, const phi::DenseTensor& v) { return t.In(v); }
  static constexpr int kInputs = 1, kOutputs = 0, kAttrs = 0;
};

template <>
struct Map<phi::DenseTensor*> {
  static phi::DenseTensor* Do(Twins& t, phi::DenseTensor* v) { return t.Out(v); }
  static constexpr int kInputs = 0, kOutputs = 1, kAttrs = 0;
};

template <>
struct Map<const phi::SelectedRows&> {
  static const phi::SelectedRows& Do(Twins& t, const phi::SelectedRows& v) { return t.In(v); }
  static constexpr int kInputs = 1, kOutputs = 0, kAttrs = 0;
};

template <>
struct Map<phi::SelectedRows*> {
  static phi::SelectedRows* Do(Twins& t, phi::SelectedRows* v) { return t.Out(v); }
  static constexpr int kInputs = 0, kOutputs = 1, kAttrs = 0;
};

template <>
struct Map<const paddle::optional<phi::DenseTensor>&> {
  static const paddle::optional<phi::DenseTensor>& Do(
      Twins& t, const paddle::optional<phi::DenseTensor>& v) {
    if (v) {
      t.optionals_.emplace_back(t.In(*v));
    } else {
      t.optionals_.emplace_back(paddle::none);
    }
    return t.optionals_.back();
  }
  static constexpr int kInputs = 1, kOutputs = 0, kAttrs = 0;
};

template <>
struct Map<const std::vector<const phi::DenseTensor*>&> {
  static const std::vector<const phi::DenseTensor*>& Do(
      Twins& t, const std::vector<const phi::DenseTensor*>& v) {
    std::vector<const phi::DenseTensor*> twins;
    for (const auto* item : v) twins.push_back(item == nullptr ? nullptr : &t.In(*item));
    t.lists_.push_back(std::move(twins));
    return t.lists_.back();
  }
  static constexpr int kInputs = 1, kOutputs = 0, kAttrs = 0;
};

template <>
struct Map<const paddle::optional<std::vector<const phi::DenseTensor*>>&> {
  static const paddle::optional<std::vector<const phi::DenseTensor*>>& Do(
      Twins& t, const paddle::optional<std::vector<const phi::DenseTensor*>>& v) {
    if (v) {
      std::vector<const phi::DenseTensor*> twins;
      for (const auto* item : *v) twins.push_back(item == nullptr ? nullptr : &t.In(*item));
      t.optional_lists_.emplace_back(std::move(twins));
    } else {
      t.optional_lists_.emplace_back(paddle::none);
    }
    return t.optional_lists_.back();
  }
  static constexpr int kInputs = 1, kOutputs = 0, kAttrs = 0;
};

template <>
struct Map<std::vector<phi::DenseTensor*>> {
  static std::vector<phi::DenseTensor*> Do(Twins& t, std::vector<phi::DenseTensor*> v) {
    for (auto& item : v) item = t.Out(item);
    return v;
  }
  static constexpr int kInputs = 0, kOutputs = 1, kAttrs = 0;
};

// The dtype of the key-th tensor input (defined tensors of optional and list inputs count
// as one input each), which selects the CPU kernel.
class KeyFinder {
 public:
  explicit KeyFinder(int key) : key_(key) {}
  void See(const phi::DenseTensor& v) { Take(v); }
  void See(const phi::SelectedRows& v) { Take(v.value()); }
  void See(const paddle::optional<phi::DenseTensor>& v) {
    if (v) {
      Take(*v);
    } else {
      ++index_;
    }
  }
  void See(const std::vector<const phi::DenseTensor*>& v) {
    if (!v.empty() && v[0] != nullptr) {
      Take(*v[0]);
    } else {
      ++index_;
    }
  }
  template <typename T>
  void See(const T&) {}
  phi::DataType dtype() const { return dtype_; }

 private:
  void Take(const phi::DenseTensor& v) {
    if (index_++ == key_) dtype_ = v.dtype();
  }
  int key_;
  int index_ = 0;
  phi::DataType dtype_ = phi::DataType::UNDEFINED;
};

inline phi::DeviceContext& CpuContext() {
  return *phi::DeviceContextPool::Instance().Get(phi::CPUPlace());
}

// The CPU kernel `name` for `dtype` (any layout but STRIDED: a strided CPU kernel is a
// view kernel, registered for every backend, ipu included).
inline const phi::Kernel* FindCpuKernel(const std::string& name, phi::DataType dtype) {
  auto& kernels = phi::KernelFactory::Instance().kernels();
  auto by_name = kernels.find(name);
  if (by_name == kernels.end()) return nullptr;
  const phi::Kernel* found = nullptr;
  for (const auto& [key, kernel] : by_name->second) {
    if (key.backend() != phi::Backend::CPU || key.dtype() != dtype) continue;
    if (key.layout() == phi::DataLayout::STRIDED) continue;
    if (key.layout() == phi::DataLayout::ALL_LAYOUT) return &kernel;
    found = &kernel;
  }
  return found;
}

template <typename Entry, typename Signature>
struct Forward;

template <typename Entry, typename... Args>
struct Forward<Entry, void (*)(const phi::CPUContext&, Args...)> {
  static constexpr int kInputs = (0 + ... + Map<Args>::kInputs);
  static constexpr int kOutputs = (0 + ... + Map<Args>::kOutputs);
  static constexpr int kAttrs = (0 + ... + Map<Args>::kAttrs);

  static void Call(const phi::CustomContext& ctx, Args... args) {
    KeyFinder finder(Entry::kKey);
    (finder.See(args), ...);
    const phi::Kernel* kernel = FindCpuKernel(Entry::kName, finder.dtype());
    PADDLE_ENFORCE_NOT_NULL(
        kernel, common::errors::NotFound(
                    "paddle-ipu: Paddle has no CPU kernel %s for %s to run on the ipu place",
                    Entry::kName, phi::DataTypeToString(finder.dtype())));
    using Variadic = void (*)(const phi::DeviceContext&, Args...);
    Twins twins;
    (*kernel->GetVariadicKernelFn<Variadic>())(CpuContext(),
                                                Map<Args>::Do(twins, args)...);
    twins.Adopt(ctx.GetPlace());
  }

  using Impl = phi::KernelImpl<decltype(&Call), &Call>;
};

}  // namespace paddle_ipu
