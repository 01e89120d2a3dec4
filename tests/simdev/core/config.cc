#include "core/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>

namespace simdev {
namespace {

[[noreturn]] void bad(const char* name, const char* value, const char* allowed) {
  fprintf(stderr, "simdev: %s=%s is not allowed; allowed: %s\n", name, value, allowed);
  exit(2);
}

unsigned long number(const char* name, unsigned long dflt, unsigned long lo, unsigned long hi) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  char* end = nullptr;
  errno = 0;
  const unsigned long n = strtoul(v, &end, 10);
  if (errno != 0 || *end != '\0' || *v == '-' || n < lo || n > hi) {
    const std::string allowed =
        "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    bad(name, v, allowed.c_str());
  }
  return n;
}

Config read() {
  Config c;
  c.devices = (int)number("SIMDEV_DEVICES", 1, 1, 8);
  c.seed = number("SIMDEV_SEED", 1, 0, ~0ul);
  c.lazy_ms = (unsigned)number("SIMDEV_LAZY_MS", 200, 1, 600000);
  c.hang_report_s = (unsigned)number("SIMDEV_HANG_REPORT_S", 60, 0, 86400);
  c.memory_pools = number("SIMDEV_MEMORY_POOLS", 1, 0, 1) != 0;
  const char* order = getenv("SIMDEV_LANE_ORDER");
  if (order == nullptr || *order == '\0' || strcmp(order, "forward") == 0)
    c.lane_order = LaneOrder::kForward;
  else if (strcmp(order, "reverse") == 0)
    c.lane_order = LaneOrder::kReverse;
  else if (strcmp(order, "random") == 0)
    c.lane_order = LaneOrder::kRandom;
  else
    bad("SIMDEV_LANE_ORDER", order, "forward, reverse or random");
  const char* schedule = getenv("SIMDEV_SCHEDULE");
  if (schedule == nullptr || *schedule == '\0' || strcmp(schedule, "lazy") == 0)
    c.schedule = Schedule::kLazy;
  else if (strcmp(schedule, "eager") == 0)
    c.schedule = Schedule::kEager;
  else
    bad("SIMDEV_SCHEDULE", schedule, "lazy or eager");
  return c;
}

}  // namespace

const Config& config() {
  static const Config c = read();
  return c;
}

}  // namespace simdev
