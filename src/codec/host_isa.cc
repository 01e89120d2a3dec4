/* Picks the host codec: the build for the best instruction set this CPU
 * runs, unless QNCCL_HOST_ISA asks for another. */
#include <stdio.h>
#include <string.h>

#include "codec/codec.h"
#include "common/env.h"
#include "common/error.h"

namespace qnccl {

namespace generic { extern const HostCodec kHostCodec; }
#ifdef QNCCL_HOST_X86
namespace avx2 { extern const HostCodec kHostCodec; }
namespace avx512 { extern const HostCodec kHostCodec; }
#endif

namespace {

struct Candidate {
  const HostCodec* codec;
  bool runs;  // this CPU has the instructions
};

/* Fastest first. */
int candidates(Candidate* out) {
  int n = 0;
#ifdef QNCCL_HOST_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                    __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  out[n++] = {&avx512::kHostCodec, avx512};
  out[n++] = {&avx2::kHostCodec, avx2};
#endif
  out[n++] = {&generic::kHostCodec, true};
  return n;
}

struct Choice {
  const HostCodec* codec = nullptr;
  char error[256] = "";
};

Choice choose() {
  Candidate all[3];
  const int n = candidates(all);
  const char* want = env::get(env::Var::kHostIsa);
  Choice c;
  char names[64] = "";
  for (int i = 0; i < n; i++) {
    if (!all[i].runs) continue;
    if (want == nullptr || strcmp(want, all[i].codec->isa) == 0) {
      c.codec = all[i].codec;
      return c;
    }
    strcat(names, names[0] ? ", " : "");
    strcat(names, all[i].codec->isa);
  }
  snprintf(c.error, sizeof c.error,
           "QNCCL_HOST_ISA=%s is not an instruction set this CPU and build run; allowed: %s "
           "(or unset for the fastest)",
           want, names);
  return c;
}

}  // namespace

ncclResult_t host_codec(const HostCodec** codec) {
  static const Choice choice = choose();
  if (choice.codec == nullptr) return set_error(ncclInvalidArgument, "%s", choice.error);
  *codec = choice.codec;
  return ncclSuccess;
}

}  // namespace qnccl
