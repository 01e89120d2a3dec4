#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"
#include "config/config.h"
#include "engine/nccl_api.h"
#include "shim/shim.h"

namespace qnccl {

void info(ncclComm_t comm, const CommState& state, const char* fmt, ...) {
  if (state.config.debug < qncclDebugInfo) return;
  const NcclApi* nccl;
  int rank = -1;
  if (real_nccl(&nccl) == ncclSuccess) nccl->commUserRank(comm, &rank);
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "QNCCL INFO comm %p rank %d%s\n", (void*)comm, rank, text);
}

void warn(const char* fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "QNCCL WARN %s\n", text);
}

ncclResult_t fail(ncclResult_t res) {
  warn("%s", last_error());
  return res;
}

const char* short_type_name(ncclDataType_t type) {
  static const char* const names[] = {"int8",    "uint8",   "int32",   "uint32",
                                      "int64",   "uint64",  "float16", "float32",
                                      "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  unsigned t = (unsigned)type;
  return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

const char* op_name(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < 5 ? names[op] : "custom";
}

void adopt_comm(ncclComm_t comm, const qncclEnvConfig_t& config) {
  std::shared_ptr<CommState> state;
  if (comm == nullptr || comm_state(comm, &config, &state) != ncclSuccess) return;
  const NcclApi* nccl;
  int nranks = 0;
  if (real_nccl(&nccl) != ncclSuccess) return;
  nccl->commCount(comm, &nranks);
  const qncclCodecConfig_t& c = config.allreduce.codec;
  info(comm, *state,
       "/%d: bits=%d bucket=%zu rounding=%s algo=%s min_bytes=%zu seed=%llu warmup=%llu "
       "error_feedback=%d enable=%d nccl=%s",
       nranks, c.bits, c.bucketSize, rounding_name(c.rounding), algo_name(config.allreduce.algo),
       config.minBytes, (unsigned long long)c.seed, (unsigned long long)config.warmupCalls,
       config.allreduce.errorFeedback, config.enable, nccl->path);
}

}  // namespace qnccl
