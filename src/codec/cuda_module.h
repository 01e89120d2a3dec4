/* The CUDA kernels built into libqnccl.so. NVRTC compiles each layer's
 * kernel source at build time (scripts/nvrtc_build.py) into machine code
 * for every GPU architecture the library carries plus PTX for the newest,
 * embedded as one image table per module ("codec", "engine"). A module is
 * loaded into the current device's primary context on first use and its
 * kernels are launched by name, through the driver API that the CUDA
 * runtime hands out (cudaGetDriverEntryPoint: no link to libcuda). */
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

/* The image tables (generated: build/gen/<module>_images.cc). */
extern const CudaImage kCudaImages_codec[];
extern const CudaImage kCudaImages_engine[];

/* The image of `images` a GPU of compute capability `arch` runs: machine
 * code of the highest architecture of its major version not above it (a
 * cubin runs on later minor versions), else PTX of the highest architecture
 * not above it; nullptr when there is none. */
const CudaImage* pick_image(const CudaImage* images, int arch);

/* Launches kernel `name` of the module `images` on `stream` of the current
 * device: `grid` blocks of `block` threads, `args` as cuLaunchKernel takes
 * them. A failure (no image for this GPU, a driver too old to load it, a
 * launch error) is returned with a message naming the kernel and the cause. */
ncclResult_t launch_kernel(const CudaImage* images, const char* name, unsigned grid,
                           unsigned block, cudaStream_t stream, void** args);

/* The architectures a table carries, as "80,86,..." (machine code) and
 * "120" (PTX). */
const char* carried_archs(const CudaImage* images, bool ptx);

}  // namespace qnccl

#endif
