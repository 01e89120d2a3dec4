/* The primitives of Segment: compute on the call's Compute (host code or
 * CUDA kernels), transport through the real NCCL's point-to-point calls;
 * and the workspace the algorithms run in. */
#include <stdio.h>
#include <stdlib.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"
#include "engine/lockstep.h"

namespace qnccl {

Range Segment::chunk(int k) const {
  const size_t buckets = num_buckets(count, params.bucket);
  const size_t first = buckets * (size_t)k / (size_t)nranks;
  const size_t last = buckets * (size_t)(k + 1) / (size_t)nranks;
  return Range{std::min(count, first * params.bucket), std::min(count, last * params.bucket)};
}

Range Segment::piece(int k) const {
  const size_t first = (size_t)(((k % nranks) + nranks) % nranks) * chunk_stride;
  return Range{first, first + count};
}

size_t Segment::max_chunk(size_t values, size_t bucket, int nranks) {
  const size_t buckets = num_buckets(values, bucket);
  return std::min(values, (buckets / (size_t)nranks + 1) * bucket);
}

size_t Segment::wire_bytes(size_t values) const {
  return compressed_bytes(values, params.bits, params.bucket);
}

/* What ring(), tree() and sra() resize their workspace to in a segment of
 * `values`; later segments are no longer and need no more. */
WorkspaceSize workspace_size(qncclAlgo_t algo, size_t count, const qncclAllReduceConfig_t& config,
                             int nranks) {
  WorkspaceSize size;
  const size_t bucket = config.codec.bucketSize;
  const int bits = config.codec.bits;
  const size_t values = std::min(count, segment_values(config));
  if (values == 0) return size;
  const size_t chunk = Segment::max_chunk(values, bucket, nranks);
  switch (algo) {
    case qncclAlgoTree: {  // encodes no input: fed_input unused
      const size_t piece = std::min(values, tree_piece_values(bucket));
      size.acc_values = piece;
      size.wire_bytes = 5 * compressed_bytes(piece, bits, bucket);
      break;
    }
    case qncclAlgoSra:
      size.acc_values = chunk;
      size.fed_input_values = config.errorFeedback ? chunk : 0;
      size.wire_bytes = 2 * (size_t)nranks * compressed_bytes(chunk, bits, bucket);
      break;
    default:  // ring
      size.acc_values = chunk;
      size.fed_input_values = config.errorFeedback ? chunk : 0;
      size.wire_bytes = 2 * compressed_bytes(chunk, bits, bucket);
      break;
  }
  return size;
}

WorkspaceSize reduce_scatter_workspace_size(qncclAlgo_t algo, size_t recvcount,
                                            const qncclAllReduceConfig_t& config, int nranks) {
  WorkspaceSize size;
  const size_t values = std::min(recvcount, segment_values(config));
  size.acc_values = values;
  const size_t slot = compressed_bytes(values, config.codec.bits, config.codec.bucketSize);
  size.wire_bytes = (algo == qncclAlgoSra ? 2 * (size_t)nranks : 2) * slot;
  add_rotation(size, recvcount, config, (size_t)nranks);
  return size;
}

WorkspaceSize hier_workspace_size(qncclAlgo_t inter, size_t count,
                                  const qncclAllReduceConfig_t& config, int local_ranks,
                                  int nodes) {
  const size_t values = std::min(count, segment_values(config));
  // The largest shard: the last one, which also takes the values left over.
  const size_t shard = values - (size_t)(local_ranks - 1) * (values / (size_t)local_ranks);
  WorkspaceSize size = workspace_size(inter, shard, config, nodes);
  if (config.intraBits == 0 || values == 0) return size;
  const size_t slot = compressed_bytes(shard, config.intraBits, config.codec.bucketSize);
  size.stage_values = shard;
  if (config.errorFeedback) size.fed_input_values = std::max(size.fed_input_values, shard);
  size.wire_bytes = std::max(size.wire_bytes, 2 * (size_t)local_ranks * slot);
  return size;
}

void add_rotation(WorkspaceSize& size, size_t count, const qncclAllReduceConfig_t& config,
                  size_t pieces) {
  const size_t block = rotation_block(config.codec);
  if (block == 0) return;
  const size_t segment = std::min(count, segment_values(config));
  size.rotated_values = pieces * segment;
  size.sign_values = std::min(segment, block);
}

void Workspace::assign(void* base, const WorkspaceSize& size, size_t lane) {
  void* memory = static_cast<char*>(base) + lane * size.lane_bytes();
  acc.assign(memory, size.acc_values);
  fed_input.assign(static_cast<float*>(memory) + size.acc_values, size.fed_input_values);
  float* const floats = static_cast<float*>(memory);
  stage.assign(floats + size.acc_values + size.fed_input_values, size.stage_values);
  float* const rotated_at = floats + size.acc_values + size.fed_input_values + size.stage_values;
  rotated.assign(rotated_at, size.rotated_values);
  signs.assign(reinterpret_cast<uint32_t*>(rotated_at + size.rotated_values), size.sign_values);
  wire.assign(static_cast<char*>(memory) + size.wire_offset(), size.wire_bytes);
}

void workspace_overflow(size_t need, size_t have) {
  fprintf(stderr,
          "QNCCL WARN internal error: an allreduce algorithm asked for %zu bytes of workspace "
          "where %zu were reserved; please report this\n",
          need, have);
  abort();
}

void Segment::encode_input(Range r, uint64_t step, uint8_t* wire) {
  if (residual == nullptr) {
    if (status != ncclSuccess) return;
    set_stream(step);
    record(compute.quantize(compute, input(r), r.size(), input_type, params, wire));
    return;
  }
  fed_input.resize(r.size());
  widen_input(r, fed_input.data());  // z = x + e
  quantize_float(r, fed_input.data(), step, wire);
}

void Segment::encode_inputs(const Range* ranges, const uint64_t* steps, int n,
                            uint8_t* const* wires) {
  if (residual != nullptr) {
    for (int i = 0; i < n; i++) encode_input(ranges[i], steps[i], wires[i]);
    return;
  }
  if (status != ncclSuccess || n == 0) return;
  std::vector<const void*> srcs((size_t)n);
  std::vector<size_t> counts((size_t)n);
  std::vector<CodecParams> ps((size_t)n);
  for (int i = 0; i < n; i++) {
    srcs[i] = input(ranges[i]);
    counts[i] = ranges[i].size();
    ps[i] = stream_params(steps[i]);
  }
  record(compute.quantize_many(compute, srcs.data(), counts.data(), n, input_type, ps.data(),
                               wires));
}

CodecParams Segment::stream_params_at(uint64_t segment, uint64_t step, uint64_t first) const {
  CodecParams p = params;
  p.stream = stream_id(call, segment, stream_rank, step_base + step);
  p.first = first;
  p.call = device_call;
  p.segment = segment;
  p.rank = stream_rank;
  p.step = step_base + step;
  return p;
}

void Segment::encode_acc(Range r, const float* acc, uint64_t step, uint8_t* wire,
                         uint64_t first) {
  quantize_float(r, acc, step, wire, first);
}

void Segment::encode_result(Range r, float* acc, uint64_t step, uint8_t* wire, uint64_t first) {
  if (average && status == ncclSuccess)
    record(compute.divide(compute, acc, r.size(), (float)average_over));
  if (status != ncclSuccess) return;
  set_stream(step, first);
  record(compute.quantize(compute, acc, r.size(), ncclFloat32, params, wire));
  // Error feedback leaves the result's own error behind (docs/allreduce.md).
  if (residual != nullptr && status == ncclSuccess)
    record(compute.clear(compute, residual + r.begin, r.size()));
}

void Segment::quantize_float(Range r, const float* v, uint64_t step, uint8_t* wire,
                             uint64_t first) {
  if (status != ncclSuccess) return;
  set_stream(step, first);
  record(compute.quantize(compute, v, r.size(), ncclFloat32, params, wire));
  if (residual == nullptr || status != ncclSuccess) return;
  float* e = residual + r.begin;  // already read into v: this is its one rewrite of the call
  record(compute.dequantize(compute, wire, r.size(), params, e, ncclFloat32, false));
  if (status == ncclSuccess) record(compute.residual(compute, v, e, r.size()));
}

void Segment::decode_output(const uint8_t* wire, Range r) const {
  if (status == ncclSuccess)
    record(compute.dequantize(compute, wire, r.size(), params, output(r), type, false));
}

void Segment::decode_outputs(const uint8_t* const* wires, const Range* ranges, int n) const {
  if (status != ncclSuccess || n == 0) return;
  std::vector<void*> dsts((size_t)n);
  std::vector<size_t> counts((size_t)n);
  for (int i = 0; i < n; i++) {
    dsts[i] = output(ranges[i]);
    counts[i] = ranges[i].size();
  }
  record(compute.decode_many(compute, wires, dsts.data(), counts.data(), n, params, type));
}

void Segment::store_result(float* acc) {
  if (average && status == ncclSuccess)
    record(compute.divide(compute, acc, count, (float)average_over));
  if (status == ncclSuccess) record(compute.narrow(compute, acc, count, type, y));
}

void Segment::copy_own(Range r) {
  if (status == ncclSuccess && input(r) != output(r))
    record(compute.copy(compute, input(r), output(r), r.size() * type_size));
}

void Segment::rotation_signs(size_t n, uint32_t* signs) {
  if (status == ncclSuccess && n > 0)
    record(compute.rotation_signs(compute, params.seed, n, signs));
}

void Segment::rotate(const void* const* srcs, const size_t* counts, int n, ncclDataType_t t,
                     const uint32_t* signs, float* const* zs) {
  if (status == ncclSuccess && n > 0)
    record(compute.rotate(compute, srcs, counts, n, t, rotation, signs, zs));
}

void Segment::unrotate(float* const* zs, const size_t* counts, int n, const uint32_t* signs,
                       void* const* dsts, ncclDataType_t t) const {
  if (status == ncclSuccess && n > 0)
    record(compute.unrotate(compute, zs, counts, n, rotation, signs, dsts, t));
}

void Segment::encode_pieces(const std::vector<Piece>& pieces) {
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    std::vector<const void*> srcs;
    std::vector<size_t> counts;
    std::vector<CodecParams> ps;
    std::vector<uint8_t*> wires;
    for (const Piece& p : pieces) {
      if (p.type != t) continue;
      srcs.push_back(p.values);
      counts.push_back(p.count);
      ps.push_back(stream_params_at(p.segment, p.step));
      wires.push_back(p.wire);
    }
    if (status != ncclSuccess || srcs.empty()) continue;
    record(compute.quantize_many(compute, srcs.data(), counts.data(), (int)srcs.size(), t,
                                 ps.data(), wires.data()));
  }
}

void Segment::decode_pieces(const std::vector<Piece>& pieces) const {
  for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16}) {
    std::vector<const uint8_t*> wires;
    std::vector<void*> dsts;
    std::vector<size_t> counts;
    for (const Piece& p : pieces) {
      if (p.type != t) continue;
      wires.push_back(p.wire);
      dsts.push_back(p.values);
      counts.push_back(p.count);
    }
    if (status != ncclSuccess || wires.empty()) continue;
    record(compute.decode_many(compute, wires.data(), dsts.data(), counts.data(),
                               (int)wires.size(), params, t));
  }
}

void Segment::widen_input(Range r, float* acc) const {
  if (status == ncclSuccess)
    record(compute.widen(compute, input(r), r.size(), input_type,
                         residual != nullptr ? residual + r.begin : nullptr, acc));
}

void Segment::reduce_input(Range r, const uint8_t* const* wires, int n, float* acc,
                           bool with_residual) const {
  const float* e = with_residual && residual != nullptr ? residual + r.begin : nullptr;
  if (status == ncclSuccess)
    record(compute.reduce(compute, input(r), r.size(), input_type, e, wires, n, params, acc));
}

bool Post::carries_bytes() const {
  for (int i = 0; i < nsends; i++)
    if (sends[i].len > 0) return true;
  for (int i = 0; i < nrecvs; i++)
    if (recvs[i].len > 0) return true;
  for (int i = 0; i < nops; i++)
    if (ops[i].count > 0) return true;
  return false;
}

ncclResult_t Segment::step(Post& post) const {
  if (status != ncclSuccess) return status;  // a compute step failed: send nothing
  if (lockstep != nullptr) return lockstep->step(lane, post);
  if (!post.carries_bytes()) return ncclSuccess;
  Post* one = &post;
  transfer(&one, 1);
  return post.result;  // its message is this thread's last error
}

ncclResult_t Segment::exchange(const Transfer* sends, int nsends, const Transfer* recvs,
                               int nrecvs) const {
  Post post(this, sends, nsends, recvs, nrecvs);
  return step(post);
}

ncclResult_t Segment::collectives(ncclComm_t on, const Collective* ops, int n) const {
  Post post(this, nullptr, 0, nullptr, 0);
  post.on = on;
  post.ops = ops;
  post.nops = n;
  return step(post);
}

namespace {

ncclResult_t post_collective(const Segment& s, ncclComm_t on, const Collective& c) {
  const NcclApi& n = *s.nccl;
  switch (c.kind) {
    case Collective::kReduceScatter:
      return n.reduceScatter(c.send, c.recv, c.count, s.type, ncclSum, on, s.stream);
    case Collective::kReduce:
      return n.reduce(c.send, c.recv, c.count, s.type, ncclSum, c.root, on, s.stream);
    case Collective::kAllGather:
      return n.allGather(c.send, c.recv, c.count, s.type, on, s.stream);
    case Collective::kBroadcast:
      return n.broadcast(c.send, c.recv, c.count, s.type, c.root, on, s.stream);
  }
  return ncclInternalError;
}

/* One post's sends, receives and collectives into the open group, under its
 * communicator's lock; from here until the group's end returns the group
 * holds them (an abort waits: comm_lifecycle.cc). */
ncclResult_t post_transfers(Post& p) {
  const Segment& s = *p.segment;
  std::lock_guard<std::mutex> lock(s.state->api);
  if (s.state->aborted) return ncclInvalidUsage;
  s.state->holds++;
  p.holding = true;
  for (int i = 0; i < p.nops; i++)
    if (p.ops[i].count > 0) QNCCL_CHECK(post_collective(s, p.on, p.ops[i]));
  for (int i = 0; i < p.nsends; i++) {
    if (p.sends[i].len == 0) continue;
    const Transfer& t = p.sends[i];
    QNCCL_CHECK(s.nccl->send(t.bytes, t.len, ncclUint8, t.peer, s.comm, s.stream));
    *s.wire_sent += t.len;
  }
  for (int i = 0; i < p.nrecvs; i++) {
    if (p.recvs[i].len == 0) continue;
    const Transfer& t = p.recvs[i];
    QNCCL_CHECK(s.nccl->recv(t.bytes, t.len, ncclUint8, t.peer, s.comm, s.stream));
  }
  return ncclSuccess;
}

}  // namespace

void transfer(Post* const* posts, size_t n) {
  if (n == 0) return;
  const NcclApi& nccl = *posts[0]->segment->nccl;
  const ncclResult_t start = nccl.groupStart();
  for (size_t i = 0; i < n; i++) {  // statistics: the group counts once per communicator
    CommState* state = posts[i]->segment->state;
    bool first = true;
    for (size_t j = 0; j < i && first; j++) first = posts[j]->segment->state != state;
    if (first) state->stats.groups.fetch_add(1, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < n; i++)
    posts[i]->result = start == ncclSuccess ? post_transfers(*posts[i]) : start;
  // Outside the locks: on a blocking communicator the group end may wait for
  // the peers, and an abort from another thread must get through (it stops
  // the group with ncclCommRevoke where NCCL has it, then waits for it).
  if (start == ncclSuccess) {
    const ncclResult_t end = nccl.groupEnd();  // always close the group we opened
    for (size_t i = 0; i < n; i++)
      if (posts[i]->result == ncclSuccess) posts[i]->result = end;
  }
  for (size_t i = 0; i < n; i++) {
    Post& p = *posts[i];
    if (p.holding) p.segment->state->holds--;  // NCCL has its operations now
    p.holding = false;
  }
  for (size_t i = 0; i < n; i++) {
    Post& p = *posts[i];
    const Segment& s = *p.segment;
    if (p.result == ncclInProgress) {
      s.in_progress = true;
      p.result = p.nsends + p.nrecvs > 0 ? wait_until_ready(nccl, s.comm, *s.state) : ncclSuccess;
      if (p.result == ncclSuccess && p.nops > 0) p.result = wait_until_ready(nccl, p.on, *s.state);
    }
    if (p.result == ncclSuccess) continue;
    std::lock_guard<std::mutex> lock(s.state->api);  // no abort frees the communicator meanwhile
    if (s.state->aborted) {
      set_error(ncclInvalidUsage, "quantized call: the communicator was aborted or destroyed "
                "(ncclCommAbort, ncclCommDestroy) during the call on rank %d", s.rank);
      p.result = ncclInvalidUsage;
    } else {
      const char* why = nccl.getLastError(p.nops > 0 ? p.on : s.comm);
      set_error(p.result, "quantized call: the NCCL %s of rank %d failed (%d): %s",
                p.nops > 0 ? "collectives inside the node" : "transfer", s.rank, (int)p.result,
                why != nullptr && why[0] != '\0' ? why : "no message");
    }
    p.message = last_error();
  }
}

ncclResult_t wait_until_ready(const NcclApi& nccl, ncclComm_t comm, CommState& state) {
  for (int polls = 0;; polls++) {
    ncclResult_t now = ncclInProgress;
    {
      std::lock_guard<std::mutex> lock(state.api);
      if (state.aborted)
        return set_error(ncclInvalidUsage, "the communicator was aborted or destroyed "
                         "(ncclCommAbort, ncclCommDestroy) while QNCCL waited for it");
      if (ncclResult_t res = nccl.commGetAsyncError(comm, &now); res != ncclSuccess) return res;
    }
    if (now != ncclInProgress) return now;
    // Yield first (transfers often end within microseconds), then sleep.
    if (polls < 1000)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

ncclResult_t Segment::all_to_all(const Transfer* to_peer, const Transfer* from_peer) const {
  for (int i = 1; i < nranks; i++) {
    const Transfer& send = to_peer[(rank + i) % nranks];
    const Transfer& recv = from_peer[(rank - i + nranks) % nranks];
    QNCCL_CHECK(exchange(&send, 1, &recv, 1));
  }
  return status;
}

}  // namespace qnccl
