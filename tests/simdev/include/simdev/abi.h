/* The interface between a kernel module compiled for the simulated GPU and
 * the simulator that runs it (docs/simulated-gpu.md).
 *
 * A kernel source (a .cu file, unchanged) is compiled as C++ with
 * simdev/kernel.h in front of it, which turns CUDA's builtins into reads of
 * the current lane and calls into the executor. The module's image (what
 * cuModuleLoadData receives in place of a cubin) is a simdev_module_image:
 * the kernels by name, each with a thunk that unpacks a parameter block, and
 * what the executor needs of the module (its __shared__ storage, its slot of
 * the current lane). Plain C types only: the module and the simulator may be
 * built by different compilers. */
#ifndef SIMDEV_ABI_H_
#define SIMDEV_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIMDEV_IMAGE_MAGIC "simdev-module-1"  /* 15 characters and the terminator */

typedef struct simdev_dim3 {
  unsigned x, y, z;
} simdev_dim3;

/* Where a warp operation was called: every lane must call it from the same line. */
typedef struct simdev_site {
  const char* file;
  int line;
} simdev_site;

/* One CUDA thread of a launch, as kernel code sees it. */
typedef struct simdev_lane {
  simdev_dim3 thread_idx, block_idx, block_dim, grid_dim;
} simdev_lane;

/* The warp operations the executor provides. A lane that calls one waits
 * until every lane of its warp named in `mask` has reached the same
 * operation with the same mask from the same site; the executor checks that
 * and fails the launch, naming the site, when they do not. */
typedef struct simdev_hooks {
  /* __shfl_xor_sync: `value` (its low `bytes` bytes) of lane (this lane ^
   * lane_mask) within its group of `width` lanes. */
  uint64_t (*shfl_xor)(uint32_t mask, uint64_t value, int bytes, int lane_mask, int width,
                       simdev_site site);
  /* __syncwarp */
  void (*syncwarp)(uint32_t mask, simdev_site site);
  /* A vector type (`type`, `alignment` bytes) read or written at `address`,
   * which is not aligned to it: the GPU's misaligned address. Does not
   * return: the launch fails. */
  void (*misaligned)(const void* address, unsigned alignment, const char* type);
} simdev_hooks;

/* A kernel: `run` calls it with the arguments packed in `params` (each at
 * its natural alignment, in order: the parameter block cuLaunchKernel
 * builds from its kernelParams array). */
typedef struct simdev_kernel {
  const char* name;
  unsigned max_threads;  /* __launch_bounds__, or 1024 */
  size_t nparams;
  const size_t* param_sizes;
  const size_t* param_aligns;
  void (*run)(const unsigned char* params, const size_t* offsets);
} simdev_kernel;

typedef struct simdev_module_image {
  char magic[16];  /* SIMDEV_IMAGE_MAGIC */
  const char* name;
  const simdev_kernel* kernels;
  size_t nkernels;
  /* This thread's slot of the module's current lane: the executor writes it
   * before each switch into a lane. */
  const simdev_lane** (*lane_slot)(void);
  /* Hands the module the executor's warp operations (once, at load). */
  void (*attach)(const simdev_hooks* hooks);
  /* The module's __shared__ variables, [begin, end): one block's worth,
   * filled with garbage before every block. */
  unsigned char* shared_begin;
  unsigned char* shared_end;
} simdev_module_image;

#ifdef __cplusplus
}
#endif

#endif
