/* Every environment variable QNCCL reads is read here, and only here, so the
 * README's table has one counterpart in the code. */
#ifndef QNCCL_COMMON_ENV_H_
#define QNCCL_COMMON_ENV_H_

namespace qnccl {
namespace env {

/* QNCCL_HOST_ISA: instruction set of the host codec, "generic", "avx2" or
 * "avx512"; unset or empty: the best this CPU runs. Null when unset. */
const char* host_isa();

/* QNCCL_NCCL_LIB: path of the real NCCL library; null when unset. */
const char* nccl_lib();

/* QNCCL_HOST_INIT_TIMEOUT: seconds the host backend waits for the ranks of a
 * new communicator, and for a group's point-to-point operations to make
 * progress; null when unset (the backend's default applies). */
const char* host_init_timeout();

}  // namespace env
}  // namespace qnccl

#endif
