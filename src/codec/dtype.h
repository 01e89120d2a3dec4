/* The three floating-point types the codec reads and writes, and the one
 * place that maps an ncclDataType_t to code. Arithmetic is always float32;
 * conversions are written out bit by bit (not left to compiler or hardware
 * intrinsics) so the host, the kernels and the emulator round identically:
 * to nearest even, NaN to the canonical quiet NaN of the type. */
#ifndef QNCCL_CODEC_DTYPE_H_
#define QNCCL_CODEC_DTYPE_H_

#include "hd.h"
#include "nccl_abi.h"

namespace qnccl {

constexpr uint32_t kCanonicalNanF32 = 0x7fc00000u;
constexpr uint16_t kCanonicalNanF16 = 0x7e00u;
constexpr uint16_t kCanonicalNanBF16 = 0x7fc0u;

QNCCL_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = 0x7f800000u | (man << 13);  // inf, or NaN with its payload
  } else if (exp != 0) {
    bits = ((exp + (127 - 15)) << 23) | (man << 13);
  } else {
    // zero or subnormal: man * 2^-24, exact in float32
    bits = float_bits((float)man * 0x1p-24f);
  }
  return bits_float(bits | sign);
}

QNCCL_HD uint16_t f32_to_f16(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return kCanonicalNanF16;
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // below 2^-14: adding 0.5 puts the binary point at 2^-24, the f16
    // subnormal step, and the float32 add rounds to nearest even there.
    uint32_t sum = float_bits(bits_float(x) + 0.5f);
    return sign | (uint16_t)(sum - 0x3f000000u);
  }
  uint32_t odd = (x >> 13) & 1u;
  x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
  return sign | (uint16_t)(x >> 13);
}

QNCCL_HD float bf16_to_f32(uint16_t h) { return bits_float((uint32_t)h << 16); }

QNCCL_HD uint16_t f32_to_bf16(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return kCanonicalNanBF16;
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* Element access per storage type. */
struct F32 {
  static constexpr const char* kName = "f32";  // in kernel names
  typedef float T;
  static constexpr ncclDataType_t kType = ncclFloat32;
  static QNCCL_HD float load(T v) { return v; }
  static QNCCL_HD T store(float f) { return f; }
};
struct F16 {
  static constexpr const char* kName = "f16";  // in kernel names
  typedef uint16_t T;
  static constexpr ncclDataType_t kType = ncclFloat16;
  static QNCCL_HD float load(T v) { return f16_to_f32(v); }
  static QNCCL_HD T store(float f) { return f32_to_f16(f); }
};
struct BF16 {
  static constexpr const char* kName = "bf16";  // in kernel names
  typedef uint16_t T;
  static constexpr ncclDataType_t kType = ncclBfloat16;
  static QNCCL_HD float load(T v) { return bf16_to_f32(v); }
  static QNCCL_HD T store(float f) { return f32_to_bf16(f); }
};

/* Calls fn(F32{}), fn(F16{}) or fn(BF16{}) for a codec type; returns false
 * for any other type. The one place where a dtype becomes a template. */
template <class Fn>
inline bool dispatch_float_type(ncclDataType_t type, Fn&& fn) {
  switch (type) {
    case ncclFloat32: fn(F32{}); return true;
    case ncclFloat16: fn(F16{}); return true;
    case ncclBfloat16: fn(BF16{}); return true;
    default: return false;
  }
}

inline size_t float_type_size(ncclDataType_t type) { return type == ncclFloat32 ? 4 : 2; }

}  // namespace qnccl

#endif
