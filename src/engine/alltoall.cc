/* Quantized all-to-all (docs/collectives.md, "All-to-all"): every rank
 * encodes each other rank's chunk of its segment once (step: the peer),
 * sends it straight there, and decodes what arrives into the sender's
 * chunk; its own chunk is copied bit for bit. */
#include <stdint.h>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"

namespace qnccl {

ncclResult_t direct_alltoall(Segment& s, Workspace& w) {
  const int n = s.nranks, r = s.rank;
  const size_t slot = s.wire_bytes(s.count);
  w.wire.resize(2 * (size_t)n * slot);
  // Slot k holds what goes to rank k; slot n + k what comes from rank k.
  auto to = [&](int k) { return w.slot((size_t)k, slot); };
  auto from = [&](int k) { return w.slot((size_t)(n + k), slot); };
  std::vector<Transfer> sends(n), recvs(n);  // indexed by peer
  std::vector<Range> out, in;
  std::vector<uint64_t> steps;
  std::vector<uint8_t*> wires;
  std::vector<const uint8_t*> received;
  for (int k = 0; k < n; k++) {
    if (k == r) continue;
    out.push_back(s.piece(k));
    steps.push_back((uint64_t)k);
    wires.push_back(to(k));
    in.push_back(s.piece(k));
    received.push_back(from(k));
    sends[k] = {to(k), slot, k};
    recvs[k] = {from(k), slot, k};
  }
  s.encode_inputs(out.data(), steps.data(), (int)out.size(), wires.data());
  s.copy_own(s.piece(r));
  QNCCL_CHECK(s.all_to_all(sends.data(), recvs.data()));
  s.decode_outputs(received.data(), in.data(), (int)in.size());
  return s.status;
}

ncclResult_t check_alltoall(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                            ncclComm_t comm) {
  QNCCL_CHECK(check_gather_config(fn, count, datatype, config));
  int nranks = 0, rank = 0;
  QNCCL_CHECK(check_chunked_comm(fn, comm, count, "count", &nranks, &rank));
  const size_t bytes = count * float_type_size(datatype) * (size_t)nranks;
  return check_buffers(fn, sendbuff, bytes, recvbuff, bytes, sendbuff, "sendbuff");
}

ncclResult_t run_alltoall(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, const qncclAllReduceConfig_t& config,
                          ncclComm_t comm, cudaStream_t stream, CommState& state,
                          Lockstep* lockstep, size_t lane) {
  return guarded_call("all-to-all", state, lockstep, lane, [&](Segment& s) {
    QNCCL_CHECK(begin_call(s, "all-to-all", comm, stream, config, datatype, ncclSum));
    s.chunk_stride = count;
    // a rotation's pieces: the N chunks in and out, but its own, copied exactly
    s.chunked_x = s.chunked_y = s.own_exact = true;
    WorkspaceSize need;
    need.wire_bytes = 2 * (size_t)s.nranks *
                      compressed_bytes(std::min(count, segment_values(config)),
                                       config.codec.bits, config.codec.bucketSize);
    add_rotation(need, count, config, (size_t)s.nranks);
    const QuantizedCall call = {
        "all-to-all", qncclAlgoAuto, direct_alltoall, need, sendbuff, recvbuff, count,
        count * s.type_size * (size_t)s.nranks, &config};
    return run_quantized(s, call, state);
  });
}

ncclResult_t alltoall(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                      ncclComm_t comm, cudaStream_t stream) {
  QNCCL_CHECK(check_alltoall(fn, sendbuff, recvbuff, count, datatype, config, comm));
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  return run_alltoall(sendbuff, recvbuff, count, datatype, *config, comm, stream, *state);
}

}  // namespace qnccl
