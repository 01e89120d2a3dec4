/* Internal interface of the codec: one host implementation (codec_host.cc)
 * and one CUDA implementation (codec_cuda.cc launching codec_kernels.cu) of
 * the same operations. The public entry points (codec_api.cc) validate
 * arguments and pick one by where the buffers live; the collectives call
 * these directly. */
#ifndef QNCCL_CODEC_CODEC_H_
#define QNCCL_CODEC_CODEC_H_

#include <stddef.h>
#include <stdint.h>

#include "qnccl.h"

namespace qnccl {

/* A validated codec configuration plus the random stream of one call. */
struct CodecParams {
  int bits;
  size_t bucket;
  qncclRounding_t rounding;
  uint64_t seed;
  uint64_t stream;
  /* Device only: when set, the stream is stream_id(*call, segment, rank,
   * step) (codec/rng.h), read by the kernel when it runs, so each replay of
   * a captured CUDA graph draws the call number a kernel of that replay
   * wrote there (docs/allreduce.md, "CUDA graph capture"). */
  const uint64_t* call;
  uint64_t segment, rank, step;
  /* Stochastic rounding: value i of this quantize draws u(first + i) of its
   * stream, so quantizing bucket-aligned pieces of a range one at a time
   * writes the codes quantizing the range at once would. */
  uint64_t first = 0;
  /* Whether buckets may take the cubic grid (wire-format.md); false: every
   * bucket on the uniform grid, a rotated call's (docs/rotation.md). */
  bool cubic = true;
  /* The clip fraction f of clip_meta (codec_math.h): every bucket's stored
   * range cut at f times its largest magnitude; 0: the whole range. */
  float clip = 0.0f;
  /* Host only: rotate before quantizing and after decoding, in blocks of
   * `rotation` (0: no rotation; docs/rotation.md), the whole buffer one
   * segment, working in `scratch` (min(count, rotation_tile(count, bucket,
   * rotation)) float32 values) and `signs` (min(count, rotation) values). */
  size_t rotation = 0;
  float* scratch = nullptr;
  uint32_t* signs = nullptr;
};

/* Argument checks shared by every entry point that takes a codec config or
 * type: ncclInvalidArgument with a message naming `fn`, the argument and
 * the values allowed. */
ncclResult_t check_codec_config(const char* fn, const qncclCodecConfig_t* config);
/* The rotation block of a checked config: 0 without a rotation. */
size_t rotation_block(const qncclCodecConfig_t& config);
/* The clip fraction of a checked config (CodecParams::clip): 0 for
 * qncclClipNone, or where the cut would keep every range whole. */
float clip_fraction(const qncclCodecConfig_t& config);
/* The same for a setting at `bits` bits and `bucket` values per bucket (a
 * hierarchical call's stage inside a node takes its own width). */
float clip_fraction(qncclClip_t clip, int bits, size_t bucket);
ncclResult_t check_codec_type(const char* fn, const char* arg, ncclDataType_t type);

/* The host codec built for one instruction set (codec_host.cc is compiled
 * once per set; all give the same bytes). */
struct HostCodec {
  const char* isa;  // "generic", "avx2" or "avx512"
  /* src holds `count` values of `type`; dst compressed_bytes(...) bytes. */
  void (*quantize)(const void* src, size_t count, ncclDataType_t type, const CodecParams& p,
                   void* dst);
  /* Decodes `count` values; accumulate ? dst += y : dst = y, in `type`. */
  void (*dequantize)(const void* src, size_t count, const CodecParams& p, void* dst,
                     ncclDataType_t type, bool accumulate);
  /* acc = float32(src) (+ residual, unless null), then acc = acc + D(wire)
   * for each of the `nwires` compressed buffers of `count` values, in order:
   * the same float32 additions as a widening and nwires dequantize-
   * accumulates, in one pass. */
  void (*reduce)(const void* src, ncclDataType_t type, const float* residual,
                 const uint8_t* const* wires, int nwires, size_t count, const CodecParams& p,
                 float* acc);
  /* z = the forward rotation of src, `n` values of `type` rotated as one
   * segment in blocks of `block`, with the signs' `masks` (rotation_masks of
   * min(n, block) values; docs/rotation.md); float32. */
  void (*rotate)(const void* src, ncclDataType_t type, size_t n, size_t block,
                 const uint32_t* masks, float* z);
  /* dst = the inverse rotation of z (`n` float32 values, overwritten),
   * stored in `type`. */
  void (*unrotate)(float* z, size_t n, size_t block, const uint32_t* masks, void* dst,
                   ncclDataType_t type);
};

/* The host codec of this process: the fastest the CPU runs, or the one
 * QNCCL_HOST_ISA names. Fails, with a message, when QNCCL_HOST_ISA is not a
 * known set or names one this CPU or this build lacks. */
ncclResult_t host_codec(const HostCodec** codec);

#ifdef QNCCL_WITH_CUDA
/* Device: same contract, enqueued on `stream` (codec_cuda.cc); a failure
 * comes with its message. */
ncclResult_t device_quantize(const void* src, size_t count, ncclDataType_t type,
                             const CodecParams& p, void* dst, cudaStream_t stream);
/* Quantizes srcs[i] (counts[i] values) into wires[i] with params ps[i] (the
 * same bits, bucket, rounding and clip; their own random streams) for i < n: the
 * same bytes as n quantizes, in one launch per 16 of them when buckets are
 * powers of two up to 4096 values, two for other buckets up to 4096 values. */
ncclResult_t device_quantize_many(const void* const* srcs, const size_t* counts, int n,
                                  ncclDataType_t type, const CodecParams* ps,
                                  uint8_t* const* wires, cudaStream_t stream);
ncclResult_t device_dequantize(const void* src, size_t count, const CodecParams& p, void* dst,
                               ncclDataType_t type, bool accumulate, cudaStream_t stream);
/* Decodes wires[i] (counts[i] values) into dsts[i] for i < n: the same
 * bytes as n dequantizes, in one launch per 32 of them. */
ncclResult_t device_decode_many(const uint8_t* const* wires, void* const* dsts,
                                const size_t* counts, int n, const CodecParams& p,
                                ncclDataType_t type, cudaStream_t stream);
ncclResult_t device_reduce(const void* src, ncclDataType_t type, const float* residual,
                           const uint8_t* const* wires, int nwires, size_t count,
                           const CodecParams& p, float* acc, cudaStream_t stream);
/* Where `ptr` points: *device is its device (device or managed memory), or
 * -1 for host memory, which is also every pointer when the machine has no
 * CUDA driver or no device. Asked of the driver, so no context is made on
 * the calling thread. A pointer the driver cannot classify (a driver older
 * than the runtime, a driver error) is an error naming the cause, never
 * taken for host memory. `fn` names the caller. */
ncclResult_t pointer_device(const char* fn, const void* ptr, int* device);
/* The linked runtime's and the installed driver's CUDA versions (0: none). */
void cuda_versions(int* runtime, int* driver);
/* The CUDA devices this process sees (0: none, or no driver). */
int cuda_devices();
#endif

/* Behind the C API (src/api/api.cc); `fn` names the entry point in
 * messages. codec_dequantize is qncclDequantize, or with `accumulate`
 * qncclDequantizeAccumulate. */
ncclResult_t codec_compressed_size(const char* fn, size_t count, const qncclCodecConfig_t* config,
                                   size_t* bytes);
ncclResult_t codec_quantize(const char* fn, const void* src, size_t count, ncclDataType_t datatype,
                            const qncclCodecConfig_t* config, uint64_t randomStream, void* dst,
                            size_t dstBytes, cudaStream_t stream);
ncclResult_t codec_dequantize(const char* fn, const void* src, size_t srcBytes, size_t count,
                              const qncclCodecConfig_t* config, void* dst, ncclDataType_t datatype,
                              cudaStream_t stream, bool accumulate);
/* qncclRotate (src into the float32 values z) and qncclUnrotate (z into dst). */
ncclResult_t codec_rotate(const char* fn, const void* src, size_t count, ncclDataType_t datatype,
                          const qncclCodecConfig_t* config, float* z, cudaStream_t stream);
ncclResult_t codec_unrotate(const char* fn, const float* z, size_t count,
                            const qncclCodecConfig_t* config, void* dst, ncclDataType_t datatype,
                            cudaStream_t stream);
ncclResult_t host_codec_isa(const char* fn, const char** isa);
ncclResult_t cuda_info(const char* fn, qncclCudaInfo_t* info);

}  // namespace qnccl

#endif
