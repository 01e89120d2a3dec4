/* The quantized allreduce engine: what its algorithms (ring.cc, tree.cc,
 * sra.cc) are written against. An algorithm is a short list of steps, each a
 * compute primitive (encode, decode, accumulate on the codec) or one
 * transport group (sends and receives of wire bytes through the real NCCL);
 * it never touches bytes itself. docs/allreduce.md is the specification.
 * The primitives run on the Compute of the call (engine/compute.h): host
 * code for host buffers, CUDA kernels on the caller's stream for device
 * buffers; the algorithms cannot tell which. */
#ifndef QNCCL_ENGINE_ENGINE_H_
#define QNCCL_ENGINE_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "engine/compute.h"
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

/* Reports an algorithm asking for more workspace than workspace_size() gave
 * it (a bug in QNCCL) and aborts. */
[[noreturn]] void workspace_overflow(size_t need, size_t have);

/* Typed view of a call's workspace memory. The algorithms resize() it to
 * what they use; that never exceeds what workspace_size() reserved (a
 * violation is a bug in QNCCL, reported and aborted on). */
template <class T>
class WorkArea {
 public:
  void assign(void* memory, size_t capacity) {
    data_ = static_cast<T*>(memory);
    capacity_ = capacity;
  }
  void resize(size_t n) const {
    if (n > capacity_) workspace_overflow(n * sizeof(T), capacity_ * sizeof(T));
  }
  T* data() const { return data_; }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

struct CommState;
struct Topology;
class Lockstep;
class Segment;
struct Workspace;
struct Post;

/* One algorithm on one segment. */
using Algorithm = ncclResult_t (*)(Segment&, Workspace&);

/* What a hierarchical call runs (engine/hierarchical.cc): the node layout
 * with its communicators, the algorithm between nodes, the bits inside one. */
struct HierPlan {
  const Topology* topology;
  Algorithm inter;
  qncclAlgo_t inter_algo;
  int intra_bits;  // 0: exact (the real NCCL's ncclReduceScatter)
};

/* One collective of the real NCCL in a group of them (Segment::collectives). */
struct Collective {
  enum Kind { kReduceScatter, kReduce, kAllGather, kBroadcast } kind;
  const void* send;
  void* recv;
  size_t count;  // per rank (ReduceScatter's recvcount, AllGather's sendcount)
  int root;      // kReduce, kBroadcast
};

/* One send or receive of a group of quantized point-to-point operations
 * (ncclSend/ncclRecv, docs/collectives.md "Send and receive"). */
struct P2pOp {
  bool send;
  void* buffer;  // const for a send
  size_t count;
  ncclDataType_t type;
  int peer;
};

/* The `call` of point-to-point calls' random streams: their own count with
 * this bit set, apart from the collectives' calls. */
constexpr uint64_t kP2pCall = 1ull << 63;

/* One segment of one call: everything an algorithm needs. */
class Segment {
 public:
  // Fixed for the call.
  const NcclApi* nccl;
  ncclComm_t comm;
  CommState* state;     // abort flag and the lock around calls into the real NCCL
  Lockstep* lockstep = nullptr;  // set when the segment runs in step with others
  size_t lane = 0;               // its lane of `lockstep`
  mutable bool in_progress = false;  // the real NCCL answered ncclInProgress (nonblocking comm)
  /* Failed before any transfer and before taking a call number, so the
   * communicator is not failed: on every rank alike (nobody waits), or on
   * this rank alone on a condition of the moment (the legacy stream while
   * another stream captures), where a retry stays in step with the peers. */
  bool refused = false;
  cudaStream_t stream;
  Compute compute;     // host code or CUDA kernels, by where the buffers live
  CodecParams params;  // params.stream is set per quantization
  qncclClip_t clip = qncclClipNone;  // the setting behind params.clip, for a stage's own bits
  ncclDataType_t type;  // of the output (and of the input, unless input_type says)
  size_t type_size;
  ncclDataType_t input_type;  // of x: `type`, or float32 for a stage fed by another
  size_t input_size;
  bool average;
  int average_over;  // avg divides by this: nranks, or the parent's for a stage
  int rank, nranks;
  uint64_t call;
  /* The random stream of quantization `step` is stream(call, index,
   * stream_rank, step_base + step): stream_rank is the rank of the call's
   * communicator, step_base keeps a stage's steps apart from another's. */
  uint64_t stream_rank;
  uint64_t step_base = 0;
  const HierPlan* hier = nullptr;  // qncclAlgoHier
  /* Device buffers: where the call's number is when its kernels run
   * (DeviceWorkspace::calls), which then override `call`. */
  const uint64_t* device_call = nullptr;
  std::atomic<uint64_t>* wire_sent;  // bytes this rank has sent (statistics)
  std::atomic<uint64_t>* compute_steps;  // compute steps issued (statistics)
  // This segment.
  uint64_t index;
  const char* x;  // this rank's input values of the segment
  char* y;        // its output values
  size_t count;
  /* Error feedback (docs/allreduce.md): this rank's float32 residuals of the
   * segment's values, or nullptr without it. The primitives add them where
   * they read the input and rewrite them where they quantize; every
   * algorithm reads each index's input once, before quantizing it once. */
  float* residual = nullptr;
  WorkArea<float> fed_input;
  /* docs/rotation.md: a rotated call's block (0: none). Each segment's
   * pieces are rotated into the workspace, the algorithm runs on them as
   * float32, and the result's pieces are rotated back into the output
   * (run_rotated, pipeline.cc). x and y each hold one piece (an allreduce's buffers, a
   * reduce-scatter's output, an allgather's input) or the N chunks of
   * chunk_stride values (`chunked_x`: a reduce-scatter's and an
   * all-to-all's input; `chunked_y`: an allgather's and an all-to-all's
   * output); `own_exact`: this rank's own chunk is copied bit for bit, never
   * rotated (an all-to-all's). */
  size_t rotation = 0;
  bool chunked_x = false, chunked_y = false, own_exact = false;

  /* The operations of a point-to-point call (run_sendrecv), in issue order. */
  const std::vector<P2pOp>* p2p = nullptr;

  /* A reduce-scatter, allgather or all-to-all (docs/collectives.md): values
   * from one chunk of its chunked buffers to the next (the API's per-rank
   * count); 0 for an allreduce. */
  size_t chunk_stride = 0;

  /* Chunk k (docs/allreduce.md, "Segments and chunks"). */
  Range chunk(int k) const;
  /* Chunk k (mod N) of the segment in a chunked buffer: its values
   * [k*chunk_stride, k*chunk_stride + count). */
  Range piece(int k) const;
  /* Most values any chunk of a segment of `values` can hold. */
  static size_t max_chunk(size_t values, size_t bucket, int nranks);
  size_t wire_bytes(size_t values) const;

  const char* input(Range r) const { return x + r.begin * input_size; }
  char* output(Range r) const { return y + r.begin * type_size; }

  /* Compute primitives. `step` numbers this rank's quantizations; `acc`
   * holds the values of range `r`. The first failure (a kernel that did not
   * launch) is kept in `status`; after it the primitives do nothing and
   * exchange() returns it, so the algorithm stops at its next transport
   * step. */
  void encode_input(Range r, uint64_t step, uint8_t* wire);          // wire = Q(x)
  /* encode_input(ranges[i], steps[i], wires[i]) for i < n, in one step
   * (with error feedback, whose residuals each quantization rewrites, one
   * after another). */
  void encode_inputs(const Range* ranges, const uint64_t* steps, int n, uint8_t* const* wires);
  /* Q(acc). `first`: r is the piece from value `first` of a larger
   * quantization on the same stream (the tree's pieces), 0 otherwise. */
  void encode_acc(Range r, const float* acc, uint64_t step, uint8_t* wire, uint64_t first = 0);
  /* The owner's result: avg divides by N, then wire = Q(acc); with error
   * feedback e[r] = 0 (the result's error is not fed back). */
  void encode_result(Range r, float* acc, uint64_t step, uint8_t* wire, uint64_t first = 0);
  void decode_output(const uint8_t* wire, Range r) const;
  /* decode_output(wires[i], ranges[i]) for i < n, in one step. */
  void decode_outputs(const uint8_t* const* wires, const Range* ranges, int n) const;
  void widen_input(Range r, float* acc) const;                 // acc = x (+ e)
  /* acc = x (+ e, with `residual`), then acc = acc + D(wires[j]) for each
   * of the n wires in order: one step. */
  void reduce_input(Range r, const uint8_t* const* wires, int n, float* acc,
                    bool residual = true) const;
  /* A reduce-scatter's result: avg divides acc by N, then output values
   * [0, count) = acc in the data type. */
  void store_result(float* acc);
  /* output(r) = input(r) bit for bit (an all-to-all's own chunk); nothing
   * when they are the same memory (in place). */
  void copy_own(Range r);
  /* docs/rotation.md: rotation_signs() makes the table of the first n sign
   * masks (n: the largest piece's count, at most `rotation`), one step;
   * rotate() sets zs[i] = the rotation of srcs[i] (counts[i] values of
   * `type`) with it for i < n, one step; unrotate() is its inverse, storing
   * into dsts[i] in `type`. */
  void rotation_signs(size_t n, uint32_t* signs);
  void rotate(const void* const* srcs, const size_t* counts, int n, ncclDataType_t type,
              const uint32_t* signs, float* const* zs);
  void unrotate(float* const* zs, const size_t* counts, int n, const uint32_t* signs,
                void* const* dsts, ncclDataType_t type) const;
  /* A piece of some buffer of a point-to-point call: `count` values of
   * `type` at `values`, quantized on the stream of (segment, step), its
   * bytes at `wire`. */
  struct Piece {
    void* values;
    size_t count;
    ncclDataType_t type;
    uint64_t segment, step;
    uint8_t* wire;
  };
  /* wire = Q(values) of each piece (one step per data type), and values =
   * D(wire) of each: the sends and receives of a point-to-point call. */
  void encode_pieces(const std::vector<Piece>& pieces);
  void decode_pieces(const std::vector<Piece>& pieces) const;

  /* Transport primitive: one group of sends and receives (zero-length ones
   * are skipped on both sides alike; a step with none makes no group, but
   * still counts as a step in lock-step). On a nonblocking communicator,
   * whose group end answers ncclInProgress, it waits (polling the real
   * NCCL's ncclCommGetAsyncError) until the transfers are done, so their
   * bytes can be used; an abort of the communicator ends the wait with an
   * error. Every rank of a call takes the same number of steps, and step k
   * of one rank only meets step k of its peers: that lets calls on several
   * communicators run in lock-step (run_collectives). */
  ncclResult_t exchange(const Transfer* sends, int nsends, const Transfer* recvs, int nrecvs) const;
  /* Transport primitive: an all-to-all, to_peer[k] sent to rank k and
   * from_peer[k] received from it (entries for this rank are ignored), as
   * nranks - 1 groups of shifted pairwise exchanges: in round i every rank
   * sends to rank + i and receives from rank - i, so no rank ever receives
   * from two peers at once (docs/allreduce.md, "Transport"). */
  ncclResult_t all_to_all(const Transfer* to_peer, const Transfer* from_peer) const;
  /* Transport primitive: collectives of the real NCCL on `on` (a
   * communicator of some of the call's ranks; `type`, ncclSum) in one group,
   * a step like exchange(): every rank of `on` takes it at the same point. */
  ncclResult_t collectives(ncclComm_t on, const Collective* ops, int n) const;

  mutable ncclResult_t status = ncclSuccess;

 private:
  /* Every compute step goes through here: counts it, keeps its failure. */
  void record(ncclResult_t res) const {
    compute_steps->fetch_add(1, std::memory_order_relaxed);
    if (status == ncclSuccess) status = res;
  }
  ncclResult_t step(Post& post) const;  // exchange() and collectives()
  /* params with the random stream of quantization `step` (from device_call
   * when set), from its value `first` on. */
  CodecParams stream_params(uint64_t step, uint64_t first = 0) const {
    return stream_params_at(index, step, first);
  }
  CodecParams stream_params_at(uint64_t segment, uint64_t step, uint64_t first = 0) const;
  void set_stream(uint64_t step, uint64_t first = 0) { params = stream_params(step, first); }
  /* wire = Q(v) of float32 values covering `r` on the stream of `step`; with
   * error feedback then e[r] = v - D(wire) (non-finite: 0). */
  void quantize_float(Range r, const float* v, uint64_t step, uint8_t* wire,
                      uint64_t first = 0);
};

/* The transfers (or collectives) of one step of one call, and how they
 * ended. */
struct Post {
  Post(const Segment* s, const Transfer* out, int nout, const Transfer* in, int nin)
      : segment(s), sends(out), nsends(nout), recvs(in), nrecvs(nin) {}
  const Segment* segment;
  const Transfer* sends;  // on segment->comm
  int nsends;
  const Transfer* recvs;
  int nrecvs;
  ncclComm_t on = nullptr;  // of the collectives
  const Collective* ops = nullptr;
  int nops = 0;
  ncclResult_t result = ncclSuccess;
  bool holding = false;  // counted in the state's holds (transfer())
  std::string message;  // of a failure

  bool carries_bytes() const;
};

/* Issues the posts' sends, receives and collectives in one real group,
 * waits out ncclInProgress on each of their communicators, and sets each
 * post's result (a failure with its message). The one place bytes reach the
 * real NCCL. */
void transfer(Post* const* posts, size_t n);

/* The workspace a call needs (docs/allreduce.md, "Workspace"), computed for
 * its first segment, the largest: float32 accumulator values, then wire
 * bytes starting at wire_offset(). One pure function for host and device. */
constexpr size_t kWorkspaceAlign = 256;  // of the wire area, as cudaMalloc aligns
struct WorkspaceSize {
  size_t acc_values = 0;
  size_t fed_input_values = 0;  // error feedback: Segment::fed_input
  size_t stage_values = 0;      // hierarchical: a stage's float32 result
  size_t rotated_values = 0;    // a rotated call: its pieces, rotated (docs/rotation.md)
  size_t sign_values = 0;       // and the signs' masks of one block
  size_t wire_bytes = 0;
  size_t lanes = 1;             // pipelined segments: one workspace per lane
  static size_t aligned(size_t bytes) {
    return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  }
  size_t wire_offset() const {
    return aligned((acc_values + fed_input_values + stage_values + rotated_values + sign_values) *
                   sizeof(float));
  }
  size_t lane_bytes() const { return aligned(wire_offset() + wire_bytes); }  // lanes' stride
  size_t bytes() const { return (lanes - 1) * lane_bytes() + wire_offset() + wire_bytes; }
};
/* Values per piece of the tree's pipeline (docs/allreduce.md, "Tree"). */
size_t tree_piece_values(size_t bucket);
/* W of docs/allreduce.md: values per segment. */
size_t segment_values(const qncclAllReduceConfig_t& config);
/* `algo` is ring, tree or SRA (resolve auto first); `config` is checked. */
WorkspaceSize workspace_size(qncclAlgo_t algo, size_t count, const qncclAllReduceConfig_t& config,
                             int nranks);
/* The same for qncclAlgoHier with `inter` (resolved) between `nodes` nodes of
 * `local_ranks` ranks. */
WorkspaceSize hier_workspace_size(qncclAlgo_t inter, size_t count,
                                  const qncclAllReduceConfig_t& config, int local_ranks,
                                  int nodes);

/* A rotated call's additions to `size` (docs/rotation.md): its first
 * segment's `pieces` pieces of `count` values each (the allreduce's one, a
 * chunked collective's N) rotated, and the signs of one block; none
 * without a rotation. */
void add_rotation(WorkspaceSize& size, size_t count, const qncclAllReduceConfig_t& config,
                  size_t pieces = 1);

/* The size to grow to: at least double, so the buffers outgrown on the way
 * add up to less than the current one. */
size_t grown_bytes(size_t have, size_t need);

/* Scratch memory of one call, in memory of the buffers' kind, sized by
 * workspace_size(). */
struct Workspace {
  WorkArea<float> acc;
  WorkArea<float> fed_input;
  WorkArea<float> stage;
  WorkArea<float> rotated;
  WorkArea<uint32_t> signs;
  WorkArea<uint8_t> wire;
  /* Points acc and wire into lane `lane`'s part of `memory`, size.bytes()
   * bytes aligned to 256. */
  void assign(void* memory, const WorkspaceSize& size, size_t lane = 0);
  uint8_t* slot(size_t i, size_t slot_bytes) { return wire.data() + i * slot_bytes; }
};

/* The segments of one call (docs/allreduce.md, "Segments and chunks"). */
struct Segments {
  const char* x;
  char* y;
  float* residual;  // error feedback, or nullptr
  size_t count;     // values of the call
  size_t values;    // W, of each segment but the last
  size_t input_size, type_size;
  size_t size() const { return (count + values - 1) / values; }
  /* Points `s` at segment g. */
  void place(Segment& s, size_t g) const;
};

/* Lanes of a hierarchical call's pipeline: its intra-node stage, two steps
 * between nodes and its allgather (a 2-node ring or SRA) each busy with a
 * different segment in every round. */
constexpr size_t kHierLanes = 4;
/* Lanes of a flat call's pipeline on device buffers unless the config says
 * otherwise: one computes while the other's bytes are in flight. */
constexpr size_t kFlatLanes = 2;
/* How many lanes the segments of a call of `count` values run on (1: one
 * after another): kHierLanes for hierarchical calls, else config.lanes (0:
 * kFlatLanes on device buffers, 1 on host ones), never more than there are
 * segments. A function of values every rank shares, so all agree. */
size_t pipeline_lanes(qncclAlgo_t algo, size_t count, const qncclAllReduceConfig_t& config,
                      bool device);
/* Runs `run` on every segment of `segs` (engine/pipeline.cc, docs/allreduce.md,
 * "Pipelined segments"): with one lane one after another in `w[0]`; with
 * more, lane j (on its own thread, in workspace w[j], on `device` when it is
 * not -1) runs segments j, j + lanes, ... A hierarchical call's lanes first
 * take j empty steps and move their steps together (each real group carries
 * steps of several segments); a flat call's lanes take turns (one computes
 * while another's group is in flight): engine/lockstep.h. `streams`
 * (device buffers, nullptr otherwise): lane j's kernels and transfers go on
 * streams[j] instead of the call's stream. Every segment's bytes are those
 * it has alone. The first failure, in segment order, is the call's. */
ncclResult_t run_pipelined(Segment& s, const Segments& segs, Algorithm run, Workspace* w,
                           size_t lanes, int device, const cudaStream_t* streams = nullptr);

ncclResult_t ring(Segment& s, Workspace& w);
ncclResult_t tree(Segment& s, Workspace& w);
ncclResult_t sra(Segment& s, Workspace& w);
ncclResult_t hierarchical(Segment& s, Workspace& w);  // needs s.hier
/* Reduce-scatters (docs/collectives.md); need s.chunk_stride. */
ncclResult_t reduce_scatter_ring(Segment& s, Workspace& w);
ncclResult_t reduce_scatter_sra(Segment& s, Workspace& w);
/* The allgather and all-to-all (docs/collectives.md); need s.chunk_stride. */
ncclResult_t direct_allgather(Segment& s, Workspace& w);
ncclResult_t direct_alltoall(Segment& s, Workspace& w);
/* The quantized sends and receives of s.p2p in one transport step
 * (sendrecv.cc). */
ncclResult_t sendrecv(Segment& s, Workspace& w);
/* The ring's reduce-scatter (ring.cc) over the parts part(s, k) (k mod N
 * taken care of by part): N - 1 hops; at hop `step` this rank sends
 * part(r - step), its input (step 0) or the partial sum in `acc`, encoded
 * (step `step`) from `out` to the right, and adds its input to the partial
 * sum of part(r - step - 1) that arrives in `in` from the left. `acc` ends
 * holding the sum of part(r + 1). */
ncclResult_t ring_reduce_scatter(Segment& s, Range (*part)(const Segment&, int), uint8_t* out,
                                 uint8_t* in, float* acc);
/* SRA's scatter-reduce (sra.cc) over the parts part(s, k) of the segment:
 * every rank's part k goes encoded (step k) to rank k, which adds them, in
 * rank order, to its own values (with their residual when `own_residual`)
 * in `acc`. Uses wire slots 0..2N-1 of `slot` bytes. */
ncclResult_t scatter_reduce(Segment& s, Workspace& w, Range (*part)(const Segment&, int),
                            size_t slot, bool own_residual, float* acc);

/* Auto picks SRA up to this many ranks (allreduce above 64 KiB, and
 * reduce-scatter), the ring beyond. */
constexpr int kAutoSraMaxRanks = 16;

/* docs/allreduce.md, "Choosing an algorithm": the flat algorithm for
 * `nranks` ranks, or qncclAlgoHier when `topology` (nullptr: one node)
 * allows it. */
qncclAlgo_t auto_algo(size_t count, ncclDataType_t type, int nranks,
                      const Topology* topology = nullptr);
/* `algo`, or auto_algo() when it is qncclAlgoAuto. */
qncclAlgo_t resolve_algo(qncclAlgo_t algo, size_t count, ncclDataType_t type, int nranks,
                         const Topology* topology = nullptr);
/* The algorithm hierarchical runs between `nodes` nodes of `local_ranks`
 * ranks: `inter`, or auto's pick for one rank's shard of the buffer. */
qncclAlgo_t resolve_inter_algo(qncclAlgo_t inter, size_t count, ncclDataType_t type,
                               int local_ranks, int nodes);

/* The checks of a quantized allreduce's arguments that need no communicator
 * or buffers (config, datatype, op, count); `fn` names the caller in
 * messages. */
ncclResult_t check_allreduce_config(const char* fn, size_t count, ncclDataType_t type,
                                    ncclRedOp_t op, const qncclAllReduceConfig_t* config);

/* All the checks of a quantized allreduce's arguments: the above, then the
 * communicator and the buffers. */
ncclResult_t check_allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                             ncclDataType_t type, ncclRedOp_t op,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm);

/* Waits until the real NCCL's ncclCommGetAsyncError(comm) leaves
 * ncclInProgress and returns what it reports then; an abort of the
 * communicator (state.aborted) ends the wait with an error. */
ncclResult_t wait_until_ready(const NcclApi& nccl, ncclComm_t comm, CommState& state);

/* Runs a checked quantized allreduce on `comm` and counts it in `state`.
 * Every transfer is complete when it returns (waited out on a nonblocking
 * communicator); it then answers ncclInProgress where the real NCCL did, so
 * the caller sees NCCL's protocol, and ncclCommGetAsyncError already reports
 * ncclSuccess. A failure is kept in `state`: later calls fail with it. */
ncclResult_t run_allreduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t type, ncclRedOp_t op,
                           const qncclAllReduceConfig_t& config, ncclComm_t comm,
                           cudaStream_t stream, CommState& state, Lockstep* lockstep = nullptr,
                           size_t lane = 0);

/* A checked quantized call, as a group defers it: an allreduce
 * (qncclCollAllReduce), reduce-scatter (qncclCollReduceScatter, `count` its
 * recvcount), allgather (qncclCollAllGather, its sendcount) or all-to-all
 * (qncclCollAllToAll, its per-peer count); `op` only for the reductions. */
struct CollectiveCall {
  qncclCollective_t kind;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  qncclAllReduceConfig_t config;
  ncclComm_t comm;
  cudaStream_t stream;
  std::vector<P2pOp> p2p;  // qncclCollSendRecv: the group's quantized sends and receives
};

/* Runs the quantized calls one group deferred (engine/lockstep.cc): the
 * calls of one communicator one after another in issue order, those of
 * different communicators in lock-step, every step of each inside one real
 * group, so that calls on several communicators of one process (one process
 * driving several GPUs, or ranks that issue a group's calls in different
 * orders) never wait for one another. Answers ncclInProgress where the real
 * NCCL did; the first failure, in issue order, otherwise. */
ncclResult_t run_collectives(const std::vector<CollectiveCall>& calls);

/* One quantized call, planned: run_quantized runs `run` on each segment of
 * `count` values (pipelined on lanes as pipeline_lanes(algo, ...) says) in
 * a workspace of `need`, on the host or, for device buffers, on the
 * caller's stream. */
struct QuantizedCall {
  const char* what;  // "allreduce", "reduce-scatter": for messages
  qncclAlgo_t algo;
  Algorithm run;
  WorkspaceSize need;
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // values per rank and chunk (allreduce: of the call)
  size_t input_bytes;  // of this rank's input (statistics)
  const qncclAllReduceConfig_t* config;
  /* A group's sends and receives (run_sendrecv): `run` once, on the
   * workspace of lane 0, with kP2pCall | the point-to-point call count as
   * its `call`. */
  bool point_to_point = false;
};
/* Points `s` at the call's communicator, stream, codec, type and op
 * (counting nothing yet). */
ncclResult_t begin_call(Segment& s, const char* what, ncclComm_t comm, cudaStream_t stream,
                        const qncclAllReduceConfig_t& config, ncclDataType_t type, ncclRedOp_t op);
/* Takes the call's number from the communicator and runs it. */
ncclResult_t run_quantized(Segment& s, QuantizedCall c, CommState& state);
/* Runs body(s) on a fresh segment state of a call on `state`'s communicator:
 * fails at once if an earlier quantized call there failed, keeps this call's
 * failure for the later ones (unless every rank refused it alike), and
 * answers ncclInProgress where the real NCCL did. */
ncclResult_t guarded_call(const char* what, CommState& state, Lockstep* lockstep, size_t lane,
                          const std::function<ncclResult_t(Segment&)>& body);
/* A reduce-scatter's, allgather's or all-to-all's config asking for error
 * feedback: an error naming `fn`. */
ncclResult_t check_no_error_feedback(const char* fn, const qncclAllReduceConfig_t& config);
/* The communicator checks of a call whose buffers hold a chunk of `count`
 * values (`count_name` in messages) per rank: non-NULL, of the real NCCL,
 * and not too many values for its ranks; gives its shape. */
ncclResult_t check_chunked_comm(const char* fn, ncclComm_t comm, size_t count,
                                const char* count_name, int* nranks, int* rank);
/* The buffer checks of a quantized call: non-NULL with data, not
 * overlapping unless recvbuff is `in_place` (named `in_place_is` in the
 * message), and (CUDA builds) both in host memory or both on one device. */
ncclResult_t check_buffers(const char* fn, const void* sendbuff, size_t send_bytes,
                           const void* recvbuff, size_t recv_bytes, const void* in_place,
                           const char* in_place_is);

/* A quantized reduce-scatter (reduce_scatter.cc, docs/collectives.md): the
 * checks of its configuration (no communicator needed), of all its
 * arguments, then, like run_allreduce, the call itself on `state`'s
 * communicator; reduce_scatter is both (qncclReduceScatter). */
ncclResult_t check_reduce_scatter_config(const char* fn, size_t recvcount, ncclDataType_t type,
                                         ncclRedOp_t op, const qncclAllReduceConfig_t* config);
ncclResult_t check_reduce_scatter(const char* fn, const void* sendbuff, void* recvbuff,
                                  size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                                  const qncclAllReduceConfig_t* config, ncclComm_t comm);
ncclResult_t run_reduce_scatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op,
                                const qncclAllReduceConfig_t& config, ncclComm_t comm,
                                cudaStream_t stream, CommState& state,
                                Lockstep* lockstep = nullptr, size_t lane = 0);
ncclResult_t reduce_scatter(const char* fn, const void* sendbuff, void* recvbuff,
                            size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                            const qncclAllReduceConfig_t* config, ncclComm_t comm,
                            cudaStream_t stream);
/* What qncclAlgoAuto runs for a reduce-scatter over nranks: SRA up to 16, ring beyond. */
qncclAlgo_t reduce_scatter_algo(qncclAlgo_t algo, int nranks);
/* A reduce-scatter's workspace (ring or SRA, resolved) for recvcount values per rank. */
WorkspaceSize reduce_scatter_workspace_size(qncclAlgo_t algo, size_t recvcount,
                                            const qncclAllReduceConfig_t& config, int nranks);

/* A quantized allgather (allgather.cc) and all-to-all (alltoall.cc),
 * docs/collectives.md: their checks, the call on `state`'s communicator
 * (like run_allreduce), and both (qncclAllGather, qncclAlltoAll). */
ncclResult_t check_gather_config(const char* fn, size_t count, ncclDataType_t type,
                                 const qncclAllReduceConfig_t* config);
ncclResult_t check_allgather(const char* fn, const void* sendbuff, void* recvbuff,
                             size_t sendcount, ncclDataType_t datatype,
                             const qncclAllReduceConfig_t* config, ncclComm_t comm);
ncclResult_t run_allgather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, const qncclAllReduceConfig_t& config,
                           ncclComm_t comm, cudaStream_t stream, CommState& state,
                           Lockstep* lockstep = nullptr, size_t lane = 0);
ncclResult_t allgather(const char* fn, const void* sendbuff, void* recvbuff, size_t sendcount,
                       ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                       ncclComm_t comm, cudaStream_t stream);
ncclResult_t check_alltoall(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                            ncclComm_t comm);
ncclResult_t run_alltoall(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, const qncclAllReduceConfig_t& config,
                          ncclComm_t comm, cudaStream_t stream, CommState& state,
                          Lockstep* lockstep = nullptr, size_t lane = 0);
ncclResult_t alltoall(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                      ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                      ncclComm_t comm, cudaStream_t stream);

/* The quantized sends and receives one group issued on `comm` (sendrecv.cc,
 * docs/collectives.md "Send and receive"), with `config` (its codec and
 * segments), as one point-to-point call; `stream` is the group's. */
ncclResult_t run_sendrecv(const std::vector<P2pOp>& ops, const qncclAllReduceConfig_t& config,
                          ncclComm_t comm, cudaStream_t stream, CommState& state,
                          Lockstep* lockstep = nullptr, size_t lane = 0);
/* Bytes a quantized send or receive of `count` values puts on the wire. */
size_t p2p_wire_bytes(size_t count, const qncclAllReduceConfig_t& config);

/* Behind the C API (src/api/api.cc); `fn` names the entry point in
 * messages. */
ncclResult_t choose_algo(const char* fn, size_t count, ncclDataType_t datatype, int nranks,
                         qncclAlgo_t* algo);                          // qncclAutoAlgo
ncclResult_t allreduce_workspace_size(const char* fn, size_t count, ncclDataType_t datatype,
                                      const qncclAllReduceConfig_t* config, int nranks,
                                      size_t* bytes);
ncclResult_t allreduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                       ncclDataType_t datatype, ncclRedOp_t op,
                       const qncclAllReduceConfig_t* config, ncclComm_t comm,
                       cudaStream_t stream);                          // qncclAllReduce
ncclResult_t get_stats(const char* fn, ncclComm_t comm, qncclStats_t* stats);
ncclResult_t allreduce_error_bound(const char* fn, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, const qncclAllReduceConfig_t* config,
                                   int nranks, double inputAbsMax, double* bound);
ncclResult_t collective_error_bound(const char* fn, qncclCollective_t collective, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op,
                                    const qncclAllReduceConfig_t* config, int nranks,
                                    double inputAbsMax, double* bound);

}  // namespace qnccl

#endif
