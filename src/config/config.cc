#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
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
 * 1024, either case, as qnccl run's flags take them) when `suffixes`; all of the text must be used and fit 64 bits. */
bool parse_unsigned(const char* text, bool suffixes, uint64_t* out) {
  if (text[0] < '0' || text[0] > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0) return false;
  int shift = 0;
  if (suffixes && *end != '\0' && end[1] == '\0') {
    const char* units = "KMG";
    const char* unit = strchr(units, toupper((unsigned char)*end));
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

/* QNCCL_ROTATION_BLOCK: a power of two in the codec's range. */
ncclResult_t read_rotation_block(size_t* out) {
  char allowed[96];
  snprintf(allowed, sizeof allowed, "a power of two from %d to %d (values per rotation block)",
           QNCCL_MIN_ROTATION_BLOCK, QNCCL_MAX_ROTATION_BLOCK);
  uint64_t v = *out;
  QNCCL_CHECK(read_unsigned(Var::kRotationBlock, QNCCL_MIN_ROTATION_BLOCK,
                            QNCCL_MAX_ROTATION_BLOCK, true, allowed, &v));
  if ((v & (v - 1)) != 0) return bad(Var::kRotationBlock, env::get(Var::kRotationBlock), allowed);
  *out = (size_t)v;
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
const char* const kRotations[] = {"none", "hadamard", nullptr};  // qncclRotation_t's order
const char* const kClips[] = {"none", "gaussian", nullptr};        // qncclClip_t's order
const char* const kAlgos[] = {"auto", "ring", "tree", "sra", "hier", nullptr};
/* QNCCL_ALGO's words: kAlgos, then "rule" (auto by its fixed rules, unmeasured). */
const char* const kAlgoWords[] = {"auto", "ring", "tree", "sra", "hier", "rule", nullptr};
constexpr int kRuleWord = 5;
const char* const kInterAlgos[] = {"auto", "ring", "tree", "sra", nullptr};
const char* const kDebugLevels[] = {"WARN", "INFO", "TRACE", nullptr};
/* QNCCL_COLLECTIVES' names, in the order of qncclCollective_t's flags. */
const char* const kCollectives[] = {"allreduce", "reducescatter", "allgather", "alltoall",
                                    "sendrecv", nullptr};

/* QNCCL_COLLECTIVES: a comma list of kCollectives' names, each at most once,
 * or "none". */
ncclResult_t read_collectives(unsigned* out) {
  const char* text = env::get(Var::kCollectives);
  if (text == nullptr) return ncclSuccess;
  const char* allowed = "none, or a comma list of allreduce, reducescatter, allgather, alltoall, "
                        "sendrecv";
  if (strcmp(text, "none") == 0) {
    *out = 0;
    return ncclSuccess;
  }
  unsigned flags = 0;
  for (const char* p = text;;) {
    const char* comma = strchr(p, ',');
    const size_t len = comma != nullptr ? (size_t)(comma - p) : strlen(p);
    char name[32];
    if (len == 0 || len >= sizeof name) return bad(Var::kCollectives, text, allowed);
    memcpy(name, p, len);
    name[len] = '\0';
    const int i = lookup(name, kCollectives);
    if (i < 0 || (flags & (1u << i)) != 0)
      return bad(Var::kCollectives, text, allowed);
    flags |= 1u << i;
    if (comma == nullptr) break;
    p = comma + 1;
  }
  *out = flags;
  return ncclSuccess;
}

/* QNCCL_<NAME>_BITS of every collective: 1..8. */
ncclResult_t read_collective_bits(int* bits) {
  const Var vars[QNCCL_NUM_COLLECTIVES] = {Var::kAllReduceBits, Var::kReduceScatterBits,
                                           Var::kAllGatherBits, Var::kAllToAllBits,
                                           Var::kSendRecvBits};
  for (int i = 0; i < QNCCL_NUM_COLLECTIVES; i++) {
    const char* text = env::get(vars[i]);
    if (text == nullptr) continue;
    uint64_t v = 0;
    QNCCL_CHECK(read_unsigned(vars[i], QNCCL_MIN_BITS, QNCCL_MAX_BITS, false,
                              "1..8 (unset: QNCCL_BITS)", &v));
    bits[i] = (int)v;
  }
  return ncclSuccess;
}

}  // namespace

qncclEnvConfig_t default_config() {
  qncclEnvConfig_t c = {};
  c.enable = 1;
  c.allreduce.codec.bits = 4;
  c.allreduce.codec.bucketSize = 128;
  c.allreduce.codec.rounding = qncclRoundStochastic;
  c.allreduce.codec.seed = 0;
  c.allreduce.algo = qncclAlgoAuto;
  c.measured = 1;
  c.allreduce.segmentValues = 0;
  c.minBytes = 64 << 10;
  c.allreduce.errorFeedback = 0;
  c.allreduce.interAlgo = qncclAlgoAuto;
  c.allreduce.intraBits = 0;
  c.allreduce.lanes = 0;
  c.warmupCalls = 0;
  c.errorFeedbackMaxBytes = (size_t)4 << 30;
  c.debug = qncclDebugWarn;
  c.collectives = qncclCollAllReduce;
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
  QNCCL_CHECK(read_unsigned(Var::kBucketSize, 1, (uint64_t)1 << 40, true,
                            "1..2^40 values per bucket, optionally with K, M or G (x1024)", &v));
  c.allreduce.codec.bucketSize = (size_t)v;
  QNCCL_CHECK(read_choice(Var::kRounding, kRoundings, "stochastic or nearest",
                          &c.allreduce.codec.rounding));
  QNCCL_CHECK(read_choice(Var::kRotation, kRotations, "none or hadamard",
                          &c.allreduce.codec.rotation));
  QNCCL_CHECK(read_rotation_block(&c.allreduce.codec.rotationBlock));
  QNCCL_CHECK(read_choice(Var::kClip, kClips, "none or gaussian", &c.allreduce.codec.clip));
  if (c.allreduce.codec.clip != qncclClipNone && c.allreduce.codec.rotation == qncclRotationNone)
    return set_error(ncclInvalidArgument,
                     "QNCCL_CLIP=gaussian clips rotated buckets' ranges and needs "
                     "QNCCL_ROTATION=hadamard; set it, or unset QNCCL_CLIP");
  int algo = (int)c.allreduce.algo;
  QNCCL_CHECK(read_choice(Var::kAlgo, kAlgoWords, "auto, rule, ring, tree, sra or hier", &algo));
  c.allreduce.algo = algo == kRuleWord ? qncclAlgoAuto : (qncclAlgo_t)algo;
  c.measured = algo == qncclAlgoAuto;
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
  v = c.allreduce.segmentValues;
  QNCCL_CHECK(read_unsigned(Var::kSegmentValues, 0, (uint64_t)1 << 40, true,
                            "0 (4M) or 1..2^40 values, optionally with K, M or G (x1024)", &v));
  c.allreduce.segmentValues = (size_t)v;
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
  v = c.errorFeedbackMaxBytes;
  QNCCL_CHECK(read_unsigned(Var::kErrorFeedbackMaxBytes, 1, UINT64_MAX, true,
                            "an integer >= 1, optionally with K, M or G (x1024)", &v));
  c.errorFeedbackMaxBytes = (size_t)v;
  QNCCL_CHECK(read_choice(Var::kDebug, kDebugLevels, "WARN, INFO or TRACE", &c.debug));
  QNCCL_CHECK(read_collectives(&c.collectives));
  QNCCL_CHECK(read_collective_bits(c.collectiveBits));
  *config = c;
  return ncclSuccess;
}

const char* rounding_name(qncclRounding_t rounding) {
  return rounding == qncclRoundNearest ? "nearest" : "stochastic";
}

const char* collective_name(int index) {
  return index >= 0 && index < QNCCL_NUM_COLLECTIVES ? kCollectives[index] : "unknown";
}

std::string describe_collectives(const qncclEnvConfig_t& config) {
  std::string words = config.collectives == 0 ? "collectives=none" : "collectives=";
  for (int i = 0, listed = 0; i < QNCCL_NUM_COLLECTIVES; i++) {
    if ((config.collectives & (1u << i)) == 0) continue;
    words += (listed++ > 0 ? "," : "");
    words += kCollectives[i];
  }
  for (int i = 0; i < QNCCL_NUM_COLLECTIVES; i++) {
    if (config.collectiveBits[i] == 0) continue;
    words += " ";
    words += kCollectives[i];
    words += "_bits=" + std::to_string(config.collectiveBits[i]);
  }
  return words;
}

const char* algo_setting(const qncclEnvConfig_t& config) {
  const qncclAlgo_t algo = config.allreduce.algo;
  return algo == qncclAlgoAuto && !config.measured ? kAlgoWords[kRuleWord] : algo_name(algo);
}

const char* algo_name(qncclAlgo_t algo) {
  return algo >= qncclAlgoAuto && algo <= qncclAlgoHier ? kAlgos[algo] : "unknown";
}

}  // namespace qnccl
