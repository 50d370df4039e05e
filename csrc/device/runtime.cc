// The "ipu" custom-device runtime for stock PaddlePaddle wheels.
//
// Paddle loads every shared library in $CUSTOM_DEVICE_ROOT (by default
// <site-packages>/paddle_custom_device) and calls InitPlugin.  This plugin gives
// Paddle a device type "ipu" whose memory is host memory: Paddle places tensors
// on it, runs CPU kernels for ops that have no ipu kernel, and paddle_ipu runs
// whole compiled graphs on it.  It is pure C ABI and needs no link against
// libpaddle.

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <type_traits>

#include "paddle/phi/backends/device_ext.h"

// CMake passes the release whose header this is (setup.py finds it); a bare compile
// (tools/check_aarch64.sh) does not.
#ifndef PADDLE_IPU_PADDLE_VERSION
#define PADDLE_IPU_PADDLE_VERSION "(unknown)"
#endif
#ifndef PADDLE_IPU_PADDLE_SERIES
#define PADDLE_IPU_PADDLE_SERIES PADDLE_IPU_PADDLE_VERSION
#endif

namespace {

constexpr const char* kDeviceType = "ipu";
constexpr const char* kCountEnv = "PADDLE_IPU_VISIBLE_DEVICES";
constexpr size_t kMaxDevices = 64;
// Reported capacity of one emulated device: host memory has no fixed size, so
// report a large budget that Paddle's allocator can plan against.
constexpr size_t kDeviceMemoryBytes = size_t{64} << 30;

struct DeviceStats {
  std::atomic<size_t> used{0};
  std::atomic<size_t> peak{0};
};

DeviceStats g_stats[kMaxDevices];
thread_local int g_current_device = 0;

size_t ParseDeviceCount() {
  const char* raw = std::getenv(kCountEnv);
  if (raw == nullptr || raw[0] == '\0') return 1;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(raw, &end, 10);
  bool ok = errno == 0 && end != raw && *end == '\0' && value >= 1 &&
            value <= static_cast<long>(kMaxDevices);
  if (!ok) {
    std::fprintf(stderr,
                 "[paddle-ipu] error: %s=\"%s\" is not a device count: expected "
                 "an integer in [1, %zu]; using 1 device.\n",
                 kCountEnv, raw, kMaxDevices);
    return 1;
  }
  return static_cast<size_t>(value);
}

size_t DeviceCount() {
  static const size_t count = ParseDeviceCount();
  return count;
}

bool ValidDevice(const C_Device device) {
  return device != nullptr && device->id >= 0 &&
         static_cast<size_t>(device->id) < DeviceCount();
}

C_Status Init() { return C_SUCCESS; }

C_Status InitDevice(const C_Device device) {
  return ValidDevice(device) ? C_SUCCESS : C_ERROR;
}

C_Status SetDevice(const C_Device device) {
  if (!ValidDevice(device)) return C_ERROR;
  g_current_device = device->id;
  return C_SUCCESS;
}

C_Status GetDevice(const C_Device device) {
  if (device == nullptr) return C_ERROR;
  device->id = g_current_device;
  return C_SUCCESS;
}

C_Status DeInitDevice(const C_Device) { return C_SUCCESS; }
C_Status Finalize() { return C_SUCCESS; }

C_Status GetDeviceCount(size_t* count) {
  *count = DeviceCount();
  return C_SUCCESS;
}

C_Status GetDeviceList(size_t* devices) {
  for (size_t i = 0; i < DeviceCount(); ++i) devices[i] = i;
  return C_SUCCESS;
}

// Allocation: 64-byte aligned host memory, with a small header holding the
// size so that statistics stay right even when Paddle passes size 0 back.
constexpr size_t kAlign = 64;

C_Status Allocate(const C_Device device, void** ptr, size_t size) {
  if (!ValidDevice(device) || ptr == nullptr) return C_ERROR;
  size_t padded = ((size + kAlign - 1) / kAlign) * kAlign + kAlign;
  void* raw = std::aligned_alloc(kAlign, padded);
  if (raw == nullptr) return C_FAILED;
  *static_cast<size_t*>(raw) = size;
  *ptr = static_cast<char*>(raw) + kAlign;
  DeviceStats& st = g_stats[device->id];
  size_t now = st.used.fetch_add(size) + size;
  size_t peak = st.peak.load();
  while (now > peak && !st.peak.compare_exchange_weak(peak, now)) {
  }
  return C_SUCCESS;
}

C_Status Deallocate(const C_Device device, void* ptr, size_t) {
  if (ptr == nullptr) return C_SUCCESS;
  void* raw = static_cast<char*>(ptr) - kAlign;
  size_t size = *static_cast<size_t*>(raw);
  if (ValidDevice(device)) g_stats[device->id].used.fetch_sub(size);
  std::free(raw);
  return C_SUCCESS;
}

C_Status HostAllocate(const C_Device device, void** ptr, size_t size) {
  return Allocate(device, ptr, size);
}

C_Status HostDeallocate(const C_Device device, void* ptr, size_t size) {
  return Deallocate(device, ptr, size);
}

C_Status MemorySet(const C_Device, void* ptr, unsigned char value,
                   size_t size) {
  std::memset(ptr, value, size);
  return C_SUCCESS;
}

C_Status Copy(const C_Device, void* dst, const void* src, size_t size) {
  if (size != 0) std::memmove(dst, src, size);
  return C_SUCCESS;
}

C_Status AsyncCopy(const C_Device device, C_Stream, void* dst, const void* src,
                   size_t size) {
  return Copy(device, dst, src, size);
}

C_Status CopyP2P(const C_Device, const C_Device, void* dst, const void* src,
                 size_t size) {
  if (size != 0) std::memmove(dst, src, size);
  return C_SUCCESS;
}

C_Status AsyncCopyP2P(const C_Device dst_device, const C_Device src_device,
                      C_Stream, void* dst, const void* src, size_t size) {
  return CopyP2P(dst_device, src_device, dst, src, size);
}

// Streams and events: every operation completes before it returns, so streams
// are tokens and events are always complete.
struct StreamToken {};
struct EventToken {};

C_Status CreateStream(const C_Device, C_Stream* stream) {
  *stream = reinterpret_cast<C_Stream>(new (std::nothrow) StreamToken());
  return *stream ? C_SUCCESS : C_FAILED;
}

C_Status DestroyStream(const C_Device, C_Stream stream) {
  delete reinterpret_cast<StreamToken*>(stream);
  return C_SUCCESS;
}

C_Status CreateEvent(const C_Device, C_Event* event) {
  *event = reinterpret_cast<C_Event>(new (std::nothrow) EventToken());
  return *event ? C_SUCCESS : C_FAILED;
}

C_Status DestroyEvent(const C_Device, C_Event event) {
  delete reinterpret_cast<EventToken*>(event);
  return C_SUCCESS;
}

C_Status RecordEvent(const C_Device, C_Stream, C_Event) { return C_SUCCESS; }
C_Status QueryEvent(const C_Device, C_Event) { return C_SUCCESS; }
C_Status QueryStream(const C_Device, C_Stream) { return C_SUCCESS; }
C_Status SyncDevice(const C_Device) { return C_SUCCESS; }
C_Status SyncStream(const C_Device, C_Stream) { return C_SUCCESS; }
C_Status SyncEvent(const C_Device, C_Event) { return C_SUCCESS; }
C_Status StreamWaitEvent(const C_Device, C_Stream, C_Event) {
  return C_SUCCESS;
}

C_Status AddCallback(const C_Device device, C_Stream stream,
                     C_Callback callback, void* user_data) {
  // Work is synchronous: the stream is already drained.
  C_Status status = C_SUCCESS;
  callback(device, stream, user_data, &status);
  return C_SUCCESS;
}

C_Status MemoryStats(const C_Device device, size_t* total, size_t* free_mem) {
  if (!ValidDevice(device)) return C_ERROR;
  size_t used = g_stats[device->id].used.load();
  *total = kDeviceMemoryBytes;
  *free_mem = used < kDeviceMemoryBytes ? kDeviceMemoryBytes - used : 0;
  return C_SUCCESS;
}

C_Status MinChunkSize(const C_Device, size_t* size) {
  *size = 512;
  return C_SUCCESS;
}

C_Status MaxChunkSize(const C_Device, size_t* size) {
  *size = 0;  // no limit
  return C_SUCCESS;
}

[[maybe_unused]] C_Status Fp16Supported(const C_Device, bool* supported) {
  *supported = true;
  return C_SUCCESS;
}

[[maybe_unused]] C_Status Bf16Supported(const C_Device, bool* supported) {
  *supported = false;
  return C_SUCCESS;
}

// Slots that only some releases' C_DeviceInterface has (is_float16_supported and
// is_bfloat16_supported arrived in Paddle 3.2): set them where the header being
// compiled against declares them.  PADDLE_CUSTOM_RUNTIME_*_VERSION is 0.1.1 in every
// 3.x release, so it cannot tell the layouts apart; the member itself can.
template <typename T, typename = void>
struct HasFloat16Slots : std::false_type {};
template <typename T>
struct HasFloat16Slots<T, std::void_t<decltype(&T::is_float16_supported),
                                      decltype(&T::is_bfloat16_supported)>>
    : std::true_type {};

template <typename T>
void SetFloat16Slots(T* api) {
  if constexpr (HasFloat16Slots<T>::value) {
    api->is_float16_supported = Fp16Supported;
    api->is_bfloat16_supported = Bf16Supported;
  }
}

}  // namespace

#define PADDLE_IPU_EXPORT __attribute__((visibility("default")))

extern "C" {

// Statistics for paddle_ipu (read with ctypes): bytes in use and the peak.
PADDLE_IPU_EXPORT size_t paddle_ipu_device_memory_used(int device) {
  if (device < 0 || static_cast<size_t>(device) >= kMaxDevices) return 0;
  return g_stats[device].used.load();
}

PADDLE_IPU_EXPORT size_t paddle_ipu_device_memory_peak(int device) {
  if (device < 0 || static_cast<size_t>(device) >= kMaxDevices) return 0;
  return g_stats[device].peak.load();
}

PADDLE_IPU_EXPORT size_t paddle_ipu_device_count() { return DeviceCount(); }

PADDLE_IPU_EXPORT void InitPlugin(CustomRuntimeParams* params) {
  PADDLE_CUSTOM_RUNTIME_CHECK_VERSION(params);
  // Paddle allocates the interface table and writes its own sizeof into ->size
  // before calling InitPlugin.  Every 3.x release has a different table (920, 976,
  // 1032, 1128 bytes for 3.0 to 3.3) under the same runtime version 0.1.1; writing
  // this build's table into another release's corrupts Paddle's heap, so `import
  // paddle` crashes.  Refuse instead: with device_type left null Paddle skips the lib
  // ("InitPlugin failed, please check the version compatibility") and paddle_ipu's
  // import names the release to install.
  if (params->interface == nullptr ||
      params->interface->size != sizeof(C_DeviceInterface)) {
    std::fprintf(stderr,
                 "[paddle-ipu] error: the ipu plugin was built against PaddlePaddle "
                 "%s, whose device interface differs from the installed one "
                 "(%zu bytes here, %zu expected); the ipu device is not "
                 "registered. Install paddlepaddle==%s.* or rebuild paddle-ipu "
                 "against the installed PaddlePaddle.\n",
                 PADDLE_IPU_PADDLE_VERSION,
                 params->interface ? params->interface->size : size_t{0},
                 sizeof(C_DeviceInterface), PADDLE_IPU_PADDLE_SERIES);
    params->device_type = nullptr;
    return;
  }
  params->device_type = const_cast<char*>(kDeviceType);
  params->sub_device_type = const_cast<char*>("emulated");

  std::memset(reinterpret_cast<void*>(params->interface), 0,
              sizeof(C_DeviceInterface));
  C_DeviceInterface* api = params->interface;
  api->size = sizeof(C_DeviceInterface);

  api->initialize = Init;
  api->finalize = Finalize;
  api->init_device = InitDevice;
  api->set_device = SetDevice;
  api->get_device = GetDevice;
  api->deinit_device = DeInitDevice;

  api->create_stream = CreateStream;
  api->destroy_stream = DestroyStream;
  api->query_stream = QueryStream;
  api->stream_add_callback = AddCallback;
  api->create_event = CreateEvent;
  api->record_event = RecordEvent;
  api->destroy_event = DestroyEvent;
  api->query_event = QueryEvent;
  api->synchronize_device = SyncDevice;
  api->synchronize_stream = SyncStream;
  api->synchronize_event = SyncEvent;
  api->stream_wait_event = StreamWaitEvent;

  api->device_memory_allocate = Allocate;
  api->device_memory_deallocate = Deallocate;
  api->device_memory_set = MemorySet;
  api->host_memory_allocate = HostAllocate;
  api->host_memory_deallocate = HostDeallocate;
  api->unified_memory_allocate = Allocate;
  api->unified_memory_deallocate = Deallocate;

  api->memory_copy_h2d = Copy;
  api->memory_copy_d2h = Copy;
  api->memory_copy_d2d = Copy;
  api->memory_copy_p2p = CopyP2P;
  api->async_memory_copy_h2d = AsyncCopy;
  api->async_memory_copy_d2h = AsyncCopy;
  api->async_memory_copy_d2d = AsyncCopy;
  api->async_memory_copy_p2p = AsyncCopyP2P;

  api->get_device_count = GetDeviceCount;
  api->get_device_list = GetDeviceList;
  api->device_memory_stats = MemoryStats;
  api->device_min_chunk_size = MinChunkSize;
  api->device_max_chunk_size = MaxChunkSize;
  SetFloat16Slots(api);
}

}  // extern "C"
