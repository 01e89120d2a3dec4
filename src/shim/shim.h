/* The interposer (libqnccl.so's NCCL entry points): what it keeps per
 * communicator, and its shared pieces. */
#ifndef QNCCL_SHIM_SHIM_H_
#define QNCCL_SHIM_SHIM_H_

#include <stdint.h>

#include <array>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "qnccl.h"
#include "shim/tune_file.h"
#include "shim/tuner.h"

namespace qnccl {

struct CommState;  // engine/comm_state.h
struct NcclApi;    // engine/nccl_api.h

/* What the interposer keeps per communicator, beside the engine's state
 * (engine/comm_state.h): the QNCCL_* configuration read when it was made,
 * the eligible calls so far (warm-up counts these), the call kinds already
 * reported, its quantized ops by value, and measured auto's decisions. Made when the communicator is
 * created (or at its first call, from the environment), dropped by
 * ncclCommDestroy/ncclCommAbort. */
struct ShimComm {
  qncclEnvConfig_t config;
  /* qncclCommSetQuantization: per collective (index: its flag's bit) the
   * bits of its eligible calls, 0 exact, -1 the environment's policy. */
  int bits[QNCCL_NUM_COLLECTIVES] = {-1, -1, -1, -1, -1};
  uint64_t eligible_calls = 0;
  /* The compressed kinds of call reported at QNCCL_DEBUG=INFO, by their text
   * (it names the algorithm, which the node layout decides). */
  std::set<std::string> logged;
  std::unordered_map<int, qncclQuantizedOpConfig_t> ops;
  TuneTable tuning;  // measured auto's decisions (shim/tuner.h)
  /* QNCCL_TUNE_FILE's decisions, read at the first call measured auto
   * handles outside a capture; kept only when every rank read the same. */
  TuneFileSnapshot tune_file;
  bool tune_file_read = false;
  /* Whether the communicator was announced (its kernels loaded, its
   * configuration reported): once it first answered queries (a nonblocking
   * creation answers none while in progress). */
  std::atomic<bool> announced{false};
  /* Its rank count, once it answered (0 before): a one-rank communicator's
   * calls then go to the real NCCL before any other bookkeeping. */
  std::atomic<int> nranks{0};
  /* The kinds of pass-through reported at QNCCL_DEBUG=INFO (collective,
   * type, op, reduction, reason: what their text says), so that a repeated
   * one formats nothing. */
  std::set<std::array<int, 5>> passes_reported;
};

/* The interposer's state of `comm`, made on first use with `config`
 * (nullptr: from the environment; fails when it is bad). */
ncclResult_t shim_comm(ncclComm_t comm, const qncclEnvConfig_t* config,
                       std::shared_ptr<ShimComm>* state);
/* Drops it (ncclCommDestroy/ncclCommAbort); whether there was one. */
bool forget_shim_comm(ncclComm_t comm);

/* qncclCommForget: everything libqnccl holds for a communicator that was
 * destroyed or aborted without it (the real NCCL's own ncclCommAbort, as
 * PyTorch's watchdog calls it when libqnccl is not preloaded), without a
 * call on it; the hierarchical allreduce's communicators made from it are
 * aborted. Fails, naming `fn`, when it holds nothing for `comm`. */
ncclResult_t forget_ended_comm(const char* fn, ncclComm_t comm);

/* Reports and returns a failure of an interposed call: the application sees
 * NCCL's error code and the message on stderr. */
ncclResult_t fail(ncclResult_t res);

/* "float32", "int32", ... and "sum", "max", ... for reports. */
const char* short_type_name(ncclDataType_t type);
const char* op_name(ncclRedOp_t op);

/* Makes the states of a communicator the real NCCL just made, from the
 * environment read before it was made, and announces it once it is ready. A
 * nonblocking creation in progress answers no query (NCCL refuses them until
 * ncclCommGetAsyncError says ncclSuccess): it is announced at its first call
 * QNCCL does work for (comm_ready). */
void adopt_comm(ncclComm_t comm, const qncclEnvConfig_t& config);

/* Before QNCCL's own work in a call on `comm`: waits out an operation of the
 * communicator still in progress (a nonblocking creation, split or call, as
 * NCCL requires before its queries and splits), fails with the
 * communicator's error if it has one, and announces it the first time. */
ncclResult_t comm_ready(ncclComm_t comm, ShimComm& shim, CommState& state, const NcclApi& nccl);

/* The bits an eligible call of `kind` on a communicator of `state` runs
 * with: 1..8, or 0 when it goes to the real NCCL exact. */
int quantization_bits(const ShimComm& state, qncclCollective_t kind);
/* The configuration it is quantized with at `bits`: the environment's, with
 * those bits; error feedback is the allreduce's alone, a reduce-scatter takes
 * QNCCL_ALGO's ring or sra (else auto), the others their one algorithm
 * (docs/collectives.md). */
qncclAllReduceConfig_t quantized_config(const qncclEnvConfig_t& env, qncclCollective_t kind,
                                        int bits);

/* qncclCommSetQuantization and qncclCommGetQuantization (shim/policy.cc). */
ncclResult_t set_comm_quantization(const char* fn, ncclComm_t comm, unsigned collectives,
                                   int bits);
ncclResult_t get_comm_quantization(const char* fn, ncclComm_t comm, qncclCollective_t collective,
                                   int* bits, qncclAllReduceConfig_t* config);

/* qncclCommGetTuning (shim/tuner.cc's table of the communicator). */
ncclResult_t get_tuning(const char* fn, ncclComm_t comm, qncclTuning_t* table, int capacity,
                        int* count);

/* qncclRedOpCreateQuantized (src/api/api.cc). */
ncclResult_t create_quantized_op(const char* fn, ncclRedOp_t* op,
                                 const qncclQuantizedOpConfig_t* config, ncclComm_t comm);

}  // namespace qnccl

#endif
