#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>

namespace qnccl {

static thread_local char last_error_message[1024];

const char* last_error() { return last_error_message; }

ncclResult_t set_error(ncclResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error_message, sizeof last_error_message, fmt, ap);
  va_end(ap);
  return code;
}

ncclResult_t prefix_error(ncclResult_t res, const char* fmt, ...) {
  if (res == ncclSuccess) return res;
  char context[512], message[sizeof last_error_message];
  snprintf(message, sizeof message, "%s", last_error_message);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(context, sizeof context, fmt, ap);
  va_end(ap);
  return set_error(res, "%s: %s", context, message);
}

const char* type_name(ncclDataType_t type) {
  static const char* const names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",
                                      "ncclUint32",  "ncclInt64",   "ncclUint64",
                                      "ncclFloat16", "ncclFloat32", "ncclFloat64",
                                      "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
  unsigned t = (unsigned)type;
  return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

}  // namespace qnccl
