#include "config/config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/error.h"

namespace qnccl {
namespace {

using env::Var;

ncclResult_t bad(Var var, const char* value, const char* allowed) {
  return set_error(ncclInvalidArgument, "%s=%s is invalid; allowed: %s", env::name(var), value,
                   allowed);
}

/* An unsigned decimal integer, optionally with a K, M or G suffix (powers of
 * 1024) when `suffixes`; all of the text must be used and fit 64 bits. */
bool parse_unsigned(const char* text, bool suffixes, uint64_t* out) {
  if (text[0] < '0' || text[0] > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0) return false;
  int shift = 0;
  if (suffixes && *end != '\0' && end[1] == '\0') {
    const char* units = "KMG";
    const char* unit = strchr(units, *end);
    if (unit == nullptr) return false;
    shift = 10 * (int)(unit - units + 1);
    end++;
  }
  if (*end != '\0' || (shift > 0 && v > (UINT64_MAX >> shift))) return false;
  *out = (uint64_t)v << shift;
  return true;
}

/* Index of `text` in `names` (nullptr-terminated), or -1. */
int lookup(const char* text, const char* const* names) {
  for (int i = 0; names[i] != nullptr; i++)
    if (strcmp(text, names[i]) == 0) return i;
  return -1;
}

ncclResult_t read_unsigned(Var var, uint64_t lo, uint64_t hi, bool suffixes, const char* allowed,
                           uint64_t* out) {
  const char* text = env::get(var);
  if (text == nullptr) return ncclSuccess;
  uint64_t v;
  if (!parse_unsigned(text, suffixes, &v) || v < lo || v > hi) return bad(var, text, allowed);
  *out = v;
  return ncclSuccess;
}

template <class Enum>
ncclResult_t read_choice(Var var, const char* const* names, const char* allowed, Enum* out) {
  const char* text = env::get(var);
  if (text == nullptr) return ncclSuccess;
  const int i = lookup(text, names);
  if (i < 0) return bad(var, text, allowed);
  *out = (Enum)i;
  return ncclSuccess;
}

const char* const kRoundings[] = {"nearest", "stochastic", nullptr};
const char* const kAlgos[] = {"auto", "ring", "tree", "sra", "hier", nullptr};
const char* const kInterAlgos[] = {"auto", "ring", "tree", "sra", nullptr};
const char* const kDebugLevels[] = {"WARN", "INFO", "TRACE", nullptr};

}  // namespace

qncclEnvConfig_t default_config() {
  qncclEnvConfig_t c = {};
  c.enable = 1;
  c.allreduce.codec.bits = 4;
  c.allreduce.codec.bucketSize = 128;
  c.allreduce.codec.rounding = qncclRoundStochastic;
  c.allreduce.codec.seed = 0;
  c.allreduce.algo = qncclAlgoAuto;
  c.allreduce.segmentValues = 0;
  c.minBytes = 64 << 10;
  c.allreduce.errorFeedback = 0;
  c.allreduce.interAlgo = qncclAlgoAuto;
  c.allreduce.intraBits = 0;
  c.allreduce.lanes = 0;
  c.warmupCalls = 0;
  c.debug = qncclDebugWarn;
  return c;
}

ncclResult_t config_from_env(qncclEnvConfig_t* config) {
  qncclEnvConfig_t c = default_config();
  uint64_t v;
  v = (uint64_t)c.enable;
  QNCCL_CHECK(read_unsigned(Var::kEnable, 0, 1, false, "0 or 1", &v));
  c.enable = (int)v;
  v = (uint64_t)c.allreduce.codec.bits;
  QNCCL_CHECK(read_unsigned(Var::kBits, QNCCL_MIN_BITS, QNCCL_MAX_BITS, false, "1..8", &v));
  c.allreduce.codec.bits = (int)v;
  v = c.allreduce.codec.bucketSize;
  QNCCL_CHECK(read_unsigned(Var::kBucketSize, 1, (uint64_t)1 << 40, false,
                            "an integer >= 1 (values per bucket)", &v));
  c.allreduce.codec.bucketSize = (size_t)v;
  QNCCL_CHECK(read_choice(Var::kRounding, kRoundings, "stochastic or nearest",
                          &c.allreduce.codec.rounding));
  QNCCL_CHECK(read_choice(Var::kAlgo, kAlgos, "auto, ring, tree, sra or hier",
                          &c.allreduce.algo));
  QNCCL_CHECK(read_choice(Var::kInterAlgo, kInterAlgos, "auto, ring, tree or sra",
                          &c.allreduce.interAlgo));
  v = (uint64_t)c.allreduce.intraBits;
  QNCCL_CHECK(read_unsigned(Var::kIntraBits, 0, QNCCL_MAX_BITS, false,
                            "0 (exact) or 1..8", &v));
  c.allreduce.intraBits = (int)v;
  v = (uint64_t)c.allreduce.lanes;
  QNCCL_CHECK(read_unsigned(Var::kLanes, 0, QNCCL_MAX_LANES, false,
                            "0 (auto: 2 on device buffers, 1 on host buffers) or 1..8", &v));
  c.allreduce.lanes = (int)v;
  v = c.minBytes;
  QNCCL_CHECK(read_unsigned(Var::kMinBytes, 0, UINT64_MAX, true,
                            "an integer >= 0, optionally with K, M or G (x1024)", &v));
  c.minBytes = (size_t)v;
  QNCCL_CHECK(read_unsigned(Var::kSeed, 0, UINT64_MAX, false, "an unsigned 64-bit integer",
                            &c.allreduce.codec.seed));
  QNCCL_CHECK(read_unsigned(Var::kWarmupCalls, 0, UINT64_MAX, false, "an integer >= 0",
                            &c.warmupCalls));
  v = (uint64_t)c.allreduce.errorFeedback;
  QNCCL_CHECK(read_unsigned(Var::kErrorFeedback, 0, 1, false, "0 or 1", &v));
  c.allreduce.errorFeedback = (int)v;
  QNCCL_CHECK(read_choice(Var::kDebug, kDebugLevels, "WARN, INFO or TRACE", &c.debug));
  *config = c;
  return ncclSuccess;
}

const char* rounding_name(qncclRounding_t rounding) {
  return rounding == qncclRoundNearest ? "nearest" : "stochastic";
}

const char* algo_name(qncclAlgo_t algo) {
  return algo >= qncclAlgoAuto && algo <= qncclAlgoHier ? kAlgos[algo] : "unknown";
}

}  // namespace qnccl
