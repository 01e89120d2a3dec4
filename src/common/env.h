/* Every environment variable QNCCL reads is read here, and only here, so the
 * README's table has one counterpart in the code. */
#ifndef QNCCL_COMMON_ENV_H_
#define QNCCL_COMMON_ENV_H_

namespace qnccl {
namespace env {

/* QNCCL_HOST_ISA: instruction set of the host codec, "generic", "avx2" or
 * "avx512"; unset or empty: the best this CPU runs. Null when unset. */
const char* host_isa();

}  // namespace env
}  // namespace qnccl

#endif
