/* CUDA's device builtins for a kernel source compiled as C++ for the
 * simulated GPU (docs/simulated-gpu.md). Included in front of the unchanged
 * .cu file by the module's generated translation unit; nothing in the
 * kernel source knows about the simulator.
 *
 * What it provides is what QNCCL's kernels use, with the GPU's semantics:
 *   threadIdx/blockIdx/blockDim/gridDim  the current lane's (simdev_lane)
 *   __shfl_xor_sync, __syncwarp           meeting points of the lane's warp,
 *                                         checked by the executor
 *   __shared__                            one block's storage, in a section
 *                                         the executor fills with garbage
 *                                         before each block
 *   __fdiv_rn, __float_as_uint, __uint_as_float
 *   uint2/uint4/float4                    loaded and stored whole: a copy from
 *                                         or to a misaligned address fails
 *                                         the launch, as on the GPU
 * The compiler flags do the rest: clang's -fno-strict-float-cast-overflow
 * makes float-to-integer conversions saturate (NaN to 0) as the GPU's cvt
 * does, -ffp-contract=off keeps multiplies and adds apart as -fmad=false
 * does. Anything else a kernel uses fails to compile: add it here, with
 * the GPU's semantics. */
#ifndef SIMDEV_KERNEL_H_
#define SIMDEV_KERNEL_H_

#include <stdint.h>
#include <string.h>

#include "simdev/abi.h"

#define __CUDACC__ 1
#define __CUDA_ARCH__ 900  /* the simulated device's compute capability */

#define __host__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#ifndef SIMDEV_SCAN  /* the kernel scan (gen_module.py) sees them as written */
#define __global__
#define __launch_bounds__(...)
#endif
/* Function-scope __shared__ variables go to one section per module; a block
 * runs at a time, and the executor fills the section with garbage first.
 * `used` keeps the compiler from folding a read of one it never sees
 * written into its zero initializer (a kernel that reads shared memory
 * before writing it must read the garbage). */
#define __shared__ static __attribute__((section("simdev_shared"), used))

/* The lane running on this thread (set by the executor before it switches
 * into a lane) and the executor's warp operations: each module's own
 * (simdev/module.h hands them to the executor). */
static thread_local const simdev_lane* simdev_current_lane;
static const simdev_hooks* simdev_module_hooks;

#define threadIdx (simdev_current_lane->thread_idx)
#define blockIdx (simdev_current_lane->block_idx)
#define blockDim (simdev_current_lane->block_dim)
#define gridDim (simdev_current_lane->grid_dim)

namespace simdev {

template <class T>
inline T shfl_xor(unsigned mask, T value, simdev_site site, int lane_mask, int width = 32) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "__shfl_xor_sync of a 4- or 8-byte value");
  uint64_t bits = 0;
  memcpy(&bits, &value, sizeof value);
  bits = simdev_module_hooks->shfl_xor(mask, bits, (int)sizeof value, lane_mask, width, site);
  T out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

inline void syncwarp(simdev_site site, unsigned mask = 0xffffffffu) {
  simdev_module_hooks->syncwarp(mask, site);
}

}  // namespace simdev

#define SIMDEV_SITE (simdev_site{__FILE__, __LINE__})
#define __shfl_xor_sync(mask, value, ...) \
  ::simdev::shfl_xor((mask), (value), SIMDEV_SITE, __VA_ARGS__)
#define __syncwarp(...) ::simdev::syncwarp(SIMDEV_SITE, ##__VA_ARGS__)

inline float __fdiv_rn(float a, float b) { return a / b; }  // IEEE division, round to nearest
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* CUDA's vector types, with their alignment. A GPU loads and stores them
 * whole, and faults on an address that is not a multiple of their size; so
 * does every copy of one here (a load from memory, a store to it), which
 * plain C++ would do in pieces whatever the address. */
namespace simdev {
template <class V>
inline void check_aligned(const V* p, const char* type) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  asm("" : "+r"(address));  // the compiler assumes a V* aligned: it may not know this one
  if (address % alignof(V) != 0) simdev_module_hooks->misaligned(p, (unsigned)alignof(V), type);
}
}  // namespace simdev

#define SIMDEV_VECTOR_COPY(name, ...)     \
  name(const name& o) {                   \
    ::simdev::check_aligned(&o, #name);   \
    __VA_ARGS__;                          \
  }                                       \
  name& operator=(const name& o) {        \
    ::simdev::check_aligned(this, #name); \
    ::simdev::check_aligned(&o, #name);   \
    __VA_ARGS__;                          \
    return *this;                         \
  }

struct __attribute__((aligned(8))) uint2 {
  unsigned x, y;
  uint2() = default;
  uint2(unsigned x_, unsigned y_) : x(x_), y(y_) {}
  SIMDEV_VECTOR_COPY(uint2, x = o.x, y = o.y)
};
struct __attribute__((aligned(16))) uint4 {
  unsigned x, y, z, w;
  uint4() = default;
  uint4(unsigned x_, unsigned y_, unsigned z_, unsigned w_) : x(x_), y(y_), z(z_), w(w_) {}
  SIMDEV_VECTOR_COPY(uint4, x = o.x, y = o.y, z = o.z, w = o.w)
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
  float4() = default;
  float4(float x_, float y_, float z_, float w_) : x(x_), y(y_), z(z_), w(w_) {}
  SIMDEV_VECTOR_COPY(float4, x = o.x, y = o.y, z = o.z, w = o.w)
};
inline uint2 make_uint2(unsigned x, unsigned y) { return uint2(x, y); }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4(x, y, z, w);
}
inline float4 make_float4(float x, float y, float z, float w) { return float4(x, y, z, w); }

#endif
