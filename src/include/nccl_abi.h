/*
 * QNCCL's own declarations of the NCCL ABI.
 *
 * QNCCL interposes on NVIDIA's libnccl.so.2 and also provides a host (MPI)
 * implementation of the same ABI, so it must agree with NVIDIA's types, enum
 * values, struct layouts and function signatures exactly, without needing the
 * CUDA or NCCL headers to build. This header states those facts in one place;
 * tests/test_abi.py compiles it beside the real nccl.h of the nvidia-nccl-cu13
 * wheel and compares every value, size, offset and signature.
 *
 * Reference release: NCCL 2.32 (ncclConfig_t as of its v23100 layout).
 *
 * A program may include NVIDIA's <nccl.h> first and then qnccl.h (which
 * includes this header): NVIDIA's declarations of the same ABI then stand
 * for ours, and everything below its include guard NCCL_H_ is left out,
 * cudaStream_t too (nccl.h has the CUDA runtime's). Only the QNCCL_* macros,
 * which nccl.h lacks, are defined either way. Included the other way round,
 * the two headers clash.
 */
#ifndef QNCCL_NCCL_ABI_H_
#define QNCCL_NCCL_ABI_H_

#ifndef QNCCL_CDEF /* cffi's cdef parser knows these types itself */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#endif

#define QNCCL_ABI_NCCL_MAJOR 2
#define QNCCL_ABI_NCCL_MINOR 32
/* NCCL's version code: major*10000 + minor*100 + patch (2.9 and later). */
#define QNCCL_NCCL_VERSION_CODE(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))

#ifndef NCCL_H_ /* NVIDIA's nccl.h was not included first */

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA runtime's stream handle; identical to its own typedef (C11 and
 * C++ accept the repetition when cuda_runtime.h comes too). */
typedef struct CUstream_st* cudaStream_t;

typedef struct ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* ncclRedOp_t must stay the size of a plain enum: NCCL computes its largest
 * value from the size of this helper enum. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5, /* first value of ops created at run time (PreMulSum, ...) */
#ifdef QNCCL_CDEF /* cffi evaluates no sizeof; the enum is 4 bytes on every ABI NCCL supports */
  ncclMaxRedOp = 0x7fffffff
#else
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
#endif
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Communicator configuration; callers fill it from NCCL_CONFIG_INITIALIZER. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_API_MAGIC 0xcafebeef
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_REVOKE_DEFAULT 0x00  /* ncclCommRevoke's only flag value (NCCL 2.28.7) */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

/* Entry points QNCCL implements (host backend), intercepts (libqnccl.so) or
 * calls (the engine). Each has a profiling twin "pnccl..." in NCCL. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */

#endif /* QNCCL_NCCL_ABI_H_ */
