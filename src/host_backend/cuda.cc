#include "host_backend/cuda.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>

#include <atomic>
#include <mutex>

namespace qnccl {
namespace host {
namespace {

/* cuGetProcAddress_v2, which finds each function in the version of the
 * ABI the backend was written for (CUDA 12.0). */
using GetProcAddress = CuResult (*)(const char*, void**, int, uint64_t, int*);
constexpr int kCudaVersion = 12000;

template <class F>
bool bind(GetProcAddress get, const char* name, F* fn) {
  void* p = nullptr;
  int status = 0;
  if (get(name, &p, kCudaVersion, 0, &status) != 0 || p == nullptr) return false;
  *fn = reinterpret_cast<F>(p);
  return true;
}

const Cuda* load() {
  // Only a driver the process already uses: loading one would start CUDA in
  // a process that never asked for it.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return nullptr;
  auto get = reinterpret_cast<GetProcAddress>(dlsym(h, "cuGetProcAddress_v2"));
  if (get == nullptr) return nullptr;
  static Cuda c;
  const bool ok =
      bind(get, "cuPointerGetAttributes", &c.pointerGetAttributes) &&
      bind(get, "cuStreamGetCtx", &c.streamGetCtx) &&
      bind(get, "cuCtxPushCurrent", &c.ctxPushCurrent) &&
      bind(get, "cuCtxPopCurrent", &c.ctxPopCurrent) &&
      bind(get, "cuCtxGetDevice", &c.ctxGetDevice) &&
      bind(get, "cuMemcpyAsync", &c.memcpyAsync) &&
      bind(get, "cuLaunchHostFunc", &c.launchHostFunc) &&
      bind(get, "cuEventCreate", &c.eventCreate) &&
      bind(get, "cuEventRecordWithFlags", &c.eventRecordWithFlags) &&
      bind(get, "cuEventSynchronize", &c.eventSynchronize) &&
      bind(get, "cuEventDestroy", &c.eventDestroy) &&
      bind(get, "cuStreamWaitEvent", &c.streamWaitEvent) &&
      bind(get, "cuMemHostAlloc", &c.memHostAlloc) &&
      bind(get, "cuStreamGetCaptureInfo", &c.streamGetCaptureInfo) &&
      bind(get, "cuThreadExchangeStreamCaptureMode", &c.threadExchangeStreamCaptureMode) &&
      bind(get, "cuUserObjectCreate", &c.userObjectCreate) &&
      bind(get, "cuGraphRetainUserObject", &c.graphRetainUserObject) &&
      bind(get, "cuGetErrorString", &c.getErrorString);
  return ok ? &c : nullptr;
}

/* A number that changes whenever the process loads a shared object (glibc's
 * dlpi_adds), read without touching the file system, unlike a dlopen. */
unsigned long long objects_loaded() {
  static std::atomic<unsigned long long> unknown{0};
  unsigned long long adds = 0;
  const int known = dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) {
        if (size < offsetof(dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds) return 0;
        *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // the first object carries the count
      },
      &adds);
  return known ? adds : ++unknown;  // (an old loader: every call looks again)
}

}  // namespace

const Cuda* cuda() {
  // Until the process loads the driver there is no device memory; the first
  // call after it does finds it (and it is never unloaded). Host-memory calls
  // of a process without CUDA ask this every time: they look again only when
  // the process has loaded something since (a dlopen costs ~20 us).
  static std::atomic<const Cuda*> found{nullptr};
  static std::atomic<unsigned long long> looked_at{~0ull};
  static std::mutex mutex;
  if (const Cuda* c = found.load(std::memory_order_acquire)) return c;
  const unsigned long long now = objects_loaded();
  if (now == looked_at.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (found.load() == nullptr) {
    found.store(load(), std::memory_order_release);
    if (found.load() == nullptr) looked_at.store(now, std::memory_order_relaxed);
  }
  return found.load();
}

int device_of(const void* p) {
  const Cuda* c = cuda();
  if (c == nullptr || p == nullptr) return -1;
  unsigned type = 0;
  int device = -1;
  int attributes[2] = {kCuPointerAttributeMemoryType, kCuPointerAttributeDeviceOrdinal};
  void* values[2] = {&type, &device};
  // Never an error for memory CUDA does not know: its type is 0 then.
  if (c->pointerGetAttributes(2, attributes, values, (uintptr_t)p) != 0) return -1;
  return type == (unsigned)kCuMemoryTypeDevice ? device : -1;
}

int current_device() {
  const Cuda* c = cuda();
  int device = -1;
  if (c == nullptr || c->ctxGetDevice(&device) != 0) return -1;
  return device;
}

const char* cuda_error(CuResult r) {
  static thread_local char text[160];
  const char* s = nullptr;
  if (cuda() == nullptr || cuda()->getErrorString(r, &s) != 0 || s == nullptr) s = "unknown";
  snprintf(text, sizeof text, "CUDA error %d (%s)", r, s);
  return text;
}

}  // namespace host
}  // namespace qnccl
