/* The CUDA kernels built into libqnccl.so, and the device context they run
 * in. NVRTC compiles each layer's kernel source at build time
 * (scripts/nvrtc_build.py) into machine code for every GPU architecture the
 * library carries plus PTX for the oldest it supports, embedded as one
 * module per layer ("codec", "engine") with the names of its kernels. Every
 * module is loaded into a device's primary context, and every kernel of it
 * resolved, once per device, before QNCCL's first NCCL work there
 * (load_kernels: when a communicator is announced, at its creation or, for
 * one not ready then, at its first call QNCCL works for; else at the first
 * call on the device); launches then take no lock and load nothing. The driver API comes from the CUDA runtime
 * (cudaGetDriverEntryPoint: no link to libcuda). */
#ifndef QNCCL_CODEC_CUDA_MODULE_H_
#define QNCCL_CODEC_CUDA_MODULE_H_

#include <stddef.h>

#include "nccl_abi.h"

namespace qnccl {

struct CudaImage {
  const char* module;  // nullptr ends a table
  int arch;            // 10 * major + minor of the compute capability
  bool ptx;            // PTX (compiled by the driver at load time), else machine code
  const char* data;
  size_t size;
};

/* One module: its images and the names of all its kernels (generated:
 * build/gen/<module>_images.cc). */
struct CudaModule {
  const char* name;
  const CudaImage* images;      // ended by an entry with module == nullptr
  const char* const* kernels;   // ended by nullptr
};

extern const CudaModule kCudaModule_codec;
extern const CudaModule kCudaModule_engine;

/* The image of `images` a GPU of compute capability `arch` runs: machine
 * code of the highest architecture of its major version not above it (a
 * cubin runs on later minor versions), else PTX of the highest architecture
 * not above it; nullptr when there is none. */
const CudaImage* pick_image(const CudaImage* images, int arch);

/* Loads both modules on `device` and resolves every kernel (with CUDA's
 * lazy loading, resolving is what loads a kernel: it may wait for the
 * device, so it must not happen while QNCCL's collectives are in flight,
 * nor during a capture on old drivers). Once per device: later calls return
 * at once. No lock is held across a driver call: threads racing to load one
 * device each load, and the first to finish is kept. Enters `device`'s
 * context for the loading and restores the caller's. */
ncclResult_t load_kernels(int device);

/* Launches kernel `name` of `module` on `stream` of the current device:
 * `grid` blocks of `block` threads, `args` as cuLaunchKernel takes them.
 * Loads the modules first if this device has none yet (load_kernels). A
 * failure (no image for this GPU, a driver too old to load it, a launch
 * error) is returned with a message naming the kernel and the cause. */
ncclResult_t launch_kernel(const CudaModule& module, const char* name, unsigned grid,
                           unsigned block, cudaStream_t stream, void** args);

/* The architectures a module carries, as "80,86,..." (machine code) and
 * "70" (PTX). */
const char* carried_archs(const CudaModule& module, bool ptx);

/* The device whose memory `ptr` is (device memory, stream-ordered or
 * managed), else -1 (host memory, registered or not), as the driver says
 * (cuPointerGetAttributes, which answers on a thread that has no context and
 * makes none). kNoDevice: the machine has no GPU; kDriverTooOld: the driver
 * API is unavailable because the driver is older than the runtime; kFailed:
 * *why says what failed. */
enum class PointerQuery { kOk, kNoDevice, kDriverTooOld, kFailed };
PointerQuery driver_pointer_device(const void* ptr, int* device, const char** why);

/* Makes a device's primary context current on this thread for the scope's
 * life (where the kernels are loaded, whatever context the thread had) and
 * then restores the context that was current before, itself, not a
 * device number: a thread that had no context (PyTorch's watchdog, a thread
 * of the application's) is left with none, and no other device's context is
 * created on its way. */
class DeviceScope {
 public:
  DeviceScope() = default;
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  /* `fn` names the caller in a failure's message. */
  ncclResult_t enter(const char* fn, int device);
  ~DeviceScope();

 private:
  bool switched_ = false;
  void* saved_ = nullptr;  // CUcontext, possibly none
};

}  // namespace qnccl

#endif
