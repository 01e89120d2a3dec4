/* Communicator entry points libqnccl.so exports: each reads the QNCCL_*
 * configuration before the real NCCL makes the communicator (a bad value
 * fails the creation), and drops QNCCL's state when it ends. */
#include <chrono>
#include <thread>

#include "common/error.h"
#include "config/config.h"
#include "engine/comm_state.h"
#include "engine/nccl_api.h"
#include "engine/report.h"
#include "shim/shim.h"

using namespace qnccl;

namespace {

/* The real NCCL and the environment's configuration, or the failure. */
ncclResult_t prepare(const NcclApi** nccl, qncclEnvConfig_t* config) {
  if (real_nccl(nccl) != ncclSuccess) return fail(ncclSystemError);
  if (config_from_env(config) != ncclSuccess) return fail(ncclInvalidArgument);
  return ncclSuccess;
}

ncclResult_t finish_init(ncclResult_t res, const ncclComm_t* comms, int n,
                         const qncclEnvConfig_t& config) {
  // A nonblocking creation's handle is valid at once, but answers no query
  // until it is ready (a split's child may appear only later: it is adopted
  // at its first call, from the environment).
  if (res == ncclSuccess || res == ncclInProgress)
    for (int i = 0; i < n; i++) adopt_comm(comms[i], config);
  return res;
}

void report_stats(ncclComm_t comm) {
  const std::shared_ptr<CommState> state = existing_comm_state(comm);
  if (state == nullptr) return;
  const qncclStats_t s = comm_stats(*state);
  info(comm, state->debug,
       ": compressed=%llu passed_through=%llu bytes_in=%llu bytes_on_wire=%llu "
       "residual_buffers=%llu residual_bytes=%llu compute_steps=%llu groups=%llu",
       (unsigned long long)s.callsCompressed, (unsigned long long)s.callsPassedThrough,
       (unsigned long long)s.bytesIn, (unsigned long long)s.bytesOnWire,
       (unsigned long long)s.residualBuffers, (unsigned long long)s.residualBytes,
       (unsigned long long)s.computeSteps, (unsigned long long)s.groups);
}

/* How long an abort or destroy waits for QNCCL's uses of the communicator on
 * other threads to end (a group's ncclGroupEnd, a split, an agreement): on
 * their own at first, then (an abort, where the real NCCL has ncclCommRevoke)
 * after stopping them. */
constexpr auto kGroupGrace = std::chrono::milliseconds(100);
constexpr auto kGroupWait = std::chrono::seconds(10);

/* Waits until QNCCL holds the communicator of `state` (or its node layout's)
 * nowhere (CommState::holds), so the real NCCL never frees one under a group,
 * split or agreement of QNCCL's: NCCL does not guard them against an abort
 * from another thread (they would use the freed communicator). One stuck (a
 * peer gone while NCCL waits for it) is stopped with ncclCommRevoke, which
 * frees nothing; before NCCL 2.28.7, after kGroupWait the abort goes on
 * regardless, as NCCL's own would. Not under `api`: the holder's thread may
 * still be posting (each post refuses, as `aborted` is set) before its end. */
void quiesce(const NcclApi& nccl, ncclComm_t comm, CommState& state, bool abort) {
  using Clock = std::chrono::steady_clock;
  const auto wait_until = [&](Clock::time_point end) {
    while (state.holds > 0 && Clock::now() < end)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    return state.holds == 0;
  };
  const Clock::time_point start = Clock::now();
  if (wait_until(start + kGroupGrace)) return;
  if (abort && nccl.commRevoke != nullptr) {
    ncclComm_t layout[2];
    {
      std::lock_guard<std::mutex> lock(state.api);  // where the layout's are published
      layout[0] = state.topology.cross;
      layout[1] = state.topology.local;
    }
    for (ncclComm_t c : {comm, layout[0], layout[1]}) {
      if (c == nullptr || nccl.commRevoke(c, NCCL_REVOKE_DEFAULT) != ncclInProgress) continue;
      ncclResult_t now = ncclInProgress;  // a nonblocking communicator's revoke: until quiescent
      while (now == ncclInProgress && Clock::now() < start + kGroupWait &&
             nccl.commGetAsyncError(c, &now) == ncclSuccess)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (wait_until(start + kGroupWait)) return;
  warn("%s(%p): a quantized call on another thread still waits in the real NCCL (a group "
       "end, a split) after %lld s%s; %s goes on: the real NCCL may free the communicator "
       "under it",
       abort ? "ncclCommAbort" : "ncclCommDestroy", (void*)comm, (long long)kGroupWait.count(),
       abort && nccl.commRevoke == nullptr ? " (this NCCL has no ncclCommRevoke to stop it: "
       "2.28.7 and later have)" : "", abort ? "the abort" : "the destroy");
}

/* Destroy and abort may come from another thread (PyTorch's watchdog) while
 * a quantized call runs on the communicator: the call sees `aborted` at its
 * next step and ends with an error; taking `api` waits for it to leave the
 * real NCCL, and quiesce() for its group to end, so nothing of QNCCL uses the
 * communicator once the real NCCL tears it down. */
ncclResult_t release(const NcclApi& nccl, ncclComm_t comm, bool abort) {
  report_stats(comm);
  if (std::shared_ptr<CommState> state = existing_comm_state(comm)) {
    state->aborted = true;  // no group opens from now on
    { std::lock_guard<std::mutex> lock(state->api); }  // a post under way has counted its group
    quiesce(nccl, comm, *state, abort);
    std::lock_guard<std::mutex> lock(state->api);
    end_topology(nccl, *state, abort);  // the hierarchical allreduce's communicators
  }
  ncclResult_t (*real)(ncclComm_t) = abort ? nccl.commAbort : nccl.commDestroy;
  const ncclResult_t res = real(comm);
  forget_shim_comm(comm);
  forget_comm(comm);  // device memory goes with the last reference to the state
  return res;
}

}  // namespace

namespace qnccl {

ncclResult_t forget_ended_comm(const char* fn, ncclComm_t comm) {
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  const std::shared_ptr<CommState> state = existing_comm_state(comm);
  if (state != nullptr) {
    state->aborted = true;  // a call on another thread stops at its next step
    std::lock_guard<std::mutex> lock(state->api);
    const NcclApi* nccl;
    if (real_nccl(&nccl) == ncclSuccess) end_topology(*nccl, *state, true);
  }
  const bool shim = forget_shim_comm(comm);
  forget_comm(comm);
  if (state == nullptr && !shim)
    return set_error(ncclInvalidArgument, "%s: libqnccl holds nothing for comm %p (never used "
                     "with it, or forgotten, destroyed or aborted through libqnccl already)",
                     fn, (void*)comm);
  return ncclSuccess;
}

}  // namespace qnccl

QNCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                           int rank) {
  const NcclApi* nccl;
  qncclEnvConfig_t config;
  QNCCL_CHECK(prepare(&nccl, &config));
  return finish_init(nccl->commInitRank(comm, nranks, id, rank), comm, 1, config);
}

QNCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                 int rank, ncclConfig_t* ncclConfig) {
  const NcclApi* nccl;
  qncclEnvConfig_t config;
  QNCCL_CHECK(prepare(&nccl, &config));
  return finish_init(nccl->commInitRankConfig(comm, nranks, id, rank, ncclConfig), comm, 1,
                     config);
}

QNCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const NcclApi* nccl;
  qncclEnvConfig_t config;
  QNCCL_CHECK(prepare(&nccl, &config));
  return finish_init(nccl->commInitAll(comms, ndev, devlist), comms, ndev, config);
}

QNCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t* ncclConfig) {
  const NcclApi* nccl;
  qncclEnvConfig_t config;
  QNCCL_CHECK(prepare(&nccl, &config));
  return finish_init(nccl->commSplit(comm, color, key, newcomm, ncclConfig), newcomm, 1, config);
}


QNCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  return release(*nccl, comm, false);
}

QNCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  return release(*nccl, comm, true);
}

/* The real NCCL's answer, unless a quantized call failed on the communicator:
 * then that failure, so a framework polling here (PyTorch's watchdog) learns
 * of it and aborts the communicator. From any thread. The real NCCL's own
 * calls of ncclCommGetAsyncError (it checks each operation's communicator
 * with it) reach this one too, as libnccl.so.2 calls its exported API
 * functions through the PLT: so once a quantized call failed, NCCL's own
 * operations on that communicator fail with the same error, which is right
 * (its peers are out of step: it must be aborted); until any quantized call
 * failed the answer costs one atomic load more than NCCL's (docs/allreduce.md,
 * "Nonblocking communicators, abort and failures"). */
QNCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  const ncclResult_t res = nccl->commGetAsyncError(comm, asyncError);
  if (res != ncclSuccess) {  // the library's reason, as qncclGetLastError's too
    const char* why = nccl->getLastError(nullptr);
    return set_error(res, "%s", why != nullptr && why[0] != '\0' ? why : "ncclCommGetAsyncError "
                     "refused the communicator");
  }
  if (asyncError == nullptr || !any_comm_failed()) return res;
  std::shared_ptr<CommState> state = existing_comm_state(comm);
  if (state != nullptr && state->failure != ncclSuccess &&
      (*asyncError == ncclSuccess || *asyncError == ncclInProgress))
    *asyncError = state->failure;
  return ncclSuccess;
}
