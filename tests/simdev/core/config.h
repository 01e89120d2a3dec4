/* The simulated GPU's settings: every SIMDEV_* environment variable is read
 * here, once, strictly (a bad value stops the process with a message naming
 * the variable and what it allows). docs/simulated-gpu.md lists them. */
#ifndef SIMDEV_CORE_CONFIG_H_
#define SIMDEV_CORE_CONFIG_H_

#include <stdint.h>

namespace simdev {

/* The order in which the lanes of a warp (and the warps of a block) run and
 * resume after a warp operation. */
enum class LaneOrder { kForward, kReverse, kRandom };

/* When stream work runs. kEager: as soon as what it waits for is done, each
 * stream on its own worker, like a GPU with nothing else to do. kLazy: only
 * when the host waits for it (a synchronize, a query, a blocking copy) or
 * after `lazy_ms`, and then one operation per device at a time, the most
 * recently issued first: work that is neither ordered before what the host
 * waits for nor ordered by an event runs late or out of order, so a missing
 * cudaStreamWaitEvent or synchronization shows as wrong bytes. */
enum class Schedule { kEager, kLazy };

struct Config {
  int devices;            // SIMDEV_DEVICES: 1..8, default 1
  LaneOrder lane_order;   // SIMDEV_LANE_ORDER: forward (default) | reverse | random
  uint64_t seed;          // SIMDEV_SEED: of the random lane order and the shared-memory garbage
  Schedule schedule;      // SIMDEV_SCHEDULE: lazy (default) | eager
  unsigned lazy_ms;       // SIMDEV_LAZY_MS: unforced work starts after this long (default 200)
  bool memory_pools;      // SIMDEV_MEMORY_POOLS: 1 (default), or 0: devices without
                          // stream-ordered allocation (cudaMallocAsync fails, as there)
  unsigned hang_report_s; // SIMDEV_HANG_REPORT_S: a host wait without progress this long
                          // prints what every stream waits for (default 60; 0: never)
};

/* Read on first use. */
const Config& config();

}  // namespace simdev

#endif
