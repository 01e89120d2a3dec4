/* libqnccl.so's own C API (src/include/qnccl.h): every exported qncclXxx
 * entry point, each a thin call into the layer that implements it (codec,
 * config, engine, shim). The NCCL entry points the interposer exports are in
 * src/shim/. */
#include "codec/codec.h"
#include "common/error.h"
#include "config/config.h"
#include "engine/comm_state.h"
#include "engine/engine.h"
#include "engine/topology.h"
#include "shim/shim.h"

using namespace qnccl;

// ---- library -------------------------------------------------------------------------

QNCCL_EXPORT const char* qncclGetLastError(void) { return last_error(); }

QNCCL_EXPORT ncclResult_t qncclGetVersion(int* version) {
  if (version == nullptr)
    return set_error(ncclInvalidArgument, "qncclGetVersion: version is NULL; pass an int*");
  *version = QNCCL_VERSION_CODE;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t qncclCudaCompiled(int* compiled) {
  if (compiled == nullptr)
    return set_error(ncclInvalidArgument, "qncclCudaCompiled: compiled is NULL; pass an int*");
#ifdef QNCCL_WITH_CUDA
  *compiled = 1;
#else
  *compiled = 0;
#endif
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t qncclCudaInfo(qncclCudaInfo_t* info) {
  return cuda_info("qncclCudaInfo", info);
}

QNCCL_EXPORT ncclResult_t qncclConfigFromEnv(qncclEnvConfig_t* config) {
  if (config == nullptr)
    return set_error(ncclInvalidArgument,
                     "qncclConfigFromEnv: config is NULL; pass a qncclEnvConfig_t*");
  return config_from_env(config);
}

// ---- codec ---------------------------------------------------------------------------

QNCCL_EXPORT ncclResult_t qncclHostCodecIsa(const char** isa) {
  return host_codec_isa("qncclHostCodecIsa", isa);
}

QNCCL_EXPORT ncclResult_t qncclCompressedSize(size_t count, const qncclCodecConfig_t* config,
                                              size_t* bytes) {
  return codec_compressed_size("qncclCompressedSize", count, config, bytes);
}

QNCCL_EXPORT ncclResult_t qncclQuantize(const void* src, size_t count, ncclDataType_t datatype,
                                        const qncclCodecConfig_t* config, uint64_t randomStream,
                                        void* dst, size_t dstBytes, cudaStream_t stream) {
  return codec_quantize("qncclQuantize", src, count, datatype, config, randomStream, dst,
                        dstBytes, stream);
}

QNCCL_EXPORT ncclResult_t qncclDequantize(const void* src, size_t srcBytes, size_t count,
                                          const qncclCodecConfig_t* config, void* dst,
                                          ncclDataType_t datatype, cudaStream_t stream) {
  return codec_dequantize("qncclDequantize", src, srcBytes, count, config, dst, datatype, stream,
                          false);
}

QNCCL_EXPORT ncclResult_t qncclDequantizeAccumulate(const void* src, size_t srcBytes, size_t count,
                                                    const qncclCodecConfig_t* config, void* acc,
                                                    ncclDataType_t datatype, cudaStream_t stream) {
  return codec_dequantize("qncclDequantizeAccumulate", src, srcBytes, count, config, acc,
                          datatype, stream, true);
}

QNCCL_EXPORT ncclResult_t qncclRotate(const void* src, size_t count, ncclDataType_t datatype,
                                      const qncclCodecConfig_t* config, float* dst,
                                      cudaStream_t stream) {
  return codec_rotate("qncclRotate", src, count, datatype, config, dst, stream);
}

QNCCL_EXPORT ncclResult_t qncclUnrotate(const float* src, size_t count,
                                        const qncclCodecConfig_t* config, void* dst,
                                        ncclDataType_t datatype, cudaStream_t stream) {
  return codec_unrotate("qncclUnrotate", src, count, config, dst, datatype, stream);
}

// ---- allreduce -----------------------------------------------------------------------

QNCCL_EXPORT ncclResult_t qncclAutoAlgo(size_t count, ncclDataType_t datatype, int nranks,
                                        qncclAlgo_t* algo) {
  return choose_algo("qncclAutoAlgo", count, datatype, nranks, algo);
}

QNCCL_EXPORT ncclResult_t qncclAllReduceWorkspaceSize(size_t count, ncclDataType_t datatype,
                                                      const qncclAllReduceConfig_t* config,
                                                      int nranks, size_t* bytes) {
  return allreduce_workspace_size("qncclAllReduceWorkspaceSize", count, datatype, config, nranks,
                                  bytes);
}

QNCCL_EXPORT ncclResult_t qncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op,
                                         const qncclAllReduceConfig_t* config, ncclComm_t comm,
                                         cudaStream_t stream) {
  return allreduce("qncclAllReduce", sendbuff, recvbuff, count, datatype, op, config, comm,
                   stream);
}

QNCCL_EXPORT ncclResult_t qncclReduceScatter(const void* sendbuff, void* recvbuff,
                                             size_t recvcount, ncclDataType_t datatype,
                                             ncclRedOp_t op,
                                             const qncclAllReduceConfig_t* config,
                                             ncclComm_t comm, cudaStream_t stream) {
  return reduce_scatter("qncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, config,
                        comm, stream);
}

QNCCL_EXPORT ncclResult_t qncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype,
                                         const qncclAllReduceConfig_t* config, ncclComm_t comm,
                                         cudaStream_t stream) {
  return allgather("qncclAllGather", sendbuff, recvbuff, sendcount, datatype, config, comm,
                   stream);
}

QNCCL_EXPORT ncclResult_t qncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype,
                                        const qncclAllReduceConfig_t* config, ncclComm_t comm,
                                        cudaStream_t stream) {
  return alltoall("qncclAlltoAll", sendbuff, recvbuff, count, datatype, config, comm, stream);
}

QNCCL_EXPORT ncclResult_t qncclAllReduceErrorBound(size_t count, ncclDataType_t datatype,
                                                   ncclRedOp_t op,
                                                   const qncclAllReduceConfig_t* config,
                                                   int nranks, double inputAbsMax, double* bound) {
  return allreduce_error_bound("qncclAllReduceErrorBound", count, datatype, op, config, nranks,
                               inputAbsMax, bound);
}

QNCCL_EXPORT ncclResult_t qncclCollectiveErrorBound(qncclCollective_t collective, size_t count,
                                                    ncclDataType_t datatype, ncclRedOp_t op,
                                                    const qncclAllReduceConfig_t* config,
                                                    int nranks, double inputAbsMax,
                                                    double* bound) {
  return collective_error_bound("qncclCollectiveErrorBound", collective, count, datatype, op,
                                config, nranks, inputAbsMax, bound);
}

QNCCL_EXPORT ncclResult_t qncclCommTopology(ncclComm_t comm, qncclTopology_t* topology) {
  return comm_topology("qncclCommTopology", comm, topology);
}

QNCCL_EXPORT ncclResult_t qncclCommGetStats(ncclComm_t comm, qncclStats_t* stats) {
  return get_stats("qncclCommGetStats", comm, stats);
}

QNCCL_EXPORT ncclResult_t qncclCommGetTuning(ncclComm_t comm, qncclTuning_t* table, int capacity,
                                             int* count) {
  return get_tuning("qncclCommGetTuning", comm, table, capacity, count);
}

QNCCL_EXPORT ncclResult_t qncclCommForget(ncclComm_t comm) {
  return forget_ended_comm("qncclCommForget", comm);
}

// ---- error feedback ------------------------------------------------------------------

QNCCL_EXPORT ncclResult_t qncclCommResetErrorFeedback(ncclComm_t comm) {
  return reset_error_feedback("qncclCommResetErrorFeedback", comm);
}

QNCCL_EXPORT ncclResult_t qncclResetErrorFeedback(void) {
  reset_all_error_feedback();
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t qncclCommGetResidual(ncclComm_t comm, const void* sendbuff,
                                               size_t count, ncclDataType_t datatype,
                                               float* residual) {
  return get_residual("qncclCommGetResidual", comm, sendbuff, count, datatype, residual);
}

// ---- random streams ------------------------------------------------------------------

QNCCL_EXPORT ncclResult_t qncclCommGetCallCounts(ncclComm_t comm, uint64_t* calls,
                                                 uint64_t* p2pCalls) {
  return get_call_counts("qncclCommGetCallCounts", comm, calls, p2pCalls);
}

QNCCL_EXPORT ncclResult_t qncclCommSetCallCounts(ncclComm_t comm, uint64_t calls,
                                                 uint64_t p2pCalls) {
  return set_call_counts("qncclCommSetCallCounts", comm, calls, p2pCalls);
}

// ---- quantized ops -------------------------------------------------------------------

QNCCL_EXPORT ncclResult_t qncclCommSetQuantization(ncclComm_t comm, unsigned collectives,
                                                   int bits) {
  return set_comm_quantization("qncclCommSetQuantization", comm, collectives, bits);
}

QNCCL_EXPORT ncclResult_t qncclCommGetQuantization(ncclComm_t comm, qncclCollective_t collective,
                                                   int* bits, qncclAllReduceConfig_t* config) {
  return get_comm_quantization("qncclCommGetQuantization", comm, collective, bits, config);
}

QNCCL_EXPORT ncclResult_t qncclRedOpCreateQuantized(ncclRedOp_t* op,
                                                    const qncclQuantizedOpConfig_t* config,
                                                    ncclComm_t comm) {
  return create_quantized_op("qncclRedOpCreateQuantized", op, config, comm);
}
