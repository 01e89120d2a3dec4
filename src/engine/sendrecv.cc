/* Quantized point-to-point (docs/collectives.md, "Send and receive"): the
 * sends and receives one group issued on a communicator, each cut in
 * segments like a collective's chunk, go as one transport step. Every send
 * segment is encoded once (one compute step per data type), all of them
 * travel in one real group, and every received segment is decoded into its
 * buffer. Sender and receiver cut the same count the same way, so their
 * pieces match one for one. */
#include <stdint.h>

#include <map>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"

namespace qnccl {

size_t p2p_wire_bytes(size_t count, const qncclAllReduceConfig_t& config) {
  const size_t W = segment_values(config);
  const size_t whole = count / W, rest = count % W;
  const int bits = config.codec.bits;
  const size_t bucket = config.codec.bucketSize;
  return whole * compressed_bytes(W, bits, bucket) + compressed_bytes(rest, bits, bucket);
}

ncclResult_t sendrecv(Segment& s, Workspace& w) {
  const size_t W = s.count;  // run_sendrecv: the segment length
  std::vector<Segment::Piece> encoded, decoded;
  std::vector<Transfer> sends, recvs;
  std::map<int, uint64_t> sent;  // sends so far to each peer: their random streams differ
  size_t used = 0;
  for (const P2pOp& op : *s.p2p) {
    // Step: the peer, for the k-th send to it in the group peer + k * nranks.
    const uint64_t step = (uint64_t)op.peer + (op.send ? sent[op.peer]++ * (uint64_t)s.nranks : 0);
    char* values = static_cast<char*>(op.buffer);
    const size_t size = float_type_size(op.type);
    for (size_t g = 0, first = 0; first < op.count; g++, first += W) {
      const size_t m = std::min(W, op.count - first);
      const size_t bytes = s.wire_bytes(m);
      w.wire.resize(used + bytes);
      uint8_t* wire = w.wire.data() + used;
      used += bytes;
      const Segment::Piece piece = {values + first * size, m, op.type, g, step, wire};
      (op.send ? encoded : decoded).push_back(piece);
      (op.send ? sends : recvs).push_back(Transfer{wire, bytes, op.peer});
    }
  }
  s.encode_pieces(encoded);
  QNCCL_CHECK(s.exchange(sends.data(), (int)sends.size(), recvs.data(), (int)recvs.size()));
  s.decode_pieces(decoded);
  return s.status;
}

namespace {

/* The call's compute runs where its first buffer lives: every other one must
 * live there too. */
ncclResult_t check_memory(const std::vector<P2pOp>& ops) {
#ifdef QNCCL_WITH_CUDA
  const char* fn = "quantized send/receive";
  int first = -1;
  QNCCL_CHECK(pointer_device(fn, ops[0].buffer, &first));
  for (const P2pOp& op : ops) {
    int device = -1;
    QNCCL_CHECK(pointer_device(fn, op.buffer, &device));
    if (device != first)
      return set_error(ncclInvalidUsage,
                       "%s: the group's quantized sends and receives on this communicator have "
                       "buffers on device %d and on device %d (-1: host memory); pass all in "
                       "host memory or all on one device",
                       fn, first, device);
  }
#else
  (void)ops;
#endif
  return ncclSuccess;
}

}  // namespace

ncclResult_t run_sendrecv(const std::vector<P2pOp>& ops, const qncclAllReduceConfig_t& config,
                          ncclComm_t comm, cudaStream_t stream, CommState& state,
                          Lockstep* lockstep, size_t lane) {
  return guarded_call("send/receive", state, lockstep, lane, [&](Segment& s) {
    QNCCL_CHECK(check_memory(ops));
    QNCCL_CHECK(begin_call(s, "send/receive", comm, stream, config, ops[0].type, ncclSum));
    s.p2p = &ops;
    s.count = segment_values(config);  // sendrecv() cuts each operation in these
    WorkspaceSize need;
    size_t values = 0, input_bytes = 0;
    for (const P2pOp& op : ops) {
      need.wire_bytes += p2p_wire_bytes(op.count, config);
      values += op.count;
      if (op.send) input_bytes += op.count * float_type_size(op.type);
    }
    const QuantizedCall call = {
        "send/receive", qncclAlgoAuto, sendrecv, need, ops[0].buffer, ops[0].buffer, values,
        input_bytes, &config, true};
    return run_quantized(s, call, state);
  });
}

}  // namespace qnccl
