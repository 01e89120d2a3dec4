// The NCCL backend of the perf binaries (all_reduce_perf, reduce_scatter_perf,
// all_gather_perf, alltoall_perf, sendrecv_perf: docs/perf.md): the NCCL call
// of each collective.
//
// Written against the plain NCCL API, so the same source runs on QNCCL's host
// backend and, built with CUDA, on GPUs with NVIDIA's NCCL. It does not link
// QNCCL: when libqnccl.so is preloaded it finds QNCCL's calls with dlsym and
// also reports what QNCCL did (configuration, bytes on the wire, the error
// bound a compressed result must meet).
#include "nccl_backend.h"

#include <dlfcn.h>
#include <link.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "qnccl.h"  // the types of QNCCL's calls; include <nccl.h> first

#ifdef QNCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace perf {
namespace {

// QNCCL's API when libqnccl.so is in the process, else all null.
struct Qnccl {
  decltype(&qncclGetVersion) get_version;
  decltype(&qncclConfigFromEnv) config_from_env;
  decltype(&qncclCommGetStats) comm_get_stats;
  decltype(&qncclCollectiveErrorBound) error_bound;
  decltype(&qncclAutoAlgo) auto_algo;
  decltype(&qncclCommGetQuantization) get_quantization;
  decltype(&qncclCommGetTuning) get_tuning;

  Qnccl() {
    find(&get_version, "qncclGetVersion");
    find(&config_from_env, "qncclConfigFromEnv");
    find(&comm_get_stats, "qncclCommGetStats");
    find(&error_bound, "qncclCollectiveErrorBound");
    find(&auto_algo, "qncclAutoAlgo");
    find(&get_quantization, "qncclCommGetQuantization");
    find(&get_tuning, "qncclCommGetTuning");
  }
  bool loaded() const {
    return get_version && config_from_env && comm_get_stats && error_bound && auto_algo &&
           get_quantization && get_tuning;
  }

 private:
  template <class F>
  static void find(F* fn, const char* name) {
    *fn = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  }
};

// The NCCL calls a row issues, bound either to this binary's own symbols (which a
// preloaded QNCCL interposes) or to the plain library's (found in its own scope, so
// nothing preloaded in front of it answers).
struct NcclCalls {
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclAlltoAll) alltoall = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;

  static NcclCalls linked() {
    return {&ncclAllReduce, &ncclReduceScatter, &ncclAllGather, &ncclAlltoAll,
            &ncclSend,      &ncclRecv,          &ncclGroupStart, &ncclGroupEnd};
  }
  // The plain libnccl.so.2's own calls; all null when it is not loaded or lacks one.
  // (NVIDIA's NCCL still calls its exported ncclCommGetAsyncError through the PLT, which a
  // preloaded QNCCL answers; its collective entry points see none of these calls.)
  static NcclCalls plain() {
    NcclCalls c;
    void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!handle) return c;
    bool all = bind(handle, &c.all_reduce, "ncclAllReduce") &&
               bind(handle, &c.reduce_scatter, "ncclReduceScatter") &&
               bind(handle, &c.all_gather, "ncclAllGather") &&
               bind(handle, &c.send, "ncclSend") && bind(handle, &c.recv, "ncclRecv") &&
               bind(handle, &c.group_start, "ncclGroupStart") &&
               bind(handle, &c.group_end, "ncclGroupEnd");
    bind(handle, &c.alltoall, "ncclAlltoAll");  // NCCL 2.28 on
    dlclose(handle);  // still loaded: the binary links it
    return all ? c : NcclCalls{};
  }

 private:
  template <class F>
  static bool bind(void* handle, F* fn, const char* name) {
    *fn = reinterpret_cast<F>(dlsym(handle, name));
    return *fn != nullptr;
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

// The flag of a collective in QNCCL's policy.
qncclCollective_t flag_of(Collective c) {
  switch (c) {
    case Collective::ReduceScatter: return qncclCollReduceScatter;
    case Collective::AllGather: return qncclCollAllGather;
    case Collective::AlltoAll: return qncclCollAllToAll;
    case Collective::SendRecv: return qncclCollSendRecv;
    default: return qncclCollAllReduce;
  }
}

}  // namespace

class NcclBackend : public Backend {
 public:
  NcclBackend(const char* tool, Collective collective) : tool_(tool), collective_(collective) {}
  const char* tool() const override { return tool_; }
  const char* library() const override { return "nccl"; }
  std::string plain_library() const override {
    return have_plain_ ? library_path("libnccl.so.2") : "";
  }

  std::string unsupported(Collective, const DataType&, const ReduceOp&, Memory) const override {
    return "";
  }

  bool init(int rank, int nranks, int local_rank, Memory memory) override {
    rank_ = rank;
    nranks_ = nranks;
#ifdef QNCCL_PERF_CUDA
    if (memory == Memory::Device) {
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
      // The communicator read the same QNCCL_* variables when it was created;
      // what this binary's collective runs with is its own policy.
      if (ncclResult_t r = qnccl_.config_from_env(&config_)) return report("qncclConfigFromEnv", r);
      if (ncclResult_t r = qnccl_.get_quantization(comm_, flag_of(collective_), &bits_, &quantized_))
        return report("qncclCommGetQuantization", r);
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
    if (!config_.enable || bits_ == 0)
      return text + "QNCCL " + qnccl_version() + " at " + (where.dli_fname ? where.dli_fname : "?") +
             ": this collective is not quantized (QNCCL_ENABLE, QNCCL_COLLECTIVES)";
    const qncclCodecConfig_t& codec = quantized_.codec;
    char line[512];
    snprintf(line, sizeof line,
             "QNCCL %s at %s: enable=%d bits=%d bucket=%zu rounding=%s rotation=%s rotation_block=%zu "
             "clip=%s algo=%s min_bytes=%zu seed=%llu warmup_calls=%llu error_feedback=%d%s",
             qnccl_version().c_str(), where.dli_fname ? where.dli_fname : "?", config_.enable,
             codec.bits, codec.bucketSize, rounding_name(), rotation_name(), codec.rotationBlock,
             clip_name(), algo_name(quantized_.algo),
             config_.minBytes, (unsigned long long)codec.seed,
             (unsigned long long)config_.warmupCalls, quantized_.errorFeedback,
             measured() ? " measured" : "");
    text += line;
    if (measured())
      text += "\nmeasured auto: a size's first calls are its trials (docs/tuning.md), " +
              std::to_string(settling_calls()) +
              " untimed calls settle it (--settle); the algo column says what it chose";
    return text;
  }

  std::string quantization_json() const override {
    if (!qnccl_.loaded() || !config_.enable || bits_ == 0) return "null";
    const qncclCodecConfig_t& codec = quantized_.codec;
    char json[512];
    snprintf(json, sizeof json,
             "{\"version\": \"%s\", \"enable\": %d, \"bits\": %d, \"bucket_size\": %zu, "
             "\"rounding\": \"%s\", \"rotation\": \"%s\", \"rotation_block\": %zu, "
             "\"clip\": \"%s\", \"algo\": \"%s\", \"min_bytes\": %zu, \"seed\": %llu, "
             "\"warmup_calls\": %llu, \"error_feedback\": %d, \"measured\": %s}",
             qnccl_version().c_str(), config_.enable, codec.bits, codec.bucketSize,
             rounding_name(), rotation_name(), codec.rotationBlock, clip_name(),
             algo_name(quantized_.algo), config_.minBytes, (unsigned long long)codec.seed,
             (unsigned long long)config_.warmupCalls, quantized_.errorFeedback,
             measured() ? "true" : "false");
    return json;
  }

  bool start(Collective c, const void* send, void* recv, size_t count, const DataType& type,
             const ReduceOp& op) override {
    return issue(linked_, c, send, recv, count, type, op);
  }

  bool start_plain(Collective c, const void* send, void* recv, size_t count,
                   const DataType& type, const ReduceOp& op) override {
    return have_plain_ && issue(plain_, c, send, recv, count, type, op);
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

  bool wire_stats(WireStats* stats) const override {
    qncclStats_t s;
    if (!qnccl_.loaded() || qnccl_.comm_get_stats(comm_, &s) != ncclSuccess) return false;
    stats->calls_compressed = s.callsCompressed;
    stats->bytes_in = s.bytesIn;
    stats->bytes_on_wire = s.bytesOnWire;
    return true;
  }

  bool quantization_bound(Collective c, size_t count, const DataType& type, const ReduceOp& op,
                          double input_abs_max, double* bound, std::string* algo) const override {
    if (!qnccl_.loaded() || bits_ == 0) return false;
    qncclAllReduceConfig_t config = quantized_;
    const bool direct = c != Collective::AllReduce && c != Collective::ReduceScatter;
    if (measured()) {
      const qncclTuning_t* row = nullptr;
      std::vector<qncclTuning_t> table;
      if (!tuning(&table)) return false;
      const int size_class = 63 - __builtin_clzll((unsigned long long)(count * type.size));
      for (const qncclTuning_t& t : table)
        if (t.collective == flag_of(c) && t.datatype == type.nccl && t.sizeClass == size_class)
          row = &t;
      if (row == nullptr || row->choice < 0) return false;  // not settled: no single bound
      const int choice = row->candidates[row->choice];
      if (choice == QNCCL_EXACT_CANDIDATE) return false;  // ran exact: not compressed
      if (!direct) config.algo = (qncclAlgo_t)choice;
    } else if (c == Collective::AllReduce && config.algo == qncclAlgoAuto &&
               qnccl_.auto_algo(count, type.nccl, nranks_, &config.algo) != ncclSuccess) {
      return false;
    }
    *algo = direct ? "direct" : algo_name(config.algo);
    if (config.errorFeedback) return false;  // no per-call bound: see qnccl.h
    return qnccl_.error_bound(flag_of(c), count, type.nccl, op.nccl, &config, nranks_,
                              input_abs_max, bound) == ncclSuccess;
  }

  int settling_calls() const override {
    // every trial, then the decision
    return measured() ? QNCCL_TRIALS_PER_CANDIDATE * QNCCL_MAX_CANDIDATES + 1 : 0;
  }

  void finalize() override {
    if (comm_) ncclCommDestroy(comm_);
#ifdef QNCCL_PERF_CUDA
    if (stream_) cudaStreamDestroy(stream_);
#endif
  }

 private:
  bool issue(const NcclCalls& nccl, Collective c, const void* send, void* recv, size_t count,
             const DataType& type, const ReduceOp& op) {
    switch (c) {
      case Collective::ReduceScatter:
        return check(nccl.reduce_scatter(send, recv, count, type.nccl, op.nccl, comm_, stream_),
                     "ncclReduceScatter");
      case Collective::AllGather:
        return check(nccl.all_gather(send, recv, count, type.nccl, comm_, stream_),
                     "ncclAllGather");
      case Collective::AlltoAll:
        return check(nccl.alltoall(send, recv, count, type.nccl, comm_, stream_), "ncclAlltoAll");
      case Collective::SendRecv: {
        const int right = (rank_ + 1) % nranks_, left = (rank_ + nranks_ - 1) % nranks_;
        if (!check(nccl.group_start(), "ncclGroupStart")) return false;
        const bool sent =
            check(nccl.send(send, count, type.nccl, right, comm_, stream_), "ncclSend");
        const bool received =
            sent && check(nccl.recv(recv, count, type.nccl, left, comm_, stream_), "ncclRecv");
        return check(nccl.group_end(), "ncclGroupEnd") && received;
      }
      default:
        return check(nccl.all_reduce(send, recv, count, type.nccl, op.nccl, comm_, stream_),
                     "ncclAllReduce");
    }
  }
  bool check(ncclResult_t r, const char* call) const { return r == ncclSuccess || report(call, r); }
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
  // Whether this collective's calls run QNCCL's measured auto (docs/tuning.md).
  bool measured() const {
    return qnccl_.loaded() && config_.enable && bits_ > 0 && config_.measured &&
           quantized_.algo == qncclAlgoAuto && collective_ != Collective::SendRecv;
  }
  bool tuning(std::vector<qncclTuning_t>* table) const {
    int n = 0;
    if (qnccl_.get_tuning(comm_, nullptr, 0, &n) != ncclSuccess) return false;
    table->resize((size_t)n);
    return qnccl_.get_tuning(comm_, table->data(), n, &n) == ncclSuccess;
  }
  const char* rounding_name() const {
    return quantized_.codec.rounding == qncclRoundNearest ? "nearest" : "stochastic";
  }
  const char* rotation_name() const {
    switch (quantized_.codec.rotation) {
      case qncclRotationHadamard: return "hadamard";
      case qncclRotationPrerotated: return "prerotated";
      default: return "none";
    }
  }
  const char* clip_name() const {
    return quantized_.codec.clip == qncclClipGaussian ? "gaussian" : "none";
  }

  const char* tool_;
  Collective collective_;
  const NcclCalls linked_ = NcclCalls::linked();
  const NcclCalls plain_ = NcclCalls::plain();
  // whether plain_ has this binary's calls
  const bool have_plain_ = plain_.all_reduce != nullptr &&
                           (collective_ != Collective::AlltoAll || plain_.alltoall != nullptr);
  Qnccl qnccl_;
  qncclEnvConfig_t config_{};
  int bits_ = 0;                       // of this collective: 0 exact (qncclCommGetQuantization)
  qncclAllReduceConfig_t quantized_{};  // what it is quantized with
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0, nranks_ = 1;
};

int run_nccl(int argc, char** argv, const char* tool, Collective collective) {
  NcclBackend backend(tool, collective);
  return run(argc, argv, backend, collective);
}

}  // namespace perf
