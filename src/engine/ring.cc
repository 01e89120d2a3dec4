/* Quantized ring allreduce (docs/allreduce.md, "Ring"): a reduce-scatter in
 * which every hop decodes, adds its own values and re-encodes, then an
 * allgather that forwards the owner's bytes unchanged. The reduce-scatter
 * alone is also the ring's quantized ncclReduceScatter (docs/collectives.md). */
#include "engine/engine.h"

#include <utility>

#include "common/error.h"

namespace qnccl {

namespace {

Range chunk_mod(const Segment& s, int k) { return s.chunk(((k % s.nranks) + s.nranks) % s.nranks); }

/* Chunk k + 1 of a reduce-scatter sits where the allreduce's chunk k does,
 * so that the sum of chunk r ends at its owner, rank r. */
Range piece_before(const Segment& s, int k) { return s.piece(k - 1); }

}  // namespace

ncclResult_t ring_reduce_scatter(Segment& s, Range (*part)(const Segment&, int), uint8_t* out,
                                 uint8_t* in, float* acc) {
  const int n = s.nranks, r = s.rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int step = 0; step < n - 1; step++) {
    const Range sent = part(s, r - step), got = part(s, r - step - 1);
    if (step == 0)
      s.encode_input(sent, step, out);
    else
      s.encode_acc(sent, acc, step, out);
    const Transfer send = {out, s.wire_bytes(sent.size()), right};
    const Transfer recv = {in, s.wire_bytes(got.size()), left};
    QNCCL_CHECK(s.exchange(&send, 1, &recv, 1));
    s.reduce_input(got, &in, 1, acc);
  }
  if (n == 1) s.reduce_input(part(s, r + 1), nullptr, 0, acc);
  return s.status;
}

ncclResult_t ring(Segment& s, Workspace& w) {
  const int n = s.nranks, r = s.rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto chunk = [&](int k) { return chunk_mod(s, k); };
  const size_t most = Segment::max_chunk(s.count, s.params.bucket, n);
  const size_t slot = s.wire_bytes(most);
  w.acc.resize(most);
  w.wire.resize(2 * slot);
  uint8_t* out = w.slot(0, slot);
  uint8_t* in = w.slot(1, slot);
  float* acc = w.acc.data();

  // Reduce-scatter: send chunk r - step, receive and add chunk r - step - 1.
  QNCCL_CHECK(ring_reduce_scatter(s, chunk_mod, out, in, acc));

  // This rank owns chunk r + 1: encode the result once, use the decoded bytes.
  const Range own = chunk(r + 1);
  s.encode_result(own, acc, n - 1, out);
  s.decode_output(out, own);

  // Allgather: forward what arrived last step; decode what arrives.
  for (int step = 0; step < n - 1; step++) {
    const Range sent = chunk(r + 1 - step), got = chunk(r - step);
    const Transfer send = {out, s.wire_bytes(sent.size()), right};
    const Transfer recv = {in, s.wire_bytes(got.size()), left};
    QNCCL_CHECK(s.exchange(&send, 1, &recv, 1));
    s.decode_output(in, got);
    std::swap(out, in);
  }
  return ncclSuccess;
}

ncclResult_t reduce_scatter_ring(Segment& s, Workspace& w) {
  const size_t slot = s.wire_bytes(s.count);
  w.acc.resize(s.count);
  w.wire.resize(2 * slot);
  float* acc = w.acc.data();
  QNCCL_CHECK(ring_reduce_scatter(s, piece_before, w.slot(0, slot), w.slot(1, slot), acc));
  s.store_result(acc);
  return s.status;
}

}  // namespace qnccl
