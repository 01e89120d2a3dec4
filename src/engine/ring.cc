/* Quantized ring allreduce (docs/allreduce.md, "Ring"): a reduce-scatter in
 * which every hop decodes, adds its own values and re-encodes, then an
 * allgather that forwards the owner's bytes unchanged. */
#include "engine/engine.h"

#include <utility>

#include "common/error.h"

namespace qnccl {

ncclResult_t ring(Segment& s, Workspace& w) {
  const int n = s.nranks, r = s.rank;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto chunk = [&](int k) { return s.chunk(((k % n) + n) % n); };
  const size_t most = Segment::max_chunk(s.count, s.params.bucket, n);
  const size_t slot = s.wire_bytes(most);
  w.acc.resize(most);
  w.wire.resize(2 * slot);
  uint8_t* out = w.slot(0, slot);
  uint8_t* in = w.slot(1, slot);
  float* acc = w.acc.data();

  // Reduce-scatter: send chunk r - step, receive and add chunk r - step - 1.
  for (int step = 0; step < n - 1; step++) {
    const Range sent = chunk(r - step), got = chunk(r - step - 1);
    if (step == 0)
      s.encode_input(sent, step, out);
    else
      s.encode_acc(sent, acc, step, out);
    const Transfer send = {out, s.wire_bytes(sent.size()), right};
    const Transfer recv = {in, s.wire_bytes(got.size()), left};
    QNCCL_CHECK(s.exchange(&send, 1, &recv, 1));
    s.reduce_input(got, &in, 1, acc);
  }

  // This rank owns chunk r + 1: encode the result once, use the decoded bytes.
  const Range own = chunk(r + 1);
  if (n == 1) s.reduce_input(own, nullptr, 0, acc);
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

}  // namespace qnccl
