/* Picks the host codec built for the best instruction set this CPU has. */
#include "codec/codec.h"

namespace qnccl {

#define QNCCL_DECLARE_HOST_CODEC(isa)                                                        \
  namespace isa {                                                                            \
  void host_quantize(const void*, size_t, ncclDataType_t, const CodecParams&, void*);        \
  void host_dequantize(const void*, size_t, const CodecParams&, void*, ncclDataType_t, bool); \
  }
QNCCL_DECLARE_HOST_CODEC(generic)
#ifdef QNCCL_HOST_AVX2
QNCCL_DECLARE_HOST_CODEC(avx2)
#endif

namespace {
bool use_avx2() {
#ifdef QNCCL_HOST_AVX2
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}
}  // namespace

void host_quantize(const void* src, size_t count, ncclDataType_t type, const CodecParams& p,
                   void* dst) {
#ifdef QNCCL_HOST_AVX2
  if (use_avx2()) return avx2::host_quantize(src, count, type, p, dst);
#endif
  generic::host_quantize(src, count, type, p, dst);
}

void host_dequantize(const void* src, size_t count, const CodecParams& p, void* dst,
                     ncclDataType_t type, bool accumulate) {
#ifdef QNCCL_HOST_AVX2
  if (use_avx2()) return avx2::host_dequantize(src, count, p, dst, type, accumulate);
#endif
  generic::host_dequantize(src, count, p, dst, type, accumulate);
}

}  // namespace qnccl
