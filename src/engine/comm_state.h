/* What the engine keeps per communicator: its call count, statistics,
 * device workspace, error-feedback residuals, and its abort and failure
 * flags. Created on first use, dropped by ncclCommDestroy/ncclCommAbort
 * (exported by libqnccl.so). What only the interposer needs (the QNCCL_*
 * configuration, eligibility counters, quantized ops) is in shim/shim.h. */
#ifndef QNCCL_ENGINE_COMM_STATE_H_
#define QNCCL_ENGINE_COMM_STATE_H_

#include <stdint.h>

#include <atomic>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/topology.h"
#include "qnccl.h"

namespace qnccl {

/* The workspace of the communicator's calls on device buffers
 * (engine/compute_cuda.cc, docs/allreduce.md "Device buffers"): device
 * memory that only grows, so repeated calls allocate nothing and a CUDA
 * graph captured with it stays valid. Made, with its private stream, event
 * and call counter, by the first call that needs memory (captured or not);
 * freed when the communicator is forgotten, ordered after its calls on the
 * private stream, without waiting for the device. */
struct DeviceWorkspace {
  int device = -1;               // the device it lives on (-1: none yet)
  void* memory = nullptr;
  size_t bytes = 0;
  std::vector<void*> retired;    // outgrown buffers: a captured graph may still use them
  void* stream = nullptr;        // cudaStream_t of its frees (non-blocking, private)
  void* done = nullptr;          // cudaEvent_t recorded after each call (and graph replay)
  /* Pipelined calls (docs/allreduce.md, "Pipelined segments"): a stream per
   * lane (non-blocking, private), the event that forks them from the
   * caller's stream and one per lane that joins them back; made on first
   * use, `lanes` of each. */
  void* lane_streams[QNCCL_MAX_LANES] = {};
  void* lane_joins[QNCCL_MAX_LANES] = {};
  void* fork = nullptr;
  size_t lanes = 0;
  /* Device memory: [0] the next call number, [1] the current one; [2] and
   * [3] the same for point-to-point calls (CommState::p2p_calls), kept with
   * their kP2pCall bit (engine.h), as the codec's kernels read them. */
  uint64_t* calls = nullptr;
  static constexpr size_t kCallCounters = 4;
  bool async_alloc = false;      // the device has stream-ordered allocation (cudaMallocAsync)
};

/* Error feedback's residual of one buffer (docs/allreduce.md, "Error
 * feedback"): `count` float32 values, zero when made, in host memory or on
 * `device`; freed with the communicator or by a reset. */
class Residual {
 public:
  /* Zeroed residuals: in host memory for device < 0, else on `device` in
   * the communicator's workspace `ws` (engine/compute_cuda.cc;
   * `capturing`: the call's stream is being captured). */
  static ncclResult_t make(size_t count, int device, bool capturing, DeviceWorkspace* ws,
                           std::unique_ptr<Residual>* out);
  /* Frees the values: device memory that a captured call used is retired
   * with the workspace instead (a graph may still replay it). */
  ~Residual();
  Residual(const Residual&) = delete;
  Residual& operator=(const Residual&) = delete;

  float* values() const { return values_; }
  size_t count() const { return count_; }
  int device() const { return device_; }
  size_t bytes() const { return count_ * sizeof(float); }
  uint64_t last_use = 0;   // CommState::residual_uses when a call last used it
  bool captured = false;   // a call captured into a CUDA graph used it

 private:
  Residual(float* values, size_t count, int device, DeviceWorkspace* ws)
      : values_(values), count_(count), device_(device), ws_(ws) {}
  float* values_;
  size_t count_;
  int device_;          // -1: host memory
  DeviceWorkspace* ws_;  // device: the workspace whose stream frees it
};

/* Residuals by the buffer they belong to: (sendbuff, count, datatype). */
struct ResidualKey {
  const void* buffer;
  size_t count;
  ncclDataType_t type;
  bool operator<(const ResidualKey& o) const {
    return std::tie(buffer, count, type) < std::tie(o.buffer, o.count, o.type);
  }
};
using ResidualStore = std::map<ResidualKey, std::unique_ptr<Residual>>;

struct CommState {
  ~CommState();
  qncclDebugLevel_t debug = qncclDebugWarn;  // QNCCL_DEBUG when the state was made
  /* Set by ncclCommAbort (from any thread) before the real NCCL aborts the
   * communicator: a quantized call in flight stops at its next step, and
   * none starts; `api` is held around each call into the real NCCL, so the
   * abort waits for the one in progress to return. */
  std::atomic<bool> aborted{false};
  std::mutex api;
  /* QNCCL's uses of the communicator (or its node layout's) outside `api`
   * that may wait for peers: each group of a step from its first post until
   * its ncclGroupEnd returned, the layout's splits, measured auto's
   * agreement (CommHold). NCCL frees a communicator aborted under such a
   * use, which then reads freed memory: the abort waits for none to be left
   * (shim/comm_lifecycle.cc, quiesce). */
  std::atomic<int> holds{0};
  /* The failure of a quantized call that may have left peers waiting: every
   * later call fails with it, and ncclCommGetAsyncError reports it, so the
   * application aborts the communicator (docs/allreduce.md, "Failures"). */
  std::atomic<ncclResult_t> failure{ncclSuccess};
  std::string failure_message;  // under `api`
  uint64_t calls = 0;            // compressed calls so far: the `call` of the random streams
  /* This rank's quantized point-to-point calls so far (a group's sends and
   * receives on the communicator are one): kP2pCall | p2p_calls is their
   * `call` (docs/collectives.md, "Send and receive"). */
  uint64_t p2p_calls = 0;
  /* qncclStats_t's counters: updated by the calls, read from any thread
   * (qncclCommGetStats, the report of an abort from PyTorch's watchdog). */
  struct Counters {
    std::atomic<uint64_t> callsCompressed{0}, callsPassedThrough{0}, bytesIn{0}, bytesOnWire{0},
        residualBuffers{0}, residualBytes{0}, computeSteps{0}, groups{0};
  } stats;
  Topology topology;             // found by the first call that needs it
  DeviceWorkspace device;        // calls on device buffers
  /* Calls on host buffers: grown to the largest call's need, then kept
   * (fresh memory each call cost a page fault per page). */
  std::unique_ptr<uint64_t[]> host_workspace;
  size_t host_workspace_bytes = 0;
  ResidualStore residuals;       // error feedback
  uint64_t residual_uses = 0;    // calls that used a residual so far (their LRU clock)
  size_t residual_max_bytes = SIZE_MAX;  // QNCCL_ERROR_FEEDBACK_MAX_BYTES
  bool warned_residual_max = false;      // the first eviction was reported
  bool warned_feedback_ring = false;     // error feedback on a low-bit ring was reported
  bool reported_one_node = false;        // hierarchical calls on one node run exact: said
  bool reported_capture_hier = false;    // a hierarchical call captured too early ran exact: said
};

/* One of the uses `holds` counts, for its scope: taken under `api` unless
 * the communicator was aborted (held() is then false, and nothing may be
 * done with it). */
class CommHold {
 public:
  explicit CommHold(CommState& state) : state_(state) {
    std::lock_guard<std::mutex> lock(state.api);
    held_ = !state.aborted;
    if (held_) state.holds++;
  }
  CommHold(const CommHold&) = delete;
  CommHold& operator=(const CommHold&) = delete;
  ~CommHold() {
    if (held_) state_.holds--;
  }
  bool held() const { return held_; }

 private:
  CommState& state_;
  bool held_ = false;
};

/* The state of `comm`, made on first use with the debug level of `config`
 * (nullptr: from the environment; fails when the environment is bad). A
 * shared reference (common/registry.h). Like NCCL, one thread at a time
 * issues operations on a communicator; any thread may poll or abort it. */
ncclResult_t comm_state(ncclComm_t comm, const qncclEnvConfig_t* config,
                        std::shared_ptr<CommState>* state);

/* comm_state from the environment for the C API's calls on a communicator:
 * a NULL `comm` fails with a message that names `fn`. */
ncclResult_t checked_comm_state(const char* fn, ncclComm_t comm,
                               std::shared_ptr<CommState>* state);

/* Whether a quantized call has failed on any communicator of the process
 * (note_comm_failed() counts them): lets the interposed
 * ncclCommGetAsyncError, which the real NCCL also calls for each of its own
 * operations, answer without a lookup while none has. */
void note_comm_failed();
bool any_comm_failed();

/* The state of `comm` if it has one (nothing is made). */
std::shared_ptr<CommState> existing_comm_state(ncclComm_t comm);

/* Drops the state of a communicator that ends; a new one that reuses its
 * handle starts from call 0. The last reference frees its device memory,
 * ordered after its calls, without waiting for the device. */
void forget_comm(ncclComm_t comm);

/* The residual of a buffer in memory of `device` (-1: host), or nullptr. */
Residual* find_residual(CommState& state, const void* sendbuff, size_t count,
                        ncclDataType_t type, int device);

/* The residual values a call with error feedback on the buffer uses: found,
 * or made zeroed (reported at QNCCL_DEBUG=INFO). */
ncclResult_t residual_for_call(ncclComm_t comm, CommState& state, const void* sendbuff,
                               size_t count, ncclDataType_t type, int device, bool capturing,
                               float** values);

/* Frees the residuals of `state` (keeping the counters right). */
void clear_residuals(CommState& state);

/* Frees the residuals of every communicator (qncclResetErrorFeedback). */
void reset_all_error_feedback();

/* qncclCommResetErrorFeedback and qncclCommGetResidual; `fn` names the
 * caller in messages. */
ncclResult_t reset_error_feedback(const char* fn, ncclComm_t comm);
ncclResult_t get_residual(const char* fn, ncclComm_t comm, const void* sendbuff, size_t count,
                          ncclDataType_t datatype, float* residual);

/* qncclCommGetCallCounts and qncclCommSetCallCounts: the numbers the next
 * quantized collective and point-to-point calls of `comm` take; `fn` names
 * the caller in messages. */
ncclResult_t get_call_counts(const char* fn, ncclComm_t comm, uint64_t* calls,
                             uint64_t* p2p_calls);
ncclResult_t set_call_counts(const char* fn, ncclComm_t comm, uint64_t calls, uint64_t p2p_calls);

/* The statistics of `state`, its residuals' figures filled in. */
qncclStats_t comm_stats(const CommState& state);

}  // namespace qnccl

#endif
