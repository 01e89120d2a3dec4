/* Allocation, copies and memset. A copy's or memset's pointers are checked
 * when it is issued (device memory must be allocated and cover the bytes;
 * the kind, when not cudaMemcpyDefault, must match what the pointers are)
 * and its bytes move when it runs on the stream, so a buffer changed or
 * freed before then gives what a GPU would: other bytes, or a fault. */
#include <stdint.h>
#include <string.h>

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/core.h"
#include "core/errors.h"
#include "core/executor.h"
#include "core/faults.h"
#include "core/internal.h"
#include "core/memory.h"

namespace simdev {
namespace {

enum class Where { kDevice, kPinned, kPageable, kInvalid };

const char* where_name(Where w) {
  switch (w) {
    case Where::kDevice: return "device memory";
    case Where::kPinned: return "pinned host memory";
    case Where::kPageable: return "pageable host memory";
    default: return "no live allocation";
  }
}

/* What [p, p + n) is. */
Where locate(const void* p, size_t n, int* device) {
  Allocation a;
  Memory& m = Memory::get();
  if (m.find(p, n, &a) && !a.freed) {
    *device = a.device;
    return a.kind == MemKind::kDevice || a.kind == MemKind::kAsync ? Where::kDevice
                                                                   : Where::kPinned;
  }
  if (m.device_of_range((uintptr_t)p) >= 0) return Where::kInvalid;
  return Where::kPageable;
}

bool host(Where w) { return w == Where::kPinned || w == Where::kPageable; }

const char* kind_name(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
  }
}

struct Move {
  void* dst;
  const void* src;
  size_t n;
  int value;  // memset: the byte; copy: -1
};

void move_bytes(void* arg) {
  const Move* m = static_cast<const Move*>(arg);
  if (m->value < 0)
    memcpy(m->dst, m->src, m->n);
  else
    memset(m->dst, m->value, m->n);
}

/* The work of a copy or memset: a fault in it is the device's. `staged`
 * holds the bytes a copy reads when they were staged at the call. */
Work transfer(const char* api, Move move, const char* what,
              std::shared_ptr<const std::vector<uint8_t>> staged = nullptr) {
  Work w;
  w.kind = Work::kDevice;
  w.what = what;
  std::string name = api;
  w.run = [move, name, staged] {
    Move m = move;
    Fault fault;
    std::lock_guard<std::mutex> one_at_a_time(device_work_lock());
    if (run_protected(move_bytes, &m, &fault)) return cudaSuccess;
    return fail_loudly(cudaErrorIllegalAddress, "%s of %zu bytes (%p -> %p) touched memory the "
                       "device may not use: %s", name.c_str(), m.n, m.src, m.dst,
                       Memory::get().describe(fault.address).c_str());
  };
  return w;
}

void count_allocation() {
  Lock lock(sim().mutex);
  if (!sim().captures.empty()) sim().counters.allocations_in_capture++;
}

}  // namespace

cudaError_t device_alloc(Device* d, size_t bytes, const char* api, void** out) {
  SIMDEV_CHECK(use_device(d));
  SIMDEV_CHECK(check_unsafe_call(api));
  count_allocation();
  return Memory::get().alloc_device(d->ordinal, bytes, MemKind::kDevice, api, out);
}

cudaError_t device_free(void* p, const char* api) {
  if (p == nullptr) return cudaSuccess;
  SIMDEV_CHECK(check_unsafe_call(api));
  Allocation a;
  if (Memory::get().find(p, 0, &a) && a.kind == MemKind::kAsync && !a.freed) {
    // CUDA allows it, without any synchronization: the caller has ordered every use before
    return Memory::get().free_device(p, MemKind::kAsync, api);
  }
  // No synchronization either (CUDA may synchronize here, but promises nothing): work still
  // queued that uses the memory faults when it runs.
  return Memory::get().free_device(p, MemKind::kDevice, api);
}

cudaError_t async_alloc(Stream* s, size_t bytes, void** out) {
  *out = nullptr;
  if (!config().memory_pools)
    return fail(cudaErrorNotSupported, "cudaMallocAsync: device %d has no memory pools "
                "(SIMDEV_MEMORY_POOLS=0; cudaDevAttrMemoryPoolsSupported says so)",
                s->device->ordinal);
  {
    Lock lock(sim().mutex);
    if (s->capture != nullptr)
      return fail(cudaErrorNotSupported, "cudaMallocAsync during stream capture (a graph memory "
                  "node) is not simulated");
  }
  count_allocation();
  void* p = nullptr;
  char how[64];
  snprintf(how, sizeof how, "cudaMallocAsync on stream %lu", (unsigned long)s->id);
  SIMDEV_CHECK(Memory::get().alloc_device(s->device->ordinal, bytes, MemKind::kAsync, how, &p));
  if (p == nullptr) return cudaSuccess;
  Work w;
  w.what = "stream-ordered allocation";
  w.run = [p] {
    std::lock_guard<std::mutex> one_at_a_time(device_work_lock());
    Memory::get().make_live(p);
    return cudaSuccess;
  };
  const cudaError_t e = issue(s, std::move(w));
  if (e != cudaSuccess) {
    Memory::get().free_device(p, MemKind::kAsync, "a failed cudaMallocAsync");
    return e;
  }
  *out = p;
  return cudaSuccess;
}

cudaError_t async_free(Stream* s, void* p) {
  if (p == nullptr) return cudaSuccess;
  Allocation a;
  if (!Memory::get().find(p, 0, &a) || a.begin != (uintptr_t)p || a.kind != MemKind::kAsync ||
      a.freed)
    return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): not the start of memory from "
                "cudaMallocAsync that is not freed yet", p);
  {
    Lock lock(sim().mutex);
    if (s->capture != nullptr)
      return fail(cudaErrorNotSupported, "cudaFreeAsync during stream capture (a graph memory "
                  "node) is not simulated");
  }
  char how[64];
  snprintf(how, sizeof how, "cudaFreeAsync on stream %lu", (unsigned long)s->id);
  std::string freed_by = how;
  Work w;
  w.what = "stream-ordered free";
  w.run = [p, freed_by] {
    std::lock_guard<std::mutex> one_at_a_time(device_work_lock());
    Memory::get().free_device(p, MemKind::kAsync, freed_by.c_str());
    return cudaSuccess;
  };
  return issue(s, std::move(w));
}

cudaError_t host_alloc(size_t bytes, const char* api, void** out) {
  SIMDEV_CHECK(check_unsafe_call(api));
  count_allocation();
  Device* d = current_context();
  return Memory::get().alloc_host(bytes, d != nullptr ? d->ordinal : 0, api, out);
}

cudaError_t host_free(void* p) {
  SIMDEV_CHECK(check_unsafe_call("cudaFreeHost"));
  return Memory::get().free_host(p);
}

cudaError_t host_register(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0)
    return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): no memory", p, bytes);
  SIMDEV_CHECK(check_unsafe_call("cudaHostRegister"));
  Device* d = current_context();
  return Memory::get().register_host(p, bytes, d != nullptr ? d->ordinal : 0);
}

cudaError_t host_unregister(void* p) { return Memory::get().unregister_host(p); }

cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, Stream* s, bool wait,
                 const char* api) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
    return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d is not a cudaMemcpyKind", api,
                (int)kind);
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr)
    return fail(cudaErrorInvalidValue, "%s: %s is NULL", api, dst == nullptr ? "dst" : "src");
  int ds = -1, dd = -1;
  const Where from = locate(src, n, &ds), to = locate(dst, n, &dd);
  if (from == Where::kInvalid || to == Where::kInvalid)
    return fail(cudaErrorInvalidValue, "%s of %zu bytes: the %s is not live device memory "
                "covering them (%s)", api, n, from == Where::kInvalid ? "source" : "destination",
                Memory::get().describe((uintptr_t)(from == Where::kInvalid ? src : dst)).c_str());
  const bool ok = kind == cudaMemcpyDefault ||
                  (kind == cudaMemcpyHostToHost && host(from) && host(to)) ||
                  (kind == cudaMemcpyHostToDevice && host(from) && to == Where::kDevice) ||
                  (kind == cudaMemcpyDeviceToHost && from == Where::kDevice && host(to)) ||
                  (kind == cudaMemcpyDeviceToDevice && from == Where::kDevice &&
                   to == Where::kDevice);
  if (!ok)
    return fail(cudaErrorInvalidValue, "%s with %s: the source is %s and the destination %s",
                api, kind_name(kind), where_name(from), where_name(to));
  const uintptr_t a = (uintptr_t)src, b = (uintptr_t)dst;
  if (a < b + n && b < a + n)
    return fail(cudaErrorInvalidValue, "%s: source and destination overlap", api);
  Lock lock(sim().mutex);
  if (s->capture != nullptr && (from == Where::kPageable || to == Where::kPageable)) {
    invalidate_locked(s->capture, std::string(api) + " to or from pageable host memory");
    return fail(cudaErrorStreamCaptureUnsupported, "%s to or from pageable host memory during "
                "stream capture: not allowed (the capture is invalidated); use pinned memory "
                "(cudaMallocHost, cudaHostRegister)", api);
  }
  char what[96];
  snprintf(what, sizeof what, "copy of %zu bytes (%s to %s)", n, where_name(from), where_name(to));
  if (wait && from == Where::kPageable && to == Where::kDevice) {
    // CUDA's API synchronization behaviour for cudaMemcpy from pageable memory to the
    // device: the stream's earlier work is waited for, the bytes are staged, and the call
    // returns while the DMA to the device may not have landed. Work on a non-blocking
    // stream is not ordered after it: it may read the destination's old bytes.
    SIMDEV_CHECK(wait_locked(lock, s->last, api));
    auto staged = std::make_shared<const std::vector<uint8_t>>(
        static_cast<const uint8_t*>(src), static_cast<const uint8_t*>(src) + n);
    return issue_locked(s, transfer(api, Move{dst, staged->data(), n, -1}, what, staged));
  }
  SIMDEV_CHECK(issue_locked(s, transfer(api, Move{dst, src, n, -1}, what)));
  if (!wait) return cudaSuccess;
  return wait_locked(lock, s->last, api);
}

cudaError_t fill(void* dst, int value, size_t n, Stream* s, const char* api) {
  if (n == 0) return cudaSuccess;
  int d = -1;
  const Where to = locate(dst, n, &d);
  if (to != Where::kDevice && to != Where::kPinned)
    return fail(cudaErrorInvalidValue, "%s of %zu bytes at %p: %s", api, n, dst,
                to == Where::kInvalid ? Memory::get().describe((uintptr_t)dst).c_str()
                                      : "not device memory");
  char what[64];
  snprintf(what, sizeof what, "memset of %zu bytes", n);
  Lock lock(sim().mutex);
  return issue_locked(s, transfer(api, Move{dst, nullptr, n, value & 0xff}, what));
}

cudaError_t pointer_attributes(const void* p, cudaPointerAttributes* out) {
  memset(out, 0, sizeof *out);
  out->device = -2;
  Allocation a;
  Memory& m = Memory::get();
  if (m.find(p, 0, &a) && !a.freed) {
    out->device = a.device;
    out->devicePointer = const_cast<void*>(p);
    if (a.kind == MemKind::kDevice || a.kind == MemKind::kAsync) {
      out->type = cudaMemoryTypeDevice;
    } else {
      out->type = cudaMemoryTypeHost;
      out->hostPointer = const_cast<void*>(p);
    }
    return cudaSuccess;
  }
  if (m.device_of_range((uintptr_t)p) >= 0)
    return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(%p): %s", p,
                m.describe((uintptr_t)p).c_str());
  out->type = cudaMemoryTypeUnregistered;
  return cudaSuccess;
}

}  // namespace simdev
