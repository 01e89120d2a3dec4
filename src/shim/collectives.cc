/* The interposed ncclAllReduce, ncclReduceScatter, ncclAllGather,
 * ncclAlltoAll, ncclSend and ncclRecv: eligible calls (of the collectives the
 * policy names, shim/policy.cc) run the quantized engine, everything else
 * goes to the real NCCL unchanged (DESIGN invariant 5). Inside a group,
 * eligible calls wait for the outermost ncclGroupEnd, which first lets the
 * real NCCL flush the group's pass-through operations, then runs them: per
 * communicator its collectives in issue order, then its sends and receives
 * as one call; across communicators in lock-step (engine/lockstep.cc). */
#include <stdio.h>
#include <string.h>

#include <chrono>
#include <vector>

#include "codec/dtype.h"
#include "common/env.h"
#include "common/error.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/comm_state.h"
#include "engine/compute.h"
#include "engine/nccl_api.h"
#include "engine/report.h"
#include "engine/topology.h"
#include "shim/shim.h"

using namespace qnccl;

namespace {

/* Why a call passes through; put in words only when it is reported
 * (why_text), so that a passed-through call formats nothing. */
enum class Why : uint8_t {
  kNone,
  kDisabled,       // QNCCL_ENABLE=0
  kExactHere,      // qncclCommSetQuantization made the collective exact
  kNotListed,      // not in QNCCL_COLLECTIVES
  kType,           // not a float type
  kOp,             // not sum or average
  kSmall,          // below QNCCL_MIN_BYTES
  kWarmup,         // one of the first QNCCL_WARMUP_CALLS
  kTrialExact,     // measured auto tries the exact call
  kExactFastest,   // measured auto chose the exact call
  kOneRank,        // nothing crosses a link
  kOneNode,        // hierarchical on one node
  kSelf,           // a send or receive to or from this rank
};

struct Decision {
  bool compress = false;
  bool counted = false;   // took an eligible-call number (warm-up counts these)
  bool measured = false;  // measured auto picks what it runs (shim/tuner.h)
  bool requested = false;  // a quantized op's call: the application asked for it
  qncclAllReduceConfig_t config = {};
  ncclRedOp_t reduction = ncclSum;
  Why why = Why::kNone;  // when it passes through
};

void why_text(const Decision& d, const qncclEnvConfig_t& c, ncclDataType_t type, char* text,
              size_t size) {
  switch (d.why) {
    case Why::kDisabled: snprintf(text, size, "QNCCL_ENABLE=0"); return;
    case Why::kExactHere:
      snprintf(text, size, "exact on this communicator (qncclCommSetQuantization)");
      return;
    case Why::kNotListed: snprintf(text, size, "not in QNCCL_COLLECTIVES"); return;
    case Why::kType: snprintf(text, size, "%s is not quantized", short_type_name(type)); return;
    case Why::kOp: snprintf(text, size, "op %s is not quantized", op_name(d.reduction)); return;
    case Why::kSmall: snprintf(text, size, "below QNCCL_MIN_BYTES=%zu", c.minBytes); return;
    case Why::kWarmup:
      snprintf(text, size, "warm-up: the first %llu eligible calls stay exact",
               (unsigned long long)c.warmupCalls);
      return;
    case Why::kTrialExact: snprintf(text, size, "measured auto: a trial of the exact call"); return;
    case Why::kExactFastest:
      snprintf(text, size, "measured auto: the exact call is fastest");
      return;
    case Why::kOneRank: snprintf(text, size, "one rank: nothing crosses a link"); return;
    case Why::kOneNode:
      snprintf(text, size, "hierarchical on one node: nothing crosses a node link");
      return;
    case Why::kSelf: snprintf(text, size, "to or from itself"); return;
    case Why::kNone: break;
  }
  snprintf(text, size, "?");
}

bool is_float(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16; }

bool reduces(qncclCollective_t kind) {
  return kind == qncclCollAllReduce || kind == qncclCollReduceScatter;
}

Decision decide(ShimComm& st, qncclCollective_t kind, size_t count, ncclDataType_t type,
                ncclRedOp_t op) {
  Decision d;
  d.reduction = op;  // the quantized op's own reduction for an explicit request
  const qncclEnvConfig_t& c = st.config;
  const int bits = quantization_bits(st, kind);
  const auto quantized = st.ops.find((int)op);
  if (quantized != st.ops.end() && kind == qncclCollAllReduce) {
    // An explicit request: the environment does not apply.
    d.compress = true;
    d.requested = true;
    d.config = quantized->second.allreduce;
    d.reduction = quantized->second.reduction;
    return d;
  }
  if (quantized != st.ops.end())  // elsewhere the exact sum or average it stands for
    op = d.reduction = quantized->second.reduction;
  if (!c.enable) {
    d.why = Why::kDisabled;
  } else if (bits == 0) {
    d.why = st.bits[__builtin_ctz((unsigned)kind)] == 0 ? Why::kExactHere : Why::kNotListed;
  } else if (!is_float(type)) {
    d.why = Why::kType;
  } else if (reduces(kind) && op != ncclSum && op != ncclAvg) {
    d.why = Why::kOp;
  } else if (count * float_type_size(type) < c.minBytes) {
    d.why = Why::kSmall;
  } else if (kind != qncclCollSendRecv && st.eligible_calls++ < c.warmupCalls) {
    // (Not sends and receives: the two sides of one count different calls.)
    d.counted = true;
    d.why = Why::kWarmup;
  } else {
    d.counted = kind != qncclCollSendRecv;
    d.compress = true;
    d.config = quantized_config(c, kind, bits);
    d.measured = c.measured && d.config.algo == qncclAlgoAuto && kind != qncclCollSendRecv;
  }
  return d;
}

const char* call_name(qncclCollective_t kind) {
  switch (kind) {
    case qncclCollReduceScatter: return "ncclReduceScatter";
    case qncclCollAllGather: return "ncclAllGather";
    case qncclCollAllToAll: return "ncclAlltoAll";
    case qncclCollSendRecv: return "ncclSend/ncclRecv";
    default: return "ncclAllReduce";
  }
}

/* One report per kind of call (type, op, decision) and communicator; at
 * QNCCL_DEBUG=TRACE one per call, with its size. */
void report_kind(ncclComm_t comm, ShimComm& st, const CommState& state, qncclCollective_t call,
                 ncclDataType_t type, ncclRedOp_t op, const Decision& d, size_t count,
                 const NcclApi& nccl) {
  if (st.config.debug < qncclDebugInfo) return;
  char kind[256];
  if (d.compress) {
    int nranks = 1;
    nccl.commCount(comm, &nranks);
    // Before its first call auto does not know the node layout yet.
    const Topology& t = state.topology;
    const qncclAlgo_t algo =
        call == qncclCollReduceScatter ? reduce_scatter_algo(d.config.algo, nranks)
        : d.config.algo == qncclAlgoAuto && !t.known
            ? qncclAlgoAuto
            : resolve_algo(d.config.algo, count, type, nranks, &t);
    char how[96];
    if (!reduces(call))
      snprintf(how, sizeof how, "direct, %d bits", d.config.codec.bits);
    else if (algo == qncclAlgoHier)
      snprintf(how, sizeof how, "hier: %s inside nodes, %s between them",
               d.config.intraBits ? "quantized" : "exact",
               t.known && t.uniform ? algo_name(resolve_inter_algo(d.config.interAlgo, count, type,
                                                                   t.local_ranks, t.nodes))
                                    : algo_name(d.config.interAlgo));
    else
      snprintf(how, sizeof how, "%s", algo_name(algo));
    snprintf(kind, sizeof kind, "%s%s%s: compressed (%s)", short_type_name(type),
             reduces(call) ? " " : "",
             !reduces(call) ? "" : st.ops.count((int)op) ? "quantized-op" : op_name(op), how);
  } else {
    const std::array<int, 5> key = {(int)call, (int)type, (int)op, (int)d.reduction,
                                    (int)d.why};
    if (st.config.debug < qncclDebugTrace && !st.passes_reported.insert(key).second) return;
    char why[96];
    why_text(d, st.config, type, why, sizeof why);
    snprintf(kind, sizeof kind, "%s%s%s: passed through (%s)", short_type_name(type),
             reduces(call) ? " " : "", reduces(call) ? op_name(op) : "", why);
  }
  if (st.config.debug >= qncclDebugTrace)
    info(comm, st.config.debug, ": %s %zu values %s", call_name(call), count, kind);
  else if (!d.compress || st.logged.insert(std::string(call_name(call)) + kind).second)
    info(comm, st.config.debug, ": %s %s", call_name(call), kind);
}

/* A call measured auto times: its key's state and the candidate it tries. */
struct Trial {
  Tuning* tuning = nullptr;
  int index = -1;
  int device = -1;        // of the buffers (-1: host memory)
  bool timed = false;     // past the candidate's untimed trials
  std::chrono::steady_clock::time_point begin;
  void* start = nullptr;  // device buffers: the event recorded before it
};

/* The decision's INFO line: the candidates' agreed times. */
void report_decision(ncclComm_t comm, const ShimComm& st, qncclCollective_t kind,
                     ncclDataType_t type, int size_class, const Tuning& t) {
  char times[384] = "";
  size_t used = 0;
  for (size_t i = 0; i < t.candidates.size() && used < sizeof times; i++) {
    used += snprintf(times + used, sizeof times - used, "%s%s %.3f", i ? ", " : "",
                     candidate_name(t.candidates[i]), t.agreed.median[i] * 1e3);
    if (!t.stored && used < sizeof times)
      used += snprintf(times + used, sizeof times - used, " [%.3f, %.3f]",
                       t.agreed.floor[i] * 1e3, t.agreed.ceiling[i] * 1e3);
  }
  if (t.stored)
    info(comm, st.config.debug,
         ": measured auto: %s %s of %zu..%zu bytes per rank runs %s (QNCCL_TUNE_FILE, no "
         "trials; its times, ms: %s)",
         call_name(kind), short_type_name(type), (size_t)1 << size_class,
         ((size_t)2 << size_class) - 1, candidate_name(t.candidates[t.choice]), times);
  else
    info(comm, st.config.debug,
         ": measured auto: %s %s of %zu..%zu bytes per rank runs %s (the slowest rank's "
         "median trial [its fastest, the slowest of any rank], ms: %s; %zu trial calls)",
         call_name(kind), short_type_name(type), (size_t)1 << size_class,
         ((size_t)2 << size_class) - 1, candidate_name(t.candidates[t.choice]), times,
         (size_t)trial_calls(t));
}

/* QNCCL_TUNE_FILE's decisions for `comm`: this rank's file, read once, kept
 * only when every rank read the same decisions (the file may differ per node,
 * or be set on some ranks only: the agreement runs either way, so every rank
 * issues it). */
ncclResult_t read_stored_decisions(ncclComm_t comm, ShimComm& shim, CommState& st,
                                   const NcclApi& nccl, cudaStream_t stream, int device) {
  shim.tune_file_read = true;
  const char* path = env::get(env::Var::kTuneFile);
  TuneFileSnapshot snap = read_tune_file(path);
  bool same = false;
  QNCCL_CHECK(agree_equal(snap.hash, nccl, comm, stream, device, st, &same));
  if (same) {
    shim.tune_file = std::move(snap);
  } else {
    info(comm, shim.config.debug,
         ": measured auto: the ranks' QNCCL_TUNE_FILE decisions differ (this rank's: %s, %zu "
         "decisions): none used on this communicator, its trials run",
         path ? path : "unset", snap.decisions.size());
  }
  return ncclSuccess;
}

/* The stored decision of `key` when the file holds one for the same
 * candidates: `t` is decided without trials. */
void use_stored_decision(ncclComm_t comm, const ShimComm& shim, const std::string& key,
                         Tuning& t) {
  const auto found = shim.tune_file.decisions.find(key);
  if (found == shim.tune_file.decisions.end()) return;
  const StoredDecision& d = found->second;
  bool same = d.candidates.size() == t.candidates.size();
  for (size_t i = 0; same && i < d.candidates.size(); i++)
    same = d.candidates[i] == candidate_name(t.candidates[i]);
  if (!same) {  // every rank read the same file: all skip it alike
    info(comm, shim.config.debug, ": measured auto: QNCCL_TUNE_FILE's decision for '%s' names "
         "other candidates: not used", key.c_str());
    return;
  }
  t.choice = d.choice;
  t.agreed.median = d.seconds;
  t.stored = true;
}

/* Makes `d` run `candidate` of measured auto (a trial of it, or the choice). */
void run_candidate(int candidate, qncclCollective_t kind, bool trial, Decision& d) {
  if (candidate == kExactCandidate) {
    d.compress = false;
    d.why = trial ? Why::kTrialExact : Why::kExactFastest;
  } else if (reduces(kind)) {
    d.config.algo = (qncclAlgo_t)candidate;
  }
}

/* Where the call's buffers are (`device`, -1: host memory) and whether its
 * stream is being captured (device buffers only). */
ncclResult_t placement(qncclCollective_t kind, const void* send, size_t count,
                       cudaStream_t stream, int* device, bool* capturing) {
  *device = -1;
  *capturing = false;
#ifdef QNCCL_WITH_CUDA
  if (count > 0) QNCCL_CHECK(pointer_device(call_name(kind), send, device));
  if (*device >= 0)
    return prefix_error(stream_capturing(*device, stream, capturing), "%s", call_name(kind));
#else
  (void)kind, (void)send, (void)count, (void)stream;  // host memory, without CUDA
#endif
  return ncclSuccess;
}

/* Measured auto for an eligible call outside a group (d.measured): picks
 * what it runs, deciding first at its key's deciding call, and fills `trial`
 * for a trial. During a CUDA graph capture nothing is tried or counted: a
 * decision made before applies, else auto's rule. */
ncclResult_t tune(ncclComm_t comm, ShimComm& shim, CommState& st, const NcclApi& nccl,
                  qncclCollective_t kind, size_t count, ncclDataType_t type, cudaStream_t stream,
                  int device, bool capturing, int nranks, Decision& d, Trial* trial) {
  const int size = size_class(count * float_type_size(type));
  const TuneKey key{kind, type, size};
  if (capturing) {  // the decision made before, else the rule; nothing made or counted
    const auto made = shim.tuning.find(key);
    if (made == shim.tuning.end() || made->second.choice < 0) return ncclSuccess;
  } else if (nranks > 1) {
    if (!st.topology.known) {  // the tune file's keys name the layout
      int rank = 0;
      nccl.commUserRank(comm, &rank);
      QNCCL_CHECK(discover_topology(nccl, comm, rank, nranks, st));
    }
    if (!shim.tune_file_read)
      QNCCL_CHECK(read_stored_decisions(comm, shim, st, nccl, stream, device));
  }
  Tuning& t = shim.tuning[key];
  auto file_key = [&] {  // made only where used: at a key's first call and its decision
    // values every rank shares: an uneven layout (nodes 0) has no one local size
    const int local = st.topology.uniform ? st.topology.local_ranks : 0;
    return tune_file_key(kind, type, size, nranks, st.topology.nodes, local, device >= 0,
                         d.config);
  };
  if (t.candidates.empty()) {
    t.candidates = tune_candidates(kind, nranks, st.topology);
    if (t.candidates.size() > 1) use_stored_decision(comm, shim, file_key(), t);
    if (t.stored) report_decision(comm, shim, kind, type, size, t);
  }
  int index = t.choice;
  if (!capturing) {
    const TuneStep step = next_step(t);
    if (step.what == TuneStep::kDecide) {
      QNCCL_CHECK(decide(t, nccl, comm, stream, device, st));
      report_decision(comm, shim, kind, type, size, t);
      const char* path = env::get(env::Var::kTuneFile);
      if (path != nullptr && st.topology.local_rank == 0) {  // one writer per node
        StoredDecision stored;
        for (int c : t.candidates) stored.candidates.push_back(candidate_name(c));
        stored.choice = t.choice;
        stored.seconds = t.agreed.median;
        store_tune_decision(path, file_key(), stored);
      }
    }
    index = t.choice;
    if (step.what == TuneStep::kTrial) {
      index = step.index;
      *trial = Trial{&t, index, device, step.timed, std::chrono::steady_clock::now(), nullptr};
    }
  }
  run_candidate(t.candidates[index], kind, trial->tuning != nullptr, d);
  return ncclSuccess;
}

/* Starts the timing of a trial (device buffers: an event on its stream). */
ncclResult_t start_trial(Trial& trial, cudaStream_t stream) {
  if (!trial.timed) return ncclSuccess;
#ifdef QNCCL_WITH_CUDA
  if (trial.device >= 0) return timing_event(trial.device, stream, &trial.start);
#else
  (void)stream;
#endif
  trial.begin = std::chrono::steady_clock::now();
  return ncclSuccess;
}

/* Ends it after the call `res` answered. ncclInProgress is waited out
 * first (the answer stays ncclInProgress), untimed trials too: on host
 * buffers the call is then complete, on device buffers all of its work is
 * queued, and an event records its end, read at the deciding call. */
ncclResult_t end_trial(Trial& trial, ncclResult_t res, const NcclApi& nccl, ncclComm_t comm,
                       CommState& st, cudaStream_t stream) {
  if (res != ncclSuccess && res != ncclInProgress) return res;
  if (res == ncclInProgress) {
    const ncclResult_t ready = wait_until_ready(nccl, comm, st);
    if (ready != ncclSuccess) return fail(ready);
  }
  if (!trial.timed) return res;
#ifdef QNCCL_WITH_CUDA
  if (trial.device >= 0) {
    void* end = nullptr;
    const ncclResult_t recorded = timing_event(trial.device, stream, &end);
    if (recorded != ncclSuccess) return fail(recorded);
    trial.tuning->pending.push_back({trial.index, trial.start, end});
    return res;
  }
#else
  (void)stream;
#endif
  record_trial(*trial.tuning, trial.index,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - trial.begin)
                   .count());
  return res;
}

thread_local int group_depth = 0;
thread_local std::vector<CollectiveCall> deferred;
/* The group's quantized sends and receives: one call per communicator, run
 * after the group's collectives on it. */
thread_local std::vector<CollectiveCall> deferred_p2p;

/* The real NCCL's own call of `kind`. */
ncclResult_t pass_through(const NcclApi& nccl, qncclCollective_t kind, const void* send,
                          void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t stream) {
  switch (kind) {
    case qncclCollReduceScatter:
      return nccl.reduceScatter(send, recv, count, type, op, comm, stream);
    case qncclCollAllGather:
      return nccl.allGather(send, recv, count, type, comm, stream);
    case qncclCollAllToAll:
      if (nccl.alltoAll == nullptr) {  // NCCL before 2.28: the application's own NCCL has none
        set_error(ncclInvalidUsage, "ncclAlltoAll: %s has no ncclAlltoAll (NCCL 2.28 added it)",
                  nccl.path);
        return fail(ncclInvalidUsage);
      }
      return nccl.alltoAll(send, recv, count, type, comm, stream);
    default:
      return nccl.allReduce(send, recv, count, type, op, comm, stream);
  }
}

/* The interposer's and the engine's state of `comm` (made on first use). */
ncclResult_t states_of(ncclComm_t comm, std::shared_ptr<ShimComm>* shim,
                       std::shared_ptr<CommState>* state) {
  QNCCL_CHECK(shim_comm(comm, nullptr, shim));
  return comm_state(comm, &(*shim)->config, state);
}

/* A quantized call outside any group, run now; a failure is reported. */
ncclResult_t run_now(const CollectiveCall& call) {
  const ncclResult_t res = run_collectives({call});
  return res == ncclSuccess || res == ncclInProgress ? res : fail(res);
}

/* The checks of a quantized call of `kind`. */
ncclResult_t check_call(qncclCollective_t kind, const void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, const qncclAllReduceConfig_t& config,
                        ncclComm_t comm) {
  const char* fn = call_name(kind);
  switch (kind) {
    case qncclCollReduceScatter:
      return check_reduce_scatter(fn, send, recv, count, type, op, &config, comm);
    case qncclCollAllGather: return check_allgather(fn, send, recv, count, type, &config, comm);
    case qncclCollAllToAll: return check_alltoall(fn, send, recv, count, type, &config, comm);
    default: return check_allreduce(fn, send, recv, count, type, op, &config, comm);
  }
}

/* An interposed collective (`count`: the API's per-rank count; `op`: ncclSum
 * for an allgather or all-to-all). */
ncclResult_t collective(qncclCollective_t kind, const void* send, void* recv, size_t count,
                        ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                        cudaStream_t stream) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  if (comm == nullptr) return pass_through(*nccl, kind, send, recv, count, type, op, comm, stream);
  std::shared_ptr<ShimComm> shim;
  std::shared_ptr<CommState> st;
  if (states_of(comm, &shim, &st) != ncclSuccess) return fail(ncclInvalidArgument);
  Decision d = decide(*shim, kind, count, type, op);
  // On one rank nothing crosses a link: the policy's calls are exact, whatever the
  // algorithm (a quantized op is the application's own request, and keeps it). The
  // rank count is asked once the communicator is ready, and kept.
  int nranks = shim->nranks.load(std::memory_order_relaxed);
  if ((d.compress || d.measured) && (nranks != 1 || d.requested)) {
    if (const ncclResult_t res = comm_ready(comm, *shim, *st, *nccl); res != ncclSuccess)
      return fail(res);
    if (nranks == 0 && nccl->commCount(comm, &nranks) == ncclSuccess)
      shim->nranks.store(nranks, std::memory_order_relaxed);
  }
  if ((d.compress || d.measured) && !d.requested && nranks == 1) {
    d.compress = d.measured = false;
    d.why = Why::kOneRank;
  }
  if (nranks == 0) nranks = 1;  // not answered: QNCCL's own work finds out below
  if (d.compress &&
      check_call(kind, send, recv, count, type, d.reduction, d.config, comm) != ncclSuccess)
    return fail(ncclInvalidArgument);
  int device = -1;
  bool capturing = false;
  if (d.compress) {
    if (const ncclResult_t res = placement(kind, send, count, stream, &device, &capturing);
        res != ncclSuccess) {
      if (d.counted) shim->eligible_calls--;  // refused: a retry takes the same number
      return fail(res);
    }
  }
  if (d.compress && kind == qncclCollAllReduce) {
    // Outside a group and a capture the node layout can be found now (a
    // split of the communicator: an NCCL init), so the report names the
    // algorithm auto picks.
    const bool layout = d.config.algo == qncclAlgoAuto || d.config.algo == qncclAlgoHier;
    if (layout && group_depth == 0 && !capturing && !st->topology.known) {
      int rank = 0;
      nccl->commUserRank(comm, &rank);
      if (const ncclResult_t res = discover_topology(*nccl, comm, rank, nranks, *st);
          res != ncclSuccess)
        return fail(res);
    }
    // A hierarchical call on one node is exact (auto never picks it there);
    // inside a group the engine finds the layout and runs it exact itself.
    if (d.config.algo == qncclAlgoHier && st->topology.known && st->topology.nodes == 1) {
      d.compress = false;
      d.why = Why::kOneNode;
    }
  }
  Trial trial;
  if (d.measured && group_depth == 0) {
    if (const ncclResult_t res = tune(comm, *shim, *st, *nccl, kind, count, type, stream, device,
                                      capturing, nranks, d, &trial);
        res != ncclSuccess)
      return fail(res);
  } else if (d.measured) {
    // Inside a group: the decision made before, else auto's rule (nothing is tried).
    const auto made = shim->tuning.find(
        TuneKey{kind, type, size_class(count * float_type_size(type))});
    if (made != shim->tuning.end() && made->second.choice >= 0)
      run_candidate(made->second.candidates[made->second.choice], kind, false, d);
  }
  if (trial.tuning == nullptr || shim->config.debug >= qncclDebugTrace)
    report_kind(comm, *shim, *st, kind, type, op, d, count, *nccl);
  if (trial.tuning != nullptr && start_trial(trial, stream) != ncclSuccess)
    return fail(ncclUnhandledCudaError);
  ncclResult_t res;
  if (!d.compress) {
    st->stats.callsPassedThrough++;
    res = pass_through(*nccl, kind, send, recv, count, type, d.reduction, comm, stream);
  } else {
    const CollectiveCall call = {kind,     send, recv, count, type, d.reduction, d.config,
                                 comm,     stream, {}};
    if (group_depth > 0) {
      deferred.push_back(call);
      return ncclSuccess;
    }
    res = run_now(call);
  }
  return trial.tuning != nullptr ? end_trial(trial, res, *nccl, comm, *st, stream) : res;
}

/* An interposed ncclSend (`send`) or ncclRecv. Eligible ones are decided
 * from count, type and configuration alone, so both sides agree; one to or
 * from this rank itself crosses no link and goes to the real NCCL. */
ncclResult_t point_to_point(bool send, void* buffer, size_t count, ncclDataType_t type, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  auto real = [&] {
    return send ? nccl->send(buffer, count, type, peer, comm, stream)
                : nccl->recv(buffer, count, type, peer, comm, stream);
  };
  if (comm == nullptr) return real();
  std::shared_ptr<ShimComm> shim;
  std::shared_ptr<CommState> st;
  if (states_of(comm, &shim, &st) != ncclSuccess) return fail(ncclInvalidArgument);
  Decision d = decide(*shim, qncclCollSendRecv, count, type, ncclSum);
  int rank = -1, nranks = 0;
  if (d.compress) {
    if (const ncclResult_t res = comm_ready(comm, *shim, *st, *nccl); res != ncclSuccess)
      return fail(res);
    nccl->commUserRank(comm, &rank);
    nccl->commCount(comm, &nranks);
  }
  if (d.compress && peer == rank) {
    d.compress = false;
    d.why = Why::kSelf;
  }
  const char* fn = send ? "ncclSend" : "ncclRecv";
  if (d.compress) {
    if (peer < 0 || peer >= nranks) {
      set_error(ncclInvalidArgument, "%s: peer = %d; allowed: 0..%d", fn, peer, nranks - 1);
      return fail(ncclInvalidArgument);
    }
    if (check_gather_config(fn, count, type, &d.config) != ncclSuccess ||
        check_buffers(fn, buffer, 0, buffer, count * float_type_size(type), buffer, "itself") !=
            ncclSuccess)
      return fail(ncclInvalidArgument);
  }
  report_kind(comm, *shim, *st, qncclCollSendRecv, type, ncclSum, d, count, *nccl);
  if (!d.compress) {
    st->stats.callsPassedThrough++;
    return real();
  }
  const P2pOp op = {send, buffer, count, type, peer};
  if (group_depth == 0) {
    const CollectiveCall call = {qncclCollSendRecv, nullptr, nullptr, 0,    type,
                                 ncclSum,           d.config, comm,   stream, {op}};
    return run_now(call);
  }
  for (CollectiveCall& call : deferred_p2p) {
    if (call.comm != comm) continue;
    if (call.stream != stream || memcmp(&call.config, &d.config, sizeof d.config) != 0) {
      set_error(ncclInvalidUsage,
                "%s: the quantized sends and receives of one group on a communicator run as "
                "one call, on one stream with one configuration; this one's %s differs from "
                "the group's first: issue it in a group of its own",
                fn, call.stream != stream ? "stream" : "configuration");
      return fail(ncclInvalidUsage);
    }
    call.p2p.push_back(op);
    return ncclSuccess;
  }
  deferred_p2p.push_back(
      CollectiveCall{qncclCollSendRecv, nullptr, nullptr, 0, type, ncclSum, d.config, comm, stream,
                     {op}});
  return ncclSuccess;
}

}  // namespace

QNCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

QNCCL_EXPORT ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

QNCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}

QNCCL_EXPORT ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(false, recvbuff, count, datatype, peer, comm, stream);
}

QNCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  return collective(qncclCollAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

QNCCL_EXPORT ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  return collective(qncclCollAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

QNCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                            size_t recvcount, ncclDataType_t datatype,
                                            ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream) {
  return collective(qncclCollReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm,
                    stream);
}

QNCCL_EXPORT ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff,
                                             size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  return collective(qncclCollReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm,
                    stream);
}

QNCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  return collective(qncclCollAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, comm,
                    stream);
}

QNCCL_EXPORT ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream) {
  return collective(qncclCollAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, comm,
                    stream);
}

QNCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       cudaStream_t stream) {
  return collective(qncclCollAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, comm, stream);
}

QNCCL_EXPORT ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream) {
  return collective(qncclCollAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, comm, stream);
}

QNCCL_EXPORT ncclResult_t ncclGroupStart(void) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  const ncclResult_t res = nccl->groupStart();
  if (res == ncclSuccess) group_depth++;
  return res;
}

/* The real group end first: it flushes the group's pass-through calls. On a
 * nonblocking communicator it answers ncclInProgress; the deferred quantized
 * calls then wait until their communicators are ready (NCCL allows no call
 * before), run, and the answer stays ncclInProgress (ncclCommGetAsyncError
 * then reports ncclSuccess). Only a group that failed as a whole, where the
 * real NCCL ran none of it, drops its quantized calls too. */
QNCCL_EXPORT ncclResult_t ncclGroupEnd(void) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  const ncclResult_t end = nccl->groupEnd();
  if (group_depth > 0) group_depth--;
  if (group_depth > 0) return end;
  std::vector<CollectiveCall> calls;
  calls.swap(deferred);
  // Per communicator its collectives in issue order, then its sends and
  // receives: every rank issues the same collectives, so both orders agree.
  for (CollectiveCall& p2p : deferred_p2p) calls.push_back(std::move(p2p));
  deferred_p2p.clear();
  if (calls.empty() || (end != ncclSuccess && end != ncclInProgress)) return end;
  if (end == ncclInProgress) {
    for (const CollectiveCall& call : calls) {
      std::shared_ptr<CommState> st;
      if (comm_state(call.comm, nullptr, &st) != ncclSuccess) return fail(ncclInvalidArgument);
      const ncclResult_t ready = wait_until_ready(*nccl, call.comm, *st);
      if (ready != ncclSuccess) return fail(ready);
    }
  }
  const ncclResult_t res = run_collectives(calls);
  if (res != ncclSuccess && res != ncclInProgress) return fail(res);
  return end == ncclInProgress ? ncclInProgress : res;
}
