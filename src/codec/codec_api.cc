/* The codec behind the C API (src/api/api.cc): validate every argument,
 * then run the host or the CUDA implementation according to where the
 * buffers live. */
#include <stdint.h>

#include <string.h>

#include <algorithm>
#include <memory>
#include <new>

#include "codec/codec.h"
#include "codec/codec_math.h"
#include "codec/rotation.h"
#include "common/error.h"
#ifdef QNCCL_WITH_CUDA
#include "codec/cuda_module.h"
#endif

namespace qnccl {

ncclResult_t check_codec_config(const char* fn, const qncclCodecConfig_t* config) {
  if (config == nullptr)
    return set_error(ncclInvalidArgument, "%s: config is NULL; pass a qncclCodecConfig_t", fn);
  if (config->bits < QNCCL_MIN_BITS || config->bits > QNCCL_MAX_BITS)
    return set_error(ncclInvalidArgument, "%s: bits = %d is out of range; allowed: %d..%d", fn,
                     config->bits, QNCCL_MIN_BITS, QNCCL_MAX_BITS);
  if (config->bucketSize < 1)
    return set_error(ncclInvalidArgument, "%s: bucketSize = 0 is invalid; allowed: >= 1", fn);
  if (config->rounding != qncclRoundNearest && config->rounding != qncclRoundStochastic)
    return set_error(ncclInvalidArgument,
                     "%s: rounding = %d is unknown; allowed: qncclRoundNearest (0) or "
                     "qncclRoundStochastic (1)",
                     fn, (int)config->rounding);
  if (config->rotation != qncclRotationNone && config->rotation != qncclRotationHadamard &&
      config->rotation != qncclRotationPrerotated)
    return set_error(ncclInvalidArgument,
                     "%s: rotation = %d is unknown; allowed: qncclRotationNone (0), "
                     "qncclRotationHadamard (1) or qncclRotationPrerotated (2)",
                     fn, (int)config->rotation);
  if (config->clip != qncclClipNone && config->clip != qncclClipGaussian)
    return set_error(ncclInvalidArgument,
                     "%s: clip = %d is unknown; allowed: qncclClipNone (0) or "
                     "qncclClipGaussian (1)",
                     fn, (int)config->clip);
  if (config->clip != qncclClipNone && config->rotation == qncclRotationNone)
    return set_error(ncclInvalidArgument,
                     "%s: clip = qncclClipGaussian needs rotated values; allowed with rotation = "
                     "qncclRotationHadamard or qncclRotationPrerotated, or pass clip = "
                     "qncclClipNone",
                     fn);
  const size_t block = config->rotationBlock;
  if (block != 0 && (block < QNCCL_MIN_ROTATION_BLOCK || block > QNCCL_MAX_ROTATION_BLOCK ||
                     (block & (block - 1)) != 0))
    return set_error(ncclInvalidArgument,
                     "%s: rotationBlock = %zu; allowed: 0 (the default, %d) or a power of two "
                     "from %d to %d",
                     fn, block, QNCCL_DEFAULT_ROTATION_BLOCK, QNCCL_MIN_ROTATION_BLOCK,
                     QNCCL_MAX_ROTATION_BLOCK);
  return ncclSuccess;
}

size_t rotation_block(const qncclCodecConfig_t& config) {
  if (config.rotation != qncclRotationHadamard) return 0;
  return config.rotationBlock != 0 ? config.rotationBlock : QNCCL_DEFAULT_ROTATION_BLOCK;
}

/* docs/rotation.md, "Clipped ranges": f = c(bits) / m(bucketSize), c the
 * outermost level of the 2^bits-level uniform quantizer with the least mean
 * squared error for a standard Gaussian (Max's), m the expected largest
 * magnitude of n standard Gaussian values, tabulated at n = 2^k and
 * interpolated linearly in n between (the last entry beyond 2^32). Plain
 * double arithmetic, so that qnccl.emulate derives the same float. */
float clip_fraction(qncclClip_t clip, int bits, size_t bucket) {
  static const double kLevel[QNCCL_MAX_BITS + 1] = {
      0, 0.7979, 1.4935, 2.0511, 2.5140, 2.9162, 3.2780, 3.6111, 3.9222};
  static const double kLargest[33] = {
      0.797885, 1.128379, 1.464728, 1.783367, 2.077204, 2.347079, 2.596111, 2.827558, 3.044225,
      3.248391, 3.441870, 3.626116, 3.802295, 3.971358, 4.134087, 4.291131, 4.443040, 4.590279,
      4.733248, 4.872294, 5.007719, 5.139788, 5.268736, 5.394773, 5.518083, 5.638835, 5.757180,
      5.873255, 5.987183, 6.099080, 6.209048, 6.317183, 6.423573};
  if (clip != qncclClipGaussian) return 0.0f;
  int k = 0;
  while (k < 32 && ((size_t)2 << k) <= bucket) ++k;  // 2^k <= bucket < 2^(k+1), or k = 32
  double largest = kLargest[k];
  if (k < 32) {
    const double low = (double)((size_t)1 << k);
    largest += (kLargest[k + 1] - kLargest[k]) * (((double)bucket - low) / low);
  }
  const double f = kLevel[bits] / largest;
  return f < 1.0 ? (float)f : 0.0f;
}

float clip_fraction(const qncclCodecConfig_t& config) {
  return clip_fraction(config.clip, config.bits, config.bucketSize);
}

ncclResult_t check_codec_type(const char* fn, const char* arg, ncclDataType_t type) {
  if (type == ncclFloat32 || type == ncclFloat16 || type == ncclBfloat16) return ncclSuccess;
  return set_error(ncclInvalidArgument,
                   "%s: %s = %d (%s) is not supported by the codec; allowed: ncclFloat32 (%d), "
                   "ncclFloat16 (%d), ncclBfloat16 (%d)",
                   fn, arg, (int)type, type_name(type), (int)ncclFloat32, (int)ncclFloat16,
                   (int)ncclBfloat16);
}

namespace {

/* Counts above this could overflow the byte arithmetic of the wire format. */
constexpr size_t kMaxCount = SIZE_MAX / 16;

ncclResult_t check_count(const char* fn, size_t count) {
  if (count <= kMaxCount) return ncclSuccess;
  return set_error(ncclInvalidArgument, "%s: count = %zu is too large; allowed: <= %zu", fn, count,
                   kMaxCount);
}

ncclResult_t check_buffer(const char* fn, const char* arg, const void* ptr, size_t count) {
  if (ptr != nullptr || count == 0) return ncclSuccess;
  return set_error(ncclInvalidArgument, "%s: %s is NULL with count = %zu; pass a buffer", fn, arg,
                   count);
}

ncclResult_t check_bytes(const char* fn, const char* arg, size_t have, size_t count,
                         const qncclCodecConfig_t* config) {
  size_t need = compressed_bytes(count, config->bits, config->bucketSize);
  if (have >= need) return ncclSuccess;
  return set_error(ncclInvalidArgument,
                   "%s: %s = %zu is too small; %zu values at %d bits, bucket %zu take %zu bytes "
                   "(qncclCompressedSize)",
                   fn, arg, have, count, config->bits, config->bucketSize, need);
}

/* The codec reads one buffer while writing the other: they must not overlap. */
ncclResult_t check_disjoint(const char* fn, const void* a, size_t abytes, const void* b,
                            size_t bbytes) {
  uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  if (abytes == 0 || bbytes == 0 || a0 + abytes <= b0 || b0 + bbytes <= a0) return ncclSuccess;
  return set_error(ncclInvalidArgument,
                   "%s: the compressed and the uncompressed buffer overlap; pass separate buffers",
                   fn);
}

CodecParams params_of(const qncclCodecConfig_t* config, uint64_t stream) {
  CodecParams p{config->bits, config->bucketSize, config->rounding, config->seed, stream,
                nullptr, 0, 0, 0, 0};
  p.cubic = config->rotation == qncclRotationNone;
  p.rotation = rotation_block(*config);
  p.clip = clip_fraction(*config);
  return p;
}

/* A rotated host call's working memory (CodecParams::scratch and signs),
 * or a failure saying so. */
struct RotationMemory {
  std::unique_ptr<float[]> tile;
  std::unique_ptr<uint32_t[]> signs;
};

ncclResult_t rotation_memory(const char* fn, size_t count, CodecParams* p, RotationMemory* m) {
  if (p->rotation == 0) return ncclSuccess;
  const size_t values = std::min(count, rotation_tile(count, p->bucket, p->rotation));
  m->tile.reset(new (std::nothrow) float[values]);
  m->signs.reset(new (std::nothrow) uint32_t[std::min(count, p->rotation)]);
  p->scratch = m->tile.get();
  p->signs = m->signs.get();
  if (p->scratch != nullptr && p->signs != nullptr) return ncclSuccess;
  return set_error(ncclSystemError,
                   "%s: no memory for the rotation's %zu float32 values; quantize a smaller "
                   "buffer at a time, or a bucket size that divides the rotation block",
                   fn, values);
}

#ifdef QNCCL_WITH_CUDA
/* Where the buffers live decides who computes: both on one device (*device,
 * whose context the work is then enqueued in), or both in host memory
 * (*device = -1). */
ncclResult_t locate(const char* fn, const void* src, const void* dst, int* device) {
  int ds = -1, dd = -1;
  QNCCL_CHECK(pointer_device(fn, src, &ds));
  QNCCL_CHECK(pointer_device(fn, dst, &dd));
  if ((ds >= 0) != (dd >= 0))
    return set_error(ncclInvalidArgument,
                     "%s: one buffer is in device memory and the other in host memory; pass both "
                     "on the same side",
                     fn);
  if (ds != dd)
    return set_error(ncclInvalidArgument,
                     "%s: src is on device %d and dst on device %d; pass both on one device (the "
                     "stream must be that device's too)",
                     fn, ds, dd);
  *device = ds;
  return ncclSuccess;
}

#endif


}  // namespace

ncclResult_t codec_compressed_size(const char* fn, size_t count, const qncclCodecConfig_t* config,
                                   size_t* bytes) {
  QNCCL_CHECK(check_codec_config(fn, config));
  QNCCL_CHECK(check_count(fn, count));
  if (bytes == nullptr) return set_error(ncclInvalidArgument, "%s: bytes is NULL; pass a size_t*", fn);
  *bytes = compressed_bytes(count, config->bits, config->bucketSize);
  return ncclSuccess;
}

ncclResult_t codec_quantize(const char* fn, const void* src, size_t count, ncclDataType_t datatype,
                            const qncclCodecConfig_t* config, uint64_t randomStream, void* dst,
                            size_t dstBytes, cudaStream_t stream) {
  QNCCL_CHECK(check_codec_config(fn, config));
  QNCCL_CHECK(check_codec_type(fn, "datatype", datatype));
  QNCCL_CHECK(check_count(fn, count));
  if (count == 0) return ncclSuccess;
  QNCCL_CHECK(check_buffer(fn, "src", src, count));
  QNCCL_CHECK(check_buffer(fn, "dst", dst, count));
  QNCCL_CHECK(check_bytes(fn, "dstBytes", dstBytes, count, config));
  QNCCL_CHECK(check_disjoint(fn, dst, dstBytes, src, count * float_type_size(datatype)));
  CodecParams p = params_of(config, randomStream);
#ifdef QNCCL_WITH_CUDA
  int device = -1;
  QNCCL_CHECK(locate(fn, src, dst, &device));
  if (device >= 0 && p.rotation != 0)
    return set_error(ncclInvalidUsage,
                     "%s: a rotation on device buffers is not in this build yet; quantize host "
                     "buffers, or pass rotation = qncclRotationNone",
                     fn);
  if (device >= 0) {  // in the buffers' device's context, whichever is current
    DeviceScope scope;
    QNCCL_CHECK(scope.enter(fn, device));
    return prefix_error(device_quantize(src, count, datatype, p, dst, stream), "%s", fn);
  }
#else
  (void)stream;
#endif
  const HostCodec* host;
  QNCCL_CHECK(host_codec(&host));
  RotationMemory memory;
  QNCCL_CHECK(rotation_memory(fn, count, &p, &memory));
  host->quantize(src, count, datatype, p, dst);
  return ncclSuccess;
}

ncclResult_t codec_dequantize(const char* fn, const void* src, size_t srcBytes, size_t count,
                              const qncclCodecConfig_t* config, void* dst, ncclDataType_t datatype,
                              cudaStream_t stream, bool accumulate) {
  QNCCL_CHECK(check_codec_config(fn, config));
  QNCCL_CHECK(check_codec_type(fn, "datatype", datatype));
  QNCCL_CHECK(check_count(fn, count));
  if (count == 0) return ncclSuccess;
  QNCCL_CHECK(check_buffer(fn, "src", src, count));
  QNCCL_CHECK(check_buffer(fn, accumulate ? "acc" : "dst", dst, count));
  QNCCL_CHECK(check_bytes(fn, "srcBytes", srcBytes, count, config));
  QNCCL_CHECK(check_disjoint(fn, src, srcBytes, dst, count * float_type_size(datatype)));
  CodecParams p = params_of(config, 0);
#ifdef QNCCL_WITH_CUDA
  int device = -1;
  QNCCL_CHECK(locate(fn, src, dst, &device));
  if (device >= 0 && p.rotation != 0)
    return set_error(ncclInvalidUsage,
                     "%s: a rotation on device buffers is not in this build yet; decode into "
                     "host buffers, or pass rotation = qncclRotationNone",
                     fn);
  if (device >= 0) {
    DeviceScope scope;
    QNCCL_CHECK(scope.enter(fn, device));
    return prefix_error(device_dequantize(src, count, p, dst, datatype, accumulate, stream),
                        "%s", fn);
  }
#else
  (void)stream;
#endif
  const HostCodec* host;
  QNCCL_CHECK(host_codec(&host));
  RotationMemory memory;
  QNCCL_CHECK(rotation_memory(fn, count, &p, &memory));
  host->dequantize(src, count, p, dst, datatype, accumulate);
  return ncclSuccess;
}

namespace {

/* qncclRotate's and qncclUnrotate's checks: a Hadamard config, the type, the
 * count, the buffers (`forward`: src of `datatype`, dst float32; else the
 * reverse; the same buffer only as float32), on the host. */
ncclResult_t check_rotation_call(const char* fn, const void* src, size_t count,
                                 ncclDataType_t datatype, const qncclCodecConfig_t* config,
                                 const void* dst, bool forward) {
  QNCCL_CHECK(check_codec_config(fn, config));
  if (config->rotation != qncclRotationHadamard)
    return set_error(ncclInvalidArgument,
                     "%s: rotation = %d; allowed: qncclRotationHadamard (1), the rotation it "
                     "computes",
                     fn, (int)config->rotation);
  QNCCL_CHECK(check_codec_type(fn, "datatype", datatype));
  QNCCL_CHECK(check_count(fn, count));
  if (count == 0) return ncclSuccess;
  QNCCL_CHECK(check_buffer(fn, "src", src, count));
  QNCCL_CHECK(check_buffer(fn, "dst", dst, count));
  const size_t typed = count * float_type_size(datatype), f32 = count * sizeof(float);
  const uintptr_t a = (uintptr_t)src, b = (uintptr_t)dst;
  const size_t a_bytes = forward ? typed : f32, b_bytes = forward ? f32 : typed;
  const bool in_place = a == b && datatype == ncclFloat32;
  if (!in_place && a < b + b_bytes && b < a + a_bytes)
    return set_error(ncclInvalidArgument,
                     "%s: src and dst overlap; pass separate buffers, or one buffer for both "
                     "with ncclFloat32 (in place)",
                     fn);
#ifdef QNCCL_WITH_CUDA
  int device = -1;
  QNCCL_CHECK(locate(fn, src, dst, &device));
  if (device >= 0)
    return set_error(ncclInvalidUsage,
                     "%s: device buffers are not in this build yet; rotate host buffers", fn);
#endif
  return ncclSuccess;
}

/* What qncclRotate and qncclUnrotate run with: the host codec and the
 * signs' masks of one block of a `count`-value segment. */
ncclResult_t rotation_of(const char* fn, const qncclCodecConfig_t* config, size_t count,
                         const HostCodec** host, std::unique_ptr<uint32_t[]>* masks) {
  QNCCL_CHECK(host_codec(host));
  const size_t n = std::min(count, rotation_block(*config));
  masks->reset(new (std::nothrow) uint32_t[n]);
  if (*masks == nullptr)
    return set_error(ncclSystemError, "%s: no memory for %zu sign masks", fn, n);
  rotation_masks(rotation_key(config->seed), n, masks->get());
  return ncclSuccess;
}

}  // namespace

ncclResult_t codec_rotate(const char* fn, const void* src, size_t count, ncclDataType_t datatype,
                          const qncclCodecConfig_t* config, float* z, cudaStream_t stream) {
  (void)stream;
  QNCCL_CHECK(check_rotation_call(fn, src, count, datatype, config, z, true));
  if (count == 0) return ncclSuccess;
  const HostCodec* host;
  std::unique_ptr<uint32_t[]> masks;
  QNCCL_CHECK(rotation_of(fn, config, count, &host, &masks));
  host->rotate(src, datatype, count, rotation_block(*config), masks.get(), z);
  for (size_t i = 0; i < count; i++)  // a NaN's bits as unrotate leaves them
    if (z[i] != z[i]) z[i] = bits_float(kCanonicalNanF32);
  return ncclSuccess;
}

ncclResult_t codec_unrotate(const char* fn, const float* z, size_t count,
                            const qncclCodecConfig_t* config, void* dst, ncclDataType_t datatype,
                            cudaStream_t stream) {
  (void)stream;
  QNCCL_CHECK(check_rotation_call(fn, z, count, datatype, config, dst, false));
  if (count == 0) return ncclSuccess;
  const HostCodec* host;
  std::unique_ptr<uint32_t[]> masks;
  QNCCL_CHECK(rotation_of(fn, config, count, &host, &masks));
  // the inverse runs in place in float32: in dst itself when it is float32, else in a copy
  std::unique_ptr<float[]> copy;
  float* work = static_cast<float*>(dst);
  if (datatype != ncclFloat32) {
    copy.reset(new (std::nothrow) float[count]);
    if (copy == nullptr)
      return set_error(ncclSystemError,
                       "%s: no memory for %zu float32 values to rotate back in; rotate back a "
                       "smaller buffer at a time, or into float32",
                       fn, count);
    work = copy.get();
  }
  if (work != z) memcpy(work, z, count * sizeof(float));
  host->unrotate(work, count, rotation_block(*config), masks.get(), dst, datatype);
  return ncclSuccess;
}

ncclResult_t host_codec_isa(const char* fn, const char** isa) {
  if (isa == nullptr)
    return set_error(ncclInvalidArgument, "%s: isa is NULL; pass a const char**", fn);
  const HostCodec* host;
  QNCCL_CHECK(host_codec(&host));
  *isa = host->isa;
  return ncclSuccess;
}

ncclResult_t cuda_info(const char* fn, qncclCudaInfo_t* info) {
  if (info == nullptr)
    return set_error(ncclInvalidArgument, "%s: info is NULL; pass a qncclCudaInfo_t*", fn);
  *info = qncclCudaInfo_t{0, 0, 0, "", ""};
#ifdef QNCCL_WITH_CUDA
  info->compiled = 1;
  cuda_versions(&info->runtimeVersion, &info->driverVersion);
  info->sass = carried_archs(kCudaModule_codec, false);
  info->ptx = carried_archs(kCudaModule_codec, true);
#endif
  return ncclSuccess;
}

}  // namespace qnccl
