/* What the simulated GPU offers tests beyond CUDA's API (exported by
 * build/simdev/libcuda.so.1; a program that runs on a real GPU does not
 * call these). */
#ifndef SIMDEV_SIMDEV_H_
#define SIMDEV_SIMDEV_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct simdevCounters {
  uint64_t kernels;                /* kernels executed */
  uint64_t graphLaunches;          /* graph instances executed */
  uint64_t allocationsInCapture;   /* memory allocations made while a stream captured */
  uint64_t hostFunctions;          /* host functions run */
  uint64_t modulesLoaded;          /* modules loaded (cuModuleLoadData) */
  uint64_t kernelsResolved;        /* kernels loaded by their first cuModuleGetFunction */
} simdevCounters;

/* 0 on success. */
int simdevGetCounters(simdevCounters* out);

/* The sentence the calling thread's last failed CUDA call left: what was
 * wrong, in more words than the error code. */
const char* simdevGetLastMessage(void);

#ifdef __cplusplus
}
#endif

#endif
