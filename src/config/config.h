/* The QNCCL_* configuration: parsed and validated in one place. */
#ifndef QNCCL_CONFIG_CONFIG_H_
#define QNCCL_CONFIG_CONFIG_H_

#include <string>

#include "qnccl.h"

namespace qnccl {

/* The defaults of docs/environment.md's table. */
qncclEnvConfig_t default_config();

/* Reads every QNCCL_* knob. A bad value fails with ncclInvalidArgument and a
 * message naming the variable, the value and what is allowed. */
ncclResult_t config_from_env(qncclEnvConfig_t* config);

const char* rounding_name(qncclRounding_t rounding);
const char* algo_name(qncclAlgo_t algo);
/* QNCCL_ALGO's word for `config`: "rule" for auto by the fixed rules, else algo_name. */
const char* algo_setting(const qncclEnvConfig_t& config);
/* "allreduce", "reducescatter", ...: QNCCL_COLLECTIVES' name of the
 * collective whose flag is 1 << index. */
const char* collective_name(int index);
/* "collectives=allreduce,reducescatter", then " <name>_bits=N" for each
 * collective with bits of its own: the INFO line's words for them. */
std::string describe_collectives(const qncclEnvConfig_t& config);

}  // namespace qnccl

#endif
