#include "common/env.h"

#include <stdlib.h>

namespace qnccl {
namespace env {

const char* name(Var var) {
  switch (var) {
    case Var::kEnable: return "QNCCL_ENABLE";
    case Var::kBits: return "QNCCL_BITS";
    case Var::kBucketSize: return "QNCCL_BUCKET_SIZE";
    case Var::kRounding: return "QNCCL_ROUNDING";
    case Var::kRotation: return "QNCCL_ROTATION";
    case Var::kRotationBlock: return "QNCCL_ROTATION_BLOCK";
    case Var::kClip: return "QNCCL_CLIP";
    case Var::kAlgo: return "QNCCL_ALGO";
    case Var::kInterAlgo: return "QNCCL_INTER_ALGO";
    case Var::kIntraBits: return "QNCCL_INTRA_BITS";
    case Var::kLanes: return "QNCCL_LANES";
    case Var::kSegmentValues: return "QNCCL_SEGMENT_VALUES";
    case Var::kMinBytes: return "QNCCL_MIN_BYTES";
    case Var::kSeed: return "QNCCL_SEED";
    case Var::kErrorFeedback: return "QNCCL_ERROR_FEEDBACK";
    case Var::kErrorFeedbackMaxBytes: return "QNCCL_ERROR_FEEDBACK_MAX_BYTES";
    case Var::kWarmupCalls: return "QNCCL_WARMUP_CALLS";
    case Var::kDebug: return "QNCCL_DEBUG";
    case Var::kCollectives: return "QNCCL_COLLECTIVES";
    case Var::kAllReduceBits: return "QNCCL_ALLREDUCE_BITS";
    case Var::kReduceScatterBits: return "QNCCL_REDUCESCATTER_BITS";
    case Var::kAllGatherBits: return "QNCCL_ALLGATHER_BITS";
    case Var::kAllToAllBits: return "QNCCL_ALLTOALL_BITS";
    case Var::kSendRecvBits: return "QNCCL_SENDRECV_BITS";
    case Var::kNcclLib: return "QNCCL_NCCL_LIB";
    case Var::kHostIsa: return "QNCCL_HOST_ISA";
    case Var::kTuneFile: return "QNCCL_TUNE_FILE";
    case Var::kHostInitTimeout: return "QNCCL_HOST_INIT_TIMEOUT";
    case Var::kNcclCommBlocking: return "NCCL_COMM_BLOCKING";
    case Var::kNcclHostId: return "NCCL_HOSTID";
  }
  return "?";
}

const char* get(Var var) {
  const char* value = getenv(name(var));
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace env
}  // namespace qnccl
