/* Communicators of the host backend: MPI start-up, creation (from an id, by
 * split, or of one rank), queries, and the registry that lets calls on a
 * destroyed communicator fail instead of touching freed memory. */
#include <sched.h>
#include <stdlib.h>

#include <cmath>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "common/env.h"
#include "host_backend/host.h"

namespace qnccl {
namespace host {
namespace {

constexpr double kDefaultInitTimeout = 60;

/* The communicators created and not destroyed, by address. */
std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::unordered_set<const ncclComm*>& registry() {
  static std::unordered_set<const ncclComm*> comms;
  return comms;
}

bool mpi_finalized() {
  int finalized;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

/* atexit: finalize MPI when the backend initialized it and nobody else did. */
void finalize_mpi() {
  if (!mpi_finalized()) MPI_Finalize();
}

ncclResult_t start_mpi() {
  int initialized;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    QNCCL_CHECK(mpi_result(rc, "starting MPI", "MPI_Init_thread"));
    atexit(finalize_mpi);
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

/* Wraps an MPI communicator the backend now owns. */
ncclResult_t adopt(MPI_Comm mpi, double timeout_s, ncclComm_t* out) {
  MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);  // errors become NCCL codes, not aborts
  auto* comm = new ncclComm();
  comm->mpi = mpi;
  MPI_Comm_rank(mpi, &comm->rank);
  MPI_Comm_size(mpi, &comm->nranks);
  comm->timeout_s = timeout_s;
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().insert(comm);
  *out = comm;
  return ncclSuccess;
}

ncclResult_t check_config(const ncclConfig_t* config, const char* fn) {
  if (config != nullptr && config->magic != NCCL_API_MAGIC) {
    return set_error(ncclInvalidArgument, "%s: config was not initialized with "
                     "NCCL_CONFIG_INITIALIZER (magic 0x%x)", fn, config->magic);
  }
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                       const ncclConfig_t* config, const char* fn) {
  if (out == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  QNCCL_CHECK(check_config(config, fn));
  QNCCL_CHECK(ensure_mpi(fn));
  double timeout_s;
  QNCCL_CHECK(init_timeout(fn, &timeout_s));
  MPI_Comm mpi;
  QNCCL_CHECK(rendezvous(id, nranks, rank, timeout_s, &mpi));
  return adopt(mpi, timeout_s, out);
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

/* Destroy and abort alike: every operation completed before its call
 * returned (or was cancelled when a group timed out), so nothing is pending. */
ncclResult_t release(ncclComm_t comm, const char* fn) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  QNCCL_CHECK(check_live(comm, fn));
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase(comm);
  }
  if (!mpi_finalized()) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
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
  // Spin (yielding) for a millisecond, then poll every 100 us.
  if (std::chrono::steady_clock::now() - last_progress_ < std::chrono::milliseconds(1)) {
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

ncclResult_t check_live(const ncclComm* comm, const char* fn) {
  if (comm == nullptr) return set_error(ncclInvalidArgument, "%s: comm is NULL", fn);
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (registry().count(comm) == 0) {
    return set_error(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed, "
                     "aborted, or not made by this library)", fn, (const void*)comm);
  }
  return ncclSuccess;
}

ncclResult_t check_usable(const ncclComm* comm, const char* fn) {
  QNCCL_CHECK(check_live(comm, fn));
  if (comm->finalized) {
    return set_error(ncclInvalidUsage, "%s: the communicator was finalized (ncclCommFinalize); "
                     "only ncclCommDestroy may follow", fn);
  }
  if (comm->async_error != ncclSuccess) {
    return set_error(ncclInvalidUsage, "%s: the communicator is unusable after an earlier "
                     "error (%s); destroy it with ncclCommAbort", fn, comm->async_message.c_str());
  }
  if (mpi_finalized()) return set_error(ncclSystemError, "%s: MPI is already finalized", fn);
  return ncclSuccess;
}

void mark_unusable(ncclComm* comm, ncclResult_t code, const std::string& message) {
  comm->async_error = code;
  comm->async_message = message;
}

}  // namespace host
}  // namespace qnccl

using namespace qnccl;
using namespace qnccl::host;

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

/* The config's tuning fields have no meaning on the host; non-blocking
 * communicators still complete every call before it returns (ncclSuccess). */
QNCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                 ncclUniqueId commId, int rank,
                                                 ncclConfig_t* config) {
  return init_rank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

/* One process drives one rank here, so only a communicator of one rank can be
 * made without an MPI launcher's other processes. */
QNCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* /*devlist*/) {
  const char* fn = "ncclCommInitAll";
  QNCCL_CHECK(check_out(comm, "comm", fn));
  if (ndev < 1) return set_error(ncclInvalidArgument, "%s: ndev=%d: must be >= 1", fn, ndev);
  if (ndev > 1) {
    return set_error(ncclInvalidUsage, "%s: ndev=%d: the host backend runs one rank per process; "
                     "start the ranks under an MPI launcher and use ncclCommInitRank (only "
                     "ndev=1 works here)", fn, ndev);
  }
  QNCCL_CHECK(ensure_mpi(fn));
  double timeout_s;
  QNCCL_CHECK(init_timeout(fn, &timeout_s));
  MPI_Comm self;
  QNCCL_CHECK(mpi_result(MPI_Comm_dup(MPI_COMM_SELF, &self), fn, "MPI_Comm_dup"));
  return adopt(self, timeout_s, comm);
}

/* Collective over `comm` like MPI_Comm_split (same ordering: key, then rank).
 * A rank whose arguments are invalid still takes part (without a color), so
 * the others do not wait for it forever. */
QNCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t* config) {
  QNCCL_CHECK(check_usable(comm, "ncclCommSplit"));
  ncclResult_t arg_error = check_split(color, newcomm, config);
  bool joins = arg_error == ncclSuccess && color != NCCL_SPLIT_NOCOLOR;
  MPI_Comm mpi;
  QNCCL_CHECK(mpi_result(MPI_Comm_split(comm->mpi, joins ? color : MPI_UNDEFINED, key, &mpi),
                         "ncclCommSplit", "MPI_Comm_split"));
  if (arg_error != ncclSuccess) return arg_error;
  if (mpi == MPI_COMM_NULL) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  return adopt(mpi, comm->timeout_s, newcomm);
}

QNCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  QNCCL_CHECK(check_live(comm, "ncclCommFinalize"));
  comm->finalized = true;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return release(comm, "ncclCommDestroy");
}

QNCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm, "ncclCommAbort"); }

QNCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  QNCCL_CHECK(check_live(comm, "ncclCommCount"));
  QNCCL_CHECK(check_out(count, "count", "ncclCommCount"));
  *count = comm->nranks;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  QNCCL_CHECK(check_live(comm, "ncclCommUserRank"));
  QNCCL_CHECK(check_out(rank, "rank", "ncclCommUserRank"));
  *rank = comm->rank;
  return ncclSuccess;
}

/* No CUDA device backs a host communicator: -1, which cudaSetDevice rejects,
 * so code that assumes a GPU fails loudly instead of using device 0. */
QNCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  QNCCL_CHECK(check_live(comm, "ncclCommCuDevice"));
  QNCCL_CHECK(check_out(device, "device", "ncclCommCuDevice"));
  *device = -1;
  return ncclSuccess;
}

QNCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  QNCCL_CHECK(check_live(comm, "ncclCommGetAsyncError"));
  QNCCL_CHECK(check_out(asyncError, "asyncError", "ncclCommGetAsyncError"));
  *asyncError = comm->async_error;
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

/* The last error of the calling thread, whatever the communicator. */
QNCCL_EXPORT const char* ncclGetLastError(ncclComm_t /*comm*/) { return last_error(); }
