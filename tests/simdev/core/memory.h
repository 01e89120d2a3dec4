/* Device memory and pinned host memory of the simulated GPU.
 *
 * Each device owns a 1 TiB range of address space (reserved, inaccessible).
 * An allocation maps whole pages of it and ends at the end of its pages (at
 * 256-byte alignment, as cudaMalloc aligns), with an unmapped page after
 * it, so reading or writing past its end faults. Freed memory is unmapped
 * for good (addresses are never handed out twice), so any later use faults
 * too, whenever the work that uses it runs; memory from cudaMallocAsync is
 * mapped only when its allocation runs on the stream, and unmapped when its
 * cudaFreeAsync runs. cudaPointerGetAttributes reads the same records. */
#ifndef SIMDEV_CORE_MEMORY_H_
#define SIMDEV_CORE_MEMORY_H_

#include <stddef.h>
#include <stdint.h>

#include <map>
#include <set>
#include <mutex>
#include <string>
#include <vector>

#include <driver_types.h>

namespace simdev {

enum class MemKind { kDevice, kAsync, kPinned, kRegistered };

struct Allocation {
  uintptr_t begin = 0;
  size_t size = 0;
  uintptr_t map_begin = 0;  // the pages it owns (none for registered memory)
  size_t map_size = 0;
  int device = -1;          // of device memory; the current device when pinned host memory was made
  MemKind kind = MemKind::kDevice;
  bool live = false;        // mapped and usable
  bool freed = false;
  std::string how;          // "cudaMalloc", then ", freed by cudaFree", ...
};

class Memory {
 public:
  static Memory& get();

  /* Device memory of `bytes` on `device`; kAsync memory is not mapped
   * until make_live(). bytes == 0 gives nullptr. */
  cudaError_t alloc_device(int device, size_t bytes, MemKind kind, const char* how, void** out);
  void make_live(void* p);
  /* Unmaps device memory allocated by alloc_device; `how` says by what. */
  cudaError_t free_device(void* p, MemKind kind, const char* how);

  cudaError_t alloc_host(size_t bytes, int device, const char* how, void** out);
  cudaError_t free_host(void* p);
  cudaError_t register_host(void* p, size_t bytes, int device);
  cudaError_t unregister_host(void* p);

  /* The allocation holding [p, p + bytes) (bytes 0: holding p), live or
   * freed; false when there is none. */
  bool find(const void* p, size_t bytes, Allocation* out);
  /* Unmaps (or maps again) every live allocation of `device`: while a
   * kernel of another device without peer access to it runs. */
  void hide_device(int device, bool hide);
  /* The device whose range holds p, or -1. */
  int device_of_range(uintptr_t p) const;
  /* Where `address` is, for a fault's message. */
  std::string describe(uintptr_t address);

 private:
  Memory();
  struct Range {
    uintptr_t base = 0, end = 0, next = 0;
  };
  std::mutex mutex_;
  std::vector<Range> ranges_;                 // per device
  std::vector<size_t> in_use_;                // bytes of live device memory, per device
  std::vector<std::set<uintptr_t>> live_;     // begins of live device allocations, per device
  std::map<uintptr_t, Allocation> by_begin_;  // every allocation ever made, by begin
  size_t page_;
  bool find_locked(uintptr_t p, size_t bytes, Allocation** out);
};

}  // namespace simdev

#endif
