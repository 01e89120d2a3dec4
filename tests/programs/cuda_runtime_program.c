/*
 * A CUDA program of the plain runtime API (no simulator header) whose kernels
 * are QNCCL's, launched through the library: qncclQuantize and
 * qncclDequantize on device buffers. Linked against NVIDIA's libcudart.so.12,
 * it runs on a GPU as it is and on the simulated GPU with
 * LD_LIBRARY_PATH=build/simdev (docs/simulated-gpu.md);
 * tests/test_simdev_runtime.py runs it on both.
 *
 *     cuda_runtime_program            the checks below; prints "OK: N checks"
 *     cuda_runtime_program RULE       one rule of CUDA's (see rules[] below);
 *                                     prints "RULE: <what happened>"
 *
 * The checks: devices, properties and attributes; pointer attributes;
 * cudaMalloc, cudaMallocHost and their frees, pageable and pinned copies,
 * memsets, stream-ordered cudaMallocAsync/cudaFreeAsync; a non-blocking
 * stream and a second stream joined through an event; timing events
 * (elapsed time), event query and synchronize; cudaLaunchHostFunc; the
 * library's kernels give the bytes of its host codec (the same call on host
 * buffers), eagerly and from a graph: the copy in, quantize, dequantize and
 * copy out captured in global mode, instantiated, replayed with new inputs
 * in pinned memory, each replay the host codec's bytes of its input. Any
 * failure exits non-zero naming the call.
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qnccl.h"

enum { COUNT = 100003 };

static int checks = 0;

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,          \
              cudaGetErrorName(e_), cudaGetErrorString(e_));                             \
      exit(1);                                                                           \
    }                                                                                    \
    checks++;                                                                            \
  } while (0)

#define NCCL_OK(call)                                                                    \
  do {                                                                                   \
    ncclResult_t r_ = (call);                                                            \
    if (r_ != ncclSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s failed (%d): %s\n", __FILE__, __LINE__, #call, (int)r_, \
              qncclGetLastError());                                                      \
      exit(1);                                                                           \
    }                                                                                    \
    checks++;                                                                            \
  } while (0)

#define EXPECT(cond, ...)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);                \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fprintf(stderr, "\n");                                                             \
      exit(1);                                                                           \
    }                                                                                    \
    checks++;                                                                            \
  } while (0)

static const qncclCodecConfig_t kConfig = {4, 512, qncclRoundStochastic, 0x5eed,
                                           qncclRotationNone, 0, qncclClipNone};

/* Input `round` of the program: values of several magnitudes, some zeros. */
static void fill(float* x, int round) {
  uint64_t s = 0x9E3779B97F4A7C15ULL * (uint64_t)(round + 1);
  for (size_t i = 0; i < COUNT; i++) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = (double)(s >> 11) / 9007199254740992.0 - 0.5;
    x[i] = i % 97 == 0 ? 0.0f : (float)(u * (double)(1 + (i % 7) * 100));
  }
}

/* What the library's host codec makes of `x`: the packed bytes and the values back. */
static void host_codec(const float* x, uint64_t random_stream, unsigned char* packed,
                       size_t packed_bytes, float* back) {
  NCCL_OK(qncclQuantize(x, COUNT, ncclFloat32, &kConfig, random_stream, packed, packed_bytes,
                        NULL));
  NCCL_OK(qncclDequantize(packed, packed_bytes, COUNT, &kConfig, back, ncclFloat32, NULL));
}

static void mark(void* flag) { *(volatile int*)flag += 1; }

struct Device {
  float *x, *back;
  unsigned char* packed;
  size_t packed_bytes;
};

static void check_devices(void) {
  int count = 0, device = -1, sms = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  EXPECT(count >= 1, "%d devices", count);
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaGetDevice(&device));
  EXPECT(device == 0, "device %d", device);
  struct cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  EXPECT(prop.name[0] != '\0' && prop.major >= 7 && prop.totalGlobalMem > 0,
         "name '%s', compute capability %d.%d", prop.name, prop.major, prop.minor);
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  EXPECT(sms == prop.multiProcessorCount && sms > 0, "%d SMs, properties say %d", sms,
         prop.multiProcessorCount);
  printf("device 0: %s (compute capability %d.%d, %d SMs), %d device(s)\n", prop.name,
         prop.major, prop.minor, sms, count);
}

/* The kernels on a non-blocking stream, the results copied out on it (into
 * pageable memory) and checked against the host codec. */
static void check_eager(struct Device* d, const float* x, const unsigned char* want_packed,
                        const float* want_back) {
  cudaStream_t s, t;
  cudaEvent_t start, stop, quantized;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreate(&t));
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  CUDA_OK(cudaEventCreateWithFlags(&quantized, cudaEventDisableTiming));
  unsigned char* packed = malloc(d->packed_bytes);
  float* back = malloc(COUNT * sizeof(float));
  volatile int flag = 0;

  CUDA_OK(cudaMemsetAsync(d->packed, 0xA5, d->packed_bytes, s));
  CUDA_OK(cudaMemcpyAsync(d->x, x, COUNT * sizeof(float), cudaMemcpyHostToDevice, s));
  CUDA_OK(cudaEventRecord(start, s));
  NCCL_OK(qncclQuantize(d->x, COUNT, ncclFloat32, &kConfig, 7, d->packed, d->packed_bytes, s));
  CUDA_OK(cudaEventRecord(quantized, s));
  // The second stream decodes once the first has quantized.
  CUDA_OK(cudaStreamWaitEvent(t, quantized, 0));
  NCCL_OK(qncclDequantize(d->packed, d->packed_bytes, COUNT, &kConfig, d->back, ncclFloat32, t));
  CUDA_OK(cudaEventRecord(stop, t));
  CUDA_OK(cudaLaunchHostFunc(t, mark, (void*)&flag));
  CUDA_OK(cudaMemcpyAsync(back, d->back, COUNT * sizeof(float), cudaMemcpyDeviceToHost, t));
  CUDA_OK(cudaMemcpyAsync(packed, d->packed, d->packed_bytes, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaEventSynchronize(stop));
  CUDA_OK(cudaStreamSynchronize(t));
  CUDA_OK(cudaEventQuery(stop));
  float ms = -1;
  CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms >= 0, "elapsed %g ms", ms);
  EXPECT(flag == 1, "the host function ran %d times", flag);
  EXPECT(memcmp(packed, want_packed, d->packed_bytes) == 0, "the device's packed bytes");
  EXPECT(memcmp(back, want_back, COUNT * sizeof(float)) == 0, "the device's decoded values");
  printf("eager: kernels and copies in %.3f ms, bit-identical to the host codec\n", ms);

  // Stream-ordered memory: a scratch copy that lives only on the stream.
  void* scratch = NULL;
  CUDA_OK(cudaMallocAsync(&scratch, d->packed_bytes, s));
  CUDA_OK(cudaMemcpyAsync(scratch, d->packed, d->packed_bytes, cudaMemcpyDeviceToDevice, s));
  NCCL_OK(qncclDequantize(scratch, d->packed_bytes, COUNT, &kConfig, d->back, ncclFloat32, s));
  CUDA_OK(cudaFreeAsync(scratch, s));
  memset(back, 0, COUNT * sizeof(float));
  CUDA_OK(cudaMemcpyAsync(back, d->back, COUNT * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT(memcmp(back, want_back, COUNT * sizeof(float)) == 0, "decoded from stream memory");

  free(packed);
  free(back);
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));
  CUDA_OK(cudaEventDestroy(quantized));
  CUDA_OK(cudaStreamDestroy(t));
  CUDA_OK(cudaStreamDestroy(s));
}

/* The copy in, the kernels and the copies out captured once, replayed with
 * new inputs: each replay the host codec's bytes of its own input. */
static void check_graph(struct Device* d) {
  enum { REPLAYS = 3 };
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *in, *back;
  unsigned char* packed;
  CUDA_OK(cudaMallocHost((void**)&in, COUNT * sizeof(float)));
  CUDA_OK(cudaMallocHost((void**)&back, COUNT * sizeof(float)));
  CUDA_OK(cudaMallocHost((void**)&packed, d->packed_bytes));
  unsigned char* want_packed = malloc(d->packed_bytes);
  float* want_back = malloc(COUNT * sizeof(float));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  enum cudaStreamCaptureStatus status;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusActive, "capture status %d", (int)status);
  CUDA_OK(cudaMemcpyAsync(d->x, in, COUNT * sizeof(float), cudaMemcpyHostToDevice, s));
  NCCL_OK(qncclQuantize(d->x, COUNT, ncclFloat32, &kConfig, 11, d->packed, d->packed_bytes, s));
  NCCL_OK(qncclDequantize(d->packed, d->packed_bytes, COUNT, &kConfig, d->back, ncclFloat32, s));
  CUDA_OK(cudaMemcpyAsync(packed, d->packed, d->packed_bytes, cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaMemcpyAsync(back, d->back, COUNT * sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 1; round <= REPLAYS; round++) {
    fill(in, round);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    host_codec(in, 11, want_packed, d->packed_bytes, want_back);
    EXPECT(memcmp(packed, want_packed, d->packed_bytes) == 0, "replay %d: packed bytes", round);
    EXPECT(memcmp(back, want_back, COUNT * sizeof(float)) == 0, "replay %d: decoded", round);
  }
  printf("graph: %d replays with new inputs, each bit-identical to the host codec\n", REPLAYS);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaFreeHost(in));
  CUDA_OK(cudaFreeHost(back));
  CUDA_OK(cudaFreeHost(packed));
  free(want_packed);
  free(want_back);
  CUDA_OK(cudaStreamDestroy(s));
}

static int checks_program(void) {
  check_devices();
  struct Device d;
  NCCL_OK(qncclCompressedSize(COUNT, &kConfig, &d.packed_bytes));
  CUDA_OK(cudaMalloc((void**)&d.x, COUNT * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&d.back, COUNT * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&d.packed, d.packed_bytes));
  struct cudaPointerAttributes attr;
  CUDA_OK(cudaPointerGetAttributes(&attr, d.x));
  EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == 0, "type %d on device %d",
         (int)attr.type, attr.device);
  float host_x[1];
  CUDA_OK(cudaPointerGetAttributes(&attr, host_x));
  EXPECT(attr.type == cudaMemoryTypeUnregistered, "a stack address has type %d", (int)attr.type);

  float* x = malloc(COUNT * sizeof(float));
  unsigned char* want_packed = malloc(d.packed_bytes);
  float* want_back = malloc(COUNT * sizeof(float));
  fill(x, 0);
  host_codec(x, 7, want_packed, d.packed_bytes, want_back);
  check_eager(&d, x, want_packed, want_back);
  check_graph(&d);

  // A synchronous copy on the legacy stream, then a memset and a copy back.
  CUDA_OK(cudaMemcpy(d.x, x, COUNT * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d.x, 0, sizeof(float) * 10));
  CUDA_OK(cudaMemcpy(x, d.x, COUNT * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(x[0] == 0 && x[9] == 0 && x[10] != 0, "memset: %g %g %g", x[0], x[9], x[10]);
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(d.x));
  CUDA_OK(cudaFree(d.back));
  CUDA_OK(cudaFree(d.packed));
  CUDA_OK(cudaGetLastError());
  free(x);
  free(want_packed);
  free(want_back);
  printf("OK: %d checks\n", checks);
  return 0;
}

/* ---- CUDA's rules: each prints what the runtime answered ----------------- */

static void say(const char* rule, const char* what, cudaError_t e) {
  printf("%s: %s -> %s\n", rule, what, cudaGetErrorName(e));
  fflush(stdout);
}

static cudaStream_t new_stream(unsigned flags) {
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, flags));
  return s;
}

/* A synchronizing call on a capturing stream is refused, and ends the capture. */
static void rule_capture_sync(void) {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  cudaGraph_t g = NULL;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  say("capture-sync", "cudaStreamSynchronize", cudaStreamSynchronize(s));
  say("capture-sync", "cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
}

/* In a global-mode capture, this thread may not allocate (a relaxed one may). */
static void rule_capture_malloc(void) {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  cudaGraph_t g = NULL;
  void* p = NULL;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  say("capture-malloc", "relaxed: cudaMalloc", cudaMalloc(&p, 256));
  say("capture-malloc", "relaxed: cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaFree(p));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  say("capture-malloc", "global: cudaMalloc", cudaMalloc(&p, 256));
  say("capture-malloc", "global: cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
}

struct Other {
  cudaError_t is_capturing, malloc_result;
};

static void* other_thread(void* arg) {
  struct Other* o = arg;
  enum cudaStreamCaptureStatus status;
  void* p = NULL;
  cudaSetDevice(0);
  o->is_capturing = cudaStreamIsCapturing((cudaStream_t)0, &status);
  o->malloc_result = cudaMalloc(&p, 256);
  if (o->malloc_result == cudaSuccess) cudaFree(p);
  return NULL;
}

/* While one thread captures a blocking stream in global mode, another may not
 * query the legacy stream's capture status (it would depend on the capturing
 * stream) nor allocate (which invalidates the capture). */
static void rule_capture_other_thread(void) {
  cudaStream_t s = new_stream(cudaStreamDefault);
  cudaGraph_t g = NULL;
  struct Other o;
  pthread_t t;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  pthread_create(&t, NULL, other_thread, &o);
  pthread_join(t, NULL);
  say("capture-other-thread", "cudaStreamIsCapturing(legacy stream)", o.is_capturing);
  say("capture-other-thread", "cudaMalloc", o.malloc_result);
  say("capture-other-thread", "cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
}

/* A stream forked into the capture through an event must be joined back. */
static void rule_capture_unjoined(void) {
  cudaStream_t s = new_stream(cudaStreamNonBlocking), t = new_stream(cudaStreamNonBlocking);
  cudaEvent_t e;
  cudaGraph_t g = NULL;
  void* p;
  CUDA_OK(cudaMalloc(&p, 4096));
  CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaEventRecord(e, s));
  CUDA_OK(cudaStreamWaitEvent(t, e, 0));
  CUDA_OK(cudaMemsetAsync(p, 0, 4096, t));
  say("capture-unjoined", "cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
}

/* Work on the legacy stream would wait for a capturing blocking stream: refused. */
static void rule_capture_implicit(void) {
  cudaStream_t s = new_stream(cudaStreamDefault);
  cudaGraph_t g = NULL;
  void* p;
  CUDA_OK(cudaMalloc(&p, 4096));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaMemsetAsync(p, 0, 4096, s));
  say("capture-implicit", "cudaMemsetAsync(legacy stream)", cudaMemsetAsync(p, 1, 4096, 0));
  say("capture-implicit", "cudaStreamEndCapture", cudaStreamEndCapture(s, &g));
}

/* The legacy stream waits for blocking streams' work: results read right after
 * the library's kernels on a blocking stream, through a legacy-stream copy, are
 * there; through a non-blocking stream nothing orders them. */
static void implicit_sync(const char* rule, unsigned flags) {
  size_t bytes;
  NCCL_OK(qncclCompressedSize(COUNT, &kConfig, &bytes));
  float* x = malloc(COUNT * sizeof(float));
  unsigned char *want = malloc(bytes), *got = malloc(bytes);
  float* back = malloc(COUNT * sizeof(float));
  fill(x, 5);
  host_codec(x, 3, want, bytes, back);
  float* dx;
  unsigned char* dp;
  CUDA_OK(cudaMalloc((void**)&dx, COUNT * sizeof(float)));
  CUDA_OK(cudaMalloc((void**)&dp, bytes));
  CUDA_OK(cudaMemset(dp, 0, bytes));
  CUDA_OK(cudaMemcpy(dx, x, COUNT * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s = new_stream(flags);
  NCCL_OK(qncclQuantize(dx, COUNT, ncclFloat32, &kConfig, 3, dp, bytes, s));
  CUDA_OK(cudaMemcpy(got, dp, bytes, cudaMemcpyDeviceToHost));  // the legacy stream
  printf("%s: the legacy stream's copy read %s\n", rule,
         memcmp(got, want, bytes) == 0 ? "the kernels' results" : "bytes from before them");
  CUDA_OK(cudaStreamSynchronize(s));
}

static void rule_legacy_sync(void) { implicit_sync("legacy-sync", cudaStreamDefault); }
static void rule_nonblocking(void) { implicit_sync("nonblocking", cudaStreamNonBlocking); }

/* Memory freed with cudaFreeAsync, then read by a kernel on the same stream. */
static void rule_use_after_free_async(void) {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  size_t bytes;
  NCCL_OK(qncclCompressedSize(COUNT, &kConfig, &bytes));
  void *x, *packed;
  CUDA_OK(cudaMallocAsync(&x, COUNT * sizeof(float), s));
  CUDA_OK(cudaMallocAsync(&packed, bytes, s));
  CUDA_OK(cudaMemsetAsync(x, 0, COUNT * sizeof(float), s));
  CUDA_OK(cudaFreeAsync(x, s));
  NCCL_OK(qncclQuantize(x, COUNT, ncclFloat32, &kConfig, 0, packed, bytes, s));
  say("use-after-free-async", "cudaStreamSynchronize", cudaStreamSynchronize(s));
}

static cudaError_t host_function_result = cudaSuccess;
static void calls_cuda(void* unused) {
  (void)unused;
  int device;
  host_function_result = cudaGetDevice(&device);
}

/* A host function may make no CUDA call. */
static void rule_host_function(void) {
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  CUDA_OK(cudaLaunchHostFunc(s, calls_cuda, NULL));
  CUDA_OK(cudaStreamSynchronize(s));
  say("host-function", "cudaGetDevice in a host function", host_function_result);
}

/* The codec on buffers of two devices (refused: no kernel could read both
 * without peer access). */
static void rule_peer(void) {
  size_t bytes;
  NCCL_OK(qncclCompressedSize(COUNT, &kConfig, &bytes));
  void *x, *packed;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMalloc(&x, COUNT * sizeof(float)));
  CUDA_OK(cudaMemset(x, 0, COUNT * sizeof(float)));
  CUDA_OK(cudaSetDevice(1));
  CUDA_OK(cudaMalloc(&packed, bytes));
  cudaStream_t s = new_stream(cudaStreamNonBlocking);
  ncclResult_t r = qncclQuantize(x, COUNT, ncclFloat32, &kConfig, 0, packed, bytes, s);
  printf("peer: qncclQuantize -> %d%s%s\n", (int)r, r ? ": " : "", r ? qncclGetLastError() : "");
  say("peer", "cudaStreamSynchronize", cudaStreamSynchronize(s));
}

/* The driver's cuCtxGetCurrent, from libcuda.so.1 itself: a runtime call
 * to find it could make the very context the rule looks for. */
typedef int (*CtxGetCurrent)(void**);

static int has_context(CtxGetCurrent get) {
  void* ctx = NULL;
  return get(&ctx) == 0 && ctx != NULL;
}

typedef int (*PointerGetAttributes)(unsigned, int*, void**, unsigned long long);

struct PointerThread {
  CtxGetCurrent get;
  PointerGetAttributes driver;  /* NULL: ask the runtime */
  const void* ptr;
  int before, after, result, type, ordinal;
};

static void* pointer_thread(void* arg) {
  struct PointerThread* t = arg;
  t->before = has_context(t->get);
  if (t->driver == NULL) {
    struct cudaPointerAttributes attributes;
    t->result = cudaPointerGetAttributes(&attributes, t->ptr);
  } else {
    /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2), CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9) */
    int attributes[2] = {2, 9};
    unsigned type = 0;
    int ordinal = -1;
    void* values[2] = {&type, &ordinal};
    t->result = t->driver(2, attributes, values, (unsigned long long)(uintptr_t)t->ptr);
    t->type = (int)type;
    t->ordinal = ordinal;
  }
  t->after = has_context(t->get);
  return NULL;
}

static void pointer_on_new_thread(struct PointerThread* t) {
  pthread_t thread;
  pthread_create(&thread, NULL, pointer_thread, t);
  pthread_join(thread, NULL);
}

/* Classifying a pointer on a thread with no context leaves none behind: the
 * driver's cuPointerGetAttributes answers for device and host memory and makes
 * no context current (what libqnccl's pointer_device relies on), and neither
 * does the runtime's cudaPointerGetAttributes (as a GPU answered: CUDA 12.9
 * runtime, driver 580; the simulator once made device 0's current there). */
static void rule_pointer_context(void) {
  static char host[64];
  void* driver = dlopen("libcuda.so.1", RTLD_NOW);
  int (*init)(unsigned) = driver ? (int (*)(unsigned))dlsym(driver, "cuInit") : NULL;
  CtxGetCurrent get = driver ? (CtxGetCurrent)dlsym(driver, "cuCtxGetCurrent") : NULL;
  PointerGetAttributes query =
      driver ? (PointerGetAttributes)dlsym(driver, "cuPointerGetAttributes") : NULL;
  void* device = NULL;
  if (init == NULL || get == NULL || query == NULL || init(0) != 0) {
    printf("pointer-context: no usable libcuda.so.1\n");
    return;
  }
  CUDA_OK(cudaMalloc(&device, 256));  /* on device 0, from this (the main) thread */
  for (int i = 0; i < 2; i++) {
    struct PointerThread t = {get, query, i == 0 ? (const void*)host : device, 0, 0, 0, 0, -1};
    pointer_on_new_thread(&t);
    printf("pointer-context: cuPointerGetAttributes(%s memory) on a new thread -> %d: type %d, "
           "device %d; a context before %s, after %s\n", i == 0 ? "host" : "device", t.result,
           t.type, i == 0 ? -1 : t.ordinal, t.before ? "yes" : "no", t.after ? "yes" : "no");
  }
  struct PointerThread t = {get, NULL, host, 0, 0, 0, 0, -1};
  pointer_on_new_thread(&t);
  printf("pointer-context: a new thread has a context: %s\n", t.before ? "yes" : "no");
  say("pointer-context", "cudaPointerGetAttributes(host memory)", (cudaError_t)t.result);
  printf("pointer-context: then it has a context: %s\n", t.after ? "yes" : "no");
  CUDA_OK(cudaFree(device));
}

/* A call the simulated runtime does not implement. */
static void rule_unimplemented(void) {
  void* p = NULL;
  say("unimplemented", "cudaMallocManaged", cudaMallocManaged(&p, 256, cudaMemAttachGlobal));
}

static const struct {
  const char* name;
  void (*run)(void);
} rules[] = {
    {"capture-sync", rule_capture_sync},
    {"capture-malloc", rule_capture_malloc},
    {"capture-other-thread", rule_capture_other_thread},
    {"capture-unjoined", rule_capture_unjoined},
    {"capture-implicit", rule_capture_implicit},
    {"legacy-sync", rule_legacy_sync},
    {"pointer-context", rule_pointer_context},
    {"nonblocking", rule_nonblocking},
    {"use-after-free-async", rule_use_after_free_async},
    {"host-function", rule_host_function},
    {"peer", rule_peer},
    {"unimplemented", rule_unimplemented},
};

int main(int argc, char** argv) {
  if (argc == 1) return checks_program();
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    if (strcmp(argv[1], rules[i].name) == 0) {
      rules[i].run();
      return 0;
    }
  }
  fprintf(stderr, "unknown rule %s; the rules:", argv[1]);
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) fprintf(stderr, " %s", rules[i].name);
  fprintf(stderr, "\n");
  return 2;
}
