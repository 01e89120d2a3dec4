/* qncclAllReduce: checks the arguments, then runs the chosen algorithm on
 * each segment of the buffer (docs/allreduce.md). */
#include <stdint.h>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"

namespace qnccl {
namespace {

size_t segment_values(const qncclAllReduceConfig_t* config) {
  const size_t bucket = config->codec.bucketSize;
  const size_t want = config->segmentValues ? config->segmentValues : QNCCL_DEFAULT_SEGMENT_VALUES;
  return want < bucket ? bucket : want / bucket * bucket;
}

}  // namespace

ncclResult_t check_allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                             ncclDataType_t type, ncclRedOp_t op,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm) {
  if (config == nullptr)
    return set_error(ncclInvalidArgument, "%s: config is NULL; pass a qncclAllReduceConfig_t", fn);
  QNCCL_CHECK(check_codec_config(fn, &config->codec));
  QNCCL_CHECK(check_codec_type(fn, "datatype", type));
  if (config->algo < qncclAlgoAuto || config->algo > qncclAlgoSra)
    return set_error(ncclInvalidArgument,
                     "%s: algo = %d is unknown; allowed: qncclAlgoAuto (0), qncclAlgoRing (1), "
                     "qncclAlgoTree (2), qncclAlgoSra (3)",
                     fn, (int)config->algo);
  if (op != ncclSum && op != ncclAvg)
    return set_error(ncclInvalidArgument,
                     "%s: op = %d is not a quantized reduction; allowed: ncclSum (0), ncclAvg (4)",
                     fn, (int)op);
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (count > SIZE_MAX / 16)
    return set_error(ncclInvalidArgument, "%s: count = %zu is too large", fn, count);
  if (count > 0 && (sendbuff == nullptr || recvbuff == nullptr))
    return set_error(ncclInvalidArgument, "%s: %s is NULL with count = %zu; pass a buffer", fn,
                     sendbuff == nullptr ? "sendbuff" : "recvbuff", count);
  const size_t bytes = count * float_type_size(type);
  const uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (s != r && s < r + bytes && r < s + bytes)
    return set_error(ncclInvalidArgument,
                     "%s: sendbuff and recvbuff overlap without being equal; pass the same "
                     "buffer (in place) or disjoint ones",
                     fn);
#ifdef QNCCL_WITH_CUDA
  if (count > 0 && (is_device_pointer(sendbuff) || is_device_pointer(recvbuff)))
    return set_error(ncclInvalidUsage,
                     "%s: device buffers need the CUDA engine path, which this build does not "
                     "have yet; pass host buffers",
                     fn);
#endif
  return ncclSuccess;
}

qncclAlgo_t auto_algo(size_t count, ncclDataType_t type, int nranks) {
  if (nranks == 1) return qncclAlgoRing;
  if (count * float_type_size(type) < (64u << 10)) return qncclAlgoTree;
  return nranks <= 16 ? qncclAlgoSra : qncclAlgoRing;
}


ncclResult_t run_allreduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           const qncclAllReduceConfig_t& config, ncclComm_t comm,
                           cudaStream_t stream, CommState& state) {
  Segment s;
  QNCCL_CHECK(real_nccl(&s.nccl));
  QNCCL_CHECK(host_codec(&s.codec));
  if (s.nccl->commCount(comm, &s.nranks) != ncclSuccess ||
      s.nccl->commUserRank(comm, &s.rank) != ncclSuccess)
    return set_error(ncclInvalidArgument, "quantized allreduce: comm is not a communicator of %s",
                     s.nccl->path);
  s.comm = comm;
  s.stream = stream;
  s.params = CodecParams{config.codec.bits, config.codec.bucketSize, config.codec.rounding,
                         config.codec.seed, 0};
  s.type = datatype;
  s.type_size = float_type_size(datatype);
  s.average = op == ncclAvg;
  s.call = state.calls++;
  s.wire_sent = &state.stats.bytesOnWire;
  state.stats.callsCompressed++;
  state.stats.bytesIn += count * s.type_size;
  const qncclAlgo_t algo =
      config.algo == qncclAlgoAuto ? auto_algo(count, datatype, s.nranks) : config.algo;
  ncclResult_t (*run)(Segment&, Workspace&) =
      algo == qncclAlgoRing ? ring : algo == qncclAlgoTree ? tree : sra;

  Workspace w;
  const size_t step = segment_values(&config);
  for (size_t first = 0, g = 0; first < count; first += step, g++) {
    s.index = g;
    s.x = static_cast<const char*>(sendbuff) + first * s.type_size;
    s.y = static_cast<char*>(recvbuff) + first * s.type_size;
    s.count = count - first < step ? count - first : step;
    QNCCL_CHECK(run(s, w));
  }
  return ncclSuccess;
}

}  // namespace qnccl

using namespace qnccl;

QNCCL_EXPORT ncclResult_t qncclAutoAlgo(size_t count, ncclDataType_t datatype, int nranks,
                                        qncclAlgo_t* algo) {
  QNCCL_CHECK(check_codec_type("qncclAutoAlgo", "datatype", datatype));
  if (nranks < 1)
    return set_error(ncclInvalidArgument, "qncclAutoAlgo: nranks = %d; allowed: >= 1", nranks);
  if (algo == nullptr)
    return set_error(ncclInvalidArgument, "qncclAutoAlgo: algo is NULL; pass a qncclAlgo_t*");
  *algo = auto_algo(count, datatype, nranks);
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t qncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op,
                                         const qncclAllReduceConfig_t* config, ncclComm_t comm,
                                         cudaStream_t stream) {
  QNCCL_CHECK(check_allreduce("qncclAllReduce", sendbuff, recvbuff, count, datatype, op, config,
                              comm));
  CommState* state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  return run_allreduce(sendbuff, recvbuff, count, datatype, op, *config, comm, stream, *state);
}

QNCCL_EXPORT ncclResult_t qncclCommGetStats(ncclComm_t comm, qncclStats_t* stats) {
  if (comm == nullptr || stats == nullptr)
    return set_error(ncclInvalidArgument, "qncclCommGetStats: %s is NULL",
                     comm == nullptr ? "comm" : "stats");
  CommState* state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  *stats = state->stats;
  return ncclSuccess;
}
