// all_reduce_perf: ncclAllReduce measured the nccl-tests way (docs/perf.md).
//
// Written against the plain NCCL API, so the same source runs on QNCCL's host
// backend and, built with CUDA, on GPUs with NVIDIA's NCCL. It does not link
// QNCCL: when libqnccl.so is preloaded it finds QNCCL's calls with dlsym and
// also reports what QNCCL did (configuration, bytes on the wire, the error
// bound a compressed result must meet).
#include <dlfcn.h>
#include <link.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <string>

#include "perf.h"
#include "qnccl.h"  // the types of QNCCL's calls; include <nccl.h> first

#ifdef QNCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// QNCCL's API when libqnccl.so is in the process, else all null.
struct Qnccl {
  decltype(&qncclGetVersion) get_version;
  decltype(&qncclConfigFromEnv) config_from_env;
  decltype(&qncclCommGetStats) comm_get_stats;
  decltype(&qncclAllReduceErrorBound) error_bound;
  decltype(&qncclAutoAlgo) auto_algo;

  Qnccl() {
    find(&get_version, "qncclGetVersion");
    find(&config_from_env, "qncclConfigFromEnv");
    find(&comm_get_stats, "qncclCommGetStats");
    find(&error_bound, "qncclAllReduceErrorBound");
    find(&auto_algo, "qncclAutoAlgo");
  }
  bool loaded() const {
    return get_version && config_from_env && comm_get_stats && error_bound && auto_algo;
  }

 private:
  template <class F>
  static void find(F* fn, const char* name) {
    *fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  }
};

const char* algo_name(qncclAlgo_t algo) {
  switch (algo) {
    case qncclAlgoRing: return "ring";
    case qncclAlgoTree: return "tree";
    case qncclAlgoSra: return "sra";
    case qncclAlgoHier: return "hier";
    default: return "auto";
  }
}

// Path of the loaded shared object that defines `symbol`, or of `soname`.
std::string library_path(const char* soname) {
  void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) return "?";
  link_map* map = nullptr;
  std::string path = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : "?";
  dlclose(handle);
  return path;
}

class NcclAllReduce : public perf::Backend {
 public:
  const char* tool() const override { return "all_reduce_perf"; }
  const char* library() const override { return "nccl"; }

  std::string unsupported(const perf::DataType&, const perf::ReduceOp&, perf::Memory) const override {
    return "";
  }

  bool init(int rank, int nranks, int local_rank, perf::Memory memory) override {
    rank_ = rank;
    nranks_ = nranks;
#ifdef QNCCL_PERF_CUDA
    if (memory == perf::Memory::Device) {
      int devices = 0;
      if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0 ||
          cudaSetDevice(local_rank % devices) != cudaSuccess ||
          cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "rank %d: cannot use a CUDA device: %s\n", rank,
                cudaGetErrorString(cudaGetLastError()));
        return false;
      }
    }
#else
    (void)local_rank;
    (void)memory;
#endif
    ncclUniqueId id;
    ncclResult_t made = rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (made != ncclSuccess) return report("ncclGetUniqueId", made);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (ncclResult_t r = ncclCommInitRank(&comm_, nranks, id, rank)) return report("ncclCommInitRank", r);
    if (qnccl_.loaded()) {
      // The communicator read the same QNCCL_* variables when it was created.
      if (ncclResult_t r = qnccl_.config_from_env(&config_)) return report("qncclConfigFromEnv", r);
    }
    return true;
  }

  std::string describe() const override {
    int version = 0;
    ncclGetVersion(&version);
    std::string text = "NCCL " + std::to_string(version / 10000) + "." +
                       std::to_string(version / 100 % 100) + "." + std::to_string(version % 100) +
                       " at " + library_path("libnccl.so.2") + "\n";
    if (!qnccl_.loaded()) return text + "QNCCL not loaded: every call is the plain NCCL's";
    Dl_info where{};
    dladdr(reinterpret_cast<void*>(qnccl_.get_version), &where);
    const qncclCodecConfig_t& codec = config_.allreduce.codec;
    char line[512];
    snprintf(line, sizeof line,
             "QNCCL %s at %s: enable=%d bits=%d bucket=%zu rounding=%s algo=%s min_bytes=%zu "
             "seed=%llu warmup_calls=%llu error_feedback=%d",
             qnccl_version().c_str(), where.dli_fname ? where.dli_fname : "?", config_.enable,
             codec.bits, codec.bucketSize, rounding_name(), algo_name(config_.allreduce.algo),
             config_.minBytes, (unsigned long long)codec.seed,
             (unsigned long long)config_.warmupCalls, config_.allreduce.errorFeedback);
    return text + line;
  }

  std::string quantization_json() const override {
    if (!qnccl_.loaded()) return "null";
    const qncclCodecConfig_t& codec = config_.allreduce.codec;
    char json[512];
    snprintf(json, sizeof json,
             "{\"version\": \"%s\", \"enable\": %d, \"bits\": %d, \"bucket_size\": %zu, "
             "\"rounding\": \"%s\", \"algo\": \"%s\", \"min_bytes\": %zu, \"seed\": %llu, "
             "\"warmup_calls\": %llu, \"error_feedback\": %d}",
             qnccl_version().c_str(), config_.enable, codec.bits, codec.bucketSize,
             rounding_name(), algo_name(config_.allreduce.algo), config_.minBytes,
             (unsigned long long)codec.seed, (unsigned long long)config_.warmupCalls,
             config_.allreduce.errorFeedback);
    return json;
  }

  bool allreduce(const void* send, void* recv, size_t count, const perf::DataType& type,
                 const perf::ReduceOp& op) override {
    ncclResult_t r = ncclAllReduce(send, recv, count, type.nccl, op.nccl, comm_, stream_);
    return r == ncclSuccess || report("ncclAllReduce", r);
  }

  bool wait() override {
#ifdef QNCCL_PERF_CUDA
    if (stream_ && cudaStreamSynchronize(stream_) != cudaSuccess) {
      fprintf(stderr, "rank %d: cudaStreamSynchronize: %s\n", rank_,
              cudaGetErrorString(cudaGetLastError()));
      return false;
    }
#endif
    return true;
  }

  bool wire_stats(perf::WireStats* stats) const override {
    qncclStats_t s;
    if (!qnccl_.loaded() || qnccl_.comm_get_stats(comm_, &s) != ncclSuccess) return false;
    stats->calls_compressed = s.callsCompressed;
    stats->bytes_in = s.bytesIn;
    stats->bytes_on_wire = s.bytesOnWire;
    return true;
  }

  bool quantization_bound(size_t count, const perf::DataType& type, const perf::ReduceOp& op,
                          double input_abs_max, double* bound, std::string* algo) const override {
    if (!qnccl_.loaded()) return false;
    qncclAlgo_t resolved = config_.allreduce.algo;
    if (resolved == qncclAlgoAuto &&
        qnccl_.auto_algo(count, type.nccl, nranks_, &resolved) != ncclSuccess) {
      return false;
    }
    *algo = algo_name(resolved);
    if (config_.allreduce.errorFeedback) return false;  // no per-call bound: see qnccl.h
    return qnccl_.error_bound(count, type.nccl, op.nccl, &config_.allreduce, nranks_,
                              input_abs_max, bound) == ncclSuccess;
  }

  void finalize() override {
    if (comm_) ncclCommDestroy(comm_);
#ifdef QNCCL_PERF_CUDA
    if (stream_) cudaStreamDestroy(stream_);
#endif
  }

 private:
  bool report(const char* call, ncclResult_t r) const {
    fprintf(stderr, "rank %d: %s failed: %s (%d): %s\n", rank_, call, ncclGetErrorString(r),
            (int)r, ncclGetLastError(comm_));
    return false;
  }
  std::string qnccl_version() const {
    int v = 0;
    qnccl_.get_version(&v);
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
           std::to_string(v % 100);
  }
  const char* rounding_name() const {
    return config_.allreduce.codec.rounding == qncclRoundNearest ? "nearest" : "stochastic";
  }

  Qnccl qnccl_;
  qncclEnvConfig_t config_{};
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, nranks_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  NcclAllReduce backend;
  return perf::run(argc, argv, backend);
}
