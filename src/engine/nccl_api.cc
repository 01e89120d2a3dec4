#include "engine/nccl_api.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "common/env.h"
#include "common/error.h"

namespace qnccl {
namespace {

struct Resolved {
  NcclApi api = {};
  char error[768] = "";
};

void* open_library() {
  // The NCCL the application already uses (PyTorch loads the wheel's copy).
  if (void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) return h;
  const char* path = env::get(env::Var::kNcclLib);
  return dlopen(path != nullptr ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
}

template <class Fn>
bool bind(void* handle, const char* name, Fn* fn, char* error, size_t len) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) snprintf(error, len, "the NCCL library has no %s", name);
  return *fn != nullptr;
}

Resolved resolve() {
  Resolved r;
  void* h = open_library();
  if (h == nullptr) {
    const char* path = env::get(env::Var::kNcclLib);
    snprintf(r.error, sizeof r.error,
             "cannot load the real NCCL (%s): %s. Set QNCCL_NCCL_LIB to the path of "
             "libnccl.so.2 (NVIDIA's, or build/host/libnccl.so.2 for host memory)",
             path != nullptr ? path : "libnccl.so.2 from the library path", dlerror());
    return r;
  }
  NcclApi& a = r.api;
  const bool ok = bind(h, "ncclGroupStart", &a.groupStart, r.error, sizeof r.error) &&
                  bind(h, "ncclGroupEnd", &a.groupEnd, r.error, sizeof r.error) &&
                  bind(h, "ncclSend", &a.send, r.error, sizeof r.error) &&
                  bind(h, "ncclRecv", &a.recv, r.error, sizeof r.error) &&
                  bind(h, "ncclCommCount", &a.commCount, r.error, sizeof r.error) &&
                  bind(h, "ncclCommUserRank", &a.commUserRank, r.error, sizeof r.error) &&
                  bind(h, "ncclCommDestroy", &a.commDestroy, r.error, sizeof r.error) &&
                  bind(h, "ncclCommAbort", &a.commAbort, r.error, sizeof r.error) &&
                  bind(h, "ncclCommGetAsyncError", &a.commGetAsyncError, r.error,
                       sizeof r.error) &&
                  bind(h, "ncclGetLastError", &a.getLastError, r.error, sizeof r.error) &&
                  bind(h, "ncclReduceScatter", &a.reduceScatter, r.error, sizeof r.error) &&
                  bind(h, "ncclReduce", &a.reduce, r.error, sizeof r.error) &&
                  bind(h, "ncclAllGather", &a.allGather, r.error, sizeof r.error) &&
                  bind(h, "ncclBroadcast", &a.broadcast, r.error, sizeof r.error) &&
                  bind(h, "ncclAllReduce", &a.allReduce, r.error, sizeof r.error) &&
                  bind(h, "ncclCommInitRank", &a.commInitRank, r.error, sizeof r.error) &&
                  bind(h, "ncclCommInitRankConfig", &a.commInitRankConfig, r.error,
                       sizeof r.error) &&
                  bind(h, "ncclCommInitAll", &a.commInitAll, r.error, sizeof r.error) &&
                  bind(h, "ncclCommSplit", &a.commSplit, r.error, sizeof r.error) &&
                  bind(h, "ncclRedOpCreatePreMulSum", &a.redOpCreatePreMulSum, r.error,
                       sizeof r.error) &&
                  bind(h, "ncclRedOpDestroy", &a.redOpDestroy, r.error, sizeof r.error) &&
                  bind(h, "ncclCommCuDevice", &a.commCuDevice, r.error, sizeof r.error);
  if (!ok) return r;
  // NCCL 2.28 added ncclAlltoAll, 2.28.7 ncclCommRevoke; an older library has none.
  a.alltoAll = reinterpret_cast<decltype(a.alltoAll)>(dlsym(h, "ncclAlltoAll"));
  a.commRevoke = reinterpret_cast<decltype(a.commRevoke)>(dlsym(h, "ncclCommRevoke"));
  struct link_map* map = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr)
    snprintf(a.path, sizeof a.path, "%s", map->l_name);
  return r;
}

}  // namespace

ncclResult_t real_nccl(const NcclApi** api) {
  static const Resolved resolved = resolve();
  if (resolved.error[0] != '\0') return set_error(ncclSystemError, "%s", resolved.error);
  *api = &resolved.api;
  return ncclSuccess;
}

ncclResult_t comm_shape(const char* what, ncclComm_t comm, const NcclApi** api, int* nranks,
                        int* rank) {
  QNCCL_CHECK(real_nccl(api));
  if ((*api)->commCount(comm, nranks) != ncclSuccess ||
      (*api)->commUserRank(comm, rank) != ncclSuccess)
    return set_error(ncclInvalidArgument, "%s: comm is not a communicator of %s", what,
                     (*api)->path);
  return ncclSuccess;
}

}  // namespace qnccl
