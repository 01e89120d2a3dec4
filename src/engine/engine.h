/* The quantized allreduce engine: what its algorithms (ring.cc, tree.cc,
 * sra.cc) are written against. An algorithm is a short list of steps, each a
 * compute primitive (encode, decode, accumulate on the codec) or one
 * transport group (sends and receives of wire bytes through the real NCCL);
 * it never touches bytes itself. docs/allreduce.md is the specification. */
#ifndef QNCCL_ENGINE_ENGINE_H_
#define QNCCL_ENGINE_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "codec/codec.h"
#include "engine/nccl_api.h"

namespace qnccl {

/* Values [begin, end) of a segment. */
struct Range {
  size_t begin, end;
  size_t size() const { return end - begin; }
};

/* One point-to-point transfer of a transport group. */
struct Transfer {
  void* bytes;
  size_t len;
  int peer;
};

/* stream(call, segment, rank, step) of docs/allreduce.md. */
uint64_t stream_id(uint64_t call, uint64_t segment, uint64_t rank, uint64_t step);

/* One segment of one call: everything an algorithm needs. */
class Segment {
 public:
  // Fixed for the call.
  const NcclApi* nccl;
  ncclComm_t comm;
  cudaStream_t stream;
  const HostCodec* codec;
  CodecParams params;  // params.stream is set per quantization
  ncclDataType_t type;
  size_t type_size;
  bool average;
  int rank, nranks;
  uint64_t call;
  uint64_t* wire_sent;  // bytes this rank has sent (statistics)
  // This segment.
  uint64_t index;
  const char* x;  // this rank's input values of the segment
  char* y;        // its output values
  size_t count;

  /* Chunk k (docs/allreduce.md, "Segments and chunks"). */
  Range chunk(int k) const;
  /* Most values any chunk of a segment of `values` can hold. */
  static size_t max_chunk(size_t values, size_t bucket, int nranks);
  size_t wire_bytes(size_t values) const;

  const char* input(Range r) const { return x + r.begin * type_size; }
  char* output(Range r) const { return y + r.begin * type_size; }

  /* Compute primitives. `step` numbers this rank's quantizations. */
  void encode_input(Range r, uint64_t step, uint8_t* wire);
  void encode_acc(const float* acc, size_t n, uint64_t step, uint8_t* wire);
  void decode_output(const uint8_t* wire, Range r) const;
  void widen_input(Range r, float* acc) const;                 // acc = x
  void add_decoded(const uint8_t* wire, size_t n, float* acc) const;  // acc = acc + D(wire)
  void finish(float* acc, size_t n) const;                     // avg: acc = acc / N

  /* Transport primitive: one group of sends and receives (zero-length ones
   * are skipped on both sides alike). */
  ncclResult_t exchange(const Transfer* sends, int nsends, const Transfer* recvs, int nrecvs) const;
};

/* Scratch memory of one call, sized by the algorithm. */
struct Workspace {
  std::vector<float> acc;
  std::vector<uint8_t> wire;
  uint8_t* slot(size_t i, size_t slot_bytes) { return wire.data() + i * slot_bytes; }
};

ncclResult_t ring(Segment& s, Workspace& w);
ncclResult_t tree(Segment& s, Workspace& w);
ncclResult_t sra(Segment& s, Workspace& w);

/* docs/allreduce.md, "Choosing an algorithm". */
qncclAlgo_t auto_algo(size_t count, ncclDataType_t type, int nranks);

struct CommState;

/* The checks of a quantized allreduce's arguments; `fn` names the caller in
 * messages. */
ncclResult_t check_allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                             ncclDataType_t type, ncclRedOp_t op,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm);

/* Runs a checked quantized allreduce on `comm` and counts it in `state`. */
ncclResult_t run_allreduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t type, ncclRedOp_t op,
                           const qncclAllReduceConfig_t& config, ncclComm_t comm,
                           cudaStream_t stream, CommState& state);

}  // namespace qnccl

#endif
