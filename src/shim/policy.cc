/* Which interposed calls are quantized, with how many bits: the
 * environment's QNCCL_COLLECTIVES and QNCCL_<NAME>_BITS, or a
 * communicator's own policy (qncclCommSetQuantization); and what measured
 * auto decided (qncclCommGetTuning). */
#include "common/error.h"
#include "engine/nccl_api.h"
#include "shim/shim.h"

namespace qnccl {

int quantization_bits(const ShimComm& state, qncclCollective_t kind) {
  const int i = __builtin_ctz((unsigned)kind);
  if (state.bits[i] >= 0) return state.bits[i];
  if ((state.config.collectives & (unsigned)kind) == 0) return 0;
  const int own = state.config.collectiveBits[i];
  return own != 0 ? own : state.config.allreduce.codec.bits;
}

qncclAllReduceConfig_t quantized_config(const qncclEnvConfig_t& env, qncclCollective_t kind,
                                        int bits) {
  qncclAllReduceConfig_t config = env.allreduce;
  config.codec.bits = bits;
  if (kind == qncclCollAllReduce) return config;
  config.errorFeedback = 0;
  const bool ring_or_sra = config.algo == qncclAlgoRing || config.algo == qncclAlgoSra;
  if (kind != qncclCollReduceScatter || !ring_or_sra) config.algo = qncclAlgoAuto;
  return config;
}

namespace {

constexpr unsigned kAllCollectives = (1u << QNCCL_NUM_COLLECTIVES) - 1;

ncclResult_t state_of(const char* fn, ncclComm_t comm, std::shared_ptr<ShimComm>* state) {
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  const NcclApi* nccl;
  int nranks = 0, rank = 0;
  QNCCL_CHECK(comm_shape(fn, comm, &nccl, &nranks, &rank));
  return shim_comm(comm, nullptr, state);
}

}  // namespace

ncclResult_t set_comm_quantization(const char* fn, ncclComm_t comm, unsigned collectives,
                                   int bits) {
  if (collectives == 0 || (collectives & ~kAllCollectives) != 0)
    return set_error(ncclInvalidArgument,
                     "%s: collectives = %#x; allowed: qncclColl* flags OR-ed, at least one "
                     "(qncclCollAllReduce 1, qncclCollReduceScatter 2, qncclCollAllGather 4, "
                     "qncclCollAllToAll 8, qncclCollSendRecv 16)",
                     fn, collectives);
  if (bits < -1 || bits > QNCCL_MAX_BITS)
    return set_error(ncclInvalidArgument,
                     "%s: bits = %d; allowed: %d..%d (quantized), 0 (exact) or -1 (the "
                     "environment's QNCCL_COLLECTIVES and QNCCL_<NAME>_BITS)",
                     fn, bits, QNCCL_MIN_BITS, QNCCL_MAX_BITS);
  std::shared_ptr<ShimComm> state;
  QNCCL_CHECK(state_of(fn, comm, &state));
  for (int i = 0; i < QNCCL_NUM_COLLECTIVES; i++)
    if (collectives & (1u << i)) state->bits[i] = bits;
  return ncclSuccess;
}

ncclResult_t get_comm_quantization(const char* fn, ncclComm_t comm, qncclCollective_t collective,
                                   int* bits, qncclAllReduceConfig_t* config) {
  const unsigned c = (unsigned)collective;
  if (c == 0 || (c & (c - 1)) != 0 || (c & ~kAllCollectives) != 0)
    return set_error(ncclInvalidArgument,
                     "%s: collective = %#x; allowed: one qncclColl* flag (1, 2, 4, 8 or 16)", fn,
                     c);
  if (bits == nullptr) return set_error(ncclInvalidArgument, "%s: bits is NULL", fn);
  std::shared_ptr<ShimComm> state;
  QNCCL_CHECK(state_of(fn, comm, &state));
  *bits = quantization_bits(*state, collective);
  if (config != nullptr && *bits > 0) *config = quantized_config(state->config, collective, *bits);
  return ncclSuccess;
}

ncclResult_t get_tuning(const char* fn, ncclComm_t comm, qncclTuning_t* table, int capacity,
                        int* count) {
  if (count == nullptr) return set_error(ncclInvalidArgument, "%s: count is NULL", fn);
  if (capacity < 0 || (capacity > 0 && table == nullptr))
    return set_error(ncclInvalidArgument,
                     "%s: capacity = %d with table %s; allowed: capacity >= 0, and a table of "
                     "that many entries unless capacity is 0",
                     fn, capacity, table == nullptr ? "NULL" : "given");
  std::shared_ptr<ShimComm> state;
  QNCCL_CHECK(state_of(fn, comm, &state));
  int n = 0;
  for (const auto& [key, t] : state->tuning) {
    if (n < capacity) {
      qncclTuning_t& e = table[n];
      e = qncclTuning_t{};
      e.collective = key.kind;
      e.datatype = key.type;
      e.sizeClass = key.size_class;
      e.calls = t.calls;
      e.candidateCount = (int)t.candidates.size();
      e.trialCalls = trial_calls(t);
      e.stored = t.stored ? 1 : 0;
      for (int i = 0; i < e.candidateCount; i++) {
        e.candidates[i] = t.candidates[i];
        const auto at = [i](const std::vector<double>& v) {
          return i < (int)v.size() ? v[i] : 0.0;
        };
        e.seconds[i] = at(t.agreed.median);
        e.floorSeconds[i] = at(t.agreed.floor);
        e.ceilingSeconds[i] = at(t.agreed.ceiling);
      }
      e.choice = t.choice;
    }
    n++;
  }
  *count = n;
  return ncclSuccess;
}

}  // namespace qnccl
