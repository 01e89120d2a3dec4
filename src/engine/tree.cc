/* Quantized tree allreduce (docs/allreduce.md, "Tree"): partial sums go up
 * a binary tree in heap order, re-encoded at every level; the root encodes
 * the result once and its bytes come down the tree unchanged. The tree
 * moves one level per step, and every rank takes part in every step (some
 * with nothing to send), so all ranks take the same 2 * depth steps. */
#include "engine/engine.h"

#include "common/error.h"

namespace qnccl {
namespace {

int depth_of(int rank) {
  int d = 0;
  for (int r = rank + 1; r > 1; r /= 2) d++;
  return d;
}

}  // namespace

ncclResult_t tree(Segment& s, Workspace& w) {
  const int r = s.rank, parent = (r - 1) / 2;
  const int depth = depth_of(r), levels = depth_of(s.nranks - 1);
  const int children[2] = {2 * r + 1, 2 * r + 2};
  const int nchildren = (children[0] < s.nranks) + (children[1] < s.nranks);
  const Range all = {0, s.count};
  const size_t bytes = s.wire_bytes(s.count);
  w.acc.resize(s.count);
  w.wire.resize(3 * bytes);
  uint8_t* from_child[2] = {w.slot(0, bytes), w.slot(1, bytes)};
  uint8_t* up = from_child[0];  // reused once the children's bytes are added
  uint8_t* result = w.slot(2, bytes);
  float* acc = w.acc.data();
  Transfer to_parent = {up, bytes, parent}, from_parent = {result, bytes, parent};
  Transfer with_child[2];

  // This rank's values plus its children's partial sums, encoded for its
  // parent (the root: the result).
  auto combine = [&] {
    s.reduce_input(all, from_child, nchildren, acc);
    if (r == 0)
      s.encode_result(all, acc, 1, result);
    else
      s.encode_acc(all, acc, 0, up);
  };

  // Reduce, deepest level first: in step `level` that level sends up.
  if (depth == levels) combine();
  for (int level = levels; level >= 1; level--) {
    const bool sends = depth == level, receives = depth == level - 1;
    for (int c = 0; c < nchildren; c++) with_child[c] = {from_child[c], bytes, children[c]};
    QNCCL_CHECK(s.exchange(&to_parent, sends, with_child, receives ? nchildren : 0));
    if (receives) combine();
  }

  // Broadcast, root first: in step `level` that level sends down.
  if (r == 0) s.decode_output(result, all);
  for (int level = 0; level < levels; level++) {
    const bool sends = depth == level, receives = depth == level + 1;
    for (int c = 0; c < nchildren; c++) with_child[c] = {result, bytes, children[c]};
    QNCCL_CHECK(s.exchange(with_child, sends ? nchildren : 0, &from_parent, receives));
    if (receives) s.decode_output(result, all);
  }
  return ncclSuccess;
}

}  // namespace qnccl
