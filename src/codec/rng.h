/* The counter-based random numbers of stochastic rounding.
 *
 * u(seed, stream, i) is a pure function: no state, no order. Host, device and
 * the numpy emulator (qnccl/emulate/codec.py) compute the same bits for the
 * same (seed, stream, i), whatever thread or lane handles element i.
 *
 *   key        = mix64(seed ^ mix64(stream))         once per call
 *   h          = hash32(lo32(i) * (lo32(key) | 1) + (hi32(key) ^ hi32(i)))
 *   u          = (h >> 8) * 2^-24                    uniform on [0, 1), 24 bits
 *
 * mix64 is the splitmix64 finalizer; hash32 a 32-bit xorshift-multiply
 * finalizer. Each stream walks the 32-bit inputs of one hash32 with its own
 * odd stride and offset (a Weyl sequence), so two streams meet at the same
 * index only where i * (stride difference) hits the offset difference: a
 * handful of indices in 2^32. Three 32-bit multiplies per value keep the
 * per-element work cheap and vectorizable. */
#ifndef QNCCL_CODEC_RNG_H_
#define QNCCL_CODEC_RNG_H_

#include "hd.h"

namespace qnccl {

QNCCL_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

QNCCL_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

struct RngKey {
  uint32_t lo, hi;
};

QNCCL_HD RngKey rng_key(uint64_t seed, uint64_t stream) {
  uint64_t k = mix64(seed ^ mix64(stream));
  RngKey key = {(uint32_t)k, (uint32_t)(k >> 32)};
  return key;
}

/* The Weyl sequence of a stream: element i = hi * 2^32 + lo hashes
 * rng_weyl(key, lo, hi), and element i + 1 (same hi) hashes that plus
 * rng_stride(key), so a loop can step it by addition. */
QNCCL_HD uint32_t rng_stride(RngKey key) { return key.lo | 1u; }
QNCCL_HD uint32_t rng_weyl(RngKey key, uint32_t lo, uint32_t hi) {
  return lo * rng_stride(key) + (key.hi ^ hi);
}

/* 24 random bits of the element whose Weyl value is w, as a float in [0, 1). */
QNCCL_HD float rng_uniform_weyl(uint32_t w) {
  return (float)(int32_t)(hash32(w) >> 8) * 0x1p-24f;  // via int32: SIMD converts signed natively
}

/* The same for element i = hi * 2^32 + lo. The split form lets a loop over a
 * run that does not cross a multiple of 2^32 keep hi fixed (and vectorize). */
QNCCL_HD float rng_uniform_split(RngKey key, uint32_t lo, uint32_t hi) {
  return rng_uniform_weyl(rng_weyl(key, lo, hi));
}

QNCCL_HD float rng_uniform(RngKey key, uint64_t i) {
  return rng_uniform_split(key, (uint32_t)i, (uint32_t)(i >> 32));
}

/* stream(call, segment, rank, step) of docs/allreduce.md: the random stream
 * of one quantization of a quantized allreduce. */
QNCCL_HD uint64_t stream_id(uint64_t call, uint64_t segment, uint64_t rank, uint64_t step) {
  return mix64(mix64(mix64(call) ^ segment) ^ (rank << 32 | step));
}

}  // namespace qnccl

#endif
