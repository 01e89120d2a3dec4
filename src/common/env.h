/* Every environment variable QNCCL reads is read here, and only here: the
 * table in env.cc is the code's counterpart of docs/environment.md's. Parsing and
 * validation live with the users (src/config/config.cc for QNCCL_* knobs). */
#ifndef QNCCL_COMMON_ENV_H_
#define QNCCL_COMMON_ENV_H_

namespace qnccl {
namespace env {

enum class Var {
  kEnable,            // QNCCL_ENABLE
  kBits,              // QNCCL_BITS
  kBucketSize,        // QNCCL_BUCKET_SIZE
  kRounding,          // QNCCL_ROUNDING
  kRotation,          // QNCCL_ROTATION: none | hadamard (docs/rotation.md)
  kRotationBlock,     // QNCCL_ROTATION_BLOCK: values per rotation block
  kClip,              // QNCCL_CLIP: none | gaussian, a rotated call's ranges (docs/rotation.md)
  kAlgo,              // QNCCL_ALGO
  kInterAlgo,         // QNCCL_INTER_ALGO: hierarchical, between nodes
  kIntraBits,         // QNCCL_INTRA_BITS: hierarchical, inside a node (0: exact)
  kLanes,             // QNCCL_LANES: lanes of a flat call's pipeline (0: auto)
  kSegmentValues,     // QNCCL_SEGMENT_VALUES: values per pipelined segment (0: the default)
  kMinBytes,          // QNCCL_MIN_BYTES
  kSeed,              // QNCCL_SEED
  kErrorFeedback,     // QNCCL_ERROR_FEEDBACK
  kErrorFeedbackMaxBytes,  // QNCCL_ERROR_FEEDBACK_MAX_BYTES: residual memory per communicator
  kWarmupCalls,       // QNCCL_WARMUP_CALLS
  kDebug,             // QNCCL_DEBUG
  kCollectives,       // QNCCL_COLLECTIVES: which interposed collectives are quantized
  kAllReduceBits,     // QNCCL_ALLREDUCE_BITS .. QNCCL_SENDRECV_BITS: bits per collective,
  kReduceScatterBits,  //   in the order of qncclCollective_t's flags
  kAllGatherBits,
  kAllToAllBits,
  kSendRecvBits,
  kNcclLib,           // QNCCL_NCCL_LIB: path of the real NCCL
  kHostIsa,           // QNCCL_HOST_ISA: generic | avx2 | avx512 host codec
  kHostInitTimeout,   // QNCCL_HOST_INIT_TIMEOUT: host backend waits, seconds
  kTuneFile,          // QNCCL_TUNE_FILE: measured auto's decisions kept across jobs
  kNcclCommBlocking,  // NCCL_COMM_BLOCKING: the real NCCL's default mode, which the host backend follows
  kNcclHostId,        // NCCL_HOSTID: the host name ranks of one node share, as NCCL reads it
};

/* The variable's name, e.g. "QNCCL_BITS". */
const char* name(Var var);

/* Its value, or null when it is unset or empty. */
const char* get(Var var);

}  // namespace env
}  // namespace qnccl

#endif
