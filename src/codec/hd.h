/* __host__ __device__ marker for code shared by the host codec and the CUDA
 * kernels: the same source compiles on both sides, so they agree bit for bit. */
#ifndef QNCCL_CODEC_HD_H_
#define QNCCL_CODEC_HD_H_

#ifdef __CUDACC__
#define QNCCL_HD __host__ __device__ __forceinline__
#define QNCCL_UNROLL _Pragma("unroll")
#else
#define QNCCL_HD inline __attribute__((always_inline))
#define QNCCL_UNROLL _Pragma("GCC unroll 8")  // a loop of constant trip count, unrolled so
                                              // that the loop around it vectorizes
#endif

#include <stdint.h>
#include <string.h>

namespace qnccl {

QNCCL_HD uint32_t float_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

QNCCL_HD float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

}  // namespace qnccl

#endif
