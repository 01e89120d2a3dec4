/* The QNCCL_* configuration: parsed and validated in one place. */
#ifndef QNCCL_CONFIG_CONFIG_H_
#define QNCCL_CONFIG_CONFIG_H_

#include "qnccl.h"

namespace qnccl {

/* The defaults of the README's environment table. */
qncclEnvConfig_t default_config();

/* Reads every QNCCL_* knob. A bad value fails with ncclInvalidArgument and a
 * message naming the variable, the value and what is allowed. */
ncclResult_t config_from_env(qncclEnvConfig_t* config);

const char* rounding_name(qncclRounding_t rounding);
const char* algo_name(qncclAlgo_t algo);

}  // namespace qnccl

#endif
