/* qncclAllReduceErrorBound and qncclCollectiveErrorBound: an a priori bound
 * on how far a quantized call's result can lie from the exact one, from
 * nothing but the configuration and a bound A on the inputs' magnitude.
 * docs/allreduce.md, "Error bound", derives every term; the names below
 * follow it. docs/collectives.md, "Error bound", the other collectives'. */
#include <float.h>
#include <math.h>

#include <algorithm>

#include "codec/codec.h"
#include "common/error.h"
#include "engine/engine.h"

namespace qnccl {
namespace {

constexpr double kUnit = 0x1p-24;  // u: float32 unit roundoff
// One quantization's float32 slack, relative to the magnitude bound of what
// it quantizes (encode, decode and step arithmetic of docs/wire-format.md):
// below 15.1u, 11.1u unless 1/step is subnormal.
constexpr double kCodecSlack = 16 * kUnit;
// One quantization's absolute slack: the 2^-126 floor of the step, and
// subnormal roundings of the codec's products.
constexpr double kCodecTiny = 0x1p-125;
// The avg division's absolute slack (its quotient may be subnormal).
constexpr double kDivideTiny = 0x1p-150;
// The bound is evaluated in double: some 50 roundings, each below 2^-53,
// all of positive terms, stay far inside this relative margin.
constexpr double kDoubleMargin = 1 + 0x1p-40;
// Smallest magnitude that float16 / bfloat16 round to infinity (max + half an ulp).
constexpr double kFloat16Overflow = 65520.0;
constexpr double kBfloat16Overflow = 0x1.ffp127;

/* Where the inputs of one result value meet quantizations and additions,
 * each counted with the number of ranks' inputs its partial sum covers
 * (its "coverage"), over everything before the owner's final quantization. */
struct Coverage {
  double quantized;      // sum of the coverages of the quantized partial sums
  double quantizations;  // how many there are
  double added;          // sum of the coverages of the float32 additions' results
};

/* Partial sums covering 1, 2, .., N-1 ranks, each quantized once; the
 * additions produce coverages 2..N. */
Coverage ring_coverage(double n) { return {n * (n - 1) / 2, n - 1, n * (n + 1) / 2 - 1}; }

/* N-1 single-rank inputs quantized; the owner's additions produce 2..N. */
Coverage sra_coverage(double n) { return {n - 1, n - 1, n * (n + 1) / 2 - 1}; }

/* Every non-root rank quantizes its subtree's sum. The subtree sizes of the
 * non-root ranks add up to the sum of all depths, floor(log2(r + 1)) for rank
 * r, summed here a level at a time. A rank's additions (one per child)
 * cover at most its subtree, so they add up to at most twice the sum of all
 * subtree sizes, depths + N. */
Coverage tree_coverage(int nranks) {
  double depths = 0;
  for (long long level = 1, first = 2; first <= nranks; level++, first *= 2) {
    const long long last = first * 2 - 1 < nranks ? first * 2 - 1 : nranks;  // r + 1 in [first, last]
    depths += (double)level * (double)(last - first + 1);
  }
  return {depths, (double)nranks - 1, 2 * (depths + nranks)};
}

Coverage coverage_of(qncclAlgo_t algo, int nranks) {
  switch (algo) {
    case qncclAlgoTree: return tree_coverage(nranks);
    case qncclAlgoSra: return sra_coverage(nranks);
    default: return ring_coverage(nranks);
  }
}

/* One quantization of values bounded by M errs by at most
 * alpha * M + kCodecTiny: rho * (the widest cell of the grid) + slack. A
 * uniform grid's cell is its step, <= 2M/L (1+u)^2; a cubic grid's (bits >= 2,
 * docs/wire-format.md) is a side's top cell, <= 3 (max - min) / (L - 1) <=
 * 6M/(L-1), with (1+u)^3 for the roundings of the unit and of z's choice. */
double quantization_alpha(const qncclCodecConfig_t& codec) {
  const double levels = (double)((1u << codec.bits) - 1u);
  const double rho = codec.rounding == qncclRoundNearest ? 0.5 : 1.0;
  // a rotated call's buckets are all on the uniform grid (docs/rotation.md)
  const bool cubic = codec.bits >= 2 && codec.rotation == qncclRotationNone;
  const double cell = cubic ? 6 / (levels - 1) : 2 / levels;
  const double f = clip_fraction(codec);
  if (f == 0) return rho * cell * (1 + kUnit) * (1 + kUnit) * (1 + kUnit) + kCodecSlack;
  // A clipped range (docs/rotation.md, "Clipped ranges") is cut at t = fl(f M) >= f M (1 - u):
  // its cell is at most 2 t / L, and a value past the cut lands on the cut's end, at most
  // M - t away, plus that end's own rounding.
  return (1 - f * (1 - kUnit)) +
         rho * f * cell * (1 + kUnit) * (1 + kUnit) * (1 + kUnit) * (1 + kUnit) + kCodecSlack;
}

/* Rounding of the decoded float32 result into the output type, for results
 * of magnitude at most m; infinity when the store could overflow. */
double store_error(ncclDataType_t type, double m) {
  if (type == ncclFloat16) return m < kFloat16Overflow ? 0x1p-11 * m + 0x1p-25 : HUGE_VAL;
  if (type == ncclBfloat16) return m < kBfloat16Overflow ? 0x1p-8 * m + 0x1p-134 : HUGE_VAL;
  return 0;
}

/* `owner_quantizes`: the allreduce's owner quantizes the result once more;
 * a reduce-scatter stores it. */
double error_bound(qncclAlgo_t algo, ncclDataType_t type, bool average,
                   const qncclCodecConfig_t& codec, int nranks, double a,
                   bool owner_quantizes = true) {
  const double n = nranks;
  // A partial sum covering k ranks is at most k A G in magnitude (decoding
  // never leaves a bucket's [min, max]; each addition rounds up by <= 1+u).
  const double g = pow(1 + kUnit, n - 1);
  const double full = n * a * g;
  if (!(full <= FLT_MAX)) return HUGE_VAL;  // a partial sum could overflow float32
  const double alpha = quantization_alpha(codec);
  const Coverage c = coverage_of(algo, nranks);
  double before = alpha * a * g * c.quantized + c.quantizations * kCodecTiny +
                  kUnit * a * g * c.added;
  double result_max = full;
  if (average) {
    before = before / n + kUnit * a * g + kDivideTiny;
    result_max = a * g * (1 + kUnit) + kDivideTiny;
  }
  const double last = owner_quantizes ? alpha * result_max + kCodecTiny : 0;
  return (before + last + store_error(type, result_max)) * kDoubleMargin;
}

/* A rotated call's bound (docs/rotation.md, "Error bound"), for inputs at
 * most A in magnitude, in blocks of at most b = 2^k values: a rotated input
 * is 2^-ceil(k/2) times a sum of b inputs, so at most A' = 2^floor(k/2) A,
 * and its float32 butterfly is off by at most gamma_k A' (gamma_k =
 * k u / (1 - k u) >= (1 + u)^k - 1). The call then errs, in the rotated
 * domain, by at most inner(float32, A' (1 + gamma_k)), its unrotated bound
 * for such inputs, plus the forward roundings of the `summed` ranks whose
 * rotated inputs a result adds (avg: their mean); rotating back maps a
 * block's errors e to at most 2^-floor(k/2) sum |e| <= 2^ceil(k/2) max |e|
 * per value, and its own butterfly adds gamma_k 2^ceil(k/2) Y for rotated
 * results of at most Y. The bound grows with the block, so the largest one
 * a value can be in bounds every value of the call. */
template <typename Inner>
double rotated_bound(ncclDataType_t type, bool average, int summed, double a, size_t block,
                     Inner inner) {
  int k = 0;
  while (((size_t)2 << k) <= block) k++;
  const double n = summed, terms = average ? 1 : n, gamma = k * kUnit / (1 - k * kUnit);
  if (!(ldexp(n * a, k) <= FLT_MAX)) return HUGE_VAL;  // a butterfly's sum could overflow
  const double rotated = ldexp(a, k / 2);  // A'
  // each rank's forward rotation: its butterfly, and its scale where the
  // result is subnormal (2^-149 at most)
  const double forward = (gamma * rotated + 0x1p-149) * terms * pow(1 + kUnit, n - 1);
  const double inside = inner(ncclFloat32, rotated * (1 + gamma)) + forward;
  const double result = terms * rotated * (1 + gamma) * pow(1 + kUnit, n) + inside;
  const double error = ldexp(inside + gamma * result, (k + 1) / 2) + 0x1p-149;
  const double result_max = terms * a + error;
  return (error + store_error(type, result_max)) * kDoubleMargin;
}

/* An allgather's, all-to-all's or send's value: quantized once, decoded into
 * the data type. */
double direct_bound(ncclDataType_t type, const qncclCodecConfig_t& codec, double a) {
  return (quantization_alpha(codec) * a + kCodecTiny + store_error(type, a)) * kDoubleMargin;
}

/* The largest rotation block a value of a call can be in (0: none): the
 * config's, or the largest power of two in the longest segment of a piece
 * of `count` values if that is shorter. */
size_t largest_block(const qncclAllReduceConfig_t& config, size_t count) {
  const size_t block = rotation_block(config.codec);
  if (block == 0 || count == 0) return 0;
  const size_t longest = std::min(count, segment_values(config));
  size_t largest = 1;
  while (largest * 2 <= std::min(longest, block)) largest *= 2;
  return largest;
}

/* The bound of a call of `type` on pieces of `count` values whose
 * unrotated bound is inner(type, a) for inputs of magnitude at most a,
 * rotated or not as `config` says (a result adds `summed` ranks' inputs). */
template <typename Inner>
double call_bound(const qncclAllReduceConfig_t& config, size_t count, ncclDataType_t type,
                  bool average, int summed, double a, Inner inner) {
  const size_t block = largest_block(config, count);
  return block != 0 ? rotated_bound(type, average, summed, a, block, inner) : inner(type, a);
}

ncclResult_t check_bound_args(const char* fn, int nranks, double inputAbsMax, double* bound) {
  if (nranks < 1) return set_error(ncclInvalidArgument, "%s: nranks = %d; allowed: >= 1", fn, nranks);
  if (!(inputAbsMax >= 0 && inputAbsMax <= DBL_MAX))  // also NaN
    return set_error(ncclInvalidArgument,
                     "%s: inputAbsMax = %g; allowed: finite and >= 0 (the largest |input|)", fn,
                     inputAbsMax);
  if (bound == nullptr) return set_error(ncclInvalidArgument, "%s: bound is NULL; pass a double*", fn);
  return ncclSuccess;
}

}  // namespace

ncclResult_t allreduce_error_bound(const char* fn, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, const qncclAllReduceConfig_t* config,
                                   int nranks, double inputAbsMax, double* bound) {
  QNCCL_CHECK(check_allreduce_config(fn, count, datatype, op, config));
  QNCCL_CHECK(check_bound_args(fn, nranks, inputAbsMax, bound));
  if (config->errorFeedback)
    return set_error(ncclInvalidArgument,
                     "%s: config->errorFeedback = 1: a call with error feedback also returns "
                     "the residuals of earlier calls, so its inputs alone bound nothing; pass "
                     "errorFeedback = 0 (docs/allreduce.md, \"Error feedback\", bounds the sum "
                     "over calls)",
                     fn);
  const qncclAlgo_t algo = resolve_algo(config->algo, count, datatype, nranks);
  if (algo == qncclAlgoHier)
    return set_error(ncclInvalidArgument,
                     "%s: config->algo = qncclAlgoHier: its bound depends on the node layout, "
                     "which nranks does not give; qnccl.emulate.allreduce(..., nodes=...) "
                     "reports it",
                     fn);
  const bool average = op == ncclAvg;
  *bound = call_bound(*config, count, datatype, average, nranks, inputAbsMax,
                      [&](ncclDataType_t type, double a) {
                        return error_bound(algo, type, average, config->codec, nranks, a);
                      });
  return ncclSuccess;
}

ncclResult_t collective_error_bound(const char* fn, qncclCollective_t collective, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op,
                                    const qncclAllReduceConfig_t* config, int nranks,
                                    double inputAbsMax, double* bound) {
  switch (collective) {
    case qncclCollAllReduce:
      return allreduce_error_bound(fn, count, datatype, op, config, nranks, inputAbsMax, bound);
    case qncclCollReduceScatter: {
      QNCCL_CHECK(check_reduce_scatter_config(fn, count, datatype, op, config));
      QNCCL_CHECK(check_bound_args(fn, nranks, inputAbsMax, bound));
      const qncclAlgo_t algo = reduce_scatter_algo(config->algo, nranks);
      const bool average = op == ncclAvg;
      *bound = call_bound(*config, count, datatype, average, nranks, inputAbsMax,
                          [&](ncclDataType_t type, double a) {
                            return error_bound(algo, type, average, config->codec, nranks, a,
                                               false);
                          });
      return ncclSuccess;
    }
    case qncclCollAllGather:
    case qncclCollAllToAll:
    case qncclCollSendRecv:
      QNCCL_CHECK(check_gather_config(fn, count, datatype, config));
      QNCCL_CHECK(check_bound_args(fn, nranks, inputAbsMax, bound));
      *bound = call_bound(*config, count, datatype, false, 1, inputAbsMax,
                          [&](ncclDataType_t type, double a) {
                            return direct_bound(type, config->codec, a);
                          });
      return ncclSuccess;
  }
  return set_error(ncclInvalidArgument,
                   "%s: collective = %d; allowed: one qncclColl* flag (1, 2, 4, 8 or 16)", fn,
                   (int)collective);
}

}  // namespace qnccl
