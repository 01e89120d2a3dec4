/* qncclAllReduce: checks the arguments, then runs the chosen algorithm on
 * each segment of the buffer (docs/allreduce.md), computing on the host for
 * host buffers and with CUDA kernels on the caller's stream for device
 * buffers. */
#include <stdint.h>
#include <stdio.h>

#include <memory>
#include <vector>

#include "codec/codec_math.h"
#include "common/error.h"
#include "engine/comm_state.h"
#include "engine/engine.h"
#include "engine/report.h"
#ifdef QNCCL_WITH_CUDA
#include "codec/cuda_module.h"
#endif

namespace qnccl {
namespace {

ncclResult_t check_error_feedback(const char* fn, int error_feedback) {
  if (error_feedback == 0 || error_feedback == 1) return ncclSuccess;
  return set_error(ncclInvalidArgument,
                   "%s: errorFeedback = %d; allowed: 0 (off) or 1 (on)", fn, error_feedback);
}

ncclResult_t check_algo(const char* fn, const qncclAllReduceConfig_t& config) {
  if (config.algo < qncclAlgoAuto || config.algo > qncclAlgoHier)
    return set_error(ncclInvalidArgument,
                     "%s: algo = %d is unknown; allowed: qncclAlgoAuto (0), qncclAlgoRing (1), "
                     "qncclAlgoTree (2), qncclAlgoSra (3), qncclAlgoHier (4)",
                     fn, (int)config.algo);
  if (config.interAlgo < qncclAlgoAuto || config.interAlgo > qncclAlgoSra)
    return set_error(ncclInvalidArgument,
                     "%s: interAlgo = %d is not a flat algorithm; allowed: qncclAlgoAuto (0), "
                     "qncclAlgoRing (1), qncclAlgoTree (2), qncclAlgoSra (3)",
                     fn, (int)config.interAlgo);
  if (config.intraBits < 0 || config.intraBits > QNCCL_MAX_BITS)
    return set_error(ncclInvalidArgument,
                     "%s: intraBits = %d; allowed: 0 (exact inside a node) or %d..%d", fn,
                     config.intraBits, QNCCL_MIN_BITS, QNCCL_MAX_BITS);
  if (config.lanes < 0 || config.lanes > QNCCL_MAX_LANES)
    return set_error(ncclInvalidArgument,
                     "%s: lanes = %d; allowed: 0 (auto: 2 on device buffers, 1 on host "
                     "buffers) or 1..%d",
                     fn, config.lanes, QNCCL_MAX_LANES);
  return ncclSuccess;
}

Algorithm algorithm(qncclAlgo_t algo) {
  switch (algo) {
    case qncclAlgoTree: return tree;
    case qncclAlgoSra: return sra;
    case qncclAlgoHier: return hierarchical;
    default: return ring;
  }
}

/* Counts the call (it gets the next `call` number) and runs the algorithm
 * on each segment, in the workspace at `memory` of `size` (its lanes: see
 * run_pipelined); `residual` holds the buffer's error-feedback residuals,
 * or is nullptr. `device`: of the buffers, or -1. */
ncclResult_t run_segments(Segment& s, void* memory, const QuantizedCall& c, float* residual,
                          CommState& state, int device,
                          const cudaStream_t* lane_streams = nullptr) {
  const WorkspaceSize& size = c.need;
  const size_t count = c.count;
  s.call = c.point_to_point ? kP2pCall | state.p2p_calls++ : state.calls++;
  s.wire_sent = &state.stats.bytesOnWire;
  s.compute_steps = &state.stats.computeSteps;
  state.stats.callsCompressed++;
  state.stats.bytesIn += c.input_bytes;
  if (c.point_to_point) {  // the algorithm takes the segments of each operation itself
    Workspace w;
    w.assign(memory, size);
    return c.run(s, w);
  }
  const Segments segs = {static_cast<const char*>(c.sendbuff), static_cast<char*>(c.recvbuff),
                         residual, count, segment_values(*c.config), s.input_size, s.type_size};
  std::vector<Workspace> w(size.lanes);
  for (size_t j = 0; j < size.lanes; j++) w[j].assign(memory, size, j);
  return run_pipelined(s, segs, c.run, w.data(), size.lanes, device, lane_streams);
}

#ifdef QNCCL_WITH_CUDA
const char* memory_kind(int device) { return device >= 0 ? "device" : "host"; }

/* Whether the call's stream is being captured (device buffers, on `device`;
 * host buffers never are). The legacy stream while another stream of the
 * device captures is refused before anything is issued or counted, so a
 * retry once the capture has ended stays in step with the peers. */
ncclResult_t capture_status(Segment& s, int device, bool* capturing) {
  *capturing = false;
  if (device < 0) return ncclSuccess;
  const ncclResult_t res = stream_capturing(device, s.stream, capturing);
  if (res == ncclInvalidUsage) s.refused = true;
  return res;
}

/* The CUDA path: compute on the caller's stream, in the communicator's
 * device workspace (docs/allreduce.md, "Device buffers"). */
ncclResult_t run_on_device(Segment& s, int device, const QuantizedCall& c, CommState& state) {
  const WorkspaceSize& need = c.need;
  const void* sendbuff = c.sendbuff;
  void* recvbuff = c.recvbuff;
  const size_t count = c.count;
  const qncclAllReduceConfig_t& config = *c.config;
  DeviceWorkspace& ws = state.device;
  if (ws.device >= 0 && ws.device != device)
    return set_error(ncclInvalidArgument,
                     "quantized %s: the buffers are on device %d, but this communicator has "
                     "run on device %d; a communicator belongs to one device",
                     c.what, device, ws.device);
  if ((uintptr_t)sendbuff % s.type_size != 0 || (uintptr_t)recvbuff % s.type_size != 0)
    return set_error(ncclInvalidArgument,
                     "quantized %s: %s is not aligned to its %zu-byte elements; device buffers "
                     "must be",
                     c.what, (uintptr_t)sendbuff % s.type_size != 0 ? "sendbuff" : "recvbuff",
                     s.type_size);
  DeviceScope scope;  // the buffers' device, for the call
  QNCCL_CHECK(scope.enter(c.what, device));
  // Before any NCCL work of the call (a communicator the interposer adopted
  // has them already: cuda_module.h).
  QNCCL_CHECK(load_kernels(device));
  bool capturing = false;
  QNCCL_CHECK(capture_status(s, device, &capturing));
  // What the call needs is made now, captured or not (compute.h), so the
  // NCCL calls it issues never depend on this rank's history.
  if (need.bytes() > ws.bytes)
    QNCCL_CHECK(grow_device_workspace(ws, device, grown_bytes(ws.bytes, need.bytes()),
                                      state.calls, state.p2p_calls, capturing));
  float* residual = nullptr;
  if (config.errorFeedback && count > 0)
    QNCCL_CHECK(residual_for_call(s.comm, state, sendbuff, count, s.type, device, capturing,
                                  &residual));
  if (need.lanes > 1 && ws.lanes < need.lanes) QNCCL_CHECK(device_lanes_make(ws, need.lanes));
  s.compute = device_compute(s.stream);
  // Ordered after the communicator's previous call (and the memory just
  // made), with a call number from the device counter (each graph replay
  // takes a new one). Only a call of nothing on a communicator without a
  // workspace has neither.
  const bool counted = ws.calls != nullptr;
  uint64_t* counter = counted ? ws.calls + (c.point_to_point ? 2 : 0) : nullptr;
  if (counted) QNCCL_CHECK(device_call_begin(ws, s.stream, capturing, counter));
  s.device_call = counted ? counter + 1 : nullptr;
  ncclResult_t res = ncclSuccess;
  // Several lanes run on streams of their own, forked from the caller's and
  // joined back to it.
  cudaStream_t lanes[QNCCL_MAX_LANES];
  const bool forked = res == ncclSuccess && need.lanes > 1;
  if (forked) res = device_lanes_fork(ws, s.stream, need.lanes, lanes);
  if (res == ncclSuccess)
    res = run_segments(s, ws.memory, c, residual, state, device, forked ? lanes : nullptr);
  if (forked) {
    const ncclResult_t joined = device_lanes_join(ws, s.stream, need.lanes);
    if (res == ncclSuccess) res = joined;
  }
  if (counted) {
    const ncclResult_t end = device_call_end(ws, s.stream, capturing);
    if (res == ncclSuccess) res = end;
  }
  return res;
}
#endif

}  // namespace

ncclResult_t begin_call(Segment& s, const char* what, ncclComm_t comm, cudaStream_t stream,
                        const qncclAllReduceConfig_t& config, ncclDataType_t type,
                        ncclRedOp_t op) {
  char fn[48];
  snprintf(fn, sizeof fn, "quantized %s", what);
  QNCCL_CHECK(comm_shape(fn, comm, &s.nccl, &s.nranks, &s.rank));
  s.comm = comm;
  s.stream = stream;
  s.params = CodecParams{config.codec.bits, config.codec.bucketSize, config.codec.rounding,
                         config.codec.seed, 0, nullptr, 0, 0, 0, 0};
  // A rotated call quantizes values rotated already, on the uniform grid.
  s.params.cubic = config.codec.rotation == qncclRotationNone;
  s.clip = config.codec.clip;
  s.params.clip = clip_fraction(config.codec);
  s.rotation = rotation_block(config.codec);
  s.type = s.input_type = type;
  s.type_size = s.input_size = float_type_size(type);
  s.average = op == ncclAvg;
  s.average_over = s.nranks;
  s.stream_rank = (uint64_t)s.rank;
  return ncclSuccess;
}

namespace {

/* A hierarchical call that runs as the real library's exact `allreduce`:
 * on one node (its quantized stage runs between nodes, and there is one:
 * docs/allreduce.md, "Where nothing crosses a link"), or captured before its
 * node communicators exist (making them is an NCCL init). It takes no call
 * number and leaves error feedback's residuals untouched; `why` is said once
 * per communicator (`reported`). */
ncclResult_t run_exact(Segment& s, CommState& state, const std::function<ncclResult_t()>& allreduce,
                       bool& reported, const char* why) {
  if (!reported) {
    reported = true;
    info(s.comm, state.debug, ": %s", why);
  }
  state.stats.callsPassedThrough++;
  if (const ncclResult_t res = allreduce(); res != ncclSuccess)
    return set_error(res, "quantized allreduce (hierarchical, run exact): the exact call of %s "
                     "failed (%d)", s.nccl->path, (int)res);
  return ncclSuccess;
}

}  // namespace

ncclResult_t run_quantized(Segment& s, QuantizedCall c, CommState& state) {
  int device = -1;  // of the buffers (the checks made sure both are on the same side)
#ifdef QNCCL_WITH_CUDA
  if (c.count > 0) {
    char fn[48];
    snprintf(fn, sizeof fn, "quantized %s", c.what);
    QNCCL_CHECK(pointer_device(fn, c.sendbuff, &device));
  }
#endif
  c.need.lanes = c.point_to_point ? 1 : pipeline_lanes(c.algo, c.count, *c.config, device >= 0);
#ifdef QNCCL_WITH_CUDA
  if (device >= 0) return run_on_device(s, device, c, state);
  // The device's counter numbers every call of the communicator once it has one.
  if (state.device.calls != nullptr)
    QNCCL_CHECK(device_call_skipped(state.device, c.point_to_point));
#endif
  QNCCL_CHECK(host_compute(&s.compute));
  float* residual = nullptr;
  if (c.config->errorFeedback && c.count > 0)
    QNCCL_CHECK(residual_for_call(s.comm, state, c.sendbuff, c.count, s.type, -1, false,
                                  &residual));
  if (state.host_workspace_bytes < c.need.bytes()) {
    state.host_workspace.reset(new uint64_t[(c.need.bytes() + 7) / 8]);
    state.host_workspace_bytes = c.need.bytes();
  }
  return run_segments(s, state.host_workspace.get(), c, residual, state, -1);
}

size_t grown_bytes(size_t have, size_t need) { return need > 2 * have ? need : 2 * have; }

size_t segment_values(const qncclAllReduceConfig_t& config) {
  const size_t bucket = config.codec.bucketSize;
  const size_t want = config.segmentValues ? config.segmentValues : QNCCL_DEFAULT_SEGMENT_VALUES;
  return want < bucket ? bucket : want / bucket * bucket;
}

ncclResult_t check_allreduce_config(const char* fn, size_t count, ncclDataType_t type,
                                    ncclRedOp_t op, const qncclAllReduceConfig_t* config) {
  if (config == nullptr)
    return set_error(ncclInvalidArgument, "%s: config is NULL; pass a qncclAllReduceConfig_t", fn);
  QNCCL_CHECK(check_codec_config(fn, &config->codec));
  QNCCL_CHECK(check_codec_type(fn, "datatype", type));
  QNCCL_CHECK(check_algo(fn, *config));
  QNCCL_CHECK(check_error_feedback(fn, config->errorFeedback));
  if (op != ncclSum && op != ncclAvg)
    return set_error(ncclInvalidArgument,
                     "%s: op = %d is not a quantized reduction; allowed: ncclSum (0), ncclAvg (4)",
                     fn, (int)op);
  if (count > SIZE_MAX / 16)
    return set_error(ncclInvalidArgument, "%s: count = %zu is too large", fn, count);
  return ncclSuccess;
}

ncclResult_t check_buffers(const char* fn, const void* sendbuff, size_t send_bytes,
                           const void* recvbuff, size_t recv_bytes, const void* in_place,
                           const char* in_place_is) {
  if (recv_bytes > 0 && (sendbuff == nullptr || recvbuff == nullptr))
    return set_error(ncclInvalidArgument, "%s: %s is NULL; pass a buffer", fn,
                     sendbuff == nullptr ? "sendbuff" : "recvbuff");
  const uintptr_t s = (uintptr_t)sendbuff, r = (uintptr_t)recvbuff;
  if (recvbuff != in_place && s < r + recv_bytes && r < s + send_bytes)
    return set_error(ncclInvalidArgument,
                     "%s: sendbuff and recvbuff overlap without recvbuff being %s (in place); "
                     "pass that or disjoint buffers",
                     fn, in_place_is);
#ifdef QNCCL_WITH_CUDA
  if (recv_bytes > 0 && recvbuff != in_place) {
    int ds = -1, dr = -1;
    QNCCL_CHECK(pointer_device(fn, sendbuff, &ds));
    QNCCL_CHECK(pointer_device(fn, recvbuff, &dr));
    if ((ds >= 0) != (dr >= 0))
      return set_error(ncclInvalidArgument,
                       "%s: sendbuff is in %s memory and recvbuff in %s memory; pass both in "
                       "device memory (computed on the GPU) or both in host memory",
                       fn, memory_kind(ds), memory_kind(dr));
    if (ds != dr)
      return set_error(ncclInvalidArgument,
                       "%s: sendbuff is on device %d and recvbuff on device %d; pass both on "
                       "the communicator's device",
                       fn, ds, dr);
  }
#endif
  return ncclSuccess;
}

ncclResult_t check_no_error_feedback(const char* fn, const qncclAllReduceConfig_t& config) {
  if (!config.errorFeedback) return ncclSuccess;
  return set_error(ncclInvalidArgument,
                   "%s: errorFeedback = 1; error feedback applies to allreduce only: pass 0", fn);
}

ncclResult_t check_chunked_comm(const char* fn, ncclComm_t comm, size_t count,
                                const char* count_name, int* nranks, int* rank) {
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  const NcclApi* nccl;
  QNCCL_CHECK(comm_shape(fn, comm, &nccl, nranks, rank));
  if (count > SIZE_MAX / 16 / (size_t)*nranks)
    return set_error(ncclInvalidArgument, "%s: %s = %zu is too large for %d ranks", fn,
                     count_name, count, *nranks);
  return ncclSuccess;
}

ncclResult_t check_allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                             ncclDataType_t type, ncclRedOp_t op,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm) {
  QNCCL_CHECK(check_allreduce_config(fn, count, type, op, config));
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  const size_t bytes = count * float_type_size(type);
  return check_buffers(fn, sendbuff, bytes, recvbuff, bytes, sendbuff, "sendbuff");
}

qncclAlgo_t auto_algo(size_t count, ncclDataType_t type, int nranks, const Topology* topology) {
  if (topology != nullptr && topology->hierarchical()) return qncclAlgoHier;
  if (nranks == 1) return qncclAlgoRing;
  if (count * float_type_size(type) < (64u << 10)) return qncclAlgoTree;
  return nranks <= kAutoSraMaxRanks ? qncclAlgoSra : qncclAlgoRing;
}

qncclAlgo_t resolve_algo(qncclAlgo_t algo, size_t count, ncclDataType_t type, int nranks,
                         const Topology* topology) {
  return algo == qncclAlgoAuto ? auto_algo(count, type, nranks, topology) : algo;
}

qncclAlgo_t resolve_inter_algo(qncclAlgo_t inter, size_t count, ncclDataType_t type,
                               int local_ranks, int nodes) {
  return inter == qncclAlgoAuto ? auto_algo(count / (size_t)local_ranks, type, nodes) : inter;
}

namespace {

/* run_allreduce on the segment state `s`. */
ncclResult_t run_call(Segment& s, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, ncclRedOp_t op, const qncclAllReduceConfig_t& config,
                      ncclComm_t comm, cudaStream_t stream, CommState& state) {
  QNCCL_CHECK(begin_call(s, "allreduce", comm, stream, config, datatype, op));
  bool capturing = false;
#ifdef QNCCL_WITH_CUDA
  int device = -1;
  if (count > 0) QNCCL_CHECK(pointer_device("quantized allreduce", sendbuff, &device));
  QNCCL_CHECK(capture_status(s, device, &capturing));
#endif
  // Finding the node layout splits the communicator (an NCCL init): never
  // inside a capture (docs/allreduce.md, "Decisions every rank shares"). A
  // call of no values has no buffer to find its device by, and is taken for
  // uncaptured (it takes its call number like any other).
  const bool may_split = !capturing;
  if (config.algo == qncclAlgoAuto && may_split)
    QNCCL_CHECK(discover_topology(*s.nccl, comm, s.rank, s.nranks, state));
  qncclAlgo_t algo = resolve_algo(config.algo, count, datatype, s.nranks, &state.topology);
  auto exact = [&] {  // the real library's call
    return s.nccl->allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  };
  if (algo == qncclAlgoHier && !may_split && !state.topology.ready()) {
    if (config.algo == qncclAlgoAuto) {
      algo = resolve_algo(qncclAlgoAuto, count, datatype, s.nranks, nullptr);  // a flat one
    } else {
      return run_exact(s, state, exact, state.reported_capture_hier,
                       "a hierarchical call captured before its communicator's node layout and "
                       "node communicators were made runs exact (the real NCCL's); run one "
                       "uncaptured call first to have captured ones quantized");
    }
  }
  HierPlan plan = {};
  WorkspaceSize need;
  if (algo == qncclAlgoHier) {
    QNCCL_CHECK(discover_topology(*s.nccl, comm, s.rank, s.nranks, state));
    if (!state.topology.uniform) {
      s.refused = true;  // every rank refuses alike: nobody waits
      return set_error(ncclInvalidUsage,
                       "quantized allreduce: the hierarchical algorithm (QNCCL_ALGO=hier, "
                       "qncclAlgoHier) needs the same number of ranks on every node; this "
                       "communicator's nodes differ (this one, %s, has %d of its %d ranks): "
                       "use a flat algorithm (QNCCL_ALGO=auto picks one)",
                       state.topology.host.c_str(), state.topology.local_ranks, s.nranks);
    }
    const Topology& t = state.topology;
    if (t.nodes == 1)
      return run_exact(s, state, exact, state.reported_one_node,
                       "hierarchical on one node, nothing crosses a node link: quantized calls "
                       "run exact (the real NCCL's)");
    QNCCL_CHECK(make_hierarchy(*s.nccl, comm, s.rank, state));
    plan.topology = &t;
    plan.inter_algo = resolve_inter_algo(config.interAlgo, count, datatype, t.local_ranks, t.nodes);
    plan.inter = algorithm(plan.inter_algo);
    plan.intra_bits = config.intraBits;
    s.hier = &plan;
    need = hier_workspace_size(plan.inter_algo, count, config, t.local_ranks, t.nodes);
  } else {
    need = workspace_size(algo, count, config, s.nranks);
  }
  add_rotation(need, count, config);
  if (config.errorFeedback && algo == qncclAlgoRing && config.codec.bits <= 2 &&
      s.nranks >= 8 && !state.warned_feedback_ring) {
    state.warned_feedback_ring = true;
    warn("comm %p rank %d: error feedback on the ring algorithm at %d bits over %d ranks: each "
         "hop re-quantizes the residuals the hops before it fed in, and at 2 bits or fewer "
         "from 8 ranks on they grow without bound (docs/allreduce.md, \"Error feedback\"); "
         "use QNCCL_ALGO=sra or tree, or more bits (warned once per communicator)",
         (void*)comm, s.rank, config.codec.bits, s.nranks);
  }
  const QuantizedCall call = {
      "allreduce", algo, algorithm(algo), need, sendbuff, recvbuff, count, count * s.type_size,
      &config};
  return run_quantized(s, call, state);
}

}  // namespace

ncclResult_t run_allreduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           const qncclAllReduceConfig_t& config, ncclComm_t comm,
                           cudaStream_t stream, CommState& state, Lockstep* lockstep,
                           size_t lane) {
  return guarded_call("allreduce", state, lockstep, lane, [&](Segment& s) {
    return run_call(s, sendbuff, recvbuff, count, datatype, op, config, comm, stream, state);
  });
}

ncclResult_t guarded_call(const char* what, CommState& state, Lockstep* lockstep, size_t lane,
                          const std::function<ncclResult_t(Segment&)>& body) {
  if (const ncclResult_t failed = state.failure; failed != ncclSuccess) {
    std::lock_guard<std::mutex> lock(state.api);
    return set_error(failed, "quantized %s: an earlier quantized call on this communicator "
                     "failed (%s); its peers may still wait for it: abort the communicator "
                     "(ncclCommAbort)", what, state.failure_message.c_str());
  }
  Segment s;
  s.state = &state;
  s.lockstep = lockstep;
  s.lane = lane;
  const ncclResult_t res = body(s);
  if (res == ncclSuccess) return s.in_progress ? ncclInProgress : ncclSuccess;
  if (s.refused) return res;
  std::lock_guard<std::mutex> lock(state.api);
  if (state.failure == ncclSuccess) {
    state.failure_message = last_error();
    state.failure = res;
    note_comm_failed();
  }
  return res;
}

ncclResult_t choose_algo(const char* fn, size_t count, ncclDataType_t datatype, int nranks,
                         qncclAlgo_t* algo) {
  QNCCL_CHECK(check_codec_type(fn, "datatype", datatype));
  if (nranks < 1) return set_error(ncclInvalidArgument, "%s: nranks = %d; allowed: >= 1", fn, nranks);
  if (algo == nullptr)
    return set_error(ncclInvalidArgument, "%s: algo is NULL; pass a qncclAlgo_t*", fn);
  *algo = auto_algo(count, datatype, nranks);
  return ncclSuccess;
}

ncclResult_t allreduce_workspace_size(const char* fn, size_t count, ncclDataType_t datatype,
                                      const qncclAllReduceConfig_t* config, int nranks,
                                      size_t* bytes) {
  // The op does not change the workspace: check the rest as a sum would be.
  QNCCL_CHECK(check_allreduce_config(fn, count, datatype, ncclSum, config));
  if (nranks < 1) return set_error(ncclInvalidArgument, "%s: nranks = %d; allowed: >= 1", fn, nranks);
  if (bytes == nullptr) return set_error(ncclInvalidArgument, "%s: bytes is NULL; pass a size_t*", fn);
  const qncclAlgo_t algo = resolve_algo(config->algo, count, datatype, nranks);
  if (algo == qncclAlgoHier)
    return set_error(ncclInvalidArgument,
                     "%s: config->algo = qncclAlgoHier: its workspace depends on the "
                     "communicator's node layout, which nranks does not give; pass a flat "
                     "algorithm (the hierarchical one needs no more than its inter algorithm "
                     "over one rank's shard, plus the intra stage's with intraBits)", fn);
  WorkspaceSize need = workspace_size(algo, count, *config, nranks);
  add_rotation(need, count, *config);
  need.lanes = pipeline_lanes(algo, count, *config, /*device=*/true);
  *bytes = need.bytes();
  return ncclSuccess;
}

ncclResult_t allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                       ncclDataType_t datatype, ncclRedOp_t op,
                       const qncclAllReduceConfig_t* config, ncclComm_t comm,
                       cudaStream_t stream) {
  QNCCL_CHECK(check_allreduce(fn, sendbuff, recvbuff, count, datatype, op, config, comm));
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  return run_allreduce(sendbuff, recvbuff, count, datatype, op, *config, comm, stream, *state);
}

ncclResult_t get_stats(const char* fn, ncclComm_t comm, qncclStats_t* stats) {
  if (comm == nullptr || stats == nullptr)
    return set_error(ncclInvalidArgument, "%s: %s is NULL", fn, comm == nullptr ? "comm" : "stats");
  std::shared_ptr<CommState> state;
  QNCCL_CHECK(comm_state(comm, nullptr, &state));
  *stats = comm_stats(*state);
  return ncclSuccess;
}

}  // namespace qnccl
