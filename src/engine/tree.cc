/* Quantized tree allreduce (docs/allreduce.md, "Tree"): partial sums go up
 * a binary tree in heap order, re-encoded at every level; the root encodes
 * the result once and its bytes come down the tree unchanged. The segment
 * moves in pieces, as in NCCL's tree: in step t a rank at depth d sends
 * piece t - (L - d) up and receives piece t - (L - d - 1) from its
 * children, receives result piece t - L - d + 1 from its parent and
 * forwards piece t - L - d to its children, so every level and both
 * directions are busy at once. Every rank takes the same P + 2L - 1 steps
 * (P with a single rank; some with nothing to move). Pieces are
 * bucket-aligned and each piece is quantized on the segment's stream from
 * its first value on, so the bytes are those of quantizing the whole
 * segment at once. */
#include "engine/engine.h"

#include <algorithm>

#include "common/error.h"

namespace qnccl {
namespace {

int depth_of(int rank) {
  int d = 0;
  for (int r = rank + 1; r > 1; r /= 2) d++;
  return d;
}

}  // namespace

size_t tree_piece_values(size_t bucket) {
  const size_t want = (size_t)1 << 18;
  return want < bucket ? bucket : want / bucket * bucket;
}

ncclResult_t tree(Segment& s, Workspace& w) {
  const int r = s.rank, parent = (r - 1) / 2;
  const int depth = depth_of(r), levels = depth_of(s.nranks - 1);
  const int children[2] = {2 * r + 1, 2 * r + 2};
  const int nchildren = (children[0] < s.nranks) + (children[1] < s.nranks);
  const size_t values = tree_piece_values(s.params.bucket);
  const long pieces = (long)((s.count + values - 1) / values);
  auto piece = [&](long k) { return Range{k * values, std::min(s.count, (k + 1) * values)}; };
  auto valid = [&](long k) { return k >= 0 && k < pieces; };
  const size_t slot = s.wire_bytes(std::min(s.count, values));
  w.acc.resize(std::min(s.count, values));
  w.wire.resize(5 * slot);
  uint8_t* from_child[2] = {w.slot(0, slot), w.slot(1, slot)};
  uint8_t* up = w.slot(2, slot);
  uint8_t* result[2] = {w.slot(3, slot), w.slot(4, slot)};  // by piece parity
  float* acc = w.acc.data();

  // Piece k of this rank's values plus its children's partial sums,
  // encoded for its parent (the root: the result, decoded here too).
  auto combine = [&](long k) {
    const Range p = piece(k);
    s.reduce_input(p, from_child, nchildren, acc);
    if (r > 0) return s.encode_acc(p, acc, 0, up, p.begin);
    s.encode_result(p, acc, 1, result[k % 2], p.begin);
    s.decode_output(result[k % 2], p);
  };

  const long steps = pieces + (levels > 0 ? 2 * levels - 1 : 0);
  for (long t = 0; t < steps; t++) {
    const long sent_up = t - (levels - depth), from_below = sent_up + 1;
    const long from_above = t - levels - depth + 1, sent_down = from_above - 1;
    if (nchildren == 0 && valid(sent_up)) combine(sent_up);  // a leaf's own piece
    Transfer sends[3], recvs[3];
    int nsends = 0, nrecvs = 0;
    if (r > 0 && valid(sent_up)) sends[nsends++] = {up, s.wire_bytes(piece(sent_up).size()), parent};
    if (r > 0 && valid(from_above))
      recvs[nrecvs++] = {result[from_above % 2], s.wire_bytes(piece(from_above).size()), parent};
    for (int c = 0; c < nchildren; c++) {
      if (valid(from_below))
        recvs[nrecvs++] = {from_child[c], s.wire_bytes(piece(from_below).size()), children[c]};
      if (valid(sent_down))
        sends[nsends++] = {result[sent_down % 2], s.wire_bytes(piece(sent_down).size()),
                           children[c]};
    }
    QNCCL_CHECK(s.exchange(sends, nsends, recvs, nrecvs));
    if (nchildren > 0 && valid(from_below)) combine(from_below);
    if (r > 0 && valid(from_above)) s.decode_output(result[from_above % 2], piece(from_above));
  }
  return ncclSuccess;
}

}  // namespace qnccl
