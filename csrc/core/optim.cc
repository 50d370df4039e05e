// The host backend's Adam update in one pass over each parameter.
//
// paddle_ipu.backends.host_optim evaluates Adam in float32 with numpy, one array
// operation at a time: about ten passes over memory per parameter.  These loops do
// the same operations on each element, in the same order, each rounded to float32
// (the file is built with -ffp-contract=off, so no multiply-add is fused; packed
// add, multiply, divide and square root round every lane as the scalar operations
// do): the results are bitwise those of the numpy formulas, which
// tests/test_core_optim.py checks against them.
//
// adam_update_many updates every parameter of a step in one call: the parameters are
// cut into chunks which up to `threads` threads take in turn, with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bindings.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define PADDLE_IPU_ADAM_WIDE 1
#endif

namespace py = pybind11;

namespace paddle_ipu {
namespace {

using F32Array = py::array_t<float, py::array::c_style>;

// The outputs are allocated here, on a cache line: the packed loops store whole,
// aligned vectors.
constexpr std::size_t kOutputAlignment = 64;
// Below this many elements (in all) the work stays on the calling thread, and below
// kReleaseGilElements the GIL is kept: starting a thread or releasing the GIL costs
// more than the loop.
constexpr py::ssize_t kReleaseGilElements = 16384;
constexpr py::ssize_t kThreadElements = 1 << 18;
// What one thread takes at a time: a multiple of any vector width (and of a cache
// line, so two threads never store into the same line).
constexpr py::ssize_t kChunkElements = 1 << 15;

const float* Input(const py::array& a, const char* role, py::ssize_t size) {
  if (!py::isinstance<F32Array>(a) || !(a.flags() & py::array::c_style)) {
    throw py::type_error(std::string(role) + " must be a C-contiguous float32 array");
  }
  if (a.size() != size) {
    throw py::value_error(std::string(role) + " has " + std::to_string(a.size()) +
                          " elements; expected " + std::to_string(size) +
                          " (the weight's)");
  }
  return static_cast<const float*>(a.data());
}

// Memory for the outputs, recycled.  A step's update makes new weights and moments and
// drops the previous step's, of the same sizes: handing those blocks back to the next
// update, rather than to free(), spares the page faults (and the kernel's zeroing of
// the pages) of memory the C library returned to the system in between.  Blocks are
// kept by size, up to kPoolBytes in all; the rest is freed.
class BlockPool {
 public:
  void* Take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(bytes);
      if (it != blocks_.end()) {
        void* block = it->second;
        blocks_.erase(it);
        held_ -= bytes;
        return block;
      }
    }
    void* block = std::aligned_alloc(kOutputAlignment, bytes);
    if (block == nullptr) {
      throw std::bad_alloc();
    }
    return block;
  }

  void Give(void* block, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (held_ + bytes <= kPoolBytes) {
        blocks_.emplace(bytes, block);
        held_ += bytes;
        return;
      }
    }
    std::free(block);
  }

  // Frees every block held; returns their bytes.
  std::size_t Release() {
    std::unordered_multimap<std::size_t, void*> blocks;
    std::size_t held = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(blocks_);
      std::swap(held, held_);
    }
    for (auto& entry : blocks) {
      std::free(entry.second);
    }
    return held;
  }

 private:
  static constexpr std::size_t kPoolBytes = std::size_t{256} << 20;
  std::mutex mutex_;
  std::unordered_multimap<std::size_t, void*> blocks_;
  std::size_t held_ = 0;
};

// Never destroyed: arrays may outlive the module's statics at exit.
BlockPool& Pool() {
  static BlockPool* pool = new BlockPool();
  return *pool;
}

// A new float32 array of `shape` whose memory starts on a kOutputAlignment boundary.
// The block's first kOutputAlignment bytes hold its size, for the pool.
F32Array AlignedArray(const std::vector<py::ssize_t>& shape, py::ssize_t n) {
  const std::size_t bytes =
      (static_cast<std::size_t>(n) * sizeof(float) + kOutputAlignment - 1) /
          kOutputAlignment * kOutputAlignment +
      kOutputAlignment;
  auto* block = static_cast<unsigned char*>(Pool().Take(bytes));
  *reinterpret_cast<std::size_t*>(block) = bytes;
  float* data = reinterpret_cast<float*>(block + kOutputAlignment);
  py::capsule owner(data, [](void* p) {
    unsigned char* start = static_cast<unsigned char*>(p) - kOutputAlignment;
    Pool().Give(start, *reinterpret_cast<std::size_t*>(start));
  });
  return F32Array(shape, data, owner);
}

struct Coefficients {
  float b1, c1, b2, c2;
};

// One parameter's update: the inputs, the (aligned) outputs and its two scalars.
struct AdamJob {
  const float* w;
  const float* g;
  const float* m1;
  const float* m2;
  float* w_out;
  float* m1_out;
  float* m2_out;
  py::ssize_t n;
  float neg_lr_t;
  float eps_t;
};

// m1' = m1 * b1 + g * c1;  m2' = m2 * b2 + (g * c2) * g
// w'  = w + (m1' / (sqrt(m2') + eps_t)) * neg_lr_t
// (c1 = 1 - b1 and c2 = 1 - b2, as float32, computed by the caller.)
inline void AdamScalar(const AdamJob& j, const Coefficients& k, py::ssize_t begin,
                       py::ssize_t end) {
  for (py::ssize_t i = begin; i < end; ++i) {
    const float gi = j.g[i];
    const float m1n = j.m1[i] * k.b1 + gi * k.c1;
    const float v = (gi * k.c2) * gi;
    const float m2n = j.m2[i] * k.b2 + v;
    const float d = std::sqrt(m2n) + j.eps_t;
    const float step = (m1n / d) * j.neg_lr_t;
    j.m1_out[i] = m1n;
    j.m2_out[i] = m2n;
    j.w_out[i] = j.w[i] + step;
  }
}

#if defined(__SSE2__)
// Ordinary stores: 16-byte streaming stores into three arrays at once measured
// slower than letting the cache write the lines back.
void AdamSse2(const AdamJob& j, const Coefficients& k, py::ssize_t begin, py::ssize_t end) {
  const __m128 b1 = _mm_set1_ps(k.b1), c1 = _mm_set1_ps(k.c1), b2 = _mm_set1_ps(k.b2),
               c2 = _mm_set1_ps(k.c2), lr = _mm_set1_ps(j.neg_lr_t), eps = _mm_set1_ps(j.eps_t);
  py::ssize_t i = begin;
  for (; i + 4 <= end; i += 4) {
    const __m128 gi = _mm_loadu_ps(j.g + i);
    const __m128 m1n = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(j.m1 + i), b1), _mm_mul_ps(gi, c1));
    const __m128 v = _mm_mul_ps(_mm_mul_ps(gi, c2), gi);
    const __m128 m2n = _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(j.m2 + i), b2), v);
    const __m128 d = _mm_add_ps(_mm_sqrt_ps(m2n), eps);
    const __m128 step = _mm_mul_ps(_mm_div_ps(m1n, d), lr);
    _mm_storeu_ps(j.m1_out + i, m1n);
    _mm_storeu_ps(j.m2_out + i, m2n);
    _mm_storeu_ps(j.w_out + i, _mm_add_ps(_mm_loadu_ps(j.w + i), step));
  }
  AdamScalar(j, k, i, end);
}
#endif

#if defined(PADDLE_IPU_ADAM_WIDE)
// The outputs are new arrays nobody reads during the loop, aligned (AlignedArray) and
// `begin` is a multiple of the vector width: streaming stores write whole lines
// without first reading them in.
__attribute__((target("avx2"))) void AdamAvx2(const AdamJob& j, const Coefficients& k,
                                               py::ssize_t begin, py::ssize_t end) {
  const __m256 b1 = _mm256_set1_ps(k.b1), c1 = _mm256_set1_ps(k.c1),
               b2 = _mm256_set1_ps(k.b2), c2 = _mm256_set1_ps(k.c2),
               lr = _mm256_set1_ps(j.neg_lr_t), eps = _mm256_set1_ps(j.eps_t);
  py::ssize_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 gi = _mm256_loadu_ps(j.g + i);
    const __m256 m1n =
        _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(j.m1 + i), b1), _mm256_mul_ps(gi, c1));
    const __m256 v = _mm256_mul_ps(_mm256_mul_ps(gi, c2), gi);
    const __m256 m2n = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(j.m2 + i), b2), v);
    const __m256 d = _mm256_add_ps(_mm256_sqrt_ps(m2n), eps);
    const __m256 step = _mm256_mul_ps(_mm256_div_ps(m1n, d), lr);
    _mm256_stream_ps(j.m1_out + i, m1n);
    _mm256_stream_ps(j.m2_out + i, m2n);
    _mm256_stream_ps(j.w_out + i, _mm256_add_ps(_mm256_loadu_ps(j.w + i), step));
  }
  AdamScalar(j, k, i, end);
}

__attribute__((target("avx512f"))) void AdamAvx512(const AdamJob& j, const Coefficients& k,
                                                    py::ssize_t begin, py::ssize_t end) {
  const __m512 b1 = _mm512_set1_ps(k.b1), c1 = _mm512_set1_ps(k.c1),
               b2 = _mm512_set1_ps(k.b2), c2 = _mm512_set1_ps(k.c2),
               lr = _mm512_set1_ps(j.neg_lr_t), eps = _mm512_set1_ps(j.eps_t);
  py::ssize_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 gi = _mm512_loadu_ps(j.g + i);
    const __m512 m1n =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(j.m1 + i), b1), _mm512_mul_ps(gi, c1));
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(gi, c2), gi);
    const __m512 m2n = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(j.m2 + i), b2), v);
    const __m512 d = _mm512_add_ps(_mm512_sqrt_ps(m2n), eps);
    const __m512 step = _mm512_mul_ps(_mm512_div_ps(m1n, d), lr);
    _mm512_stream_ps(j.m1_out + i, m1n);
    _mm512_stream_ps(j.m2_out + i, m2n);
    _mm512_stream_ps(j.w_out + i, _mm512_add_ps(_mm512_loadu_ps(j.w + i), step));
  }
  AdamScalar(j, k, i, end);
}
#endif

using AdamKernel = void (*)(const AdamJob&, const Coefficients&, py::ssize_t, py::ssize_t);

// The widest loop this CPU runs (all give the same bits).
AdamKernel SelectKernel() {
#if defined(PADDLE_IPU_ADAM_WIDE)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    return AdamAvx512;
  }
  if (__builtin_cpu_supports("avx2")) {
    return AdamAvx2;
  }
#endif
#if defined(__SSE2__)
  return AdamSse2;
#else
  return AdamScalar;
#endif
}

// Every job, chunk by chunk, on up to `threads` threads (this one included).
void RunJobs(const std::vector<AdamJob>& jobs, const Coefficients& k, int threads) {
  static const AdamKernel kernel = SelectKernel();
  struct Chunk {
    std::size_t job;
    py::ssize_t begin, end;
  };
  std::vector<Chunk> chunks;
  py::ssize_t total = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    total += jobs[j].n;
    for (py::ssize_t b = 0; b < jobs[j].n; b += kChunkElements) {
      chunks.push_back({j, b, std::min(jobs[j].n, b + kChunkElements)});
    }
  }
  std::atomic<std::size_t> next{0};
  const auto work = [&]() {
    for (std::size_t c = next.fetch_add(1); c < chunks.size(); c = next.fetch_add(1)) {
      kernel(jobs[chunks[c].job], k, chunks[c].begin, chunks[c].end);
    }
#if defined(PADDLE_IPU_ADAM_WIDE)
    // Streaming stores are weakly ordered: each thread fences its own before the join
    // (and the caller's return) publishes the arrays.
    _mm_sfence();
#endif
  };
  const int helpers = static_cast<int>(std::min<py::ssize_t>(
      std::min<py::ssize_t>(threads, static_cast<py::ssize_t>(chunks.size())) - 1,
      total / kThreadElements));
  std::vector<std::thread> pool;
  for (int t = 0; t < helpers; ++t) {
    pool.emplace_back(work);
  }
  work();
  for (auto& t : pool) {
    t.join();
  }
}

py::tuple MakeJob(const py::array& weight, const py::array& grad, const py::array& moment1,
                  const py::array& moment2, float neg_lr_t, float eps_t, AdamJob* job) {
  const py::ssize_t n = weight.size();
  const float* w = Input(weight, "weight", n);
  const float* g = Input(grad, "grad", n);
  const float* m1 = Input(moment1, "moment1", n);
  const float* m2 = Input(moment2, "moment2", n);
  std::vector<py::ssize_t> shape(weight.shape(), weight.shape() + weight.ndim());
  F32Array w_out = AlignedArray(shape, n), m1_out = AlignedArray(shape, n),
           m2_out = AlignedArray(shape, n);
  *job = AdamJob{w,
                 g,
                 m1,
                 m2,
                 w_out.mutable_data(),
                 m1_out.mutable_data(),
                 m2_out.mutable_data(),
                 n,
                 neg_lr_t,
                 eps_t};
  return py::make_tuple(w_out, m1_out, m2_out);
}

void Run(const std::vector<AdamJob>& jobs, const Coefficients& k, int threads) {
  py::ssize_t total = 0;
  for (const AdamJob& j : jobs) {
    total += j.n;
  }
  if (total >= kReleaseGilElements) {
    py::gil_scoped_release release;
    RunJobs(jobs, k, threads);
  } else {
    RunJobs(jobs, k, 1);
  }
}

py::tuple AdamUpdate(const py::array& weight, const py::array& grad, const py::array& moment1,
                     const py::array& moment2, float b1, float c1, float b2, float c2,
                     float neg_lr_t, float eps_t, int threads) {
  std::vector<AdamJob> jobs(1);
  py::tuple out = MakeJob(weight, grad, moment1, moment2, neg_lr_t, eps_t, &jobs[0]);
  Run(jobs, Coefficients{b1, c1, b2, c2}, threads);
  return out;
}

py::list AdamUpdateMany(const py::list& weights, const py::list& grads,
                        const py::list& moment1s, const py::list& moment2s, float b1,
                        float c1, float b2, float c2, const std::vector<float>& neg_lr_t,
                        const std::vector<float>& eps_t, int threads) {
  const std::size_t count = weights.size();
  if (grads.size() != count || moment1s.size() != count || moment2s.size() != count ||
      neg_lr_t.size() != count || eps_t.size() != count) {
    throw py::value_error("adam_update_many: the lists must have one entry per weight");
  }
  std::vector<AdamJob> jobs(count);
  py::list out;
  for (std::size_t i = 0; i < count; ++i) {
    out.append(MakeJob(weights[i].cast<py::array>(), grads[i].cast<py::array>(),
                       moment1s[i].cast<py::array>(), moment2s[i].cast<py::array>(),
                       neg_lr_t[i], eps_t[i], &jobs[i]));
  }
  Run(jobs, Coefficients{b1, c1, b2, c2}, threads);
  return out;
}

}  // namespace

void RegisterOptim(py::module_& m) {
  m.def("adam_update", &AdamUpdate, py::arg("weight"), py::arg("grad"), py::arg("moment1"),
        py::arg("moment2"), py::arg("b1"), py::arg("c1"), py::arg("b2"), py::arg("c2"),
        py::arg("neg_lr_t"), py::arg("eps_t"), py::arg("threads") = 1,
        "One Adam step over float32 arrays of one shape: returns new (weight, moment1, "
        "moment2), bitwise equal to host_optim's numpy formulas.  The inputs are not "
        "written.");
  m.def("adam_update_many", &AdamUpdateMany, py::arg("weights"), py::arg("grads"),
        py::arg("moment1s"), py::arg("moment2s"), py::arg("b1"), py::arg("c1"), py::arg("b2"),
        py::arg("c2"), py::arg("neg_lr_t"), py::arg("eps_t"), py::arg("threads") = 1,
        "adam_update of many parameters (lists, one entry per parameter; neg_lr_t and "
        "eps_t per parameter) in one call, on up to `threads` threads: returns a list "
        "of (weight, moment1, moment2).");
  m.def(
      "adam_release_memory", []() { return Pool().Release(); },
      "Frees the memory the Adam updates keep for reuse (freed output arrays, up to "
      "256 MiB); returns its size in bytes.");
}

}  // namespace paddle_ipu
