/*
 * A deliberately wrong ncclAllReduce, for proving that all_reduce_perf's
 * check catches bad results (tests/test_perf.py). Preloaded in front of the
 * real one (libqnccl.so's or the NCCL library's), it forwards every call,
 * then damages the result of float32 calls in host memory as FAULTY_NCCL says:
 *
 *   disagree:R   rank R flips the lowest bit of element 0: ranks no longer
 *                agree bit for bit, while the error stays tiny
 *   offset:X     every rank adds X to element count/2: ranks agree, so only
 *                the error bound can catch it
 *   send         every rank changes element 0 of the send buffer of an
 *                out-of-place call
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef ncclResult_t (*AllReduceFn)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                    ncclComm_t, cudaStream_t);
typedef ncclResult_t (*UserRankFn)(const ncclComm_t, int*);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  AllReduceFn next = (AllReduceFn)dlsym(RTLD_NEXT, "ncclAllReduce");
  UserRankFn user_rank = (UserRankFn)dlsym(RTLD_DEFAULT, "ncclCommUserRank");
  if (!next || !user_rank) {
    fprintf(stderr, "faulty_nccl: no ncclAllReduce/ncclCommUserRank to forward to\n");
    return ncclSystemError;
  }
  ncclResult_t result = next(sendbuff, recvbuff, count, datatype, op, comm, stream);
  const char* fault = getenv("FAULTY_NCCL");
  if (result != ncclSuccess || !fault || datatype != ncclFloat32 || count == 0) return result;
  int rank = -1;
  user_rank(comm, &rank);
  float* out = (float*)recvbuff;
  if (strncmp(fault, "disagree:", 9) == 0 && rank == atoi(fault + 9)) {
    uint32_t bits;
    memcpy(&bits, &out[0], sizeof bits);
    bits ^= 1u;
    memcpy(&out[0], &bits, sizeof bits);
  } else if (strncmp(fault, "offset:", 7) == 0) {
    out[count / 2] += (float)atof(fault + 7);
  } else if (strcmp(fault, "send") == 0 && sendbuff != recvbuff) {
    ((float*)sendbuff)[0] += 1.0f;
  }
  return result;
}
