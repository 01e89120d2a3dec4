/* Quantized tree allreduce (docs/allreduce.md, "Tree"): partial sums go up
 * a binary tree in heap order, re-encoded at every level; the root encodes
 * the result once and its bytes come down the tree unchanged. */
#include "engine/engine.h"

#include "common/error.h"

namespace qnccl {

ncclResult_t tree(Segment& s, Workspace& w) {
  const int r = s.rank, parent = (r - 1) / 2;
  const int children[2] = {2 * r + 1, 2 * r + 2};
  const int nchildren = (children[0] < s.nranks) + (children[1] < s.nranks);
  const Range all = {0, s.count};
  const size_t bytes = s.wire_bytes(s.count);
  w.acc.resize(s.count);
  w.wire.resize(3 * bytes);
  uint8_t* from_child[2] = {w.slot(0, bytes), w.slot(1, bytes)};
  uint8_t* result = w.slot(2, bytes);
  float* acc = w.acc.data();

  // Reduce: add the children's partial sums to this rank's values.
  Transfer recvs[2];
  for (int c = 0; c < nchildren; c++) recvs[c] = {from_child[c], bytes, children[c]};
  QNCCL_CHECK(s.exchange(nullptr, 0, recvs, nchildren));
  s.widen_input(all, acc);
  for (int c = 0; c < nchildren; c++) s.add_decoded(from_child[c], s.count, acc);

  if (r == 0) {
    s.encode_result(all, acc, 1, result);
  } else {
    s.encode_acc(all, acc, 0, from_child[0]);
    const Transfer up = {from_child[0], bytes, parent};
    QNCCL_CHECK(s.exchange(&up, 1, nullptr, 0));
    const Transfer down = {result, bytes, parent};
    QNCCL_CHECK(s.exchange(nullptr, 0, &down, 1));
  }

  // Broadcast: decode the root's bytes and pass them on unchanged.
  s.decode_output(result, all);
  Transfer sends[2];
  for (int c = 0; c < nchildren; c++) sends[c] = {result, bytes, children[c]};
  return s.exchange(sends, nchildren, nullptr, 0);
}

}  // namespace qnccl
