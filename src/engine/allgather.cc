/* Quantized allgather (docs/collectives.md, "Allgather"): every rank encodes
 * its segment once, sends the bytes to every other rank (all-to-all), and
 * every rank, itself included, decodes all of them, so every output holds the
 * same bytes. Also the argument checks allgather and all-to-all share. */
#include <stdint.h>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"

namespace qnccl {

ncclResult_t direct_allgather(Segment& s, Workspace& w) {
  const int n = s.nranks, r = s.rank;
  const size_t slot = s.wire_bytes(s.count);
  w.wire.resize((size_t)n * slot);
  // Slot k holds rank k's bytes.
  s.encode_input(Range{0, s.count}, 0, w.slot((size_t)r, slot));
  std::vector<Transfer> sends(n), recvs(n);  // indexed by peer
  for (int k = 0; k < n; k++) {
    if (k == r) continue;
    sends[k] = {w.slot((size_t)r, slot), slot, k};
    recvs[k] = {w.slot((size_t)k, slot), slot, k};
  }
  QNCCL_CHECK(s.all_to_all(sends.data(), recvs.data()));
  std::vector<const uint8_t*> wires(n);
  std::vector<Range> chunks(n);
  for (int k = 0; k < n; k++) {
    wires[k] = w.slot((size_t)k, slot);
    chunks[k] = s.piece(k);
  }
  s.decode_outputs(wires.data(), chunks.data(), n);
  return s.status;
}

ncclResult_t check_gather_config(const char* fn, size_t count, ncclDataType_t type,
                                 const qncclAllReduceConfig_t* config) {
  // Nothing is reduced: the op does not apply, check the rest as a sum would be.
  QNCCL_CHECK(check_allreduce_config(fn, count, type, ncclSum, config));
  if (config->algo != qncclAlgoAuto)
    return set_error(ncclInvalidArgument,
                     "%s: algo = %d; an allgather or all-to-all has one algorithm (every rank "
                     "sends its bytes straight to the others): pass qncclAlgoAuto (0)",
                     fn, (int)config->algo);
  return check_no_error_feedback(fn, *config);
}

ncclResult_t check_allgather(const char* fn, const void* sendbuff, void* recvbuff,
                             size_t sendcount, ncclDataType_t datatype,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm) {
  QNCCL_CHECK(check_gather_config(fn, sendcount, datatype, config));
  int nranks = 0, rank = 0;
  QNCCL_CHECK(check_chunked_comm(fn, comm, sendcount, "sendcount", &nranks, &rank));
  const size_t bytes = sendcount * float_type_size(datatype);
  // In place: sendbuff is chunk `rank` of recvbuff.
  const void* in_place = reinterpret_cast<const void*>((uintptr_t)sendbuff - (size_t)rank * bytes);
  return check_buffers(fn, sendbuff, bytes, recvbuff, bytes * (size_t)nranks, in_place,
                       "sendbuff - rank * sendcount");
}

ncclResult_t run_allgather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, const qncclAllReduceConfig_t& config,
                           ncclComm_t comm, cudaStream_t stream, CommState& state,
                           Lockstep* lockstep, size_t lane) {
  return guarded_call("allgather", state, lockstep, lane, [&](Segment& s) {
    QNCCL_CHECK(begin_call(s, "allgather", comm, stream, config, datatype, ncclSum));
    s.chunk_stride = sendcount;
    s.chunked_y = true;  // a rotation's pieces: one in, the N chunks out
    WorkspaceSize need;
    need.wire_bytes = (size_t)s.nranks *
                      compressed_bytes(std::min(sendcount, segment_values(config)),
                                       config.codec.bits, config.codec.bucketSize);
    add_rotation(need, sendcount, config, (size_t)s.nranks);
    const QuantizedCall call = {
        "allgather", qncclAlgoAuto, direct_allgather, need, sendbuff, recvbuff, sendcount,
        sendcount * s.type_size, &config};
    return run_quantized(s, call, state);
  });
}

ncclResult_t allgather(const char* fn, const void* sendbuff, void* recvbuff, size_t sendcount,
                       ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                       ncclComm_t comm, cudaStream_t stream) {
  QNCCL_CHECK(check_allgather(fn, sendbuff, recvbuff, sendcount, datatype, config, comm));
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  return run_allgather(sendbuff, recvbuff, sendcount, datatype, *config, comm, stream, *state);
}

}  // namespace qnccl
