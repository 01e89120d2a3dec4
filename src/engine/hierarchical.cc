/* Hierarchical allreduce (docs/allreduce.md, "Hierarchical"): the L ranks
 * of each node reduce-scatter the segment among themselves (exactly, with
 * the real NCCL's ncclReduceScatter, or quantized at intraBits), each rank
 * allreduces its shard with the ranks of the same local index on the other
 * nodes (the inter algorithm, quantized), and each node allgathers the
 * shards. Only the middle stage crosses the network, 1/L of the segment per
 * rank, so the L ranks of a node share its link instead of each sending
 * the whole segment through it. */
#include "engine/engine.h"

#include "common/error.h"
#include "engine/topology.h"

namespace qnccl {
namespace {

/* The shards of a segment: floor(count / L) values each (the blocks of
 * ncclReduceScatter), the last one also takes the count % L left over
 * (reduced with ncclReduce to it, broadcast from it). */
Range shard(size_t count, int nshards, int k) {
  const size_t even = count / (size_t)nshards;
  return Range{(size_t)k * even, k == nshards - 1 ? count : (size_t)(k + 1) * even};
}

Range shard_of(const Segment& s, int k) { return shard(s.count, s.nranks, k); }

}  // namespace

ncclResult_t hierarchical(Segment& s, Workspace& w) {
  const HierPlan& plan = *s.hier;
  const Topology& t = *plan.topology;
  const int nlocal = t.local_ranks, l = t.local_rank, last = nlocal - 1;
  const size_t even = s.count / (size_t)nlocal;
  const Range own = shard(s.count, nlocal, l), block = {own.begin, own.begin + even};
  const Range rest = {even * (size_t)nlocal, s.count};

  // The stage between nodes: this rank's shard, with the ranks of its local
  // index. Its random streams follow the intra stage's L steps.
  Segment inter = s;
  inter.hier = nullptr;
  inter.comm = t.cross;
  inter.rank = t.node;
  inter.nranks = t.nodes;
  inter.average_over = s.nranks;
  inter.step_base = (uint64_t)nlocal;
  inter.y = s.output(own);
  inter.count = own.size();
  inter.residual = s.residual != nullptr ? s.residual + own.begin : nullptr;

  // 1. Reduce-scatter inside the node.
  if (plan.intra_bits == 0) {
    const Collective scatter[2] = {
        {Collective::kReduceScatter, s.x, s.output(block), even, 0},
        {Collective::kReduce, s.input(rest), s.output(rest), rest.size(), last}};
    QNCCL_CHECK(s.collectives(t.local, scatter, 2));
    inter.x = s.output(own);  // in place
  } else {
    Segment intra = s;
    intra.hier = nullptr;
    intra.comm = t.local;
    intra.rank = l;
    intra.nranks = nlocal;
    intra.params.bits = plan.intra_bits;
    intra.params.clip = clip_fraction(s.clip, plan.intra_bits, s.params.bucket);
    // SRA's scatter-reduce with shards for chunks. The own shard is
    // quantized between nodes: its residual is added there.
    const size_t slot = intra.wire_bytes(shard(s.count, nlocal, last).size());
    w.stage.resize(own.size());
    w.wire.resize(2 * (size_t)nlocal * slot);
    const ncclResult_t res = scatter_reduce(intra, w, shard_of, slot, false, w.stage.data());
    s.in_progress = s.in_progress || intra.in_progress;
    QNCCL_CHECK(res);
    inter.x = reinterpret_cast<const char*>(w.stage.data());
    inter.input_type = ncclFloat32;
    inter.input_size = sizeof(float);
  }

  // 2. Allreduce of the shard across nodes.
  const ncclResult_t res = plan.inter(inter, w);
  s.in_progress = s.in_progress || inter.in_progress;
  QNCCL_CHECK(res);
  QNCCL_CHECK(inter.status);

  // 3. Allgather inside the node (in place: each rank's block is in y).
  const Collective gather[2] = {
      {Collective::kAllGather, s.output(block), s.y, even, 0},
      {Collective::kBroadcast, s.output(rest), s.output(rest), rest.size(), last}};
  return s.collectives(t.local, gather, 2);
}

}  // namespace qnccl
