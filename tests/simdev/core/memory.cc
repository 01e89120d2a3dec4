#include "core/memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/config.h"
#include "core/errors.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define SIMDEV_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define SIMDEV_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define SIMDEV_POISON(p, n) ((void)(p), (void)(n))
#define SIMDEV_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace simdev {
namespace {

constexpr size_t kRangeBytes = size_t(1) << 40;   // address space per device
constexpr size_t kDeviceMemory = size_t(80) << 30;  // what a device reports (an H100's 80 GiB)
constexpr size_t kAlign = 256;                     // cudaMalloc's alignment

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

Memory& Memory::get() {
  static Memory* memory = new Memory();  // outlives every worker thread
  return *memory;
}

Memory::Memory() : page_((size_t)sysconf(_SC_PAGESIZE)) {
  for (int d = 0; d < config().devices; d++) {
    void* p = mmap(nullptr, kRangeBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
      report("cannot reserve %zu bytes of address space for device %d", kRangeBytes, d);
      abort();
    }
    Range r;
    r.base = r.next = (uintptr_t)p;
    r.end = r.base + kRangeBytes;
    ranges_.push_back(r);
  }
  in_use_.assign(ranges_.size(), 0);
  live_.resize(ranges_.size());
}

cudaError_t Memory::alloc_device(int device, size_t bytes, MemKind kind, const char* how,
                                 void** out) {
  *out = nullptr;
  if (bytes == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t live = in_use_[(size_t)device];
  if (bytes > kDeviceMemory || live + bytes > kDeviceMemory)
    return fail(cudaErrorMemoryAllocation,
                "%s of %zu bytes on device %d: out of memory (%zu of %zu bytes in use)", how,
                bytes, device, live, kDeviceMemory);
  Range& r = ranges_[(size_t)device];
  const size_t span = round_up(round_up(bytes, kAlign), page_);
  if (r.next + span + page_ > r.end)
    return fail(cudaErrorMemoryAllocation, "%s: device %d's address space is used up", how,
                device);
  Allocation a;
  a.map_begin = r.next;
  a.map_size = span;
  a.begin = a.map_begin + span - round_up(bytes, kAlign);
  a.size = bytes;
  a.device = device;
  a.kind = kind;
  a.how = how;
  r.next += span + page_;  // and a guard page
  in_use_[(size_t)device] += bytes;
  if (kind != MemKind::kAsync) {
    if (mprotect((void*)a.map_begin, a.map_size, PROT_READ | PROT_WRITE) != 0)
      return fail(cudaErrorMemoryAllocation, "%s of %zu bytes: mprotect failed", how, bytes);
    a.live = true;
    live_[(size_t)device].insert(a.begin);
    SIMDEV_POISON((void*)a.map_begin, a.begin - a.map_begin);
    SIMDEV_POISON((void*)(a.begin + a.size), a.map_begin + a.map_size - a.begin - a.size);
  }
  *out = (void*)a.begin;
  by_begin_[a.begin] = a;
  return cudaSuccess;
}

void Memory::make_live(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_begin_.find((uintptr_t)p);
  if (it == by_begin_.end() || it->second.freed || it->second.live) return;
  Allocation& a = it->second;
  if (mprotect((void*)a.map_begin, a.map_size, PROT_READ | PROT_WRITE) != 0) {
    report("mapping %zu bytes of stream-ordered memory failed", a.map_size);
    abort();
  }
  a.live = true;
  live_[(size_t)a.device].insert(a.begin);
  SIMDEV_POISON((void*)a.map_begin, a.begin - a.map_begin);
  SIMDEV_POISON((void*)(a.begin + a.size), a.map_begin + a.map_size - a.begin - a.size);
}

cudaError_t Memory::free_device(void* p, MemKind kind, const char* how) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_begin_.find((uintptr_t)p);
  if (it == by_begin_.end() ||
      (it->second.kind != MemKind::kDevice && it->second.kind != MemKind::kAsync))
    return fail(cudaErrorInvalidValue, "%s(%p): not the start of device memory", how, p);
  Allocation& a = it->second;
  if (a.freed)
    return fail(cudaErrorInvalidValue, "%s(%p): already freed (%s)", how, p, a.how.c_str());
  (void)kind;
  in_use_[(size_t)a.device] -= a.size;
  if (a.live) {
    SIMDEV_UNPOISON((void*)a.map_begin, a.map_size);
    madvise((void*)a.map_begin, a.map_size, MADV_DONTNEED);
    mprotect((void*)a.map_begin, a.map_size, PROT_NONE);
  }
  live_[(size_t)a.device].erase(a.begin);
  a.live = false;
  a.freed = true;
  a.how += std::string(", freed by ") + how;
  return cudaSuccess;
}

cudaError_t Memory::alloc_host(size_t bytes, int device, const char* how, void** out) {
  *out = nullptr;
  const size_t span = round_up(bytes == 0 ? 1 : bytes, page_);
  void* p = mmap(nullptr, span + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED)
    return fail(cudaErrorMemoryAllocation, "%s of %zu bytes: out of memory", how, bytes);
  mprotect(static_cast<char*>(p) + span, page_, PROT_NONE);
  std::lock_guard<std::mutex> lock(mutex_);
  Allocation a;
  a.map_begin = a.begin = (uintptr_t)p;
  a.map_size = span;
  a.size = bytes;
  a.device = device;
  a.kind = MemKind::kPinned;
  a.live = true;
  a.how = how;
  by_begin_[a.begin] = a;
  *out = p;
  return cudaSuccess;
}

cudaError_t Memory::free_host(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_begin_.find((uintptr_t)p);
  if (it == by_begin_.end() || it->second.kind != MemKind::kPinned || it->second.freed)
    return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not pinned memory from "
                "cudaMallocHost or cudaHostAlloc%s", p,
                it != by_begin_.end() && it->second.freed ? " (already freed)" : "");
  Allocation& a = it->second;
  mprotect((void*)a.map_begin, a.map_size, PROT_NONE);  // kept reserved: later uses fault
  madvise((void*)a.map_begin, a.map_size, MADV_DONTNEED);
  a.live = false;
  a.freed = true;
  a.how += ", freed by cudaFreeHost";
  return cudaSuccess;
}

cudaError_t Memory::register_host(void* p, size_t bytes, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  Allocation* other = nullptr;
  if (find_locked((uintptr_t)p, bytes, &other) && other->live)
    return fail(cudaErrorHostMemoryAlreadyRegistered,
                "cudaHostRegister(%p, %zu): overlaps memory CUDA already knows (%s)", p, bytes,
                other->how.c_str());
  Allocation a;
  a.begin = (uintptr_t)p;
  a.size = bytes;
  a.device = device;
  a.kind = MemKind::kRegistered;
  a.live = true;
  a.how = "cudaHostRegister";
  by_begin_[a.begin] = a;
  return cudaSuccess;
}

cudaError_t Memory::unregister_host(void* p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_begin_.find((uintptr_t)p);
  if (it == by_begin_.end() || it->second.kind != MemKind::kRegistered || it->second.freed)
    return fail(cudaErrorHostMemoryNotRegistered,
                "cudaHostUnregister(%p): not the start of registered memory", p);
  by_begin_.erase(it);
  return cudaSuccess;
}

bool Memory::find_locked(uintptr_t p, size_t bytes, Allocation** out) {
  auto it = by_begin_.upper_bound(p);
  if (it == by_begin_.begin()) return false;
  --it;
  Allocation& a = it->second;
  const uintptr_t end = a.begin + a.size;
  if (p < a.begin || p > end || (bytes > 0 && (p == end || bytes > end - p))) return false;
  if (bytes == 0 && p == end && a.size > 0) return false;
  *out = &a;
  return true;
}

bool Memory::find(const void* p, size_t bytes, Allocation* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  Allocation* a = nullptr;
  if (!find_locked((uintptr_t)p, bytes, &a)) return false;
  *out = *a;
  return true;
}

void Memory::hide_device(int device, bool hide) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t begin : live_[(size_t)device]) {
    const Allocation& a = by_begin_[begin];
    mprotect((void*)a.map_begin, a.map_size, hide ? PROT_NONE : PROT_READ | PROT_WRITE);
  }
}

int Memory::device_of_range(uintptr_t p) const {
  for (size_t d = 0; d < ranges_.size(); d++)
    if (p >= ranges_[d].base && p < ranges_[d].end) return (int)d;
  return -1;
}

std::string Memory::describe(uintptr_t address) {
  char text[512];
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  const int device = device_of_range(address);
  if (!lock.owns_lock()) {
    snprintf(text, sizeof text, "address %#lx%s", (unsigned long)address,
             device >= 0 ? " (in a device's memory)" : "");
    return text;
  }
  // the allocation at or below the address, and how far past its end it is
  auto it = by_begin_.upper_bound(address);
  if (it != by_begin_.begin()) {
    const Allocation& a = std::prev(it)->second;
    const uintptr_t end = a.begin + a.size;
    const uintptr_t map_end = a.map_begin + a.map_size;
    if (address >= a.begin && address < end) {
      char owner[48] = "";
      if (a.kind == MemKind::kDevice || a.kind == MemKind::kAsync)
        snprintf(owner, sizeof owner, " on device %d", a.device);
      snprintf(text, sizeof text, "address %#lx, byte %lu of %zu bytes from %s%s%s",
               (unsigned long)address, (unsigned long)(address - a.begin), a.size, a.how.c_str(),
               owner, a.freed ? "" : a.live ? "" : " (allocated on its stream but not yet there)");
      return text;
    }
    if (address >= end && address < map_end + page_ && (a.map_size > 0 || address < end + 4096)) {
      snprintf(text, sizeof text, "address %#lx, %lu bytes past the end of %zu bytes from %s",
               (unsigned long)address, (unsigned long)(address - end), a.size, a.how.c_str());
      return text;
    }
  }
  if (it != by_begin_.end() && it->second.map_begin <= address && address < it->second.begin) {
    snprintf(text, sizeof text, "address %#lx, %lu bytes before the start of %zu bytes from %s",
             (unsigned long)address, (unsigned long)(it->second.begin - address),
             it->second.size, it->second.how.c_str());
    return text;
  }
  if (device >= 0)
    snprintf(text, sizeof text, "address %#lx in device %d's memory, never allocated",
             (unsigned long)address, device);
  else
    snprintf(text, sizeof text, "address %#lx (not device memory)", (unsigned long)address);
  return text;
}

}  // namespace simdev
