/*
 * An ordinary NCCL + MPI program: no QNCCL header, nothing QNCCL-specific.
 * tests/test_interposer.py runs it as is and under `qnccl run` (libqnccl.so
 * preloaded) and recomputes every result from the bytes it writes.
 *
 *     mpirun -np N nccl_allreduce OUTDIR
 *
 * Rank 0 makes an NCCL unique id and broadcasts it with MPI; every rank joins
 * the communicator and runs the steps of kSteps in order: allreduces of
 * several types, ops, sizes, in place and out of place, and a nested group
 * mixing calls of every kind. Inputs are a pure function of (call index,
 * rank). Afterwards each rank writes, for every call, its input and output as
 * raw bytes to OUTDIR/<call>.r<rank>.in and .out; rank 0 also writes
 * OUTDIR/manifest.tsv, one line per call in issue order:
 *
 *     index  name  datatype  op  count  inplace(0|1)  group depth(0 = not grouped)
 *
 * Exits non-zero, with the NCCL error, if any call fails, and also if an
 * out-of-place call changed its send buffer. Buffers are host memory: the
 * NCCL under it is QNCCL's host backend (build/host/libnccl.so.2).
 */
#include <mpi.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum Kind { CALL, GROUP_START, GROUP_END };

typedef struct {
  enum Kind kind;
  const char* name;
  ncclDataType_t type;
  ncclRedOp_t op;
  size_t count;
  int inplace;
} Step;

#define GROUP_START_STEP {GROUP_START, NULL, ncclFloat32, ncclSum, 0, 0}
#define GROUP_END_STEP {GROUP_END, NULL, ncclFloat32, ncclSum, 0, 0}

/* Sizes are picked against QNCCL_MIN_BYTES=16K in the test: float32 calls of
 * 4096 values (16 KiB) are eligible, 4095 are not; below 64 KiB per rank the
 * automatic algorithm is tree, above it SRA (up to 16 ranks). */
static const Step kSteps[] = {
    {CALL, "f32_sum", ncclFloat32, ncclSum, 300007, 0},
    {CALL, "f32_avg_inplace", ncclFloat32, ncclAvg, 262144, 1},
    {CALL, "f16_sum", ncclFloat16, ncclSum, 100003, 0},
    {CALL, "bf16_avg_inplace", ncclBfloat16, ncclAvg, 65536, 1},
    {CALL, "i32_sum", ncclInt32, ncclSum, 100000, 0},
    {CALL, "f32_max", ncclFloat32, ncclMax, 100000, 0},
    {CALL, "f64_sum", ncclFloat64, ncclSum, 50000, 0},
    {CALL, "f32_small", ncclFloat32, ncclSum, 1000, 0},
    {CALL, "f32_below_min", ncclFloat32, ncclSum, 4095, 1},
    {CALL, "f32_at_min", ncclFloat32, ncclSum, 4096, 0},
    {CALL, "f32_tree", ncclFloat32, ncclAvg, 6000, 0},
    GROUP_START_STEP,
    GROUP_START_STEP,
    {CALL, "g_f32_sum", ncclFloat32, ncclSum, 131072, 0},
    {CALL, "g_i32_sum", ncclInt32, ncclSum, 5000, 1},
    {CALL, "g_f32_avg_inplace", ncclFloat32, ncclAvg, 70001, 1},
    GROUP_END_STEP,
    {CALL, "g_f32_small", ncclFloat32, ncclSum, 100, 0},
    {CALL, "g_f16_sum", ncclFloat16, ncclSum, 40000, 0},
    GROUP_END_STEP,
    {CALL, "f32_after_group", ncclFloat32, ncclSum, 65536, 1},
};
#define NUM_STEPS (sizeof kSteps / sizeof kSteps[0])

static int rank = 0;

#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s failed: %s (%d): %s\n", rank, #call,                \
              ncclGetErrorString(r_), (int)r_, ncclGetLastError(NULL));                \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
    }                                                                                  \
  } while (0)

static void fail(const char* what, const char* name) {
  fprintf(stderr, "rank %d: %s: %s\n", rank, name, what);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static size_t type_size(ncclDataType_t type) {
  switch (type) {
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    default: fail("unexpected datatype", "type_size"); return 0;
  }
}

static const char* type_name(ncclDataType_t type) {
  switch (type) {
    case ncclFloat16: return "float16";
    case ncclBfloat16: return "bfloat16";
    case ncclInt32: return "int32";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    default: return "?";
  }
}

static const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclAvg: return "avg";
    case ncclMax: return "max";
    default: return "?";
  }
}

/* 64-bit LCG (Knuth's MMIX constants); the top bits are the random ones. */
static uint64_t lcg_next(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 11; /* 53 random bits */
}

/* Uniform in [-1, 1) with 2^-k resolution, exactly a float of every type. */
static double uniform(uint64_t* state, int k) {
  return (double)(int64_t)(lcg_next(state) >> (53 - k - 1)) / (double)(1ULL << k) - 1.0;
}

/* float16 bits of v = m / 1024, |m| <= 1024 (exact: at most 11 significant bits). */
static uint16_t half_bits(double v) {
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned m = (unsigned)(v < 0 ? -v * 1024 : v * 1024);
  if (m == 0) return sign;
  int e = 0;
  while ((m >> (e + 1)) != 0) e++; /* m in [2^e, 2^(e+1)): v = 1.f * 2^(e - 10) */
  return (uint16_t)(sign | (unsigned)(e + 5) << 10 | ((m << (10 - e)) & 0x3FF));
}

/* bfloat16 bits of v = m / 128, |m| <= 128 (exact: at most 8 significant bits). */
static uint16_t bfloat16_bits(double v) {
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return (uint16_t)(bits >> 16);
}

/* Input of call `index` on `rank`: values in [-1, 1) (int32: -1000..1000). */
static void fill_input(void* buf, const Step* s, int index) {
  uint64_t state = 0x9E3779B97F4A7C15ULL * (uint64_t)(index + 1) + (uint64_t)rank;
  for (int warm = 0; warm < 4; warm++) lcg_next(&state);
  for (size_t i = 0; i < s->count; i++) {
    switch (s->type) {
      case ncclFloat32: ((float*)buf)[i] = (float)uniform(&state, 23); break;
      case ncclFloat64: ((double*)buf)[i] = uniform(&state, 52); break;
      case ncclFloat16: ((uint16_t*)buf)[i] = half_bits(uniform(&state, 10)); break;
      case ncclBfloat16: ((uint16_t*)buf)[i] = bfloat16_bits(uniform(&state, 7)); break;
      case ncclInt32: ((int32_t*)buf)[i] = (int32_t)(lcg_next(&state) % 2001) - 1000; break;
      default: fail("unexpected datatype", s->name);
    }
  }
}

static void write_file(const char* dir, const char* name, const char* suffix, const void* data,
                       size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.r%d.%s", dir, name, rank, suffix);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) fail("cannot write", path);
}

typedef struct {
  void* send;
  void* recv;
  void* input; /* a copy of the input, kept to write and to check the send buffer */
  size_t bytes;
} Buffers;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (argc != 2) {
    if (rank == 0) fprintf(stderr, "usage: mpirun -np N %s OUTDIR\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const char* dir = argv[1];

  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  /* Every call has buffers of its own, alive until the end: grouped calls
   * only run at the outermost ncclGroupEnd. */
  Buffers buffers[NUM_STEPS];
  memset(buffers, 0, sizeof buffers);
  int depth = 0;
  for (size_t i = 0; i < NUM_STEPS; i++) {
    const Step* s = &kSteps[i];
    if (s->kind == GROUP_START) {
      NCCL_CHECK(ncclGroupStart());
      depth++;
      continue;
    }
    if (s->kind == GROUP_END) {
      NCCL_CHECK(ncclGroupEnd());
      depth--;
      continue;
    }
    Buffers* b = &buffers[i];
    b->bytes = s->count * type_size(s->type);
    b->input = malloc(b->bytes);
    b->send = malloc(b->bytes);
    b->recv = s->inplace ? b->send : malloc(b->bytes);
    if (b->input == NULL || b->send == NULL || b->recv == NULL) fail("out of memory", s->name);
    fill_input(b->input, s, (int)i);
    memcpy(b->send, b->input, b->bytes);
    if (!s->inplace) memset(b->recv, 0xA5, b->bytes);
    NCCL_CHECK(ncclAllReduce(b->send, b->recv, s->count, s->type, s->op, comm, NULL));
  }
  if (depth != 0) fail("unbalanced groups in kSteps", "main");

  FILE* manifest = NULL;
  if (rank == 0) {
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.tsv", dir);
    if ((manifest = fopen(path, "w")) == NULL) fail("cannot write", path);
  }
  for (size_t i = 0; i < NUM_STEPS; i++) {
    const Step* s = &kSteps[i];
    if (s->kind == GROUP_START) depth++;
    if (s->kind == GROUP_END) depth--;
    if (s->kind != CALL) continue;
    const Buffers* b = &buffers[i];
    if (!s->inplace && memcmp(b->send, b->input, b->bytes) != 0)
      fail("out of place, but the send buffer changed", s->name);
    write_file(dir, s->name, "in", b->input, b->bytes);
    write_file(dir, s->name, "out", b->recv, b->bytes);
    if (manifest != NULL)
      fprintf(manifest, "%zu\t%s\t%s\t%s\t%zu\t%d\t%d\n", i, s->name, type_name(s->type),
              op_name(s->op), s->count, s->inplace, depth);
    free(b->input);
    if (!s->inplace) free(b->recv);
    free(b->send);
  }
  if (manifest != NULL && fclose(manifest) != 0) fail("cannot write", "manifest.tsv");

  NCCL_CHECK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
