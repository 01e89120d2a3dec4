/* Quantized reduction ops: ncclRedOp_t values that make an ncclAllReduce
 * quantize with their own configuration. Each value is one the real NCCL
 * handed out for this communicator (a float32 PreMulSum by 1, or by 1/nranks
 * for an average), so it can equal no other op of the communicator: the
 * shim recognizes quantized ops by exact value and passes every other value,
 * whatever its range, to the real NCCL untouched. A quantized op that
 * reaches the real NCCL (an allreduce passed through, a reduce-scatter,
 * ncclReduce) goes as the exact ncclSum or ncclAvg it stands for, on any
 * type. */
#include "common/error.h"
#include "engine/engine.h"
#include "engine/nccl_api.h"
#include "shim/shim.h"

using namespace qnccl;

ncclResult_t qnccl::create_quantized_op(const char* fn, ncclRedOp_t* op,
                                        const qncclQuantizedOpConfig_t* config, ncclComm_t comm) {
  if (op == nullptr || config == nullptr || comm == nullptr)
    return set_error(ncclInvalidArgument, "%s: %s is NULL", fn,
                     op == nullptr ? "op" : config == nullptr ? "config" : "comm");
  // The checks of an allreduce of one float32 value on a stand-in buffer.
  const float probe = 0;
  QNCCL_CHECK(check_allreduce(fn, &probe, (void*)&probe, 1, ncclFloat32, config->reduction,
                              &config->allreduce, comm));
  const NcclApi* nccl;
  QNCCL_CHECK(real_nccl(&nccl));
  int nranks = 0;
  if (nccl->commCount(comm, &nranks) != ncclSuccess)
    return set_error(ncclInvalidArgument, "%s: comm is not a communicator of %s", fn, nccl->path);
  std::shared_ptr<ShimComm> st;
  QNCCL_CHECK(shim_comm(comm, nullptr, &st));
  // Outside ncclAllReduce the op stays what the real NCCL made: an exact sum or average.
  float scalar = config->reduction == ncclAvg ? 1.0f / (float)nranks : 1.0f;
  ncclRedOp_t value;
  if (ncclResult_t res = nccl->redOpCreatePreMulSum(&value, &scalar, ncclFloat32,
                                                    ncclScalarHostImmediate, comm);
      res != ncclSuccess)
    return set_error(res, "%s: %s's ncclRedOpCreatePreMulSum, which gives the op its value, "
                     "failed (%d)", fn, nccl->path, (int)res);
  st->ops[(int)value] = *config;
  *op = value;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  std::shared_ptr<ShimComm> st;
  if (comm != nullptr && shim_comm(comm, nullptr, &st) == ncclSuccess) st->ops.erase((int)op);
  return nccl->redOpDestroy(op, comm);  // frees the PreMulSum behind a quantized op too
}

namespace {

/* The reduction a call outside ncclAllReduce passes to the real NCCL: a
 * quantized op of `comm` becomes the exact sum or average it stands for (the
 * float32 PreMulSum behind it would fail on other types there), any other
 * value stays. */
ncclRedOp_t exact_op(ncclComm_t comm, ncclRedOp_t op) {
  std::shared_ptr<ShimComm> st;
  if (comm == nullptr || shim_comm(comm, nullptr, &st) != ncclSuccess) return op;
  const auto quantized = st->ops.find((int)op);
  return quantized == st->ops.end() ? op : quantized->second.reduction;
}

ncclResult_t reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const NcclApi* nccl;
  if (real_nccl(&nccl) != ncclSuccess) return fail(ncclSystemError);
  return nccl->reduce(sendbuff, recvbuff, count, datatype, exact_op(comm, op), root, comm, stream);
}

}  // namespace

QNCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     ncclDataType_t datatype, ncclRedOp_t op, int root,
                                     ncclComm_t comm, cudaStream_t stream) {
  return reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

QNCCL_EXPORT ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, int root,
                                      ncclComm_t comm, cudaStream_t stream) {
  return reduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
