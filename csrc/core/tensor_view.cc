// TensorView: a zero-copy window on a Paddle tensor's host memory, readable and
// writable through the buffer protocol (numpy, ONNX Runtime, memoryview).
//
// The view never owns the memory. It holds Python references that keep the
// memory alive: the tensor object it was made from (`owner`) and, where the
// tensor could later drop or swap its storage, an object that shares the
// allocation itself (`keepalive`, for example a DLPack capsule).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace {

struct DType {
  const char* name;
  const char* format;  // struct-module code, as numpy reads it
  py::ssize_t itemsize;
};

// Paddle's dtype names. bfloat16 has no buffer-protocol code numpy understands,
// so it is left out and refused with a message, rather than shown as uint16.
const DType kDTypes[] = {
    {"float32", "f", 4},  {"float16", "e", 2},     {"float64", "d", 8},     {"int8", "b", 1},
    {"uint8", "B", 1},    {"int16", "h", 2},       {"uint16", "H", 2},      {"int32", "i", 4},
    {"uint32", "I", 4},   {"int64", "q", 8},       {"uint64", "Q", 8},      {"bool", "?", 1},
    {"complex64", "Zf", 8}, {"complex128", "Zd", 16},
};

const DType& LookupDType(const std::string& name) {
  for (const DType& d : kDTypes) {
    if (name == d.name) return d;
  }
  std::string known;
  for (const DType& d : kDTypes) known += std::string(known.empty() ? "" : ", ") + d.name;
  throw py::type_error("cannot view a tensor of dtype '" + name + "'; supported dtypes: " + known);
}

// The DLPack ABI (stable since v0.2): Paddle's DenseTensor._to_dlpack() returns
// a capsule named "dltensor" holding a DLManagedTensor.
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDAHost = 3;

std::string DLDTypeName(DLDataType t) {
  if (t.lanes != 1) return "vector";
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case 0:
      return "int" + bits;
    case 1:
      return "uint" + bits;
    case 2:
      return "float" + bits;
    case 4:
      return "bfloat" + bits;
    case 5:
      return "complex" + bits;
    case 6:
      return t.bits == 8 ? "bool" : "bool" + bits;
  }
  return "dlpack code " + std::to_string(t.code);
}

// A non-null address for empty tensors, whose allocation may be null: numpy and
// memoryview want a pointer even for zero bytes.
alignas(64) unsigned char g_empty[64];

class TensorView {
 public:
  TensorView(py::object owner, uintptr_t ptr, const std::string& dtype,
             const std::vector<int64_t>& shape, bool readonly, py::object keepalive)
      : owner_(std::move(owner)), keepalive_(std::move(keepalive)), dtype_(&LookupDType(dtype)),
        readonly_(readonly) {
    shape_.reserve(shape.size());
    numel_ = 1;
    for (int64_t d : shape) {
      if (d < 0) {
        throw py::value_error("cannot view a tensor with an unknown (negative) dimension: " +
                              ShapeString(shape));
      }
      shape_.push_back(static_cast<py::ssize_t>(d));
      numel_ *= d;
    }
    if (ptr == 0 && numel_ != 0) {
      throw py::value_error("cannot view a tensor that holds no memory (data pointer is null)");
    }
    data_ = numel_ == 0 ? static_cast<void*>(g_empty) : reinterpret_cast<void*>(ptr);
    strides_.resize(shape_.size());
    py::ssize_t stride = dtype_->itemsize;
    for (size_t i = shape_.size(); i-- > 0;) {
      strides_[i] = stride;
      stride *= shape_[i];
    }
  }

  static TensorView FromDLPack(py::object capsule, py::object owner, bool readonly) {
    auto* managed =
        static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed == nullptr) {
      PyErr_Clear();
      throw py::type_error("expected an unconsumed DLPack capsule named 'dltensor'");
    }
    const DLTensor& t = managed->dl_tensor;
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost) {
      throw py::type_error("cannot view a tensor in device memory (DLPack device type " +
                           std::to_string(t.device.device_type) + "); copy it to the host first");
    }
    std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (t.strides != nullptr && numel != 0) {
      // DLPack strides count elements; dimensions of size 1 (and empty tensors)
      // may carry any stride.
      int64_t expected = 1;
      for (int32_t i = t.ndim; i-- > 0;) {
        if (shape[i] != 1 && t.strides[i] != expected) {
          std::vector<int64_t> strides(t.strides, t.strides + t.ndim);
          throw py::type_error("cannot view a non-contiguous tensor (shape " + ShapeString(shape) +
                               ", element strides " + ShapeString(strides) +
                               "); call .contiguous() on it first");
        }
        expected *= shape[i];
      }
    }
    auto ptr = reinterpret_cast<uintptr_t>(static_cast<char*>(t.data) + t.byte_offset);
    // The capsule stays unconsumed and referenced: its destructor releases
    // Paddle's share of the allocation when the view goes away.
    return TensorView(std::move(owner), ptr, DLDTypeName(t.dtype), shape, readonly,
                      std::move(capsule));
  }

  py::buffer_info Buffer() const {
    return py::buffer_info(data_, dtype_->itemsize, dtype_->format,
                           static_cast<py::ssize_t>(shape_.size()), shape_, strides_, readonly_);
  }

  uintptr_t data_ptr() const { return numel_ == 0 ? 0 : reinterpret_cast<uintptr_t>(data_); }
  std::string dtype() const { return dtype_->name; }
  size_t rank() const { return shape_.size(); }
  py::tuple shape() const {
    py::tuple t(shape_.size());
    for (size_t i = 0; i < shape_.size(); ++i) t[i] = py::int_(shape_[i]);
    return t;
  }
  int64_t dim(int64_t i) const {
    const auto r = static_cast<int64_t>(shape_.size());
    if (i < -r || i >= r) {
      throw py::index_error("dimension " + std::to_string(i) + " out of range for rank " +
                            std::to_string(r));
    }
    return shape_[static_cast<size_t>(i < 0 ? i + r : i)];
  }
  int64_t numel() const { return numel_; }
  int64_t itemsize() const { return dtype_->itemsize; }
  int64_t nbytes() const { return numel_ * dtype_->itemsize; }
  bool readonly() const { return readonly_; }
  py::object owner() const { return owner_; }

  std::string Repr() const {
    std::vector<int64_t> s(shape_.begin(), shape_.end());
    std::ostringstream os;
    os << "TensorView(dtype=" << dtype_->name << ", shape=" << ShapeString(s) << ", data_ptr=0x"
       << std::hex << data_ptr() << (readonly_ ? ", readonly" : "") << ")";
    return os.str();
  }

 private:
  static std::string ShapeString(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }

  py::object owner_;
  py::object keepalive_;
  const DType* dtype_;
  bool readonly_;
  void* data_ = nullptr;
  int64_t numel_ = 0;
  std::vector<py::ssize_t> shape_;
  std::vector<py::ssize_t> strides_;
};

// An unversioned DLPack capsule over a C-contiguous host buffer, read-only ones
// included.  Paddle before 3.3 takes only unversioned capsules, and numpy exports a
// read-only array only as a versioned one (it has no way to flag read-only otherwise):
// this lets Paddle share the compiled model's read-only weights instead of copying
// them.  The capsule holds the buffer (and so the array) until Paddle's tensor frees
// it, and its deleter never waits for the GIL (see DeleteExported).
struct ExportedBuffer {
  DLManagedTensor managed;
  Py_buffer view;
  std::vector<int64_t> shape;
};

void ReleaseExported(ExportedBuffer* exported) {
  PyBuffer_Release(&exported->view);
  delete exported;
}

// Buffers whose tensor Paddle freed on a thread without the GIL, released later on
// the main thread.
std::mutex g_pending_mutex;
std::vector<ExportedBuffer*> g_pending;

int ReleasePending(void*) {
  std::vector<ExportedBuffer*> batch;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    batch.swap(g_pending);
  }
  for (ExportedBuffer* exported : batch) ReleaseExported(exported);
  return 0;
}

void DeleteExported(DLManagedTensor* managed) {
  auto* exported = static_cast<ExportedBuffer*>(managed->manager_ctx);
  if (!Py_IsInitialized()) {  // after the interpreter: the buffer is gone with it
    delete exported;
    return;
  }
  if (PyGILState_Check()) {
    ReleaseExported(exported);
    return;
  }
  // Paddle frees tensors on its garbage-collector threads, and a thread holding the
  // GIL may be joining that very thread (Paddle 3.1 destroys an interpreter so): taking
  // the GIL here would deadlock, as numpy's own capsule deleter does.  Queue the
  // release for the main thread instead (Py_AddPendingCall needs no GIL).
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    first = g_pending.empty();
    g_pending.push_back(exported);
  }
  if (first) Py_AddPendingCall(ReleasePending, nullptr);
}

void DestroyCapsule(PyObject* capsule) {
  // A consumer renames the capsule ("used_dltensor") and owns the tensor; one that was
  // never consumed still holds it.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

DLDataType BufferDType(const Py_buffer& view) {
  const char* format = view.format != nullptr ? view.format : "B";
  while (*format == '@' || *format == '=' || *format == '<') ++format;
  const auto bits = static_cast<uint8_t>(view.itemsize * 8);
  const std::string code(format);
  if (code == "e" || code == "f" || code == "d") return {2, bits, 1};
  if (code == "b" || code == "h" || code == "i" || code == "l" || code == "q") return {0, bits, 1};
  if (code == "B" || code == "H" || code == "I" || code == "L" || code == "Q") return {1, bits, 1};
  if (code == "?") return {6, 8, 1};
  throw py::type_error("cannot export a buffer of format '" + code + "' through DLPack");
}

py::object ExportDLPack(const py::object& array) {
  ReleasePending(nullptr);  // also when a pending call could not be queued
  auto exported = std::make_unique<ExportedBuffer>();
  if (PyObject_GetBuffer(array.ptr(), &exported->view,
                         PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) != 0) {
    throw py::error_already_set();
  }
  const Py_buffer& view = exported->view;
  DLDataType dtype;
  try {
    dtype = BufferDType(view);
  } catch (...) {
    PyBuffer_Release(&exported->view);
    throw;
  }
  exported->shape.assign(view.shape, view.shape + view.ndim);
  DLTensor& t = exported->managed.dl_tensor;
  t.data = view.buf;
  t.device = {kDLCPU, 0};
  t.ndim = view.ndim;
  t.dtype = dtype;
  t.shape = exported->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  exported->managed.manager_ctx = exported.get();
  exported->managed.deleter = DeleteExported;
  PyObject* capsule = PyCapsule_New(&exported->managed, "dltensor", DestroyCapsule);
  if (capsule == nullptr) {
    PyBuffer_Release(&exported->view);
    throw py::error_already_set();
  }
  exported.release();
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace

void RegisterTensorView(py::module_& m) {
  m.def("export_dlpack", &ExportDLPack, py::arg("array"),
        "An unversioned DLPack capsule ('dltensor') sharing a C-contiguous host buffer,\n"
        "read-only ones included (for Paddle before 3.3, which takes no versioned capsule).");
  py::class_<TensorView>(m, "TensorView", py::buffer_protocol(),
                         "A zero-copy view of a tensor's host memory, exported through the buffer\n"
                         "protocol (np.asarray(view) shares the memory). Build one with\n"
                         "paddle_ipu.tensor_view.view(tensor); this constructor trusts `ptr`.")
      .def(py::init<py::object, uintptr_t, const std::string&, const std::vector<int64_t>&, bool,
                    py::object>(),
           // Positional-capable on purpose: pybind11's keyword matching costs ~1 us a call.
           py::arg("owner"), py::arg("ptr"), py::arg("dtype"), py::arg("shape"),
           py::arg("readonly") = false, py::arg("keepalive") = py::none())
      .def_static("_from_dlpack", &TensorView::FromDLPack, py::arg("capsule"), py::arg("owner"),
                  py::arg("readonly") = false,
                  "A view of a DLPack capsule's tensor; the capsule is kept (not consumed).")
      .def_buffer(&TensorView::Buffer)
      .def_property_readonly("data_ptr", &TensorView::data_ptr,
                             "Address of the first element (0 for an empty tensor).")
      .def_property_readonly("dtype", &TensorView::dtype, "Paddle dtype name, e.g. 'float32'.")
      .def_property_readonly("rank", &TensorView::rank)
      .def_property_readonly("ndim", &TensorView::rank)
      .def_property_readonly("shape", &TensorView::shape)
      .def("dim", &TensorView::dim, py::arg("index"))
      .def_property_readonly("numel", &TensorView::numel)
      .def_property_readonly("itemsize", &TensorView::itemsize)
      .def_property_readonly("nbytes", &TensorView::nbytes)
      .def_property_readonly("readonly", &TensorView::readonly)
      .def_property_readonly("owner", &TensorView::owner,
                             "The tensor object this view keeps alive.")
      .def("__repr__", &TensorView::Repr);
}

}  // namespace paddle_ipu
