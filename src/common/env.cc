#include "common/env.h"

#include <stdlib.h>

namespace qnccl {
namespace env {

namespace {
/* The variable's value, or null when it is unset or empty. */
const char* value_of(const char* name) {
  const char* value = getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}
}  // namespace

const char* host_isa() { return value_of("QNCCL_HOST_ISA"); }

const char* nccl_lib() { return value_of("QNCCL_NCCL_LIB"); }

const char* host_init_timeout() { return value_of("QNCCL_HOST_INIT_TIMEOUT"); }

}  // namespace env
}  // namespace qnccl
