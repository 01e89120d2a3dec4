/* Communicators of the host backend: MPI start-up, creation (from an id, by
 * split, or of one rank; in the background for nonblocking ones), queries,
 * finalize, destroy and abort, and the registry that lets calls on a
 * destroyed or aborted communicator fail instead of touching freed memory. */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmath>
#include <mutex>
#include <vector>
#include <thread>
#include <unordered_map>

#include "common/env.h"
#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

constexpr double kDefaultInitTimeout = 60;

/* The communicators created and not destroyed or aborted, by handle. */
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_map<const ncclComm*, CommRef>& registry() {
  static auto* comms = new std::unordered_map<const ncclComm*, CommRef>();  // outlives exit
  return *comms;
}

int thread_level = MPI_THREAD_SINGLE;  // of the MPI this process runs (start_mpi)

/* atexit: finalize MPI when the backend initialized it and nobody else did. */
void finalize_mpi() {
  if (!mpi_finalized()) MPI_Finalize();
}

ncclResult_t start_mpi() {
  int initialized;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level);
    QNCCL_CHECK(mpi_result(rc, "starting MPI", "MPI_Init_thread"));
    atexit(finalize_mpi);
  } else {
    MPI_Query_thread(&thread_level);
  }
  return init_datatypes();
}

ncclResult_t init_timeout(const char* fn, double* seconds) {
  const char* text = env::get(env::Var::kHostInitTimeout);
  *seconds = kDefaultInitTimeout;
  if (text == nullptr) return ncclSuccess;
  char* end;
  *seconds = strtod(text, &end);
  if (*end != '\0' || !(*seconds > 0) || !std::isfinite(*seconds)) {
    return set_error(ncclInvalidArgument, "%s: QNCCL_HOST_INIT_TIMEOUT='%s': expected a positive "
                     "number of seconds (default %g)", fn, text, kDefaultInitTimeout);
  }
  return ncclSuccess;
}

/* Gives `comm` the MPI communicator it runs on. */
void attach(ncclComm* comm, MPI_Comm mpi) {
  MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);  // errors become NCCL codes, not aborts
  MPI_Comm_rank(mpi, &comm->rank);
  MPI_Comm_size(mpi, &comm->nranks);
  comm->mpi = mpi;
}

/* A new communicator in the registry: ready on `mpi`, or (MPI_COMM_NULL)
 * in progress until a background creation attaches one. */
CommRef make_comm(MPI_Comm mpi, int rank, int nranks, double timeout_s, bool blocking) {
  CommRef comm = std::make_shared<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_s = timeout_s;
  comm->blocking = blocking;
  if (mpi != MPI_COMM_NULL) {
    attach(comm.get(), mpi);
  } else {
    comm->state = ncclInProgress;
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[comm.get()] = comm;
  return comm;
}

/* Ends background work on `comm` (creation, split, finalize): it is ready,
 * or unusable for the reason the work's thread recorded. */
void finish_background(ncclComm* comm, ncclResult_t res) {
  if (res != ncclSuccess) {
    mark_unusable(comm, res, last_error());
    return;
  }
  ncclResult_t expected = ncclInProgress;
  comm->state.compare_exchange_strong(expected, ncclSuccess);
}

ncclResult_t check_config(const ncclConfig_t* config, const char* fn) {
  if (config != nullptr && config->magic != NCCL_API_MAGIC) {
    return set_error(ncclInvalidArgument, "%s: config was not initialized with "
                     "NCCL_CONFIG_INITIALIZER (magic 0x%x)", fn, config->magic);
  }
  if (config != nullptr && config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
      config->blocking != 1) {
    return set_error(ncclInvalidArgument, "%s: config->blocking = %d; allowed: 0 (nonblocking), "
                     "1 (blocking) or NCCL_CONFIG_UNDEF_INT (the default)", fn, config->blocking);
  }
  return ncclSuccess;
}

/* Whether a communicator made with `config` blocks: its `blocking` field, else
 * `inherited` (a split's parent), else NCCL_COMM_BLOCKING, else yes, as NCCL
 * decides it. */
ncclResult_t blocking_mode(const ncclConfig_t* config, std::optional<bool> inherited,
                           const char* fn, bool* blocking) {
  if (config != nullptr && config->blocking != NCCL_CONFIG_UNDEF_INT) {
    *blocking = config->blocking != 0;
  } else if (inherited) {
    *blocking = *inherited;
  } else {
    const char* text = env::get(env::Var::kNcclCommBlocking);
    if (text != nullptr && strcmp(text, "0") != 0 && strcmp(text, "1") != 0)
      return set_error(ncclInvalidArgument, "%s: NCCL_COMM_BLOCKING=%s is invalid; allowed: 0 or 1",
                       fn, text);
    *blocking = text == nullptr || strcmp(text, "0") != 0;
  }
  if (!*blocking && !mpi_thread_multiple())
    return set_error(ncclInvalidUsage,
                     "%s: a nonblocking communicator completes its work on a background thread, "
                     "which needs MPI at MPI_THREAD_MULTIPLE; this process initialized MPI with a "
                     "lower level: call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) (or let the "
                     "backend initialize MPI), or make the communicator blocking",
                     fn);
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config, const char* fn) {
  if (out == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  QNCCL_CHECK(check_config(config, fn));
  QNCCL_CHECK(ensure_mpi(fn));
  double timeout_s;
  QNCCL_CHECK(init_timeout(fn, &timeout_s));
  bool blocking = true;
  QNCCL_CHECK(blocking_mode(config, std::nullopt, fn, &blocking));
  if (blocking) {
    MPI_Comm mpi;
    QNCCL_CHECK(rendezvous(id, nranks, rank, timeout_s, &mpi));
    CommRef comm = make_comm(mpi, rank, nranks, timeout_s, true);
    comm->cuda_device = current_device();  // as NCCL's: the caller's current device
    *out = comm.get();
    return ncclSuccess;
  }
  // Nonblocking: the handle now, the rendezvous in the background.
  CommRef comm = make_comm(MPI_COMM_NULL, rank, nranks, timeout_s, false);
  comm->cuda_device = current_device();
  *out = comm.get();
  std::thread([comm, id, nranks, rank, timeout_s] {
    MPI_Comm mpi = MPI_COMM_NULL;
    const ncclResult_t res = rendezvous(id, nranks, rank, timeout_s, &mpi);
    if (res == ncclSuccess) attach(comm.get(), mpi);
    finish_background(comm.get(), res);
  }).detach();
  return ncclInProgress;
}

ncclResult_t check_split(int color, const ncclComm_t* newcomm, const ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  if (newcomm == nullptr) return set_error(ncclInvalidArgument, "%s: newcomm is NULL", fn);
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return set_error(ncclInvalidArgument, "%s: color %d: must be >= 0 or NCCL_SPLIT_NOCOLOR",
                     fn, color);
  }
  return check_config(config, fn);
}

/* Waits until every rank of `parent` has reached the split: the ranks' colors
 * and keys are gathered without blocking, and the wait ends, as a
 * collective's does, when `parent` is aborted or revoked from another thread. (An
 * aborted wait leaves MPI's request, and the memory it writes, behind.) */
ncclResult_t gather_split_arguments(const CommRef& parent, int color, int key) {
  auto all = std::make_shared<std::vector<int>>(2 * (size_t)parent->nranks);
  const int mine[2] = {color, key};
  MPI_Request request;
  QNCCL_CHECK(mpi_result(MPI_Iallgather(mine, 2, MPI_INT, all->data(), 2, MPI_INT, parent->mpi,
                                        &request), "ncclCommSplit", "MPI_Iallgather"));
  for (Deadline pace(0);; pace.pause()) {
    int done = 0;
    QNCCL_CHECK(mpi_result(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "ncclCommSplit",
                           "MPI_Test"));
    if (done) return ncclSuccess;
    if (parent->aborted || parent->revoked) {
      static std::mutex mutex;
      static std::vector<std::shared_ptr<std::vector<int>>> abandoned;  // MPI may still write
      std::lock_guard<std::mutex> lock(mutex);
      abandoned.push_back(all);
      return set_error(ncclInvalidUsage, "ncclCommSplit: the communicator was %s while the "
                       "split waited for its ranks", parent->aborted ? "aborted (ncclCommAbort)"
                       : "revoked (ncclCommRevoke)");
    }
  }
}

/* A split under way counts as a flight of its parent (ncclCommRevoke waits
 * for it) and, on the caller's thread (a blocking parent), holds the parent
 * as a group does: NVIDIA's NCCL frees a parent aborted under it. */
class SplitInFlight {
 public:
  SplitInFlight(const CommRef& parent, bool holds) : parent_(parent), holds_(holds) {
    parent_->flights++;
    if (holds_) parent_->holders++;
  }
  SplitInFlight(const SplitInFlight&) = delete;
  SplitInFlight& operator=(const SplitInFlight&) = delete;
  ~SplitInFlight() {
    parent_->flights--;
    if (holds_) parent_->holders--;
  }

 private:
  CommRef parent_;
  bool holds_;
};

/* MPI_Comm_split of `parent` into a registered child (or none), whose handle
 * goes to *newcomm, once every rank has arrived. */
ncclResult_t split(const CommRef& parent, int color, int key, bool child_blocking,
                   ncclComm_t* newcomm) {
  const SplitInFlight in_flight(parent, parent->blocking);
  QNCCL_CHECK(wait_device_work(*parent, "ncclCommSplit"));  // its MPI calls come first
  QNCCL_CHECK(gather_split_arguments(parent, color, key));
  MPI_Comm mpi;
  QNCCL_CHECK(mpi_result(MPI_Comm_split(parent->mpi, color, key, &mpi), "ncclCommSplit",
                         "MPI_Comm_split"));
  ncclComm_t child = nullptr;
  if (mpi != MPI_COMM_NULL)
    child = make_comm(mpi, 0, 0, parent->timeout_s, child_blocking).get();
  __atomic_store_n(newcomm, child, __ATOMIC_RELEASE);
  return ncclSuccess;
}

/* Destroy and abort: the communicator leaves the registry at once, so later
 * calls with its handle fail; the object goes when the last call or background
 * operation using it lets go. */
ncclResult_t release(ncclComm_t handle, const char* fn, bool abort) {
  if (handle == nullptr) return ncclSuccess;  // as NCCL
  CommRef comm;
  QNCCL_CHECK(acquire(handle, fn, &comm));
  if (comm->holders > 0) {
    // Safe here (references keep the communicator), but not in NVIDIA's NCCL.
    fprintf(stderr, "QNCCL WARN host backend: %s(%p) while a group holds operations on it (posted "
            "in a group still open, in an ncclGroupEnd that has not returned, or an "
            "ncclCommSplit of it under way): NVIDIA's NCCL frees the communicator under that "
            "group, which then uses freed memory. End the group first, or stop it with "
            "ncclCommRevoke (NCCL 2.28.7 and later) and wait for its call to return\n", fn,
            (const void*)handle);
  }
  // Work queued on device streams ends first (an abort ends it early instead).
  const ncclResult_t waited = abort ? ncclSuccess : wait_device_work(*comm, fn);
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(handle);
  }
  if (abort) comm->aborted = true;  // waits on it, in any thread, end now
  release_device_state(*comm);
  return waited;
}

ncclResult_t check_out(const void* out, const char* name, const char* fn) {
  return out != nullptr ? ncclSuccess : set_error(ncclInvalidArgument, "%s: %s is NULL", fn, name);
}

}  // namespace

Deadline::Deadline(double seconds)
    : length_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(seconds))) {
  restart();
}

void Deadline::restart() {
  last_progress_ = std::chrono::steady_clock::now();
  end_ = last_progress_ + length_;
}

void Deadline::pause() {
  // Spin (yielding) for 5 ms, then poll every 100 us. A waiting rank that
  // yields lets the ranks it waits for run, and sees its transfers end at
  // once; one that sleeps wakes late (on 4 ranks of a 2-core machine, a
  // 64 MiB quantized allreduce took 20-30% longer with a 1 ms spin, 50%
  // longer with none). NCCL's own host threads spin too.
  if (std::chrono::steady_clock::now() - last_progress_ < std::chrono::milliseconds(5)) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

ncclResult_t mpi_result(int rc, const char* fn, const char* what) {
  if (rc == MPI_SUCCESS) return ncclSuccess;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return set_error(ncclSystemError, "%s: %s failed: %.*s", fn, what, length, text);
}

ncclResult_t ensure_mpi(const char* fn) {
  static std::once_flag once;
  static ncclResult_t result;
  static std::string message;
  if (mpi_finalized()) return set_error(ncclSystemError, "%s: MPI is already finalized", fn);
  std::call_once(once, [] {
    result = start_mpi();
    message = last_error();
  });
  return result == ncclSuccess ? ncclSuccess : set_error(result, "%s: %s", fn, message.c_str());
}

bool mpi_thread_multiple() { return thread_level == MPI_THREAD_MULTIPLE; }

bool mpi_finalized() {
  int finalized;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

ncclResult_t acquire(const ncclComm* handle, const char* fn, CommRef* out) {
  if (handle == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(handle);
  if (it == registry().end()) {
    return set_error(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed, "
                     "aborted, or not made by this library)", fn, (const void*)handle);
  }
  *out = it->second;
  return ncclSuccess;
}

ncclResult_t acquire_ready(const ncclComm* handle, const char* fn, CommRef* out) {
  QNCCL_CHECK(acquire(handle, fn, out));
  ncclComm& comm = **out;
  const ncclResult_t state = comm.state;
  if (state == ncclInProgress) {
    return set_error(ncclInvalidArgument, "%s: the communicator is not ready: its previous "
                     "operation (or its creation) is still in progress; poll "
                     "ncclCommGetAsyncError until it reports ncclSuccess first", fn);
  }
  if (state != ncclSuccess) {
    std::lock_guard<std::mutex> lock(comm.mutex);
    return set_error(state, "%s: the communicator is unusable after an earlier error (%s); "
                     "destroy it with ncclCommAbort", fn, comm.message.c_str());
  }
  return ncclSuccess;
}

/* ncclCommGetAsyncError as NVIDIA's NCCL calls it on each operation's
 * communicator: through the PLT (its API functions are not bound locally),
 * so a library preloaded in front of it (libqnccl.so) answers. This library
 * binds its own calls locally (-Bsymbolic-functions); looking the function up
 * in the global scope does what NCCL's PLT does. */
ncclResult_t interposable_async_error(ncclComm* comm, ncclResult_t* result) {
  using Fn = ncclResult_t (*)(ncclComm_t, ncclResult_t*);
  static const Fn fn = [] {
    void* found = dlsym(RTLD_DEFAULT, "ncclCommGetAsyncError");
    return found != nullptr ? reinterpret_cast<Fn>(found) : &ncclCommGetAsyncError;
  }();
  return fn(comm, result);
}

ncclResult_t acquire_usable(const ncclComm* handle, const char* fn, CommRef* out) {
  QNCCL_CHECK(acquire_ready(handle, fn, out));
  if ((*out)->finalized) {
    return set_error(ncclInvalidUsage, "%s: the communicator was finalized (ncclCommFinalize); "
                     "only ncclCommDestroy may follow", fn);
  }
  if ((*out)->revoked) {
    return set_error(ncclInvalidUsage, "%s: the communicator was revoked (ncclCommRevoke); only "
                     "ncclCommDestroy or ncclCommAbort may follow (NCCL also allows a split "
                     "without shared resources; this backend does not)", fn);
  }
  // As NCCL checks each operation's communicator: through the exported
  // ncclCommGetAsyncError, called through the PLT, so an interposer in front
  // of this library (libqnccl.so) answers it too, with its own failures.
  ncclResult_t async = ncclSuccess;
  if (interposable_async_error(const_cast<ncclComm*>(handle), &async) == ncclSuccess &&
      async != ncclSuccess && async != ncclInProgress)
    return set_error(async, "%s: ncclCommGetAsyncError reports %s for this communicator: it is "
                     "unusable; destroy it with ncclCommAbort", fn, ncclGetErrorString(async));
  if (mpi_finalized()) return set_error(ncclSystemError, "%s: MPI is already finalized", fn);
  return ncclSuccess;
}

void mark_unusable(ncclComm* comm, ncclResult_t code, const std::string& message) {
  if (comm->revoked) return;  // it refuses every operation already, and reports no error
  std::lock_guard<std::mutex> lock(comm->mutex);
  const ncclResult_t state = comm->state;
  if (state != ncclSuccess && state != ncclInProgress) return;  // the first failure stays
  comm->message = message;
  comm->state = code;
}

}  // namespace host
}  // namespace qnccl

using namespace qnccl;
using namespace qnccl::host;

ncclComm::~ncclComm() {
  // MPI is only called from the threads it allows; elsewhere the communicator is let go.
  int mpi_done = 0, main_thread = 0;
  MPI_Finalized(&mpi_done);
  if (mpi == MPI_COMM_NULL || mpi_done) return;
  MPI_Is_thread_main(&main_thread);
  if (mpi_thread_multiple() || main_thread) MPI_Comm_free(&mpi);
}

QNCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  QNCCL_CHECK(check_out(version, "version", "ncclGetVersion"));
  *version = kNcclVersionCode;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  QNCCL_CHECK(check_out(uniqueId, "uniqueId", "ncclGetUniqueId"));
  QNCCL_CHECK(ensure_mpi("ncclGetUniqueId"));
  return new_unique_id(uniqueId);
}

QNCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                           int rank) {
  return init_rank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

/* The config's tuning fields have no meaning on the host; `blocking` does:
 * a nonblocking communicator returns at once with ncclInProgress and makes
 * its rendezvous in the background. */
QNCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                 ncclUniqueId commId, int rank,
                                                 ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

/* `ndev` ranks in this process, rank i on device devlist[i] (i without a
 * list): one rank on MPI_COMM_SELF, several as a clique whose operations
 * meet in this process (clique.cc). Blocking, as NCCL's are. */
QNCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  const char* fn = "ncclCommInitAll";
  QNCCL_CHECK(check_out(comm, "comm", fn));
  if (ndev < 1) return set_error(ncclInvalidArgument, "%s: ndev=%d: must be >= 1", fn, ndev);
  QNCCL_CHECK(ensure_mpi(fn));
  double timeout_s;
  QNCCL_CHECK(init_timeout(fn, &timeout_s));
  if (ndev == 1) {
    MPI_Comm self;
    QNCCL_CHECK(mpi_result(MPI_Comm_dup(MPI_COMM_SELF, &self), fn, "MPI_Comm_dup"));
    CommRef one = make_comm(self, 0, 1, timeout_s, true);
    one->cuda_device = devlist != nullptr ? devlist[0] : 0;
    comm[0] = one.get();
    return ncclSuccess;
  }
  if (!mpi_thread_multiple())
    return set_error(ncclInvalidUsage, "%s: ndev=%d: ranks in one process complete one another's "
                     "operations from their threads, which needs MPI at MPI_THREAD_MULTIPLE; "
                     "this process initialized MPI with a lower level", fn, ndev);
  std::shared_ptr<Clique> clique = make_clique(ndev);
  for (int i = 0; i < ndev; i++) {
    CommRef c = make_comm(MPI_COMM_NULL, i, ndev, timeout_s, true);
    c->clique = clique;
    c->cuda_device = devlist != nullptr ? devlist[i] : i;
    c->state = ncclSuccess;  // nothing to wait for: the ranks are here
    comm[i] = c.get();
  }
  return ncclSuccess;
}

/* Collective over `comm` like MPI_Comm_split (same ordering: key, then rank).
 * A rank whose arguments are invalid still takes part (without a color), so
 * the others do not wait for it forever. On a nonblocking parent the split
 * runs in the background: the call answers ncclSuccess at once (NCCL 2.28
 * does not pass its group's ncclInProgress on), the parent is in progress
 * until it ends, and *newcomm is written only then (as NCCL does): a caller
 * must poll the parent, whatever the answer. */
QNCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  CommRef parent;
  QNCCL_CHECK(acquire_usable(comm, fn, &parent));
  if (parent->clique)
    return set_error(ncclInvalidUsage, "%s: the communicator's ranks are in this process "
                     "(ncclCommInitAll): the host backend splits only communicators of one rank "
                     "per process (ncclCommInitRank under an MPI launcher)", fn);
  ncclResult_t arg_error = check_split(color, newcomm, config);
  bool child_blocking = parent->blocking;
  if (arg_error == ncclSuccess)
    arg_error = blocking_mode(config, parent->blocking, fn, &child_blocking);
  const std::string arg_message = last_error();
  const bool joins = arg_error == ncclSuccess && color != NCCL_SPLIT_NOCOLOR;
  const int mpi_color = joins ? color : MPI_UNDEFINED;
  if (newcomm != nullptr) *newcomm = nullptr;
  ncclComm_t* slot = arg_error == ncclSuccess ? newcomm : nullptr;
  if (parent->blocking) {
    ncclComm_t ignored;
    QNCCL_CHECK(split(parent, mpi_color, key, child_blocking, slot ? slot : &ignored));
    return arg_error == ncclSuccess ? ncclSuccess : set_error(arg_error, "%s", arg_message.c_str());
  }
  parent->state = ncclInProgress;
  std::thread([parent, mpi_color, key, child_blocking, slot] {
    ncclComm_t ignored;
    const ncclResult_t res = split(parent, mpi_color, key, child_blocking, slot ? slot : &ignored);
    finish_background(parent.get(), res);
  }).detach();
  return arg_error == ncclSuccess ? ncclSuccess : set_error(arg_error, "%s", arg_message.c_str());
}

/* No operation of a blocking communicator is ever pending; a nonblocking one
 * answers ncclInProgress and is finalized in the background (its operations
 * were complete: the caller waited for ncclSuccess before this call). */
QNCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, "ncclCommFinalize", &ref));
  QNCCL_CHECK(wait_device_work(*ref, "ncclCommFinalize"));
  ref->finalized = true;
  if (ref->blocking) return ncclSuccess;
  ref->state = ncclInProgress;
  std::thread([ref] { finish_background(ref.get(), ncclSuccess); }).detach();
  return ncclInProgress;
}

QNCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return release(comm, "ncclCommDestroy", false);
}

/* From any thread, whatever the communicator is doing: operations of it in
 * flight in other threads or in the background fail promptly, and the other
 * ranks' waits on this rank end with QNCCL_HOST_INIT_TIMEOUT. */
QNCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return release(comm, "ncclCommAbort", true);
}

/* As NCCL 2.28.7 and later: operations of the communicator in flight (a
 * group end on another thread, nonblocking work, work queued on device
 * streams) end with an error, later ones are refused, and nothing is freed;
 * returns once none is in flight (a split waiting for its ranks too). The
 * communicator's state stays ncclSuccess (NCCL's once it is quiescent); only
 * ncclCommDestroy or ncclCommAbort may follow (NCCL also allows a split). */
QNCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  CommRef ref;
  QNCCL_CHECK(acquire(comm, "ncclCommRevoke", &ref));
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    return set_error(ncclInvalidArgument, "ncclCommRevoke: revokeFlags is %d; the only value "
                     "allowed is NCCL_REVOKE_DEFAULT (0)", revokeFlags);
  }
  if (ref->finalized) {
    return set_error(ncclInvalidUsage, "ncclCommRevoke: the communicator was finalized "
                     "(ncclCommFinalize); only ncclCommDestroy may follow");
  }
  if (ref->revoked.exchange(true))
    return set_error(ncclInvalidUsage, "ncclCommRevoke: the communicator is revoked already");
  wait_device_work(*ref, "ncclCommRevoke");  // queued work fails as it comes (revoked)
  for (Deadline pace(0); ref->flights > 0 || ref->pending > 0; pace.pause()) {
  }
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, "ncclCommCount", &ref));
  QNCCL_CHECK(check_out(count, "count", "ncclCommCount"));
  *count = ref->nranks;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, "ncclCommUserRank", &ref));
  QNCCL_CHECK(check_out(rank, "rank", "ncclCommUserRank"));
  *rank = ref->rank;
  return ncclSuccess;
}

/* The device ncclCommInitAll gave the rank, or for ncclCommInitRank the
 * device of the context current when it was called (NCCL binds a
 * communicator to the caller's current device); -1 when none was (no CUDA
 * in the process: cudaSetDevice rejects -1, so code that assumes a GPU fails
 * loudly instead of using device 0). */
QNCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  CommRef ref;
  QNCCL_CHECK(acquire_ready(comm, "ncclCommCuDevice", &ref));
  QNCCL_CHECK(check_out(device, "device", "ncclCommCuDevice"));
  *device = ref->cuda_device;
  return ncclSuccess;
}

/* From any thread; makes no MPI call. */
QNCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  CommRef ref;
  QNCCL_CHECK(acquire(comm, "ncclCommGetAsyncError", &ref));
  QNCCL_CHECK(check_out(asyncError, "asyncError", "ncclCommGetAsyncError"));
  *asyncError = ref->state;
  return ncclSuccess;
}

QNCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (ncclGetLastError has details)";
    case ncclInternalError: return "internal error (ncclGetLastError has details)";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError has details)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError has details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "operation timed out";
    default: return "unknown result code";
  }
}

/* The error that made `comm` unusable (one that surfaced in the background
 * too), else the last error of the calling thread. */
QNCCL_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  CommRef ref;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = comm != nullptr ? registry().find(comm) : registry().end();
    if (it != registry().end()) ref = it->second;
  }
  if (ref) {
    std::lock_guard<std::mutex> lock(ref->mutex);
    if (!ref->message.empty()) {
      static thread_local std::string copy;
      copy = ref->message;
      return copy.c_str();
    }
  }
  return last_error();
}
