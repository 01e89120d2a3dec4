/* The segments of a call (docs/allreduce.md, "Segments and chunks" and
 * "Pipelined segments"): one after another, or on lanes, each running every
 * L-th segment: a flat call's lanes take turns on the communicator (one
 * computes while another's bytes move); a hierarchical call's are staggered
 * by one step and move together, so that each real group carries different
 * stages of several segments at once. */
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/lockstep.h"
#ifdef QNCCL_WITH_CUDA
#include "codec/cuda_module.h"
#endif

namespace qnccl {

void Segments::place(Segment& s, size_t g) const {
  const size_t first = g * values;
  s.index = g;
  s.x = x + first * input_size;
  s.y = y + first * type_size;
  s.count = count - first < values ? count - first : values;
  s.residual = residual != nullptr ? residual + first : nullptr;
}

namespace {

/* What a rotated segment changes while its algorithm runs. */
struct Domain {
  const char* x;
  char* y;
  ncclDataType_t input_type, type;
  size_t input_size, type_size, chunk_stride;
};

Domain domain_of(const Segment& s) {
  return {s.x, s.y, s.input_type, s.type, s.input_size, s.type_size, s.chunk_stride};
}

void enter(Segment& s, const Domain& d) {
  s.x = d.x;
  s.y = d.y;
  s.input_type = d.input_type;
  s.type = d.type;
  s.input_size = d.input_size;
  s.type_size = d.type_size;
  s.chunk_stride = d.chunk_stride;
}

/* docs/rotation.md, "Collectives": the segment's pieces are rotated into
 * the workspace (N pieces of its `count` values, in rank order, or one),
 * the algorithm runs there as a float32 call (in place where x and y share
 * a piece, as the API allows), and the result's pieces are rotated back
 * into the output; an all-to-all's own chunk is copied exactly instead. */
ncclResult_t run_rotated(Segment& s, Algorithm run, Workspace& w) {
  const size_t m = s.count;
  const int n = s.nranks, r = s.rank;
  const bool chunked = s.chunked_x || s.chunked_y;
  w.rotated.resize((chunked ? (size_t)n : 1) * m);
  float* z = w.rotated.data();
  w.signs.resize(std::min(m, s.rotation));
  const size_t own = chunked ? (size_t)r * m : 0;  // a single piece's place among N
  std::vector<const void*> in;
  std::vector<void*> out;
  std::vector<float*> zin, zout;
  for (int k = 0; k < n; k++) {
    if (s.own_exact && k == r) continue;
    if (s.chunked_x) {
      in.push_back(s.input(s.piece(k)));
      zin.push_back(z + (size_t)k * m);
    }
    if (s.chunked_y) {
      out.push_back(s.output(s.piece(k)));
      zout.push_back(z + (size_t)k * m);
    }
  }
  if (!s.chunked_x) {
    in.push_back(s.x);
    zin.push_back(z + own);
  }
  if (!s.chunked_y) {
    out.push_back(s.y);
    zout.push_back(z + own);
  }
  const std::vector<size_t> counts((size_t)n, m);
  if (!in.empty())  // (an all-to-all on one rank rotates nothing: its own chunk is copied)
    s.rotation_signs(std::min(m, s.rotation), w.signs.data());
  s.rotate(in.data(), counts.data(), (int)in.size(), s.input_type, w.signs.data(), zin.data());
  if (s.status != ncclSuccess) return s.status;
  const Domain outside = domain_of(s);
  enter(s, Domain{reinterpret_cast<const char*>(s.chunked_x ? z : z + own),
                  reinterpret_cast<char*>(s.chunked_y ? z : z + own), ncclFloat32, ncclFloat32,
                  sizeof(float), sizeof(float), chunked ? m : 0});
  ncclResult_t res = run(s, w);
  enter(s, outside);
  QNCCL_CHECK(res);
  if (s.own_exact) s.copy_own(s.piece(r));
  s.unrotate(zout.data(), counts.data(), (int)out.size(), w.signs.data(), out.data(), s.type);
  return s.status;
}

/* Segment g of the call: placed, then run. */
ncclResult_t run_segment(Segment& s, const Segments& segs, size_t g, Algorithm run,
                         Workspace& w) {
  segs.place(s, g);
  if (s.rotation == 0) {
    QNCCL_CHECK(run(s, w));
    return s.status;
  }
  return run_rotated(s, run, w);
}

}  // namespace

size_t pipeline_lanes(qncclAlgo_t algo, size_t count, const qncclAllReduceConfig_t& config,
                      bool device) {
  const size_t W = segment_values(config), segments = (count + W - 1) / W;
  size_t most = kHierLanes;
  if (algo != qncclAlgoHier)
    most = config.lanes > 0 ? (size_t)config.lanes : device ? kFlatLanes : 1;
  return segments < most ? (segments > 0 ? segments : 1) : most;
}

namespace {

/* One lane: its own copy of the segment state, and how it ended. */
struct Lane {
  explicit Lane(const Segment& call) : s(call) {}
  Segment s;
  ncclResult_t result = ncclSuccess;
  size_t failed_at = 0;  // the segment
  std::string message;
};

/* Lane j: segments j, j + lanes, j + 2 lanes, ... until its first failure;
 * staggered lanes first take j empty steps. */
void run_lane(Lane& lane, const Segments& segs, Algorithm run, Workspace& w, size_t lanes,
              bool stagger, int device, cudaStream_t stream) {
  Segment& s = lane.s;
  s.fed_input = w.fed_input;
  ncclResult_t res = ncclSuccess;
#ifdef QNCCL_WITH_CUDA
  DeviceScope scope;  // the lane's thread computes on the buffers' device
  if (device >= 0) res = scope.enter("a pipelined call's lane", device);
  if (stream != nullptr) {
    s.stream = stream;
    s.compute = device_compute(stream);
  }
#else
  (void)device;
  (void)stream;
#endif
  for (size_t k = 0; stagger && res == ncclSuccess && k < s.lane; k++)
    res = s.exchange(nullptr, 0, nullptr, 0);
  for (size_t g = s.lane; res == ncclSuccess && g < segs.size(); g += lanes) {
    res = run_segment(s, segs, g, run, w);
    if (res != ncclSuccess) lane.failed_at = g;
  }
  if (res != ncclSuccess) {
    lane.result = res;
    lane.message = last_error();
  }
}

}  // namespace

ncclResult_t run_pipelined(Segment& s, const Segments& segs, Algorithm run, Workspace* w,
                           size_t lanes, int device, const cudaStream_t* streams) {
  if (lanes <= 1) {
    s.fed_input = w[0].fed_input;
    for (size_t g = 0; g < segs.size(); g++) QNCCL_CHECK(run_segment(s, segs, g, run, w[0]));
    return ncclSuccess;
  }
  // A hierarchical call's lanes use different links in one round; a flat
  // call's take turns on one, each computing while another's bytes move.
  // Each round or turn is one step of the call's own lane when the call
  // itself runs in lock-step with others (run_collectives).
  const bool hier = s.hier != nullptr;
  Lockstep lockstep(lanes, hier ? Lockstep::kTogether : Lockstep::kInTurn, s.lockstep, s.lane);
  std::vector<Lane> lane(lanes, Lane(s));
  for (size_t j = 0; j < lanes; j++) {
    lane[j].s.lockstep = &lockstep;
    lane[j].s.lane = j;
  }
  lockstep.run([&](size_t j) { run_lane(lane[j], segs, run, w[j], lanes, hier, device,
                                   streams != nullptr ? streams[j] : nullptr); },
               [&](size_t j, const char* why) {
                 lane[j].result = ncclSystemError;
                 lane[j].failed_at = j;
                 lane[j].message = std::string("quantized allreduce: could not start a thread "
                                               "for a lane of the pipelined segments: ") + why;
               });
  const Lane* failed = nullptr;
  for (const Lane& l : lane) {
    s.in_progress = s.in_progress || l.s.in_progress;
    if (l.result != ncclSuccess && (failed == nullptr || l.failed_at < failed->failed_at))
      failed = &l;
  }
  if (failed == nullptr) return ncclSuccess;
  return set_error(failed->result, "%s", failed->message.c_str());
}

}  // namespace qnccl
