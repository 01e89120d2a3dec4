/* Communicator entry points libqnccl.so exports: each reads the QNCCL_*
 * configuration before the real NCCL makes the communicator (a bad value
 * fails the creation), and drops QNCCL's state when it ends. */
#include "common/error.h"
#include "config/config.h"
#include "engine/nccl_api.h"
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
  if (res == ncclSuccess)
    for (int i = 0; i < n; i++) adopt_comm(comms[i], config);
  return res;
}

void report_stats(ncclComm_t comm) {
  CommState* state;
  if (comm == nullptr || comm_state(comm, nullptr, &state) != ncclSuccess) return;
  const qncclStats_t s = comm_stats(*state);
  info(comm, *state,
       ": compressed=%llu passed_through=%llu bytes_in=%llu bytes_on_wire=%llu "
       "residual_buffers=%llu residual_bytes=%llu",
       (unsigned long long)s.callsCompressed, (unsigned long long)s.callsPassedThrough,
       (unsigned long long)s.bytesIn, (unsigned long long)s.bytesOnWire,
       (unsigned long long)s.residualBuffers, (unsigned long long)s.residualBytes);
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
  report_stats(comm);
  forget_comm(comm);
  return nccl->commDestroy(comm);
}

QNCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  report_stats(comm);
  // Abort first: forgetting frees device memory, which waits for the
  // device, and the work of an aborted communicator may never finish.
  const ncclResult_t res = nccl->commAbort(comm);
  forget_comm(comm);
  return res;
}
