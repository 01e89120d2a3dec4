/* Quantized reduction ops: ncclRedOp_t values (from kFirstQuantizedOp up)
 * that make an ncclAllReduce quantize with their own configuration. */
#include "common/error.h"
#include "engine/engine.h"
#include "engine/nccl_api.h"
#include "shim/shim.h"

using namespace qnccl;

QNCCL_EXPORT ncclResult_t qncclRedOpCreateQuantized(ncclRedOp_t* op,
                                                    const qncclQuantizedOpConfig_t* config,
                                                    ncclComm_t comm) {
  const char* fn = "qncclRedOpCreateQuantized";
  if (op == nullptr || config == nullptr || comm == nullptr)
    return set_error(ncclInvalidArgument, "%s: %s is NULL", fn,
                     op == nullptr ? "op" : config == nullptr ? "config" : "comm");
  // The checks of an allreduce of one float32 value on a stand-in buffer.
  const float probe = 0;
  QNCCL_CHECK(check_allreduce(fn, &probe, (void*)&probe, 1, ncclFloat32, config->reduction,
                              &config->allreduce, comm));
  CommState* st;
  QNCCL_CHECK(comm_state(comm, nullptr, &st));
  int value = kFirstQuantizedOp;
  while (st->ops.count(value)) value++;
  st->ops[value] = *config;
  *op = (ncclRedOp_t)value;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  CommState* st;
  if (comm != nullptr && (int)op >= kFirstQuantizedOp &&
      comm_state(comm, nullptr, &st) == ncclSuccess && st->ops.erase((int)op) == 1)
    return ncclSuccess;
  return nccl->redOpDestroy(op, comm);
}
