/* The engine's kernels (engine/compute_cuda.cc launches them), compiled by
 * NVRTC at build time like the codec's: what the host loops of
 * compute_host.cc do, with the same per-element functions (dtype.h's load,
 * codec_math.h's accumulate, div_rn, dropped_value), so both write the same
 * bytes; and the call counter of a communicator's workspace. */
#include "codec/codec_math.h"
#include "codec/rotation.h"

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

/* docs/rotation.md on the device. A warp takes a tile of kRotationTile
 * values (aligned to it) through its part of shared memory: every butterfly
 * stage below its blocks' sizes and the tile's, its lanes meeting between
 * stages; a block larger than the tile then takes each of its remaining
 * stages as one launch over global memory (rotation_stage). A stage's pairs
 * are independent, so any lane order gives the host's bits; the signs are
 * the table of masks qnccl_rotation_masks makes, masks[i mod B], as on the
 * host. */
constexpr size_t kRotationTile = kDeviceRotationTile;
constexpr unsigned kRotationWarps = kDeviceRotationWarps;  // a CUDA block's 256 threads

/* The size of the block that holds value i of a segment of n values in
 * blocks of B (each block starts at a multiple of its size). */
__device__ __forceinline__ size_t rotation_block_of(size_t i, size_t n, size_t B) {
  size_t at = n / B * B;
  if (i < at) return B;
  for (;;) {
    const size_t b = rotation_block_at(at, n, B);
    if (i < at + b) return b;
    at += b;
  }
}

/* The end of a block of b values (a stage's last, with its scale): forward,
 * the scaled value into z; inverse, scaled, its sign, the canonical NaN, in
 * the type into out. */
template <class Type, bool FORWARD>
__device__ __forceinline__ void rotation_end(float v, size_t i, size_t b, size_t B,
                                             const uint32_t* __restrict__ masks,
                                             float* __restrict__ z, typename Type::T* out) {
  v *= rotation_scale(b, FORWARD);
  if (FORWARD)
    z[i] = v;
  else
    out[i] = Type::store(canonical(bits_float(float_bits(v) ^ masks[i % B])));
}

/* The stages below min(b, kRotationTile) of every block of [0, n), a tile
 * per warp: forward from the input x (widened, signs flipped), or inverse
 * from z; a block no larger than the tile ends here, a larger one goes back
 * to z for its stages across tiles. */
template <class Type, bool FORWARD>
__device__ __forceinline__ void rotation_tiles(const typename Type::T* __restrict__ x,
                                               float* __restrict__ z, size_t n, size_t B,
                                               const uint32_t* __restrict__ masks,
                                               typename Type::T* out) {
  constexpr unsigned kWarp = 32;
  __shared__ float tiles_of_warps[kRotationWarps][kRotationTile];
  float* v = tiles_of_warps[threadIdx.x / kWarp];
  const unsigned lane = threadIdx.x % kWarp;
  const size_t tiles = (n + kRotationTile - 1) / kRotationTile;
  const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / kWarp;
  const size_t warps = gridDim.x * (size_t)blockDim.x / kWarp;
  // `t` is the same in all lanes: every lane reaches every __syncwarp.
  for (size_t t = warp; t < tiles; t += warps) {
    const size_t first = t * kRotationTile;
    const size_t m = n - first < kRotationTile ? n - first : kRotationTile;
    for (size_t j = lane; j < m; j += kWarp) {
      const size_t i = first + j;
      v[j] = FORWARD ? bits_float(float_bits(Type::load(x[i])) ^ masks[i % B]) : z[i];
    }
    __syncwarp();
    for (size_t h = 1; h < kRotationTile; h *= 2) {
      for (size_t q = lane; q < kRotationTile / 2; q += kWarp) {
        const size_t j = q / h * 2 * h + q % h;  // pair (j, j + h), bit h of j clear
        if (j + h >= m || rotation_block_of(first + j, n, B) <= h) continue;
        const float a = v[j], c = v[j + h];
        v[j] = a + c;
        v[j + h] = a - c;
      }
      __syncwarp();
    }
    for (size_t j = lane; j < m; j += kWarp) {
      const size_t i = first + j, b = rotation_block_of(i, n, B);
      if (b <= kRotationTile)
        rotation_end<Type, FORWARD>(v[j], i, b, B, masks, z, out);
      else
        z[i] = v[j];
    }
    __syncwarp();  // before the next tile's values replace these
  }
}

/* Stage h (>= kRotationTile) of every block of z larger than h; a block's
 * last (2h = b) ends it. */
template <class Type, bool FORWARD>
__device__ __forceinline__ void rotation_stage(float* __restrict__ z, size_t n, size_t B,
                                               const uint32_t* __restrict__ masks, size_t h,
                                               typename Type::T* out) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t q = blockIdx.x * (size_t)blockDim.x + threadIdx.x; q < n / 2; q += threads) {
    const size_t j = q / h * 2 * h + q % h;
    if (j + h >= n) continue;
    const size_t b = rotation_block_of(j, n, B);
    if (b <= h) continue;
    const float a = z[j], c = z[j + h];
    if (2 * h < b) {
      z[j] = a + c;
      z[j + h] = a - c;
    } else {
      rotation_end<Type, FORWARD>(a + c, j, b, B, masks, z, out);
      rotation_end<Type, FORWARD>(a - c, j + h, b, B, masks, z, out);
    }
  }
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

/* docs/rotation.md: masks[j] = the sign mask of value j mod B, j < n (the
 * host's rotation_masks); z = the forward rotation of x (n values, blocks
 * of B) with them, its stages below a tile; then qnccl_rotate_stage for
 * each stage h = kRotationTile .. B/2 of blocks larger than a tile. The
 * inverse, into out, the same way. */
QNCCL_KERNEL qnccl_rotation_masks(uint32_t* masks, size_t n, uint64_t seed) {
  const qnccl::RngKey key = qnccl::rotation_key(seed);
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += threads)
    masks[j] = qnccl::rotation_sign_bit(key, (uint32_t)j);
}

#define QNCCL_ROTATE(TYPE, NAME)                                                          \
  QNCCL_KERNEL qnccl_rotate_##NAME(const qnccl::TYPE::T* x, size_t n, size_t B,           \
                                   const uint32_t* masks, float* z) {                     \
    qnccl::rotation_tiles<qnccl::TYPE, true>(x, z, n, B, masks, nullptr);                 \
  }                                                                                       \
  QNCCL_KERNEL qnccl_unrotate_##NAME(float* z, size_t n, size_t B, const uint32_t* masks, \
                                     qnccl::TYPE::T* out) {                               \
    qnccl::rotation_tiles<qnccl::TYPE, false>(nullptr, z, n, B, masks, out);              \
  }                                                                                       \
  QNCCL_KERNEL qnccl_unrotate_stage_##NAME(float* z, size_t n, size_t B,                  \
                                           const uint32_t* masks, size_t h,               \
                                           qnccl::TYPE::T* out) {                         \
    qnccl::rotation_stage<qnccl::TYPE, false>(z, n, B, masks, h, out);                    \
  }
QNCCL_ROTATE(F32, f32)
QNCCL_ROTATE(F16, f16)
QNCCL_ROTATE(BF16, bf16)

QNCCL_KERNEL qnccl_rotate_stage(float* z, size_t n, size_t B, const uint32_t* masks, size_t h) {
  qnccl::rotation_stage<qnccl::F32, true>(z, n, B, masks, h, nullptr);
}

QNCCL_KERNEL qnccl_divide(float* acc, size_t n, float divisor) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    acc[i] = qnccl::div_rn(acc[i], divisor);
}

QNCCL_KERNEL qnccl_residual(const float* __restrict__ v, float* __restrict__ e, size_t n) {
  const size_t threads = gridDim.x * (size_t)blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += threads)
    e[i] = qnccl::dropped_value(v[i], e[i]);
}

/* A call counter of a workspace (it has two: the collectives' and the
 * point-to-point calls'): calls[0] the next number, calls[1] the current
 * call's (read by the codec's encode kernels). Each is one thread's work:
 * compute_cuda.cc launches them as a single thread (with more, every thread
 * would take a number). */
QNCCL_KERNEL qnccl_set_calls(uint64_t* calls, uint64_t next) { calls[0] = next; }
QNCCL_KERNEL qnccl_take_call(uint64_t* calls) { calls[1] = calls[0]++; }
