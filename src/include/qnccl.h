/*
 * QNCCL public C API.
 *
 * Quantized collectives over the stock NCCL. This header holds everything a
 * program calls directly; the NCCL entry points themselves (ncclAllReduce,
 * ...) keep their NCCL signatures and are declared in nccl_abi.h.
 *
 * Errors: every function returns an ncclResult_t. On failure
 * qncclGetLastError() returns a message that names the offending argument or
 * setting and the values allowed (thread-local, valid until the next failing
 * QNCCL call on the same thread).
 *
 * With NVIDIA's header: include <nccl.h> before qnccl.h. nccl_abi.h then
 * declares nothing of NCCL's own and NVIDIA's declarations serve both (they
 * are the same ABI, tests/test_abi.py checks it); included the other way
 * round, the two headers' declarations clash.
 */
#ifndef QNCCL_H_
#define QNCCL_H_

#include "nccl_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define QNCCL_MAJOR 0
#define QNCCL_MINOR 1
#define QNCCL_PATCH 0
/* QNCCL_VERSION_CODE = major*10000 + minor*100 + patch */
#define QNCCL_VERSION_CODE (QNCCL_MAJOR * 10000 + QNCCL_MINOR * 100 + QNCCL_PATCH)

/* Version of the compressed wire format (docs/wire-format.md). Peers must
 * agree on it; it changes whenever a byte of the format would. */
#define QNCCL_WIRE_VERSION 2

#define QNCCL_MIN_BITS 1
#define QNCCL_MAX_BITS 8

ncclResult_t qncclGetVersion(int* version);
const char* qncclGetLastError(void);

/* ---- Codec: bucketed max-min quantization (docs/wire-format.md) ---------- */

typedef enum {
  qncclRoundNearest = 0,    /* round to nearest, ties to even */
  qncclRoundStochastic = 1  /* unbiased: E[decode(encode(x))] == x */
} qncclRounding_t;

typedef enum {
  qncclRotationNone = 0,    /* quantize the values as they are */
  qncclRotationHadamard = 1, /* a randomized Hadamard rotation first (docs/rotation.md) */
  qncclRotationPrerotated = 2 /* the caller rotated the values (a collective's rotated domain,
                                 e.g. qnccl.torch's hook): the uniform grid, as Hadamard's,
                                 but nothing rotated here or when decoded */
} qncclRotation_t;

/* The range each bucket's uniform grid spans (docs/rotation.md, "Clipped
 * ranges"). qncclClipGaussian takes a rotated call's buckets for the
 * Gaussians a rotation makes them: each bucket's stored range is its
 * [min, max] cut at f * max(|min|, |max|), f the fraction at which the
 * bucket's largest magnitude, as expected of `bucketSize` Gaussian values,
 * puts the 2^bits-level grid that quantizes a Gaussian with the least mean
 * squared error; values past the cut encode as its ends. Biased: it pays
 * under Adam-like optimizers and with error feedback, less under plain SGD.
 * Needs a rotation (qncclRotationHadamard or qncclRotationPrerotated). */
typedef enum {
  qncclClipNone = 0,     /* the bucket's whole [min, max] */
  qncclClipGaussian = 1  /* cut for Gaussian values (above) */
} qncclClip_t;

#define QNCCL_MIN_ROTATION_BLOCK 2
#define QNCCL_MAX_ROTATION_BLOCK 16384
#define QNCCL_DEFAULT_ROTATION_BLOCK 256

typedef struct {
  int bits;                 /* bits per value, QNCCL_MIN_BITS..QNCCL_MAX_BITS */
  size_t bucketSize;        /* values sharing one (min, max) pair, >= 1 */
  qncclRounding_t rounding;
  uint64_t seed;            /* seed of the stochastic-rounding random streams, and of the
                               rotation's signs */
  /* qncclRotationHadamard: the values are rotated in blocks of rotationBlock
   * (a power of two, QNCCL_MIN_ROTATION_BLOCK..QNCCL_MAX_ROTATION_BLOCK; 0:
   * QNCCL_DEFAULT_ROTATION_BLOCK) before they are quantized, every bucket on
   * the uniform grid, and rotated back when decoded: a quantize and its
   * dequantize take the same config. The wire layout is unchanged. */
  qncclRotation_t rotation;
  size_t rotationBlock;
  qncclClip_t clip;         /* qncclClipNone unless rotated (above) */
} qncclCodecConfig_t;

/* Bytes that qncclQuantize writes for `count` values. */
ncclResult_t qncclCompressedSize(size_t count, const qncclCodecConfig_t* config, size_t* bytes);

/* Quantizes `count` values of `datatype` (ncclFloat32, ncclFloat16 or
 * ncclBfloat16) from `src` into `dst` (at least qncclCompressedSize bytes).
 * `randomStream` selects the stochastic-rounding stream: the random number of
 * value i is a pure function of (config->seed, randomStream, i), so callers
 * give every rank and every call a stream of its own. Ignored for nearest
 * rounding. Buffers in device memory run on `stream` (CUDA builds); host
 * buffers run synchronously and `stream` is ignored. */
ncclResult_t qncclQuantize(const void* src, size_t count, ncclDataType_t datatype,
                           const qncclCodecConfig_t* config, uint64_t randomStream, void* dst,
                           size_t dstBytes, cudaStream_t stream);

/* Decodes `count` values from `src` (`srcBytes` long) into `dst` of
 * `datatype` (float32, float16 or bfloat16). */
ncclResult_t qncclDequantize(const void* src, size_t srcBytes, size_t count,
                             const qncclCodecConfig_t* config, void* dst,
                             ncclDataType_t datatype, cudaStream_t stream);

/* acc[i] = acc[i] + decode(src)[i], added in float32 and stored back as
 * `datatype` (float32, float16 or bfloat16): the hot step of a reduction. */
ncclResult_t qncclDequantizeAccumulate(const void* src, size_t srcBytes, size_t count,
                                       const qncclCodecConfig_t* config, void* acc,
                                       ncclDataType_t datatype, cudaStream_t stream);

/* The rotation on its own (docs/rotation.md), for callers that keep values in
 * the rotated domain and quantize them with qncclRotationPrerotated:
 * qncclRotate writes the forward rotation of `count` values of `datatype` at
 * src, rotated as one segment in blocks of config->rotationBlock with the
 * signs of config->seed, as `count` float32 values at dst; qncclUnrotate
 * rotates `count` float32 values at src back into dst, stored as `datatype`.
 * Both write every NaN as the canonical one (a NaN poisons its block). The
 * config's rotation must be the Hadamard one; its bits and bucketSize are
 * unused, but checked as for qncclQuantize. In place (dst == src) for ncclFloat32; otherwise the
 * buffers must not overlap. Host buffers (device ones: ncclInvalidUsage, not
 * in this build yet); `stream` is ignored. */
ncclResult_t qncclRotate(const void* src, size_t count, ncclDataType_t datatype,
                         const qncclCodecConfig_t* config, float* dst, cudaStream_t stream);
ncclResult_t qncclUnrotate(const float* src, size_t count, const qncclCodecConfig_t* config,
                           void* dst, ncclDataType_t datatype, cudaStream_t stream);

/* ---- Quantized allreduce (docs/allreduce.md) ----------------------------- */

typedef enum {
  qncclAlgoAuto = 0,  /* picked by rank count, size and node layout (docs/allreduce.md) */
  qncclAlgoRing = 1,
  qncclAlgoTree = 2,
  qncclAlgoSra = 3,   /* scatter-reduce then allgather, all-to-all in each phase */
  qncclAlgoHier = 4   /* reduce-scatter inside each node, interAlgo between the nodes'
                         ranks of one local index, allgather inside each node */
} qncclAlgo_t;

#define QNCCL_DEFAULT_SEGMENT_VALUES ((size_t)1 << 22)

typedef struct {
  qncclCodecConfig_t codec;
  qncclAlgo_t algo;
  /* Values per segment: the buffer is reduced a segment at a time, which
   * bounds the workspace. 0: QNCCL_DEFAULT_SEGMENT_VALUES. Rounded down to a
   * multiple of codec.bucketSize (at least one bucket). */
  size_t segmentValues;
  /* 1: error feedback. Each rank keeps, per (communicator, sendbuff address,
   * count, datatype), a float32 residual of what quantizing its sends
   * dropped (0 where it owns the result, whose error is not fed back) and
   * adds it to its input of the next call on that buffer
   * (docs/allreduce.md, "Error feedback"): count * 4 bytes per buffer, in
   * the buffer's kind of memory, until qncclCommResetErrorFeedback or the
   * communicator's end. 0: none. */
  int errorFeedback;
  /* With qncclAlgoHier, also when auto picks it: the quantized algorithm
   * between nodes: Ring, Tree, Sra, or Auto, which picks one for the shard
   * size and the node count. */
  qncclAlgo_t interAlgo;
  /* With qncclAlgoHier: 0 reduces inside a node exactly, with the real NCCL's
   * ncclReduceScatter; 1..8 quantizes each rank's contribution to its node's
   * reduction with that many bits (codec's bucket size, rounding and seed). */
  int intraBits;
  /* Lanes of a flat call's pipeline (docs/allreduce.md, "Pipelined
   * segments"): its segments run on up to this many lanes that take turns on
   * the communicator, each computing while another's transfers are in
   * flight (device buffers: each lane on a stream of its own). 1..
   * QNCCL_MAX_LANES; 0: 2 for device buffers, 1 for host buffers (where the
   * codec runs on the CPU that also drives the transfers). Every rank must
   * pass the same. qncclAlgoHier always runs 4 lanes. */
  int lanes;
} qncclAllReduceConfig_t;

#define QNCCL_MAX_LANES 8

/* Sum (ncclSum) or average (ncclAvg) of `count` values of `datatype`
 * (ncclFloat32, ncclFloat16 or ncclBfloat16) over the ranks of `comm`, every
 * transfer quantized as `config` says. In place when sendbuff == recvbuff.
 * Every rank receives identical bytes. With config->errorFeedback the call
 * reads and rewrites the residual of (comm, sendbuff, count, datatype).
 *
 * `comm` belongs to the NCCL library QNCCL talks to: a libnccl.so.2 already
 * loaded in the process, else the one environment variable QNCCL_NCCL_LIB
 * names, else libnccl.so.2 from the library path (NVIDIA's for device
 * buffers, QNCCL's host backend for host buffers). The random streams of
 * stochastic rounding count this communicator's calls, so every rank must
 * make the same calls in the same order, as for any collective. */
ncclResult_t qncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op,
                            const qncclAllReduceConfig_t* config, ncclComm_t comm,
                            cudaStream_t stream);

/* Quantized ncclReduceScatter (docs/collectives.md): rank r receives in
 * recvbuff the sum (ncclSum) or average (ncclAvg) over the ranks of chunk r
 * of their sendbuff (nranks * recvcount values of `datatype`: ncclFloat32,
 * ncclFloat16 or ncclBfloat16), every piece sent quantized as `config`
 * says. config->algo: qncclAlgoSra, each rank's chunk k goes straight to
 * rank k, quantized once; qncclAlgoRing, partial sums travel the ring,
 * re-quantized at every hop; qncclAlgoAuto, SRA up to 16 ranks, ring
 * beyond. errorFeedback must be 0. The result is added and stored from
 * float32, never quantized itself. In place when recvbuff == sendbuff +
 * rank * recvcount. The call counts among the communicator's quantized
 * calls (the random streams), like qncclAllReduce. */
ncclResult_t qncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op,
                                const qncclAllReduceConfig_t* config, ncclComm_t comm,
                                cudaStream_t stream);

/* Quantized ncclAllGather (docs/collectives.md): every rank's `sendcount`
 * values of `datatype` (ncclFloat32, ncclFloat16 or ncclBfloat16) are
 * quantized once, as `config` says, and every rank, the sender included,
 * decodes them into chunk `rank` of recvbuff (nranks * sendcount values):
 * every rank holds the same bytes. config->algo must be qncclAlgoAuto and
 * errorFeedback 0. In place when sendbuff == recvbuff + rank * sendcount.
 * Counts among the communicator's quantized calls, like qncclAllReduce. */
ncclResult_t qncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                            ncclComm_t comm, cudaStream_t stream);

/* Quantized ncclAlltoAll (docs/collectives.md): chunk k of sendbuff (`count`
 * values of `datatype` each, nranks chunks) goes to rank k, quantized once as
 * `config` says, and lands in chunk `rank` of its recvbuff; a rank's own
 * chunk is copied bit for bit. config->algo must be qncclAlgoAuto and
 * errorFeedback 0. In place when sendbuff == recvbuff. Counts among the
 * communicator's quantized calls, like qncclAllReduce. */
ncclResult_t qncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, const qncclAllReduceConfig_t* config,
                           ncclComm_t comm, cudaStream_t stream);

/* The algorithm qncclAlgoAuto picks for `count` values of `datatype` over
 * `nranks` ranks on one node (on several, see qncclCommTopology). */
ncclResult_t qncclAutoAlgo(size_t count, ncclDataType_t datatype, int nranks, qncclAlgo_t* algo);

/* Bytes of scratch memory (accumulator and wire buffers, docs/allreduce.md
 * "Workspace") a qncclAllReduce of `count` values of `datatype` over
 * `nranks` ranks with `config` works in. On host buffers it is allocated per
 * call; on device buffers the communicator keeps device memory at least as
 * large as its largest call so far, and a call captured into a CUDA graph
 * must fit in it (QNCCL allocates nothing during capture). */
ncclResult_t qncclAllReduceWorkspaceSize(size_t count, ncclDataType_t datatype,
                                         const qncclAllReduceConfig_t* config, int nranks,
                                         size_t* bytes);

/* An upper bound on |result[i] - exact[i]| for every element i of a
 * qncclAllReduce (or of an ncclAllReduce with a quantized op, or interposed)
 * of `count` values of `datatype` with `op` (ncclSum or ncclAvg) over
 * `nranks` ranks and `config` (qncclAlgoAuto resolved as the call would),
 * when every rank's inputs are finite and lie in [-inputAbsMax, inputAbsMax];
 * exact[i] is the sum (or average) of the inputs in exact arithmetic. Covers
 * the quantizations and every float32 rounding on the way, the final
 * rounding to float16/bfloat16 included, for both rounding modes
 * (docs/allreduce.md, "Error bound"); a rotated config's bound
 * (docs/rotation.md, "Error bound") is a worst case about 2^ceil(k/2) times
 * larger, k = log2 of the largest rotation block a value can be in. It
 * depends on count only through the algorithm auto picks and, rotated, that
 * block. *bound is +infinity when a partial sum or the result
 * could overflow its type (the call may then return infinities or NaNs).
 * Fails for config->errorFeedback = 1: a call then also returns earlier
 * calls' residuals, so no bound follows from its inputs alone (the sum over
 * calls is bounded instead: docs/allreduce.md, "Error feedback"). */
ncclResult_t qncclAllReduceErrorBound(size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                                      const qncclAllReduceConfig_t* config, int nranks,
                                      double inputAbsMax, double* bound);

/* Which ranks of `comm` share a node (a host: same host name, or same
 * NCCL_HOSTID), as the hierarchical allreduce and qncclAlgoAuto see it. */
typedef struct {
  int nodes;       /* nodes the communicator spans (when uniform; else 0) */
  int localRanks;  /* ranks of `comm` on this rank's node */
  int localRank;   /* this rank's index among them, by rank */
  int uniform;     /* 1: every node has localRanks ranks */
} qncclTopology_t;

/* The node layout of `comm`. Collective the first time on a communicator
 * (every rank calls it, like ncclCommSplit, which it uses); the answer is
 * then kept. */
ncclResult_t qncclCommTopology(ncclComm_t comm, qncclTopology_t* topology);

/* ---- Quantized reduction ops ---------------------------------------------- */

typedef struct {
  qncclAllReduceConfig_t allreduce;  /* codec, algorithm, segment size */
  ncclRedOp_t reduction;             /* ncclSum or ncclAvg */
} qncclQuantizedOpConfig_t;

/* Creates an ncclRedOp_t meaning "`config->reduction`, quantized with
 * `config->allreduce`", valid for ncclAllReduce on `comm` until
 * ncclRedOpDestroy(op, comm). It applies whatever the QNCCL_* environment
 * says (also with QNCCL_ENABLE=0 and below QNCCL_MIN_BYTES). Needs
 * libqnccl.so to be the library the program's ncclAllReduce resolves to
 * (LD_PRELOAD, or `qnccl run`). The op's value is one the real NCCL hands
 * out for `comm` (a float32 PreMulSum by 1, or by 1/nranks for ncclAvg), so
 * it equals no other op of the communicator; ncclRedOpDestroy frees it.
 * Passed to any other NCCL call it is that PreMulSum: exact, not quantized. */
ncclResult_t qncclRedOpCreateQuantized(ncclRedOp_t* op, const qncclQuantizedOpConfig_t* config,
                                       ncclComm_t comm);

/* ---- Configuration from the environment (docs/environment.md) ------------ */

typedef enum { qncclDebugWarn = 0, qncclDebugInfo = 1, qncclDebugTrace = 2 } qncclDebugLevel_t;

/* The interposed collectives QNCCL_COLLECTIVES can quantize, as flags; a
 * collective's index in qncclEnvConfig_t.collectiveBits is the flag's bit. */
typedef enum {
  qncclCollAllReduce = 1,      /* "allreduce": ncclAllReduce */
  qncclCollReduceScatter = 2,  /* "reducescatter": ncclReduceScatter */
  qncclCollAllGather = 4,      /* "allgather": ncclAllGather */
  qncclCollAllToAll = 8,       /* "alltoall": ncclAlltoAll */
  qncclCollSendRecv = 16       /* "sendrecv": ncclSend/ncclRecv (PyTorch's all-to-all) */
} qncclCollective_t;
#define QNCCL_NUM_COLLECTIVES 5

typedef struct {
  int enable;                        /* QNCCL_ENABLE: 0 passes every call through */
  qncclAllReduceConfig_t allreduce;  /* QNCCL_BITS, _BUCKET_SIZE, _ROUNDING, _SEED, _ALGO,
                                        _ERROR_FEEDBACK */
  size_t minBytes;                   /* QNCCL_MIN_BYTES: smaller calls pass through */
  uint64_t warmupCalls;              /* QNCCL_WARMUP_CALLS: first eligible calls stay exact */
  qncclDebugLevel_t debug;           /* QNCCL_DEBUG */
  unsigned collectives;              /* QNCCL_COLLECTIVES: qncclColl* flags of the quantized
                                        collectives (default qncclCollAllReduce) */
  int collectiveBits[QNCCL_NUM_COLLECTIVES]; /* QNCCL_<NAME>_BITS: bits of one collective,
                                                0 for allreduce.codec.bits (QNCCL_BITS) */
  int measured;                      /* QNCCL_ALGO=auto: 1, the interposer measures per
                                        communicator and size which candidate (the exact call
                                        or a quantized algorithm) is fastest (docs/tuning.md);
                                        QNCCL_ALGO=rule: 0, auto's fixed rules; 0 for the
                                        fixed algorithms */
  size_t errorFeedbackMaxBytes;      /* QNCCL_ERROR_FEEDBACK_MAX_BYTES: the residuals a
                                        communicator keeps at most (default 4 GiB); past it
                                        the least recently used go (docs/allreduce.md, "Error
                                        feedback") */
} qncclEnvConfig_t;

/* qncclAllReduceErrorBound for any quantized collective (docs/collectives.md,
 * "Error bound"): a bound on |result - exact| of every output value of a
 * call of `collective` (`count` as that call takes it; `op` only for the
 * reductions; config->algo as the call resolves it) when every input is
 * finite and in [-inputAbsMax, inputAbsMax]. A reduce-scatter's is the
 * allreduce's without the owner's final quantization; an allgather's,
 * all-to-all's or send's is one quantization and the store into the type;
 * rotated, each is bounded in the rotated domain and mapped back as
 * qncclAllReduceErrorBound's. */
ncclResult_t qncclCollectiveErrorBound(qncclCollective_t collective, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op,
                                       const qncclAllReduceConfig_t* config, int nranks,
                                       double inputAbsMax, double* bound);

/* A communicator's own policy for the interposed calls on it, in place of
 * QNCCL_COLLECTIVES and QNCCL_<NAME>_BITS (docs/collectives.md, "Which
 * calls are quantized"): for each collective in `collectives` (qncclColl*
 * flags, OR-ed), `bits` 1..8 quantizes its eligible calls on `comm` with
 * that many bits, 0 sends them to NCCL exact, -1 returns to the
 * environment's policy. Eligibility (type, op, QNCCL_MIN_BYTES, warm-up)
 * and QNCCL_ENABLE=0 still apply. Takes effect from the next call issued on
 * `comm`, so it also selects bits per call (e.g. the forward and backward
 * all-to-all of an embedding); every rank of `comm` must set the same. The
 * communicator must be one the interposed NCCL made (LD_PRELOAD, qnccl run). */
ncclResult_t qncclCommSetQuantization(ncclComm_t comm, unsigned collectives, int bits);

/* What an eligible interposed call of `collective` (one qncclColl* flag) on
 * `comm` runs with now: *bits 1..8 quantized, 0 exact; and, unless `config`
 * is NULL, the configuration it is quantized with (its codec, algorithm,
 * segments, lanes, error feedback) when *bits > 0. */
ncclResult_t qncclCommGetQuantization(ncclComm_t comm, qncclCollective_t collective, int* bits,
                                      qncclAllReduceConfig_t* config);

/* The configuration the QNCCL_* variables give a communicator created now.
 * An unparsable or out-of-range value fails with ncclInvalidArgument and a
 * message naming the variable and the values allowed. */
ncclResult_t qncclConfigFromEnv(qncclEnvConfig_t* config);

/* ---- Statistics ------------------------------------------------------------- */

typedef struct {
  uint64_t callsCompressed;   /* calls that went through the quantized engine (of any
                                 collective; a group's quantized sends and receives: one) */
  uint64_t callsPassedThrough; /* interposed calls forwarded to the real NCCL unchanged */
  uint64_t bytesIn;           /* input bytes of the compressed calls */
  uint64_t bytesOnWire;       /* bytes this rank sent for them */
  uint64_t residualBuffers;   /* error feedback: buffers holding a residual now */
  uint64_t residualBytes;     /* memory those residuals take now (count * 4 each) */
  uint64_t computeSteps;      /* compute steps the compressed calls ran (codec, widening,
                                 averaging, error feedback): one pass over their values each
                                 on host buffers, one kernel each on device buffers (a
                                 quantize: two or three, statistics then encoding) */
  uint64_t groups;            /* real NCCL groups the compressed calls issued (one per
                                 transport step that moves bytes) */
} qncclStats_t;

/* Counters of `comm` since its creation. */
ncclResult_t qncclCommGetStats(ncclComm_t comm, qncclStats_t* stats);

/* ---- Measured auto (docs/tuning.md) -------------------------------------------- */

#define QNCCL_MAX_CANDIDATES 5
#define QNCCL_EXACT_CANDIDATE (-1) /* a candidate: the real NCCL's exact call */
#define QNCCL_TRIALS_PER_CANDIDATE 5 /* trial calls per candidate, in a row: two warm it up,
                                        three are timed (docs/tuning.md) */

/* One (collective, type, size class) of a communicator under QNCCL_ALGO=auto. */
typedef struct {
  qncclCollective_t collective;
  ncclDataType_t datatype;
  int sizeClass;        /* its calls' input per rank: [2^sizeClass, 2^(sizeClass+1)) bytes */
  uint64_t calls;       /* its calls so far, trials included */
  int trialCalls;       /* calls its trials take: candidateCount x QNCCL_TRIALS_PER_CANDIDATE (0:
                           one candidate, or a decision read from QNCCL_TUNE_FILE) */
  int candidateCount;
  int candidates[QNCCL_MAX_CANDIDATES]; /* QNCCL_EXACT_CANDIDATE, or a qncclAlgo_t value;
                                           qncclAlgoAuto is an allgather's or all-to-all's
                                           one quantized algorithm */
  double seconds[QNCCL_MAX_CANDIDATES]; /* agreed: the slowest rank's median trial, once
                                           decided (0 before) */
  double floorSeconds[QNCCL_MAX_CANDIDATES];   /* agreed: the slowest rank's fastest timed
                                                  trial (0 before, and when stored) */
  double ceilingSeconds[QNCCL_MAX_CANDIDATES]; /* agreed: the slowest timed trial of any
                                                  rank (0 before, and when stored) */
  int choice;           /* the index of the candidate its calls run; -1 while trying */
  int stored;           /* 1: decided by QNCCL_TUNE_FILE, without trials (seconds: the
                           times the file holds) */
} qncclTuning_t;

/* The keys measured auto has met on `comm` so far, in (collective, type,
 * size class) order: the first min(*count, capacity) in `table` (NULL with
 * capacity 0 asks for the count), and their number in *count. */
ncclResult_t qncclCommGetTuning(ncclComm_t comm, qncclTuning_t* table, int capacity, int* count);

/* Drops everything libqnccl holds for `comm` (error feedback's residuals,
 * call counts, statistics, workspaces, per-communicator settings) without
 * calling the NCCL library on it, and aborts the communicators libqnccl made
 * from it (the hierarchical allreduce's): for a communicator that was
 * destroyed or aborted without libqnccl seeing it, as PyTorch's watchdog
 * aborts one through NVIDIA's ncclCommAbort when libqnccl is not preloaded (a
 * new communicator may later get its address). Fails with
 * ncclInvalidArgument when libqnccl holds nothing for `comm`. */
ncclResult_t qncclCommForget(ncclComm_t comm);

/* ---- Error feedback (docs/allreduce.md, "Error feedback") ----------------- */

/* Frees every residual of `comm`: the next call on each buffer starts again
 * from zero (as after a change of model or optimizer state). Returns at once:
 * device memory is released in stream order, after the communicator's calls
 * already queued on the device. */
ncclResult_t qncclCommResetErrorFeedback(ncclComm_t comm);

/* The same for every communicator of the process: for frameworks that do not
 * expose their communicators (PyTorch's ProcessGroupNCCL). Like any call on a
 * communicator, not while another thread runs an allreduce. */
ncclResult_t qncclResetErrorFeedback(void);

/* Copies this rank's residual of the buffer (`sendbuff`, `count`,
 * `datatype`) of `comm` into `residual`, `count` float32 values in host
 * memory (to inspect or test error feedback; a device residual is copied
 * after the device's queued work). Fails when the buffer has no residual. */
ncclResult_t qncclCommGetResidual(ncclComm_t comm, const void* sendbuff, size_t count,
                                  ncclDataType_t datatype, float* residual);

/* ---- Random streams (docs/allreduce.md, "Random streams") ---------------- */

/* The `call` numbers the next quantized collective call and the next
 * quantized point-to-point call (a group's sends and receives) on `comm`
 * take: how many this rank has made, unless set. For device calls they are
 * read from the device's counters once the calls queued so far are done. */
ncclResult_t qncclCommGetCallCounts(ncclComm_t comm, uint64_t* calls, uint64_t* p2pCalls);

/* Sets them, effective from the next call (on the device, ordered after the
 * calls queued so far): a job restored from a checkpoint on a new
 * communicator continues the random streams of stochastic rounding where the
 * saved job stopped, bit for bit, when every rank sets what
 * qncclCommGetCallCounts gave it at the checkpoint. */
ncclResult_t qncclCommSetCallCounts(ncclComm_t comm, uint64_t calls, uint64_t p2pCalls);

/* 1 when this library was built with the CUDA kernels, else 0. */
ncclResult_t qncclCudaCompiled(int* compiled);

/* The CUDA side of this library and of the machine. Versions are CUDA's
 * encoding, 1000 * major + 10 * minor (12040: CUDA 12.4), 0 for none. */
typedef struct {
  int compiled;         /* 1: built with the CUDA kernels */
  int runtimeVersion;   /* the CUDA runtime linked into the library */
  int driverVersion;    /* the CUDA version of the installed driver (0: no driver) */
  const char* sass;     /* GPU architectures with machine code: "80,86,89,90,100,120" */
  const char* ptx;      /* those with PTX, which newer GPUs compile at load time: "120" */
} qncclCudaInfo_t;
ncclResult_t qncclCudaInfo(qncclCudaInfo_t* info);

/* Instruction set of the host codec in use: "generic", "avx2" or "avx512"
 * (the fastest this CPU runs, or the one environment variable
 * QNCCL_HOST_ISA names; an unknown or unsupported name fails here and in
 * every host codec call). All give the same bytes. */
ncclResult_t qncclHostCodecIsa(const char** isa);

#ifdef __cplusplus
}
#endif

#endif /* QNCCL_H_ */
