/*
 * A plain NCCL + MPI program (no QNCCL header) that issues what an FSDP
 * training step and a recommendation model's embedding exchange issue.
 * tests/test_fsdp_program.py runs it under `qnccl run` and recomputes every
 * result with qnccl.emulate from the bytes it writes.
 *
 *     mpirun -np N fsdp_step OUTDIR STEPS
 *
 * Every rank owns a shard of SHARD float32 parameters. Each step:
 *   1. ncclAllGather of the shards: every rank holds all N * SHARD parameters
 *      (FSDP's unshard before the forward pass);
 *   2. a gradient of every parameter, a pure function of the gathered
 *      parameters, the rank and the step;
 *   3. ncclReduceScatter(ncclAvg) of the gradients: each rank gets the mean
 *      gradient of its shard;
 *   4. an SGD update of the shard in float32;
 *   5. an all-to-all of EMB bfloat16 embedding values per peer the way
 *      PyTorch's all_to_all_single issues it on NCCL: one group with an
 *      ncclSend and an ncclRecv for every rank, itself included.
 * For step s and rank r it writes OUTDIR/s<s>.<what>.r<r> (raw bytes): shard
 * (before the update), params, grads, grad_shard, emb_in, emb_out. Buffers
 * are host memory (the NCCL under it is QNCCL's host backend); built with
 * -DFSDP_DEVICE they are device memory, every NCCL call on a stream, the
 * program's own arithmetic on host copies (a CUDA program of the runtime
 * API: the simulated GPU runs it in CI). Exits non-zero, naming the call,
 * when any NCCL or CUDA call fails.
 */
#include <mpi.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SHARD = 50000, EMB = 20000 };
static const float kLearningRate = 0.25f;

static int rank = 0, nranks = 1;

#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, ncclGetErrorString(r_)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

static uint64_t next(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 11; /* 53 random bits */
}

/* Uniform in [-1, 1) on a 2^-k grid. */
static double uniform(uint64_t* state, int k) {
  return (double)(int64_t)(next(state) >> (53 - k - 1)) / (double)(1ULL << k) - 1.0;
}

static void* allocate(size_t bytes) {
  void* p = malloc(bytes);
  if (p == NULL) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return p;
}

/* Where the NCCL calls' buffers are: the host arrays themselves, or device
 * twins that the arrays are copied to and from on `stream`. */
#ifdef FSDP_DEVICE
#include <cuda_runtime_api.h>

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, cudaGetErrorString(e_)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

static cudaStream_t stream;

static void* twin(void* host, size_t bytes) {
  void* p = NULL;
  (void)host;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

static void upload(void* device, const void* host, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
}

/* After the stream's work: the device's bytes in `host`. */
static void download(void* host, const void* device, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}
#else
static const cudaStream_t stream = NULL;
static void* twin(void* host, size_t bytes) { (void)bytes; return host; }
static void upload(void* device, const void* host, size_t bytes) {
  (void)device, (void)host, (void)bytes;
}
static void download(void* host, const void* device, size_t bytes) {
  (void)host, (void)device, (void)bytes;
}
#endif

static void save(const char* dir, int step, const char* what, const void* data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/s%d.%s.r%d", dir, step, what, rank);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
    fprintf(stderr, "rank %d: cannot write %s\n", rank, path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc != 3 || atoi(argv[2]) < 1) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -np N %s OUTDIR STEPS\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const char* dir = argv[1];
  const int steps = atoi(argv[2]);
  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  const size_t full = (size_t)nranks * SHARD, emb = (size_t)nranks * EMB;
  float* shard = allocate(SHARD * sizeof(float));
  float* params = allocate(full * sizeof(float));
  float* grads = allocate(full * sizeof(float));
  float* grad_shard = allocate(SHARD * sizeof(float));
  uint16_t* emb_in = allocate(emb * sizeof(uint16_t));
  uint16_t* emb_out = allocate(emb * sizeof(uint16_t));
#ifdef FSDP_DEVICE
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
#endif
  float* d_shard = twin(shard, SHARD * sizeof(float));
  float* d_params = twin(params, full * sizeof(float));
  float* d_grads = twin(grads, full * sizeof(float));
  float* d_grad_shard = twin(grad_shard, SHARD * sizeof(float));
  uint16_t* d_emb_in = twin(emb_in, emb * sizeof(uint16_t));
  uint16_t* d_emb_out = twin(emb_out, emb * sizeof(uint16_t));
  uint64_t state = 0x9E3779B97F4A7C15ULL + (uint64_t)rank;
  for (size_t i = 0; i < SHARD; i++) shard[i] = (float)uniform(&state, 23);

  for (int step = 0; step < steps; step++) {
    upload(d_shard, shard, SHARD * sizeof(float));
    NCCL_CHECK(ncclAllGather(d_shard, d_params, SHARD, ncclFloat32, comm, stream));
    download(params, d_params, full * sizeof(float));
    for (size_t i = 0; i < full; i++)  /* d/dw of 0.5 (w - t)^2 with a rank's target t */
      grads[i] = params[i] - (float)uniform(&state, 23) * 0.5f;
    upload(d_grads, grads, full * sizeof(float));
    NCCL_CHECK(ncclReduceScatter(d_grads, d_grad_shard, SHARD, ncclFloat32, ncclAvg, comm,
                                 stream));
    download(grad_shard, d_grad_shard, SHARD * sizeof(float));
    save(dir, step, "shard", shard, SHARD * sizeof(float));
    save(dir, step, "params", params, full * sizeof(float));
    save(dir, step, "grads", grads, full * sizeof(float));
    save(dir, step, "grad_shard", grad_shard, SHARD * sizeof(float));
    for (size_t i = 0; i < SHARD; i++) shard[i] -= kLearningRate * grad_shard[i];

    for (size_t i = 0; i < emb; i++) {  /* bfloat16: the top half of a float32 */
      const float v = (float)uniform(&state, 7);
      uint32_t bits;
      memcpy(&bits, &v, sizeof bits);
      emb_in[i] = (uint16_t)(bits >> 16);
    }
    memset(emb_out, 0xA5, emb * sizeof(uint16_t));
    upload(d_emb_in, emb_in, emb * sizeof(uint16_t));
    upload(d_emb_out, emb_out, emb * sizeof(uint16_t));
    NCCL_CHECK(ncclGroupStart());
    for (int peer = 0; peer < nranks; peer++) {
      NCCL_CHECK(ncclSend(d_emb_in + (size_t)peer * EMB, EMB, ncclBfloat16, peer, comm, stream));
      NCCL_CHECK(ncclRecv(d_emb_out + (size_t)peer * EMB, EMB, ncclBfloat16, peer, comm, stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    download(emb_out, d_emb_out, emb * sizeof(uint16_t));
    save(dir, step, "emb_in", emb_in, emb * sizeof(uint16_t));
    save(dir, step, "emb_out", emb_out, emb * sizeof(uint16_t));
  }
  NCCL_CHECK(ncclCommDestroy(comm));
#ifdef FSDP_DEVICE
  void* twins[] = {d_shard, d_params, d_grads, d_grad_shard, d_emb_in, d_emb_out};
  for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++) CUDA_CHECK(cudaFree(twins[i]));
  CUDA_CHECK(cudaStreamDestroy(stream));
#endif
  free(shard);
  free(params);
  free(grads);
  free(grad_shard);
  free(emb_in);
  free(emb_out);
  MPI_Finalize();
  return 0;
}
