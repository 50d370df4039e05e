// Python bindings of the fp16 kernels, over any object exporting a C-contiguous
// buffer (numpy arrays, paddle_ipu TensorView, memoryview, bytearray...).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "fp16.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace {

// Releasing and retaking the GIL costs about as much as converting this many
// elements, so smaller calls keep it.
constexpr size_t kReleaseGilElements = 16384;
constexpr int kMaxThreadsArg = 256;

enum class Kind { kFloat32, kFloat16 };

// Owns a Py_buffer for the duration of one call.
class Buffer {
 public:
  Buffer(py::handle obj, Kind kind, bool writable, const char* role) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      std::string why = writable ? "a writable buffer" : "a buffer";
      throw py::type_error(std::string(role) + " must be " + why + " of " + KindName(kind) +
                           " (for example a numpy array); got " + TypeName(obj));
    }
    held_ = true;
    if (!PyBuffer_IsContiguous(&view_, 'C')) {
      throw py::type_error(std::string(role) + " must be C-contiguous; got a strided " +
                           TypeName(obj) + " (make a contiguous copy first)");
    }
    if (!FormatMatches(kind)) {
      throw py::type_error(std::string(role) + " must hold " + KindName(kind) + ", got format '" +
                           (view_.format ? view_.format : "B") + "' from " + TypeName(obj));
    }
  }
  ~Buffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return view_.buf; }
  size_t bytes() const { return static_cast<size_t>(view_.len); }
  size_t count() const { return bytes() / static_cast<size_t>(view_.itemsize); }
  std::vector<py::ssize_t> shape() const {
    return std::vector<py::ssize_t>(view_.shape, view_.shape + view_.ndim);
  }

 private:
  static const char* KindName(Kind kind) {
    return kind == Kind::kFloat32 ? "float32" : "float16";
  }
  static std::string TypeName(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

  bool FormatMatches(Kind kind) const {
    const char* f = view_.format ? view_.format : "B";
    // Native or little-endian byte order only: the kernels assume the host's.
    if (*f == '@' || *f == '=' || *f == '<') ++f;
    if (f[0] == '\0' || f[1] != '\0') return false;
    if (kind == Kind::kFloat32) return f[0] == 'f' && view_.itemsize == 4;
    // uint16 is accepted as raw half bits, the way ONNX and PopART buffers often arrive.
    return (f[0] == 'e' || f[0] == 'H') && view_.itemsize == 2;
  }

  Py_buffer view_{};
  bool held_ = false;
};

int CheckThreads(int threads) {
  if (threads < 0 || threads > kMaxThreadsArg) {
    throw py::value_error("threads must be 0 (automatic) or between 1 and " +
                          std::to_string(kMaxThreadsArg) + ", got " + std::to_string(threads));
  }
  return threads;
}

void CheckNoOverlap(const Buffer& a, const Buffer& b) {
  auto a0 = static_cast<const char*>(a.data());
  auto b0 = static_cast<const char*>(b.data());
  if (a.bytes() != 0 && b.bytes() != 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes()) {
    throw py::value_error("out overlaps the source buffer; use the in-place conversion instead");
  }
}

template <typename Fn>
void RunMaybeWithoutGil(size_t n, Fn fn) {
  if (n >= kReleaseGilElements) {
    py::gil_scoped_release release;
    fn();
  } else {
    fn();
  }
}

py::object Convert(py::handle src_obj, py::object out_obj, int threads, Kind from, Kind to) {
  CheckThreads(threads);
  Buffer src(src_obj, from, false, "source");
  const size_t n = src.count();
  if (out_obj.is_none()) {
    // NPY_HALF is 23; pybind11 has no C++ type to name it by.
    py::dtype dt = to == Kind::kFloat16 ? py::dtype(23) : py::dtype::of<float>();
    out_obj = py::array(dt, src.shape());
  }
  Buffer out(out_obj, to, true, "out");
  if (out.count() != n) {
    throw py::value_error("out holds " + std::to_string(out.count()) +
                          " elements but the source holds " + std::to_string(n));
  }
  CheckNoOverlap(src, out);
  RunMaybeWithoutGil(n, [&] {
    if (from == Kind::kFloat32) {
      fp16::FloatToHalf(src.data(), out.data(), n, threads);
    } else {
      fp16::HalfToFloat(src.data(), out.data(), n, threads);
    }
  });
  return out_obj;
}

fp16::Isa IsaFromName(const std::string& name) {
  fp16::Isa isa;
  if (name == "auto") return fp16::BestIsa();
  if (!fp16::ParseIsa(name.c_str(), &isa)) {
    throw py::value_error("unknown fp16 kernel '" + name +
                          "'; expected 'auto', 'scalar', 'f16c' or 'avx512'");
  }
  return isa;
}

}  // namespace

void RegisterFp16(py::module_& m) {
  m.def(
      "f32_to_f16",
      [](py::handle src, py::object out, int threads) {
        return Convert(src, std::move(out), threads, Kind::kFloat32, Kind::kFloat16);
      },
      py::arg("src"), py::arg("out") = py::none(), py::arg("threads") = 0,
      "Convert a C-contiguous float32 buffer to float16, into `out` (a writable float16 or\n"
      "uint16 buffer with as many elements) or a new numpy array of the source's shape.\n"
      "Rounds to nearest even, bit-identical to numpy's astype. threads=0 picks a count\n"
      "from the size. Returns the output object.");
  m.def(
      "f16_to_f32",
      [](py::handle src, py::object out, int threads) {
        return Convert(src, std::move(out), threads, Kind::kFloat16, Kind::kFloat32);
      },
      py::arg("src"), py::arg("out") = py::none(), py::arg("threads") = 0,
      "Convert a C-contiguous float16 (or uint16 half-bits) buffer to float32, into `out`\n"
      "or a new numpy array. Exact, bit-identical to numpy's astype.");
  m.def(
      "f32_to_f16_inplace",
      [](py::handle buf, int threads) {
        CheckThreads(threads);
        Buffer b(buf, Kind::kFloat32, true, "buffer");
        const size_t n = b.count();
        RunMaybeWithoutGil(n, [&] { fp16::FloatToHalfInPlace(b.data(), n, threads); });
      },
      py::arg("buf"), py::arg("threads") = 0,
      "Convert the n float32 values of a writable buffer to float16 in place: afterwards the\n"
      "first 2n bytes hold the halves and the rest of the buffer is unspecified.");
  m.def(
      "f16_to_f32_inplace",
      [](py::handle buf, int threads) {
        CheckThreads(threads);
        Buffer b(buf, Kind::kFloat32, true, "buffer");
        const size_t n = b.count();
        RunMaybeWithoutGil(n, [&] { fp16::HalfToFloatInPlace(b.data(), n, threads); });
      },
      py::arg("buf"), py::arg("threads") = 0,
      "The inverse of f32_to_f16_inplace: `buf` is a writable float32 buffer of n elements\n"
      "whose first 2n bytes hold n halves; afterwards it holds their n float32 values.");
  m.def(
      "fp16_isa", [] { return std::string(fp16::IsaName(fp16::ActiveIsa())); },
      "The instruction set the fp16 kernels use: 'avx512', 'f16c' or 'scalar'.");
  m.def(
      "fp16_isas",
      [] {
        py::list names;
        for (fp16::Isa isa : {fp16::Isa::kScalar, fp16::Isa::kF16c, fp16::Isa::kAvx512}) {
          if (fp16::IsaSupported(isa)) names.append(fp16::IsaName(isa));
        }
        return names;
      },
      "The fp16 kernels this CPU can run, slowest first.");
  m.def(
      "fp16_set_isa",
      [](const std::string& name) {
        fp16::Isa isa = IsaFromName(name);
        std::string previous = fp16::IsaName(fp16::ActiveIsa());
        if (!fp16::SetIsa(isa)) {
          throw py::value_error(std::string("this CPU cannot run the '") + fp16::IsaName(isa) +
                                "' fp16 kernel");
        }
        return previous;
      },
      py::arg("name"),
      "Pin the fp16 kernel ('auto', 'scalar', 'f16c', 'avx512') for the whole process, for\n"
      "tests and benchmarks. Returns the previous one.");
  m.def(
      "fp16_auto_threads", [](size_t n) { return fp16::AutoThreads(n * 6); }, py::arg("n"),
      "The thread count threads=0 picks for converting n elements.");
}

}  // namespace paddle_ipu
