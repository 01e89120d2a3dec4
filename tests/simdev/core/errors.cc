#include "core/errors.h"

#include <stdarg.h>
#include <stdio.h>

#include <string>

namespace simdev {
namespace {

thread_local std::string message;
thread_local bool host_function = false;

void set(const char* fmt, va_list ap) {
  char text[1024];
  vsnprintf(text, sizeof text, fmt, ap);
  message = text;
}

}  // namespace

cudaError_t fail(cudaError_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set(fmt, ap);
  va_end(ap);
  return code;
}

cudaError_t fail_loudly(cudaError_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set(fmt, ap);
  va_end(ap);
  fprintf(stderr, "simdev: %s\n", message.c_str());
  fflush(stderr);
  return code;
}

void report(const char* fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  fprintf(stderr, "simdev: %s\n", text);
  fflush(stderr);
}

const char* last_message() { return message.c_str(); }

const char* error_name(int error) {
  switch (error) {
#define NAME(e) \
  case e: return #e;
    NAME(cudaSuccess) NAME(cudaErrorInvalidValue) NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInitializationError) NAME(cudaErrorInvalidConfiguration)
    NAME(cudaErrorInvalidDevicePointer) NAME(cudaErrorInvalidMemcpyDirection)
    NAME(cudaErrorNoDevice) NAME(cudaErrorInvalidDevice) NAME(cudaErrorInvalidKernelImage)
    NAME(cudaErrorDeviceUninitialized) NAME(cudaErrorNoKernelImageForDevice)
    NAME(cudaErrorInvalidResourceHandle) NAME(cudaErrorIllegalState)
    NAME(cudaErrorSymbolNotFound) NAME(cudaErrorNotReady) NAME(cudaErrorIllegalAddress)
    NAME(cudaErrorLaunchOutOfResources) NAME(cudaErrorPeerAccessAlreadyEnabled)
    NAME(cudaErrorPeerAccessNotEnabled) NAME(cudaErrorHostMemoryAlreadyRegistered)
    NAME(cudaErrorHostMemoryNotRegistered) NAME(cudaErrorMisalignedAddress)
    NAME(cudaErrorLaunchFailure) NAME(cudaErrorNotPermitted) NAME(cudaErrorNotSupported)
    NAME(cudaErrorStreamCaptureUnsupported) NAME(cudaErrorStreamCaptureInvalidated)
    NAME(cudaErrorStreamCaptureMerge) NAME(cudaErrorStreamCaptureUnmatched)
    NAME(cudaErrorStreamCaptureUnjoined) NAME(cudaErrorStreamCaptureIsolation)
    NAME(cudaErrorStreamCaptureImplicit) NAME(cudaErrorCapturedEvent)
    NAME(cudaErrorStreamCaptureWrongThread) NAME(cudaErrorUnknown)
#undef NAME
    default: return "cudaErrorUnrecognized";
  }
}

const char* error_string(int error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidKernelImage: return "device kernel image is invalid";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate "
                                             "capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as "
                                                 "it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in "
                                                 "another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend "
                                                "on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a "
                                        "capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture "
                                                   "sequence from another thread";
    default: return error_name(error);
  }
}


bool in_host_function() { return host_function; }
void set_in_host_function(bool in) { host_function = in; }

}  // namespace simdev
