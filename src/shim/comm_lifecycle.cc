/* NCCL entry points libqnccl.so exports to follow communicators: they drop
 * QNCCL's state of a communicator that ends, then call the real NCCL. */
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/nccl_api.h"

using namespace qnccl;

QNCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const NcclApi* nccl;
  QNCCL_CHECK(real_nccl(&nccl));
  forget_comm(comm);
  return nccl->commDestroy(comm);
}

QNCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const NcclApi* nccl;
  QNCCL_CHECK(real_nccl(&nccl));
  forget_comm(comm);
  return nccl->commAbort(comm);
}
