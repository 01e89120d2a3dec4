/* The engine's kernels (engine/compute_cuda.cc launches them), compiled by
 * NVRTC at build time like the codec's: what the host loops of
 * compute_host.cc do, with the same per-element functions (dtype.h's load,
 * codec_math.h's accumulate, div_rn, dropped_value), so both write the same
 * bytes; and the call counter of a communicator's workspace. */
#include "codec/codec_math.h"

namespace qnccl {

template <class Type>
__device__ __forceinline__ void widen(const typename Type::T* __restrict__ src, size_t n,
                                      const float* __restrict__ residual,
                                      float* __restrict__ acc) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    acc[i] = residual != nullptr ? accumulate(Type::load(src[i]), residual[i])
                                 : Type::load(src[i]);
}

template <class Type>
__device__ __forceinline__ void narrow(const float* __restrict__ acc, size_t n,
                                       typename Type::T* __restrict__ dst) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    dst[i] = Type::store(canonical(acc[i]));
}

}  // namespace qnccl

#define QNCCL_KERNEL extern "C" __global__ void __launch_bounds__(256)

#define QNCCL_WIDEN(TYPE, NAME)                                                           \
  QNCCL_KERNEL qnccl_widen_##NAME(const qnccl::TYPE::T* src, size_t n, const float* residual, \
                                  float* acc) {                                          \
    qnccl::widen<qnccl::TYPE>(src, n, residual, acc);                                    \
  }
QNCCL_WIDEN(F32, f32)
QNCCL_WIDEN(F16, f16)
QNCCL_WIDEN(BF16, bf16)

#define QNCCL_NARROW(TYPE, NAME)                                                          \
  QNCCL_KERNEL qnccl_narrow_##NAME(const float* acc, size_t n, qnccl::TYPE::T* dst) {     \
    qnccl::narrow<qnccl::TYPE>(acc, n, dst);                                              \
  }
QNCCL_NARROW(F32, f32)
QNCCL_NARROW(F16, f16)
QNCCL_NARROW(BF16, bf16)

QNCCL_KERNEL qnccl_divide(float* acc, size_t n, float divisor) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    acc[i] = qnccl::div_rn(acc[i], divisor);
}

QNCCL_KERNEL qnccl_residual(const float* __restrict__ v, float* __restrict__ e, size_t n,
                            float scale) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    e[i] = qnccl::dropped_value(v[i], e[i], scale);
}

/* A call counter of a workspace (it has two: the collectives' and the
 * point-to-point calls'): calls[0] the next number, calls[1] the current
 * call's (read by the codec's encode kernels). Each is one thread's work:
 * compute_cuda.cc launches them as a single thread (with more, every thread
 * would take a number). */
QNCCL_KERNEL qnccl_set_calls(uint64_t* calls, uint64_t next) { calls[0] = next; }
QNCCL_KERNEL qnccl_take_call(uint64_t* calls) { calls[1] = calls[0]++; }
