/* Quantized point-to-point (docs/collectives.md, "Send and receive"): the
 * sends and receives one group issued on a communicator, each cut in
 * segments like a collective's chunk, go as one transport step. Every send
 * segment is encoded once (one compute step per data type), all of them
 * travel in one real group, and every received segment is decoded into its
 * buffer. Sender and receiver cut the same count the same way, so their
 * pieces match one for one. A rotated call (docs/rotation.md) rotates each
 * send's pieces into the workspace first, and decodes each receive's there,
 * rotating it back into its buffer. */
#include <stdint.h>

#include <algorithm>
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

namespace {

/* docs/rotation.md: every piece moves to the workspace's float32 values,
 * one after another: each send's values rotated there (after the signs'
 * table, one step per data type), each receive's only pointed there, to be
 * decoded into. */
void rotate_sends(Segment& s, Workspace& w, std::vector<Segment::Piece>& sends,
                  std::vector<Segment::Piece>& recvs) {
  size_t total = 0, largest = 0;
  for (const std::vector<Segment::Piece>* pieces : {&sends, &recvs})
    for (const Segment::Piece& p : *pieces) {
      total += p.count;
      largest = std::max(largest, p.count);
    }
  w.rotated.resize(total);
  s.rotation_signs(std::min(largest, s.rotation), w.signs.data());
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    std::vector<const void*> srcs;
    std::vector<size_t> counts;
    std::vector<float*> zs;
    float* z = w.rotated.data();
    for (const Segment::Piece& p : sends) {
      if (p.type == t) {
        srcs.push_back(p.values);
        counts.push_back(p.count);
        zs.push_back(z);
      }
      z += p.count;
    }
    s.rotate(srcs.data(), counts.data(), (int)srcs.size(), t, w.signs.data(), zs.data());
  }
  float* z = w.rotated.data();
  for (std::vector<Segment::Piece>* pieces : {&sends, &recvs})
    for (Segment::Piece& p : *pieces) {
      p.values = z;
      p.type = ncclFloat32;
      z += p.count;
    }
}

/* The receives decoded into the workspace (`decoded`) rotated back into
 * their buffers (`into`), one step per data type. */
void unrotate_receives(Segment& s, Workspace& w, const std::vector<Segment::Piece>& decoded,
                       const std::vector<Segment::Piece>& into) {
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    std::vector<float*> zs;
    std::vector<size_t> counts;
    std::vector<void*> dsts;
    for (size_t i = 0; i < into.size(); i++) {
      if (into[i].type != t) continue;
      zs.push_back(static_cast<float*>(decoded[i].values));
      counts.push_back(into[i].count);
      dsts.push_back(into[i].values);
    }
    s.unrotate(zs.data(), counts.data(), (int)zs.size(), w.signs.data(), dsts.data(), t);
  }
}

}  // namespace

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
  std::vector<Segment::Piece> received;  // rotated: the receives' own buffers
  if (s.rotation != 0) {
    received = decoded;
    rotate_sends(s, w, encoded, decoded);
  }
  s.encode_pieces(encoded);
  QNCCL_CHECK(s.exchange(sends.data(), (int)sends.size(), recvs.data(), (int)recvs.size()));
  s.decode_pieces(decoded);
  if (s.rotation != 0) unrotate_receives(s, w, decoded, received);
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
    if (s.rotation != 0) {  // every piece in float32 (docs/rotation.md), one block's signs
      need.rotated_values = values;
      need.sign_values = std::min(s.count, s.rotation);
    }
    const QuantizedCall call = {
        "send/receive", qncclAlgoAuto, sendrecv, need, ops[0].buffer, ops[0].buffer, values,
        input_bytes, &config, true};
    return run_quantized(s, call, state);
  });
}

}  // namespace qnccl
