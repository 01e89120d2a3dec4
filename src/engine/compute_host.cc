/* The host compute (engine/compute.h): the host codec, and the widening,
 * averaging and error-feedback loops the CUDA path runs as kernels
 * (compute_cuda.cc). */
#include <string.h>

#include <algorithm>

#include "codec/codec_math.h"
#include "codec/rotation.h"
#include "common/error.h"
#include "engine/compute.h"

namespace qnccl {
namespace {

ncclResult_t quantize(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                      const CodecParams& p, uint8_t* wire) {
  c.codec->quantize(src, n, type, p, wire);
  return ncclSuccess;
}

ncclResult_t quantize_many(const Compute& c, const void* const* srcs, const size_t* counts, int n,
                           ncclDataType_t type, const CodecParams* ps, uint8_t* const* wires) {
  for (int i = 0; i < n; i++) c.codec->quantize(srcs[i], counts[i], type, ps[i], wires[i]);
  return ncclSuccess;
}

ncclResult_t dequantize(const Compute& c, const uint8_t* wire, size_t n, const CodecParams& p,
                        void* dst, ncclDataType_t type, bool accumulate) {
  c.codec->dequantize(wire, n, p, dst, type, accumulate);
  return ncclSuccess;
}

ncclResult_t decode_many(const Compute& c, const uint8_t* const* wires, void* const* dsts,
                         const size_t* counts, int n, const CodecParams& p, ncclDataType_t type) {
  for (int i = 0; i < n; i++) c.codec->dequantize(wires[i], counts[i], p, dsts[i], type, false);
  return ncclSuccess;
}

ncclResult_t reduce(const Compute& c, const void* src, size_t n, ncclDataType_t type,
                    const float* residual, const uint8_t* const* wires, int nwires,
                    const CodecParams& p, float* acc) {
  c.codec->reduce(src, type, residual, wires, nwires, n, p, acc);
  return ncclSuccess;
}

ncclResult_t widen(const Compute&, const void* src, size_t n, ncclDataType_t type,
                   const float* residual, float* acc) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    const typename D::T* values = static_cast<const typename D::T*>(src);
    if (residual == nullptr) {
      for (size_t i = 0; i < n; i++) acc[i] = D::load(values[i]);
    } else {
      for (size_t i = 0; i < n; i++) acc[i] = accumulate(D::load(values[i]), residual[i]);
    }
  });
  return ncclSuccess;
}

ncclResult_t divide(const Compute&, float* acc, size_t n, float divisor) {
  for (size_t i = 0; i < n; i++) acc[i] = div_rn(acc[i], divisor);
  return ncclSuccess;
}

ncclResult_t narrow(const Compute&, const float* acc, size_t n, ncclDataType_t type, void* dst) {
  dispatch_float_type(type, [&](auto d) {
    using D = decltype(d);
    typename D::T* out = static_cast<typename D::T*>(dst);
    for (size_t i = 0; i < n; i++) out[i] = D::store(canonical(acc[i]));
  });
  return ncclSuccess;
}

ncclResult_t copy(const Compute&, const void* src, void* dst, size_t bytes) {
  if (bytes > 0) memcpy(dst, src, bytes);
  return ncclSuccess;
}

ncclResult_t residual(const Compute&, const float* v, float* e, size_t n) {
  for (size_t i = 0; i < n; i++) e[i] = dropped_value(v[i], e[i]);
  return ncclSuccess;
}

ncclResult_t clear(const Compute&, float* e, size_t n) {
  std::fill(e, e + n, 0.0f);
  return ncclSuccess;
}

ncclResult_t rotation_signs(const Compute&, uint64_t seed, size_t n, uint32_t* signs) {
  rotation_masks(rotation_key(seed), n, signs);
  return ncclSuccess;
}

ncclResult_t rotate(const Compute& c, const void* const* srcs, const size_t* counts, int n,
                    ncclDataType_t type, size_t block, const uint32_t* signs,
                    float* const* zs) {
  for (int i = 0; i < n; i++) c.codec->rotate(srcs[i], type, counts[i], block, signs, zs[i]);
  return ncclSuccess;
}

ncclResult_t unrotate(const Compute& c, float* const* zs, const size_t* counts, int n,
                      size_t block, const uint32_t* signs, void* const* dsts,
                      ncclDataType_t type) {
  for (int i = 0; i < n; i++) c.codec->unrotate(zs[i], counts[i], block, signs, dsts[i], type);
  return ncclSuccess;
}

}  // namespace

ncclResult_t host_compute(Compute* compute) {
  const HostCodec* codec;
  QNCCL_CHECK(host_codec(&codec));
  *compute = Compute{"host",         codec,    nullptr,  quantize, quantize_many, dequantize,
                     decode_many,    reduce,   widen,    divide,   narrow,        copy,
                     residual,       clear,    rotation_signs,     rotate,   unrotate};
  return ncclSuccess;
}

}  // namespace qnccl
