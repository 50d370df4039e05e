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

// ---- exporting a host buffer as a DLPack capsule ----------------------------------
//
// numpy before 2.1 exports only the unversioned capsule, and refuses read-only arrays
// (DLPack 0.x has no read-only flag).  Paddle adopts a "dltensor" capsule as it is, so
// a read-only array (a compiled model's weights, views of its bytes) can be shared
// with a Paddle tensor that only reads it; this capsule holds the exporter's buffer
// (and so the array) until the consumer calls the deleter.

struct Export {
  Py_buffer view;
  std::vector<int64_t> shape;
  DLManagedTensor managed;
};

bool DLTypeOf(const std::string& format, py::ssize_t itemsize, DLDataType* out) {
  // the buffer protocol's struct codes, with an optional byte-order prefix
  std::string f = format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@' || f[0] == '|')) f = f.substr(1);
  if (f.size() != 1) return false;
  const auto bits = static_cast<uint8_t>(itemsize * 8);
  switch (f[0]) {
    case 'e':
    case 'f':
    case 'd':
      *out = {2, bits, 1};
      return true;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      *out = {0, bits, 1};
      return true;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
      *out = {1, bits, 1};
      return true;
    case '?':
      *out = {6, 8, 1};
      return true;
  }
  return false;
}

void DeleteExport(DLManagedTensor* managed) {
  auto* e = static_cast<Export*>(managed->manager_ctx);
  // Paddle may free the tensor on a thread without the GIL; at interpreter exit the
  // buffer is left to the process's end.
  if (Py_IsInitialized()) {
    PyGILState_STATE state = PyGILState_Ensure();
    PyBuffer_Release(&e->view);
    PyGILState_Release(state);
  }
  delete e;
}

void CapsuleDestructor(PyObject* capsule) {
  // Only an unconsumed capsule still owns its tensor; a consumer renames it.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
  PyErr_Clear();
}

py::object DLPackCapsule(py::object obj) {
  auto* e = new Export();
  if (PyObject_GetBuffer(obj.ptr(), &e->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    delete e;
    throw py::error_already_set();
  }
  DLDataType dtype{};
  const std::string format = e->view.format ? e->view.format : "B";
  if (!DLTypeOf(format, e->view.itemsize, &dtype)) {
    PyBuffer_Release(&e->view);
    delete e;
    throw py::type_error("cannot export a buffer of format '" + format + "' through DLPack");
  }
  for (int i = 0; i < e->view.ndim; ++i) e->shape.push_back(e->view.shape[i]);
  DLTensor& t = e->managed.dl_tensor;
  t.data = e->view.len ? e->view.buf : static_cast<void*>(g_empty);
  t.device = {kDLCPU, 0};
  t.ndim = e->view.ndim;
  t.dtype = dtype;
  t.shape = e->shape.data();
  t.strides = nullptr;  // C-contiguous
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = &DeleteExport;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", &CapsuleDestructor);
  if (capsule == nullptr) {
    DeleteExport(&e->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

}  // namespace

void RegisterTensorView(py::module_& m) {
  m.def("dlpack_capsule", &DLPackCapsule, py::arg("buffer"),
        "An unversioned DLPack capsule ('dltensor') over a C-contiguous host buffer, "
        "read-only ones included; it keeps the buffer's exporter alive until consumed "
        "and released.");
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
