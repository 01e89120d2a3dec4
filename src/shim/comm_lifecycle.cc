/* Communicator entry points libqnccl.so exports: each reads the QNCCL_*
 * configuration before the real NCCL makes the communicator (a bad value
 * fails the creation), and drops QNCCL's state when it ends. */
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

/* Destroy and abort may come from another thread (PyTorch's watchdog) while
 * a quantized call runs on the communicator: the call sees `aborted` at its
 * next step and ends with an error; taking `api` waits for it to leave the
 * real NCCL (a call there returns promptly), so nothing of QNCCL uses the
 * communicator once the real NCCL tears it down. */
ncclResult_t release(const NcclApi& nccl, ncclComm_t comm, bool abort) {
  report_stats(comm);
  if (std::shared_ptr<CommState> state = existing_comm_state(comm)) {
    state->aborted = true;
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
  if (res != ncclSuccess || asyncError == nullptr || !any_comm_failed()) return res;
  std::shared_ptr<CommState> state = existing_comm_state(comm);
  if (state != nullptr && state->failure != ncclSuccess &&
      (*asyncError == ncclSuccess || *asyncError == ncclInProgress))
    *asyncError = state->failure;
  return ncclSuccess;
}
