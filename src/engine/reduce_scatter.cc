/* qncclReduceScatter (docs/collectives.md): checks the arguments, then runs
 * the ring's or SRA's reduce-scatter on each segment of the chunks, like an
 * allreduce, with the result kept in float32 until it is stored. */
#include <stdint.h>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"

namespace qnccl {
ncclResult_t check_reduce_scatter_config(const char* fn, size_t recvcount, ncclDataType_t type,
                                         ncclRedOp_t op, const qncclAllReduceConfig_t* config) {
  QNCCL_CHECK(check_allreduce_config(fn, recvcount, type, op, config));
  if (config->algo != qncclAlgoAuto && config->algo != qncclAlgoRing &&
      config->algo != qncclAlgoSra)
    return set_error(ncclInvalidArgument,
                     "%s: algo = %d has no reduce-scatter; allowed: qncclAlgoAuto (0), "
                     "qncclAlgoRing (1), qncclAlgoSra (3)",
                     fn, (int)config->algo);
  return check_no_error_feedback(fn, *config);
}

qncclAlgo_t reduce_scatter_algo(qncclAlgo_t algo, int nranks) {
  if (algo != qncclAlgoAuto) return algo;
  return nranks <= kAutoSraMaxRanks ? qncclAlgoSra : qncclAlgoRing;
}

ncclResult_t check_reduce_scatter(const char* fn, const void* sendbuff, void* recvbuff,
                                  size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                                  const qncclAllReduceConfig_t* config, ncclComm_t comm) {
  QNCCL_CHECK(check_reduce_scatter_config(fn, recvcount, datatype, op, config));
  // The buffers' sizes and the in-place position need the communicator's shape.
  int nranks = 0, rank = 0;
  QNCCL_CHECK(check_chunked_comm(fn, comm, recvcount, "recvcount", &nranks, &rank));
  const size_t bytes = recvcount * float_type_size(datatype);
  return check_buffers(fn, sendbuff, bytes * (size_t)nranks, recvbuff, bytes,
                       static_cast<const char*>(sendbuff) + (size_t)rank * bytes,
                       "sendbuff + rank * recvcount");
}

ncclResult_t run_reduce_scatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op,
                                const qncclAllReduceConfig_t& config, ncclComm_t comm,
                                cudaStream_t stream, CommState& state, Lockstep* lockstep,
                                size_t lane) {
  return guarded_call("reduce-scatter", state, lockstep, lane, [&](Segment& s) {
    QNCCL_CHECK(begin_call(s, "reduce-scatter", comm, stream, config, datatype, op));
    s.chunk_stride = recvcount;
    s.chunked_x = true;  // a rotation's pieces: the N chunks in, one out
    const qncclAlgo_t algo = reduce_scatter_algo(config.algo, s.nranks);
    const QuantizedCall call = {
        "reduce-scatter",
        algo,
        algo == qncclAlgoSra ? reduce_scatter_sra : reduce_scatter_ring,
        reduce_scatter_workspace_size(algo, recvcount, config, s.nranks),
        sendbuff,
        recvbuff,
        recvcount,
        recvcount * s.type_size * (size_t)s.nranks,
        &config};
    return run_quantized(s, call, state);
  });
}

ncclResult_t reduce_scatter(const char* fn, const void* sendbuff, void* recvbuff,
                            size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                            const qncclAllReduceConfig_t* config, ncclComm_t comm,
                            cudaStream_t stream) {
  QNCCL_CHECK(check_reduce_scatter(fn, sendbuff, recvbuff, recvcount, datatype, op, config, comm));
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  return run_reduce_scatter(sendbuff, recvbuff, recvcount, datatype, op, *config, comm, stream,
                            *state);
}

}  // namespace qnccl
