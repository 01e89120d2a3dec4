/* The randomized Hadamard rotation of docs/rotation.md, element by element:
 * the signs, the cut of a segment into blocks, the scales. Host and device
 * compute the same bits from these (qnccl/emulate/rotation.py is the numpy
 * form). A block of b = 2^k values rotates as
 *
 *   forward   y = (H_b (s * x)) * 2^-ceil(k/2)
 *   inverse   x = ((H_b y) * 2^-floor(k/2)) * s
 *
 * with H_b the butterfly: for h = 1, 2, .., b/2 every pair (j, j + h), bit h
 * of j clear, becomes (v[j] + v[j+h], v[j] - v[j+h]), float32; a NaN the
 * inverse leaves is the canonical NaN. */
#ifndef QNCCL_CODEC_ROTATION_H_
#define QNCCL_CODEC_ROTATION_H_

#include <stddef.h>
#include <stdint.h>

#include "hd.h"
#include "rng.h"

namespace qnccl {

/* "rotation" in ASCII: the stream of the signs' random words. */
constexpr uint64_t kRotationStream = 0x726F746174696F6Eull;

/* The signs' key: a function of the seed alone (never of the rank or the
 * call: every rank rotates alike, and error feedback's residuals stay in
 * one rotated domain). */
QNCCL_HD RngKey rotation_key(uint64_t seed) { return rng_key(seed, kRotationStream); }

/* The sign of value i of a segment in blocks of B, as a float32 bit mask,
 * from j = i mod B: 0x80000000 where s[i] = -1 (bit 31 of the random word
 * of j), else 0. XOR onto a float's bits multiplies it by s[i], exactly.
 * The signs repeat every B values: one block's worth serves a call. */
QNCCL_HD uint32_t rotation_sign_bit(RngKey key, uint32_t j) {
  return hash32(rng_weyl(key, j, 0)) & 0x80000000u;
}

/* masks[j] = rotation_sign_bit(key, j) for j < n. */
QNCCL_HD void rotation_masks(RngKey key, size_t n, uint32_t* masks) {
  for (size_t j = 0; j < n; j++) masks[j] = rotation_sign_bit(key, (uint32_t)j);
}

/* The size of the block that starts at `at`, a cut point of a segment of n
 * values (0 <= at < n) in blocks of `block` (a power of two): `block` while
 * a whole one fits, then the highest set bit of what is left (the
 * remainder's binary digits, largest first). */
QNCCL_HD size_t rotation_block_at(size_t at, size_t n, size_t block) {
  const size_t rest = n - at;
  if (rest >= block) return block;
  size_t b = 1;
  while (b * 2 <= rest) b *= 2;
  return b;
}

/* 2^-ceil(k/2) (forward) or 2^-floor(k/2) (inverse) for a block of 2^k. */
QNCCL_HD float rotation_scale(size_t size, bool forward) {
  int k = 0;
  while (((size_t)1 << k) < size) ++k;
  const int e = forward ? (k + 1) / 2 : k / 2;
  return bits_float((uint32_t)(127 - e) << 23);  // 2^-e, from its exponent: no division
}

/* The device's rotation (engine/compute_kernels.cu): a warp takes a tile of
 * this many values through shared memory, eight warps to a CUDA block; the
 * stages of larger blocks run one launch each. */
constexpr size_t kDeviceRotationTile = 1024;
constexpr unsigned kDeviceRotationWarps = 8;

/* Values per tile of a rotated host quantize or dequantize of `count`
 * values in buckets of `bucket` and blocks of `block`: whole blocks, whole
 * buckets and whole packing groups (8 values), at least 4096; or the whole
 * buffer where a tile of whole blocks and buckets would pass 2^20 values. */
QNCCL_HD size_t rotation_tile(size_t count, size_t bucket, size_t block) {
  constexpr size_t kMinTile = 4096, kMaxTile = (size_t)1 << 20;
  const size_t unit = block < 8 ? 8 : block;  // a power of two
  size_t common = unit;  // the largest power of two dividing both
  while (bucket % common != 0) common /= 2;
  if (bucket > kMaxTile || unit / common * bucket > kMaxTile) return count;
  const size_t lcm = unit / common * bucket;
  return (kMinTile + lcm - 1) / lcm * lcm;
}

}  // namespace qnccl

#endif
