#include "common/env.h"

#include <stdlib.h>

namespace qnccl {
namespace env {

const char* host_isa() {
  const char* value = getenv("QNCCL_HOST_ISA");
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace env
}  // namespace qnccl
