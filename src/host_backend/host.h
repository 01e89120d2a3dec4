/* Internals of the host backend: the NCCL API on top of MPI
 * (docs/host-backend.md). A communicator is an MPI communicator whose ranks
 * are the NCCL ranks. On host memory, blocking communicators complete every
 * call before it returns (or at the outermost ncclGroupEnd inside a group);
 * nonblocking ones answer ncclInProgress and complete in the background,
 * readiness showing in ncclCommGetAsyncError, as NVIDIA's NCCL does. Work on
 * device memory is ordered on the caller's streams instead (streams.cc). */
#ifndef QNCCL_HOST_BACKEND_HOST_H_
#define QNCCL_HOST_BACKEND_HOST_H_

// MPI's C API only: its deprecated C++ bindings do not build warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "host_backend/cuda.h"

namespace qnccl {
namespace host {
class Clique;  // ranks of one communicator in this process (clique.cc)
}  // namespace host
}  // namespace qnccl

/* Per-communicator state of a PreMulSum op: the scalar, stored in its type. */
struct PreMulSum {
  ncclDataType_t type;
  unsigned char scalar[8];
};

/* A communicator. The handle the application holds is its address; the
 * backend keeps it alive through shared references (the registry of live
 * communicators, every call in progress on it, background work), so that a
 * destroy or an abort from another thread never frees it under a call. */
struct ncclComm {
  ~ncclComm();
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL until a nonblocking creation completes
  int rank = 0;
  int nranks = 0;
  double timeout_s = 0;  // QNCCL_HOST_INIT_TIMEOUT, read when the communicator was made
  bool blocking = true;
  /* What ncclCommGetAsyncError reports: ncclSuccess, ncclInProgress while a
   * nonblocking creation or operation runs, or the error that made the
   * communicator unusable (sticky; `message` says what happened). */
  std::atomic<ncclResult_t> state{ncclSuccess};
  std::atomic<int> pending{0};       // nonblocking operations not complete yet
  std::atomic<bool> aborted{false};  // ncclCommAbort was called: stop waiting for anything
  std::atomic<bool> revoked{false};  // ncclCommRevoke: in-flight operations end, none starts
  /* Threads whose group holds operations on this communicator: posted in a
   * group that is still open, or in a group end (or a call outside a group)
   * that has not returned. NVIDIA's NCCL frees a communicator destroyed or
   * aborted under such a group, whose end then uses freed memory: release()
   * reports it (group.cc, Holding). */
  std::atomic<int> holders{0};
  std::atomic<int> flights{0};  // operations of it in flight (group.cc): ncclCommRevoke waits
  std::atomic<bool> finalized{false};
  std::mutex mutex;                  // guards the members below
  std::string message;
  std::map<int, PreMulSum> premul_ops;  // ncclRedOp_t value -> op
  int next_op = ncclNumOps;  // index of the next PreMulSum op; its value is spread (datatypes.cc)
  /* Recorded after the communicator's last work on device memory (streams.cc):
   * its next work waits for it, so its MPI operations keep their issue order. */
  qnccl::host::CuEvent device_event = nullptr;
  /* The other ranks are in this process (ncclCommInitAll): operations meet
   * in the clique instead of in MPI (`mpi` stays MPI_COMM_NULL). */
  std::shared_ptr<qnccl::host::Clique> clique;
  int cuda_device = -1;  // ncclCommCuDevice: the device ncclCommInitAll gave the rank
};

namespace qnccl {
namespace host {

using CommRef = std::shared_ptr<ncclComm>;

/* The NCCL release whose ABI the backend implements (ncclGetVersion). */
constexpr int kNcclVersionCode = QNCCL_NCCL_VERSION_CODE(2, 32, 3);

/* Largest MPI message the backend sends: longer transfers are split, so counts
 * never overflow MPI's int and no single message reaches 2 GiB. */
constexpr size_t kMaxMessageBytes = size_t(1) << 30;

/* ---- MPI and communicators (comm.cc) ---------------------------------- */

/* Initializes MPI unless it already is, and the backend's MPI types and ops. */
ncclResult_t ensure_mpi(const char* fn);

/* A reference to `handle` when it is a communicator this process created and
 * has not destroyed or aborted; ncclInvalidArgument naming `fn` otherwise. */
ncclResult_t acquire(const ncclComm* handle, const char* fn, CommRef* out);

/* acquire(), and the communicator is ready: no nonblocking creation or
 * operation of it is in progress (NCCL answers ncclInvalidArgument to any
 * call made before ncclCommGetAsyncError reported ncclSuccess). Queries and
 * op creation need this. */
ncclResult_t acquire_ready(const ncclComm* handle, const char* fn, CommRef* out);

/* acquire_ready(), and the communicator may still run operations: not
 * finalized, not failed. */
ncclResult_t acquire_usable(const ncclComm* handle, const char* fn, CommRef* out);

/* Marks `comm` unusable after a failure (the first failure wins; a revoked
 * communicator stays as it is); later operations and ncclCommGetAsyncError
 * report `code` and `message`. */
void mark_unusable(ncclComm* comm, ncclResult_t code, const std::string& message);

/* The process's MPI thread level is MPI_THREAD_MULTIPLE: background progress
 * (nonblocking communicators) and MPI calls from a second thread need it. */
bool mpi_thread_multiple();

/* MPI_Finalize has run: no MPI call may follow. */
bool mpi_finalized();

/* Turns an MPI return code into ncclSystemError with MPI's message. */
ncclResult_t mpi_result(int rc, const char* fn, const char* what);

/* Polls for completion: a deadline that also yields the CPU between polls,
 * so oversubscribed ranks leave the cores to the peers they wait for. */
class Deadline {
 public:
  explicit Deadline(double seconds);
  bool passed() const { return std::chrono::steady_clock::now() >= end_; }
  void pause();      // between two unsuccessful polls
  void restart();    // progress was made: the full timeout starts again
 private:
  std::chrono::steady_clock::duration length_;
  std::chrono::steady_clock::time_point end_;
  std::chrono::steady_clock::time_point last_progress_;
};

/* ---- unique ids and rendezvous (rendezvous.cc) ------------------------ */

/* A new id whose rendezvous root is this process. */
ncclResult_t new_unique_id(ncclUniqueId* out);

/* Forms the MPI communicator of the processes that pass `id`, ordered by
 * `rank`; fails within about `timeout_s` (2x for non-root ranks) when the
 * ranks do not all arrive or disagree. */
ncclResult_t rendezvous(const ncclUniqueId& id, int nranks, int rank, double timeout_s,
                        MPI_Comm* out);

/* ---- data types and reduction ops (datatypes.cc) ----------------------- */

/* Creates the MPI types and ops of float16/bfloat16 (after MPI_Init). */
ncclResult_t init_datatypes();

/* The MPI type of an NCCL data type; ncclInvalidArgument for unknown ones and
 * those the backend does not support (fp8). */
ncclResult_t mpi_type(ncclDataType_t type, const char* fn, MPI_Datatype* out);

/* Bytes per element of a supported type. */
size_t type_size(ncclDataType_t type);

/* How one call reduces: MPI combines the ranks' values with `op`; PreMulSum
 * scales each rank's input first and ncclAvg divides the result by nranks. */
struct Reduction {
  ncclDataType_t type;
  MPI_Datatype mpi_type;
  MPI_Op op;
  std::optional<PreMulSum> premul;
  bool average = false;
};

/* Resolves (type, op) on `comm`; ncclInvalidArgument for unknown ones. */
ncclResult_t resolve_reduction(const ncclComm* comm, ncclDataType_t type, ncclRedOp_t op,
                               const char* fn, Reduction* out);

/* out[i] = in[i] * the PreMulSum scalar, in the arithmetic of the type. */
void premultiply(const Reduction& red, const void* in, void* out, size_t count);

/* buf[i] /= nranks (integers: truncating division, as NCCL's ncclAvg). */
void divide(ncclDataType_t type, void* buf, size_t count, int nranks);

/* ---- groups and execution (group.cc) ------------------------------------ */

/* What a collective put in flight: its MPI requests, what to do once all of
 * them completed (ncclAvg's division, copying out of a temporary), and the
 * temporaries that must live until then. */
struct Posted {
  std::vector<MPI_Request> requests;
  std::function<void()> finish;
  std::vector<std::shared_ptr<void>> keep;
};

/* Posts a collective's nonblocking MPI operations on its buffers (the
 * caller's, or host copies of them when they are device memory). */
using PostCollective = std::function<ncclResult_t(const void* send, void* recv, Posted*)>;

/* The bytes a collective reads (send) and writes (recv) on this rank. */
struct Buffers {
  const void* send;
  size_t send_bytes;
  void* recv;
  size_t recv_bytes;
};

struct P2p {
  CommRef comm;
  bool send;
  void* buf;
  size_t count;
  ncclDataType_t type;
  MPI_Datatype mpi_type;
  int peer;
  CuStream stream;
};

struct Collective {
  CommRef comm;
  PostCollective post;
  Buffers buffers;
  CuStream stream;
};

/* The operations of a group (or of one call outside any). */
struct Work {
  std::vector<P2p> p2p;
  std::vector<Collective> collectives;
};

/* Runs a collective of `comm` now, or at the outermost ncclGroupEnd inside a
 * group: on a blocking communicator it completes before this returns, on a
 * nonblocking one it returns ncclInProgress and completes in the background. */
ncclResult_t submit_collective(const CommRef& comm, const char* fn, const Buffers& buffers,
                               cudaStream_t stream, PostCollective post);

/* Posts every operation of `work` and waits for all of them on this thread:
 * the group end of a blocking communicator. A failure makes the
 * communicators unusable. */
ncclResult_t complete(Work work, const char* fn);

/* complete() for the host function of device work (streams.cc), which was
 * checked when it was queued: its communicators may since be in progress
 * with a nonblocking operation of their own (a split waits for this work
 * before its MPI calls), but one destroyed, aborted or failed since fails it
 * and makes all of them unusable, the error saying why. */
ncclResult_t complete_queued(Work work, const char* fn);

/* ---- ranks in one process (clique.cc) ------------------------------------ */

std::shared_ptr<Clique> make_clique(int nranks);

/* A send or receive of `bytes` at `buf` between ranks of a clique, matched
 * with its peer's in posting order per (sender, receiver), as MPI's are. */
ncclResult_t post_clique_message(const P2p& op, char* buf, size_t bytes, MPI_Request* out);

/* One rank's buffers in a collective of a clique. */
struct Part {
  const void* send;
  void* recv;
};
using RunTogether = std::function<void(const std::vector<Part>& parts)>;

/* Posts this rank's part of the clique's next collective (each rank posts
 * its collectives in the same order, as NCCL requires); the last rank to
 * post runs `run` with every rank's part, which completes all of them. */
ncclResult_t post_together(const CommRef& comm, Part part, RunTogether run, Posted* out);

/* ---- device memory (streams.cc) ------------------------------------------ */

/* Whether any buffer of `work` is device memory. */
bool on_device(const Work& work);

/* Queues `work` on its operations' streams, as NVIDIA's NCCL does: the
 * device buffers are copied to pinned host memory on their streams, the MPI
 * operations run in a host function, and what they received is copied back,
 * all in stream order (and captured into a graph when the streams capture,
 * where every replay runs them again). */
ncclResult_t enqueue_on_streams(Work work, const char* fn);

/* Waits on the host until the device work queued for `comm` is done: before
 * MPI calls outside stream order (host-memory work, split, destroy), which
 * must come after it on every rank. */
ncclResult_t wait_device_work(ncclComm& comm, const char* fn);

/* Lets go of the communicator's CUDA resources (from ncclCommDestroy or
 * ncclCommAbort, on the calling thread). */
void release_device_state(ncclComm& comm);

/* Inside a group, records the first error of the group's calls: the group
 * then fails as a whole at ncclGroupEnd. Returns `code`. */
ncclResult_t note_group_error(ncclResult_t code);

/* ---- chunking ----------------------------------------------------------- */

/* Calls fn(offset, n) over [0, count) in pieces of at most kMaxMessageBytes;
 * stops at the first error. */
template <class Fn>
ncclResult_t for_each_chunk(size_t count, size_t elem_size, Fn&& fn) {
  const size_t step = kMaxMessageBytes / elem_size;
  for (size_t offset = 0; offset < count; offset += step) {
    QNCCL_CHECK(fn(offset, (int)std::min(step, count - offset)));
  }
  return ncclSuccess;
}

}  // namespace host
}  // namespace qnccl

#endif
