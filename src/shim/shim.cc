/* The interposer's per-communicator state, its reports, and the adoption of
 * the communicators the real NCCL makes. */
#include "common/error.h"
#include "common/registry.h"
#include "config/config.h"
#include "engine/comm_state.h"
#include "engine/engine.h"
#include "engine/nccl_api.h"
#include "engine/report.h"
#include "shim/shim.h"
#ifdef QNCCL_WITH_CUDA
#include "codec/codec.h"
#include "codec/cuda_module.h"
#endif

namespace qnccl {

namespace {

CommRegistry<ShimComm>& registry() {
  static CommRegistry<ShimComm> r;
  return r;
}

}  // namespace

ncclResult_t shim_comm(ncclComm_t comm, const qncclEnvConfig_t* config,
                       std::shared_ptr<ShimComm>* state) {
  return registry().get(
      comm,
      [config](ShimComm& made) {
        if (config == nullptr) return config_from_env(&made.config);
        made.config = *config;
        return ncclSuccess;
      },
      state);
}

bool forget_shim_comm(ncclComm_t comm) { return registry().take(comm) != nullptr; }

ncclResult_t fail(ncclResult_t res) {
  warn("%s", last_error());
  return res;
}

const char* short_type_name(ncclDataType_t type) {
  static const char* const names[] = {"int8",    "uint8",   "int32",   "uint32",
                                      "int64",   "uint64",  "float16", "float32",
                                      "float64", "bfloat16", "float8e4m3", "float8e5m2"};
  unsigned t = (unsigned)type;
  return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

const char* op_name(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  return (unsigned)op < 5 ? names[op] : "custom";
}

namespace {

/* Loads the kernels on the communicator's device and reports its
 * configuration, once it answers queries (a creation inside a group answers
 * ncclSuccess before the group's end has made the communicator: then the
 * next call QNCCL works for tries again). */
void announce(ncclComm_t comm, ShimComm& shim, const NcclApi& nccl) {
  if (shim.announced.load(std::memory_order_relaxed) || shim.announced.exchange(true)) return;
  const qncclEnvConfig_t& config = shim.config;
  int nranks = 0;
  ncclResult_t state = ncclInProgress;
  if (nccl.commGetAsyncError(comm, &state) != ncclSuccess || state != ncclSuccess ||
      nccl.commCount(comm, &nranks) != ncclSuccess) {
    shim.announced = false;
    return;
  }
#ifdef QNCCL_WITH_CUDA
  // Every kernel loaded now, before any NCCL work of QNCCL's on the device
  // (cuda_module.h). A failure shows again, with its message, at the first
  // call that needs the kernels.
  int device = -1;
  if (nccl.commCuDevice(comm, &device) == ncclSuccess && device >= 0 && cuda_devices() > 0 &&
      load_kernels(device) != ncclSuccess)
    info(comm, config.debug, ": loading the CUDA kernels on device %d failed: %s", device,
         last_error());
#endif
  const qncclCodecConfig_t& c = config.allreduce.codec;
  info(comm, config.debug,
       "/%d: bits=%d bucket=%zu rounding=%s rotation=%s rotation_block=%zu clip=%s algo=%s "
       "inter_algo=%s intra_bits=%d lanes=%d segment_values=%zu min_bytes=%zu seed=%llu "
       "warmup=%llu error_feedback=%d error_feedback_max_bytes=%zu enable=%d %s nccl=%s",
       nranks, c.bits, c.bucketSize, rounding_name(c.rounding),
       c.rotation == qncclRotationHadamard ? "hadamard" : "none",
       c.rotationBlock != 0 ? c.rotationBlock : (size_t)QNCCL_DEFAULT_ROTATION_BLOCK,
       c.clip == qncclClipGaussian ? "gaussian" : "none",
       algo_setting(config),
       algo_name(config.allreduce.interAlgo), config.allreduce.intraBits, config.allreduce.lanes,
       config.allreduce.segmentValues, config.minBytes, (unsigned long long)c.seed,
       (unsigned long long)config.warmupCalls, config.allreduce.errorFeedback,
       config.errorFeedbackMaxBytes, config.enable,
       describe_collectives(config).c_str(), nccl.path);
}

}  // namespace

void adopt_comm(ncclComm_t comm, const qncclEnvConfig_t& config) {
  std::shared_ptr<ShimComm> shim;
  std::shared_ptr<CommState> state;
  const NcclApi* nccl;
  if (comm == nullptr || shim_comm(comm, &config, &shim) != ncclSuccess ||
      comm_state(comm, &config, &state) != ncclSuccess || real_nccl(&nccl) != ncclSuccess)
    return;
  announce(comm, *shim, *nccl);  // (not yet if its creation is in progress)
}

ncclResult_t comm_ready(ncclComm_t comm, ShimComm& shim, CommState& state, const NcclApi& nccl) {
  const ncclResult_t res = wait_until_ready(nccl, comm, state);
  if (res != ncclSuccess) {
    if (state.aborted) return res;  // wait_until_ready said so
    const char* why = nccl.getLastError(comm);
    return set_error(res, "the communicator reports an error (%d): %s", (int)res,
                     why != nullptr && why[0] != '\0' ? why : "no message");
  }
  announce(comm, shim, nccl);
  return ncclSuccess;
}

}  // namespace qnccl
