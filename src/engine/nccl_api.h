/* The real NCCL, as the engine sees it: the point-to-point calls it moves
 * bytes with, resolved with dlsym on the library's own handle so that
 * QNCCL's interposed entry points are never called back. */
#ifndef QNCCL_ENGINE_NCCL_API_H_
#define QNCCL_ENGINE_NCCL_API_H_

#include "nccl_abi.h"

namespace qnccl {

struct NcclApi {
  ncclResult_t (*groupStart)(void);
  ncclResult_t (*groupEnd)(void);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*commCount)(const ncclComm_t, int*);
  ncclResult_t (*commUserRank)(const ncclComm_t, int*);
  ncclResult_t (*commDestroy)(ncclComm_t);
  ncclResult_t (*commAbort)(ncclComm_t);
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*getLastError)(ncclComm_t);
  // The collectives of the hierarchical allreduce's exact stage inside a node.
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                         ncclComm_t, cudaStream_t);
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  // Entry points libqnccl.so interposes and forwards (src/shim/).
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*alltoAll)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                           cudaStream_t);  // nullptr before NCCL 2.28
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*commInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  ncclResult_t (*commInitAll)(ncclComm_t*, int, const int*);
  ncclResult_t (*commSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);
  ncclResult_t (*redOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t,
                                       ncclComm_t);
  ncclResult_t (*redOpDestroy)(ncclRedOp_t, ncclComm_t);
  ncclResult_t (*commCuDevice)(const ncclComm_t, int*);
  ncclResult_t (*commRevoke)(ncclComm_t, int);  // nullptr before NCCL 2.28.7
  char path[512];  // the file it was loaded from
};

/* The NCCL library QNCCL talks to, found once: a libnccl.so.2 already loaded
 * in the process, else QNCCL_NCCL_LIB, else libnccl.so.2 from the library
 * path. Fails with a message saying where it looked. */
ncclResult_t real_nccl(const NcclApi** api);

/* real_nccl, then `comm`'s size and this process's rank in it; fails, naming
 * `what` (the caller), when comm is not a communicator of that library. */
ncclResult_t comm_shape(const char* what, ncclComm_t comm, const NcclApi** api, int* nranks,
                        int* rank);

}  // namespace qnccl

#endif
