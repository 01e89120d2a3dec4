"""qncclAllReduce on real ranks against the emulator: one MPI job, many cases.

    mpirun -np N python allreduce_check.py matrix
    mpirun -np N python allreduce_check.py ordering
    mpirun -np N python allreduce_check.py misuse
    mpirun -np N python allreduce_check.py calls
    mpirun -np N python allreduce_check.py counts
    QNCCL_TEST_MEMORY=device mpirun -np N python allreduce_check.py graphs
    mpirun -np N python allreduce_check.py hier      (on several nodes: perf/netlab --nodes,
                                                      or --ranks-per-node K on one host)

Every rank loads QNCCL's host backend (build/host/libnccl.so.2) before any
engine call, so libqnccl.so's dlopen("libnccl.so.2", RTLD_NOLOAD) finds it,
forms an NCCL communicator from a unique id that rank 0 broadcasts, and runs
the cases in the same order (the random streams count the calls).

matrix    algorithms x types x counts (0, 1, 300: empty chunks, 7919: prime,
          300007: large, 5003 in segments of 960, 1000 in segments of one
          bucket, 2049 in buckets of 1), roundings, sum/avg, in place or not,
          bits 1..8, 64-bit seeds, segments on 1, 2 or 3 pipeline lanes; then
          NaN/Inf inputs; then the tree in several pieces (786,209 values,
          stochastic). Rank 0 gathers every rank's output and checks: all ranks byte-identical; identical to
          qnccl.emulate.allreduce on the same inputs; for nearest rounding of
          finite inputs |output - exact float64 sum| within the emulator's
          bound; out of place, the send buffer untouched. Also qncclAutoAlgo
          against emulate.auto_algo.
ordering  the same data through ring, tree and SRA at 4 bits: bit-exact with
          the emulator, and mean |error| ring > tree > SRA (seeds/000).
misuse    invalid configurations fail with ncclInvalidArgument and a message
          naming the argument and the allowed values, on every rank, without
          counting as a call: a valid stochastic call afterwards still matches
          the emulator's call 0.
calls     each communicator counts its own calls from 0: two alive at once,
          calls interleaved, then a communicator made after one was destroyed;
          then ring and SRA calls of several segments on 2 pipeline lanes on two
          communicators in one group through the interposed ncclAllReduce.
counts    the compute steps and real NCCL groups one call of one segment costs each
          rank (qncclCommGetStats' computeSteps and groups), for ring, tree and SRA x
          sum/avg, against the counts of docs/allreduce.md ("Steps per call"); each
          call also matches the emulator.
graphs    (device buffers) an interposed call captured into a CUDA graph, replayed: each
          replay the emulator's next call, nothing allocated during the capture.
released  a residual and a communicator released while calls using them are queued:
          the calls complete with the emulator's bytes.
hier      the hierarchical algorithm on the job's node layout (host names, or
          NCCL_HOSTID): qncclCommTopology against the gathered host names, then
          inter ring/tree/SRA/auto x types x shapes x exact or quantized intra
          stage, and auto, against the emulator with nodes=; then two
          communicators' calls of several segments in one group through the
          interposed ncclAllReduce (pipelined segments inside the lock-step of
          the group's calls). On a layout whose nodes differ, auto runs flat and
          an explicit hier fails on every rank with ncclInvalidUsage naming the
          layout; on one node an explicit hier runs exact (alone, in a group, with
          error feedback). --ranks-per-node K makes the layout on one host
          (NCCL_HOSTID).

Prints one line per failure, then a summary; exits non-zero on any failure.
"""
import argparse
import dataclasses
import itertools
import os
import re
import socket
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
sys.path[:0] = [str(REPO), str(TESTS)]
from mpi import BUILD  # noqa: E402  (the build under test)

HOST_NCCL = BUILD / "host" / "libnccl.so.2"

from buffers import Memory  # noqa: E402  (host or device buffers: QNCCL_TEST_MEMORY)
from conftest import from_float32, make_values, widen  # noqa: E402  (the codec tests' data)
from qnccl import _lib  # noqa: E402
from qnccl.emulate import allreduce as emulate_allreduce  # noqa: E402
from qnccl.emulate.allreduce import auto_algo, chunks, segment_length  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, NRANKS = COMM.Get_rank(), COMM.Get_size()
ffi = _lib.ffi()
# The host backend first: the engine looks for an already loaded libnccl.so.2.
nccl = ffi.dlopen(str(HOST_NCCL))
lib = _lib.lib()

NCCL_TYPES = {"float32": lib.ncclFloat32, "float16": lib.ncclFloat16,
              "bfloat16": lib.ncclBfloat16}
ALGOS = {"auto": lib.qncclAlgoAuto, "ring": lib.qncclAlgoRing, "tree": lib.qncclAlgoTree,
         "sra": lib.qncclAlgoSra, "hier": lib.qncclAlgoHier}
NODES = None  # hier: the node of each rank (the emulator's nodes=)
ROUNDINGS = {"nearest": lib.qncclRoundNearest, "stochastic": lib.qncclRoundStochastic}
OPS = {"sum": lib.ncclSum, "avg": lib.ncclAvg}
UNWRITTEN = 0xA5  # out of place, the output buffer starts as these bytes
# With QNCCL_TEST_MEMORY=device every call's buffers are device memory on a stream (the
# simulated GPU in CI): ptr() gives a call's pointers, synced() brings the results back.
MEMORY = Memory()
STREAM = MEMORY.cuda_stream(ffi)


def ptr(array):
    return MEMORY.ptr(array, ffi)


def synced(*arrays):
    MEMORY.sync(*arrays)


def residual(comm, array, dtype=None):
    """This rank's error-feedback residual of the send buffer `array` on `comm`."""
    import qnccl.comm
    return qnccl.comm.residual(comm, MEMORY.address(array), count=array.size,
                               dtype=dtype or np.dtype(array.dtype).name)


@dataclasses.dataclass(frozen=True)
class Case:
    algo: str
    dtype: str
    count: int
    rounding: str = "stochastic"
    op: str = "sum"
    inplace: bool = False
    bits: int = 4
    bucket: int = 128
    segment_values: int = 0
    seed: int = 0
    data: str = "wide"  # "wide": conftest.make_values; "special": with NaN/Inf; "normal"
    inter: str = "auto"  # hier: between nodes
    intra_bits: int = 0  # hier: inside a node
    lanes: int = 0  # of a flat call's pipeline (0: auto, one lane on host buffers)
    rotation_block: int = 0  # a Hadamard rotation in blocks of this (0: none)
    prerotated: bool = False  # qncclRotationPrerotated: the uniform grid, nothing rotated
    clip: bool = False  # qncclClipGaussian: the rotated buckets' ranges clipped

    def __str__(self):
        hier = f" inter={self.inter} intra_bits={self.intra_bits}" if NODES is not None else ""
        return (f"{self.algo}{hier} {self.dtype} count={self.count} {self.rounding} {self.op} "
                f"{'in place' if self.inplace else 'out of place'} bits={self.bits} "
                f"bucket={self.bucket} segmentValues={self.segment_values} lanes={self.lanes} "
                f"seed={self.seed} "
                f"data={self.data}"
                + (f" rotation_block={self.rotation_block}" if self.rotation_block else "")
                + (" prerotated" if self.prerotated else "") + (" clip" if self.clip else ""))


def rank_input(case, rank):
    """Rank `rank`'s input of `case`: a pure function of (case.seed, rank)."""
    rng = np.random.default_rng([case.seed, rank])
    if case.data == "normal":
        return from_float32(rng.standard_normal(case.count), case.dtype)
    return make_values(rng, case.count, case.dtype, case.bucket, specials=case.data == "special")


# ---- calling the library ---------------------------------------------------------

class Failures:
    def __init__(self):
        self.lines = []

    def add(self, case, what):
        line = f"FAIL [N={NRANKS}] {case}: {what}"
        self.lines.append(line)
        print(line, flush=True)


def check_nccl(result, what):
    if result != lib.ncclSuccess:
        raise RuntimeError(f"rank {RANK}: {what} failed ({result}): "
                           f"{ffi.string(nccl.ncclGetErrorString(result)).decode()}")


def init_comm():
    uid = ffi.new("ncclUniqueId*")
    if RANK == 0:
        check_nccl(nccl.ncclGetUniqueId(uid), "ncclGetUniqueId")
    ffi.memmove(uid, COMM.bcast(bytes(ffi.buffer(uid)), root=0), ffi.sizeof("ncclUniqueId"))
    comm = ffi.new("ncclComm_t*")
    check_nccl(nccl.ncclCommInitRank(comm, NRANKS, uid[0], RANK), "ncclCommInitRank")
    return comm[0]


def make_config(case):
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec.bits = case.bits
    config.codec.bucketSize = case.bucket
    config.codec.rounding = ROUNDINGS[case.rounding]
    config.codec.seed = case.seed
    config.algo = ALGOS[case.algo]
    config.segmentValues = case.segment_values
    config.lanes = case.lanes
    config.interAlgo = ALGOS[case.inter]
    config.intraBits = case.intra_bits
    if case.rotation_block:
        config.codec.rotation = lib.qncclRotationHadamard
        config.codec.rotationBlock = case.rotation_block
    if case.prerotated:
        config.codec.rotation = lib.qncclRotationPrerotated
    if case.clip:
        config.codec.clip = lib.qncclClipGaussian
    return config


def call_allreduce(comm, case, x):
    """(result, message, output, send buffer afterwards) of qncclAllReduce on this rank."""
    send = x.copy()
    recv = send if case.inplace else np.full(x.nbytes, UNWRITTEN, np.uint8).view(x.dtype)
    result = lib.qncclAllReduce(ptr(send), ptr(recv), case.count, NCCL_TYPES[case.dtype],
                                OPS[case.op], make_config(case), comm, STREAM)
    message = "" if result == lib.ncclSuccess else ffi.string(lib.qncclGetLastError()).decode()
    if result == lib.ncclSuccess:
        synced(send, recv)
    return result, message, recv, send


# ---- checks on rank 0 --------------------------------------------------------------

def bits_of(values):
    values = np.ascontiguousarray(values).reshape(-1)
    return values.view({2: np.uint16, 4: np.uint32}[values.itemsize])


def describe(case, i):
    """Where value i lives: its segment, offset and chunk (chunks matter to ring and SRA)."""
    width = segment_length(case.segment_values, case.bucket)
    g, offset = divmod(i, width)
    m = min(width, case.count - g * width)
    k = next(k for k, (lo, hi) in enumerate(chunks(m, NRANKS, case.bucket)) if lo <= offset < hi)
    return f"element {i} (segment {g}, offset {offset}, chunk {k})"


def first_difference(case, got, expected, dtype, who):
    got_bits, want_bits = bits_of(got), bits_of(expected)
    differ = np.flatnonzero(got_bits != want_bits)
    if differ.size == 0:
        return None
    i = int(differ[0])
    return (f"{who}: {differ.size} of {case.count} values differ; first at {describe(case, i)}: "
            f"engine {float(widen(got[i:i + 1], dtype)[0])!r} ({int(got_bits[i]):#x}), emulator "
            f"{float(widen(expected[i:i + 1], dtype)[0])!r} ({int(want_bits[i]):#x})")


def check_case(case, call, outputs, send_ok, failures):
    """Rank 0: outputs[r] is rank r's output array of `case`, the call-th call."""
    inputs = [rank_input(case, r) for r in range(NRANKS)]
    for r in range(NRANKS):
        if not send_ok[r]:
            failures.add(case, f"rank {r}: out of place, the send buffer changed")
        diff = first_difference(case, outputs[r], outputs[0], case.dtype,
                                f"rank {r} differs from rank 0")
        if diff:
            failures.add(case, diff)
    def emulate(call):
        return emulate_allreduce(
            inputs, algo=case.algo, bits=case.bits, bucket_size=case.bucket,
            rounding=case.rounding, seed=case.seed, op=case.op, call=call,
            segment_values=case.segment_values, dtype=case.dtype, return_bounds=True,
            nodes=NODES, inter_algo=case.inter, intra_bits=case.intra_bits,
            **rotation_of(case))

    expected, bound = emulate(call)
    diff = first_difference(case, outputs[0], expected[0], case.dtype,
                            f"rank 0 differs from qnccl.emulate.allreduce(call={call})")
    if diff:
        if case.rounding == "stochastic":  # a miscounted call? say which one matches
            match = next((c for c in range(call + 16) if c != call and np.array_equal(
                bits_of(emulate(c)[0][0]), bits_of(outputs[0]))), None)
            if match is not None:
                diff += f"; the engine's bytes are the emulator's at call={match}"
        failures.add(case, diff)
    if case.rounding == "nearest" and case.data != "special" and case.count:
        exact = np.stack([widen(x, case.dtype) for x in inputs]).sum(axis=0)
        exact_slack = NRANKS * 2.0**-53 * np.abs(np.stack([widen(x, case.dtype)
                                                           for x in inputs])).sum(axis=0)
        if case.op == "avg":
            exact, exact_slack = exact / NRANKS, exact_slack / NRANKS
        finite = np.isfinite(bound)
        with np.errstate(invalid="ignore"):
            error = np.abs(widen(outputs[0], case.dtype) - exact)
        over = np.flatnonzero(finite & (error > bound + exact_slack))
        if over.size:
            i = int(over[0])
            failures.add(case, f"{over.size} values exceed the error bound; first at "
                               f"{describe(case, i)}: error {error[i]:.6g} > bound {bound[i]:.6g}")
    return expected[0]


def rotation_of(case):
    """The emulator's rotation (and clip) keywords for `case`."""
    clip = {"clip": "gaussian"} if case.clip else {}
    if case.prerotated:
        return {"rotation": "prerotated", **clip}
    if not case.rotation_block:
        return {}
    return {"rotation": "hadamard", "rotation_block": case.rotation_block, **clip}


def run_cases(comm, cases, failures, first_call=0):
    """Runs `cases` in order on every rank; rank 0 checks each. Returns the
    emulator's outputs (rank 0) and the next call number."""
    call = first_call
    results = []
    for case in cases:
        x = rank_input(case, RANK)
        result, message, out, send = call_allreduce(comm, case, x)
        send_ok = case.inplace or np.array_equal(bits_of(send), bits_of(x))
        if result != lib.ncclSuccess:  # the others would wait for us: stop here
            print(f"FAIL [N={NRANKS}] {case}: rank {RANK}: qncclAllReduce returned {result}: "
                  f"{message}", flush=True)
            COMM.Abort(1)
        gathered = COMM.gather((out, send_ok), root=0)
        if RANK == 0:
            outputs, send_oks = zip(*gathered)
            results.append((case, outputs, check_case(case, call, outputs, send_oks, failures)))
        call += 1
    return results, call


# ---- the three programs ------------------------------------------------------------

def swept_cases(shapes, first_seed, blocks=(0,)):
    """Every algorithm x type x shape ((count, bucket, segment_values)); roundings, ops, in
    place, bits, seeds and rotation blocks rotate through the cases, so each value of each
    appears with every algorithm and type. Shapes of several segments run on 1, 2 and 3
    lanes (pipelined segments) and on the default (0: one lane on host buffers, two on device
    buffers), each shape on each in turn through the algorithms and types."""
    combos = list(itertools.product(("nearest", "stochastic"), ("sum", "avg"), (False, True)))
    cases = []
    for i, (algo, dtype, (count, bucket, segment_values)) in enumerate(
            itertools.product(("ring", "tree", "sra", "auto"), ("float32", "float16", "bfloat16"),
                              shapes)):
        rounding, op, inplace = combos[(i * 5) % len(combos)]
        cases.append(Case(algo, dtype, count, rounding, op, inplace, bits=1 + (i * 3) % 8,
                          bucket=bucket, segment_values=segment_values,
                          seed=(first_seed + i) * 0x9E3779B97F4A7C15 % 2**64,
                          lanes=(0, 1, 2, 3)[i // len(shapes) % 4],
                          rotation_block=blocks[i % len(blocks)]))
    return cases


def matrix_cases():
    """swept_cases() over the shapes of docs/allreduce.md's corners; then NaN/Inf inputs,
    then the tree in several pieces."""
    cases = swept_cases([(0, 128, 0), (1, 128, 0), (300, 128, 0), (7919, 100, 0),
                         (300007, 128, 0), (5003, 64, 1000), (1000, 128, 5), (2049, 1, 700)],
                        first_seed=1000)
    for i, (algo, dtype) in enumerate(itertools.product(("ring", "tree", "sra", "auto"),
                                                        ("float32", "float16", "bfloat16"))):
        cases.append(Case(algo, dtype, 4099, ("nearest", "stochastic")[i % 2], ("sum", "avg")[
            i // 2 % 2], inplace=bool(i % 3), bits=4, bucket=32, seed=2000 + i, data="special"))
    # The tree in several pieces (2^18 values rounded down to buckets: 4 here, the last
    # short), stochastic, so each piece's random numbers must continue the segment's.
    for i, (dtype, bucket) in enumerate(itertools.product(("float32", "bfloat16"), (128, 1000))):
        cases.append(Case("tree", dtype, 3 * 2**18 + 777, "stochastic", ("sum", "avg")[i % 2],
                          inplace=bool(i // 2), bits=(4, 3)[i % 2], bucket=bucket,
                          seed=3000 + i))
    return cases


def rotated_cases():
    """docs/rotation.md: every algorithm x type x shape with a Hadamard rotation (tails that
    are not a whole block, several segments on 1..3 lanes), roundings, ops, in place, bits and
    blocks rotating through the cases; then NaN/Inf inputs, whose blocks decode to NaN."""
    cases = swept_cases([(0, 128, 0), (1, 128, 0), (300, 128, 0), (7919, 100, 0),
                         (70001, 128, 0), (5003, 64, 1000), (2049, 1, 700)],
                        first_seed=4000, blocks=(256, 2, 64, 4096, 8, 1024, 16))
    for i, (algo, dtype) in enumerate(itertools.product(("ring", "tree", "sra"),
                                                        ("float32", "bfloat16"))):
        cases.append(Case(algo, dtype, 4099, ("nearest", "stochastic")[i % 2], ("sum", "avg")[
            i // 2 % 2], inplace=bool(i % 3), bits=4, bucket=32, seed=5000 + i, data="special",
                          rotation_block=256))
    # the largest block: two whole ones, then tails of 4096, 2048, 1024, 512 and 7 smaller
    # (on the device, blocks past a warp's tile of 1024 take stages across tiles)
    for i, dtype in enumerate(("float32", "float16")):
        cases.append(Case(("ring", "sra")[i], dtype, 2 * 16384 + 7807, "stochastic",
                          ("sum", "avg")[i], bits=3, seed=5100 + i, rotation_block=16384))
    # values the caller rotated (qncclRotationPrerotated): the uniform grid, nothing rotated
    for i, (algo, dtype) in enumerate(itertools.product(("ring", "tree", "sra"),
                                                        ("float32", "float16"))):
        cases.append(Case(algo, dtype, 7919, ("nearest", "stochastic")[i % 2],
                          ("sum", "avg")[i // 2 % 2], inplace=bool(i % 2), bits=(3, 4)[i % 2],
                          bucket=100, seed=5200 + i, prerotated=True))
    # clipped ranges (docs/rotation.md, "Clipped ranges"), rotated and prerotated, at 1..4
    # bits (the cut applies at bucket 128 up to 4), wide-ranged data (the types' limits) and
    # NaN/Inf
    for i, (algo, dtype) in enumerate(itertools.product(("ring", "tree", "sra", "auto"),
                                                        ("float32", "float16", "bfloat16"))):
        cases.append(Case(algo, dtype, (7919, 300, 20011)[i % 3],
                          ("nearest", "stochastic")[i % 2], ("sum", "avg")[i // 2 % 2],
                          inplace=bool(i % 3), bits=1 + i // 2 % 4, bucket=(128, 100)[i // 6],
                          segment_values=(0, 4000)[i // 4 % 2], seed=5300 + i,
                          data=("wide", "special")[i // 3 % 2],
                          rotation_block=(256, 64)[i // 3 % 2], prerotated=i % 5 == 4,
                          clip=True))
    return cases


def rotated(comm, failures):
    cases = rotated_cases()
    run_cases(comm, cases, failures)
    return len(cases)


def check_auto_algo(failures):
    for count, dtype in itertools.product((0, 1, 16383, 16384, 32767, 32768, 10**7),
                                          NCCL_TYPES):
        got = ffi.new("qncclAlgo_t*")
        result = lib.qncclAutoAlgo(count, NCCL_TYPES[dtype], NRANKS, got)
        want = auto_algo(count, dtype, NRANKS)
        if result != lib.ncclSuccess or got[0] != ALGOS[want]:
            failures.add(f"qncclAutoAlgo({count}, {dtype}, {NRANKS})",
                         f"returned {result}, algo {got[0]}; emulate.auto_algo says {want}")


def matrix(comm, failures):
    cases = matrix_cases()
    if RANK == 0:
        check_auto_algo(failures)
    run_cases(comm, cases, failures)
    return len(cases)


def ordering(comm, failures):
    """Same data, same seed through the three algorithms at 4 bits."""
    cases = [Case(algo, "float32", 1 << 16, rounding, bits=4, bucket=128, seed=77, data="normal")
             for rounding in ("nearest", "stochastic") for algo in ("ring", "tree", "sra")]
    results, _ = run_cases(comm, cases, failures)
    if RANK == 0:
        inputs = [rank_input(cases[0], r) for r in range(NRANKS)]
        exact = np.stack(inputs).astype(np.float64).sum(axis=0)
        scale = np.abs(exact).mean()
        for rounding in ("nearest", "stochastic"):
            error = {}
            for case, outputs, _ in results:
                if case.rounding == rounding:
                    e = np.abs(outputs[0].astype(np.float64) - exact)
                    error[case.algo] = e.mean() / scale
                    print(f"error N={NRANKS} {rounding:10s} {case.algo:4s}: mean |e|/mean |S| "
                          f"{e.mean() / scale:.4f}, max |e|/mean |S| {e.max() / scale:.4f}",
                          flush=True)
            if not error["ring"] > error["tree"] > error["sra"]:
                failures.add(f"ordering {rounding}", f"expected ring > tree > sra, got {error}")
    return len(cases)


MISUSE = [  # (argument, bad value, what the message must say: the argument and allowed values)
    ("bits", 0, r"bits = 0 .*allowed: 1\.\.8"),
    ("bits", 9, r"bits = 9 .*allowed: 1\.\.8"),
    ("bucketSize", 0, r"bucketSize = 0 .*allowed: >= 1"),
    ("algo", 7, r"algo = 7 .*allowed: .*qncclAlgoAuto.*qncclAlgoRing.*qncclAlgoTree"
                r".*qncclAlgoSra"),
    ("lanes", 9, r"lanes = 9; allowed: 0 \(auto.*\) or 1\.\.8"),
    ("rotation", 5, r"rotation = 5 is unknown; allowed: qncclRotationNone \(0\), "
                    r"qncclRotationHadamard \(1\) or qncclRotationPrerotated \(2\)"),
    ("rotationBlock", 100, r"rotationBlock = 100; allowed: 0 \(the default, 256\) or a power of "
                           r"two"),
    ("clip", 1, r"clip = qncclClipGaussian needs rotated values; allowed with rotation = "
                r"qncclRotationHadamard or qncclRotationPrerotated"),
    ("op", "ncclMax", r"op = 2 .*allowed: ncclSum.*ncclAvg"),
    ("datatype", "ncclInt32", r"datatype = 2 .*allowed: ncclFloat32.*ncclFloat16.*ncclBfloat16"),
]


def misuse(comm, failures):
    base = Case("ring", "float32", 1000, "stochastic", seed=5)
    x = rank_input(base, RANK)
    lines = []
    for field, value, pattern in MISUSE:
        config = make_config(base)
        op, dtype = OPS["sum"], NCCL_TYPES["float32"]
        if field == "bits":
            config.codec.bits = value
        elif field == "bucketSize":
            config.codec.bucketSize = value
        elif field == "algo":
            config.algo = value
        elif field == "lanes":
            config.lanes = value
        elif field == "rotation":
            config.codec.rotation = value
        elif field == "rotationBlock":
            config.codec.rotation = lib.qncclRotationHadamard
            config.codec.rotationBlock = value
        elif field == "clip":
            config.codec.clip = value
        elif field == "op":
            op = getattr(lib, value)
        else:
            dtype = getattr(lib, value)
        out = np.zeros_like(x)
        result = lib.qncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(out), x.size, dtype, op,
                                    config, comm, ffi.NULL)
        message = ffi.string(lib.qncclGetLastError()).decode() if result else ""
        if result != lib.ncclInvalidArgument or not re.search(pattern, message):
            lines.append(f"{field} = {value}: returned {result} ({message!r}); expected "
                         f"ncclInvalidArgument and a message matching {pattern!r}")
    for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
        for line in rank_lines:
            failures.add(f"misuse rank {rank}", line)
    # rejected calls are not calls: the next one is call 0 of the communicator
    run_cases(comm, [base], failures, first_call=0)
    return len(MISUSE) + 1


def calls(comm, failures):
    def case(algo, seed):
        return Case(algo, "float32", 3001, "stochastic", bits=3, bucket=64, seed=seed)

    _, next_a = run_cases(comm, [case("sra", 1), case("ring", 2)], failures)
    other = init_comm()
    _, next_b = run_cases(other, [case("tree", 3)], failures)  # call 0 of `other`
    run_cases(comm, [case("ring", 4)], failures, first_call=next_a)
    run_cases(other, [case("sra", 5)], failures, first_call=next_b)
    # Destroyed through libqnccl's ncclCommDestroy (what an interposed job
    # calls), which forgets the communicator and forwards to the real one.
    check_nccl(lib.ncclCommDestroy(other), "ncclCommDestroy")
    # a new communicator starts from call 0, wherever its handle lands
    third = init_comm()
    run_cases(third, [case("ring", 6), case("sra", 7)], failures)
    check_nccl(lib.ncclCommDestroy(third), "ncclCommDestroy")
    # Flat calls of several segments on 2 lanes each, in one group on two communicators.
    return 7 + grouped(failures, "ring", lanes=2) + grouped(failures, "sra", lanes=2)


def expected_counts(algo, op, rank, nranks, rotated=False):
    """(compute steps, groups) of one call of one segment whose chunks all hold values, on
    `rank` (docs/allreduce.md, "Steps per call"); a rotated call makes the signs' table and
    rotates the segment in and out: three steps more (docs/rotation.md)."""
    n, avg, rotation = nranks, op == "avg", 3 * rotated
    if algo == "ring":  # n-1 steps of encode and reduce; the result; n-1 decodes
        return 2 * (n - 1) + 2 + avg + (n - 1) + rotation, 2 * (n - 1)
    if algo == "sra":  # one encode of the n-1 chunks; one reduce; the result; one decode
        return 1 + 1 + 2 + avg + 1 + rotation, 2 * (n - 1)
    children = sum(c < n for c in (2 * rank + 1, 2 * rank + 2))
    # reduce (the children's sums with the input), encode (the root: the result), decode
    return 3 + (avg and rank == 0) + rotation, 2 * ((rank != 0) + (children > 0))


def counts(comm, failures):
    import qnccl.comm
    cases = [Case(algo, "float32", 128 * 8 * NRANKS, op=op, seed=41, rotation_block=block)
             for block in (0, 256) for algo in ("ring", "tree", "sra") for op in ("sum", "avg")]
    for i, case in enumerate(cases):
        before = qnccl.comm.stats(comm)
        run_cases(comm, [case], failures, first_call=i)
        after = qnccl.comm.stats(comm)
        got = (after["compute_steps"] - before["compute_steps"], after["groups"] - before["groups"])
        want = expected_counts(case.algo, case.op, RANK, NRANKS, case.rotation_block > 0)
        everyone = COMM.gather((got, want), root=0)
        if RANK == 0:
            for rank, (g, w) in enumerate(everyone):
                if g != w:
                    failures.add(case, f"rank {rank}: (compute steps, groups) per call = {g}, "
                                       f"expected {w}")
    return len(cases)


def hier_cases():
    """inter x types x shapes, the intra stage exact or quantized; ops, in place,
    bits, roundings and seeds rotate; then auto."""
    shapes = [  # (count, bucket, segment_values): empty shards, a remainder, segments
        (0, 128, 0), (1, 128, 0), (5, 128, 0), (301, 16, 0), (7919, 100, 0), (300007, 128, 0),
        (5003, 64, 1000)]
    combos = list(itertools.product(("nearest", "stochastic"), ("sum", "avg"), (False, True)))
    cases = []
    for i, (inter, dtype, intra, (count, bucket, segment_values)) in enumerate(
            itertools.product(("ring", "tree", "sra", "auto"), ("float32", "float16", "bfloat16"),
                              (0, 3), shapes)):
        rounding, op, inplace = combos[(i * 5) % len(combos)]
        cases.append(Case("hier", dtype, count, rounding, op, inplace, bits=1 + (i * 3) % 8,
                          bucket=bucket, segment_values=segment_values,
                          seed=(3000 + i) * 0x9E3779B97F4A7C15 % 2**64, inter=inter,
                          intra_bits=intra))
    for i, dtype in enumerate(("float32", "float16", "bfloat16")):
        cases.append(Case("auto", dtype, 40000 + i, op=("sum", "avg")[i % 2], seed=4000 + i))
    # Rotated (docs/rotation.md): the stages run on the rotated float32 values, the exact
    # one inside a node too, whatever the buffers' type.
    rotated_shapes = [(7919, 100, 0), (5003, 64, 1000), (301, 16, 0)]
    for i, (inter, dtype, intra) in enumerate(
            itertools.product(("ring", "tree", "sra"), ("float32", "float16", "bfloat16"),
                              (0, 3))):
        rounding, op, inplace = combos[(i * 3) % len(combos)]
        count, bucket, segment_values = rotated_shapes[i % len(rotated_shapes)]
        cases.append(Case("hier", dtype, count, rounding, op, inplace, bits=(4, 3, 8)[i % 3],
                          bucket=bucket, segment_values=segment_values, seed=6000 + i,
                          inter=inter, intra_bits=intra, rotation_block=(256, 64, 16)[i % 3]))
    # clipped ranges: the stage inside a node clips at the fraction of its own width (8 bits
    # over 2 inside: only that stage is cut; 2 over 8: only the stage between nodes)
    for i, (bits, intra) in enumerate(((8, 2), (2, 8), (3, 3))):
        cases.append(Case("hier", ("float32", "bfloat16", "float16")[i], 7919,
                          ("stochastic", "nearest")[i % 2], ("sum", "avg")[i % 2], bits=bits,
                          seed=6100 + i, inter=("sra", "ring", "tree")[i], intra_bits=intra,
                          rotation_block=256, clip=True))
    return cases


def grouped(failures, algo, lanes=0):
    """Calls of several segments (QNCCL_SEGMENT_VALUES) on two communicators in one
    group, through the interposed ncclAllReduce (QNCCL_* variables): the calls run
    in lock-step, and each one's pipelined segments (engine/pipeline.cc) take its
    steps: a hierarchical call's lanes together, so each real group carries
    segments of both calls; a flat call's `lanes` in turn. Each is call 0 of its
    communicator. The emulator cuts the calls at QNCCL_SEGMENT_VALUES too: a library
    that ignored the variable would run one segment, other random streams."""
    seed, width = 7071, 4096
    os.environ.update(QNCCL_ALGO=algo, QNCCL_BITS="4", QNCCL_BUCKET_SIZE="128",
                      QNCCL_ROUNDING="stochastic", QNCCL_SEED=str(seed), QNCCL_MIN_BYTES="0",
                      QNCCL_INTER_ALGO="auto", QNCCL_INTRA_BITS="0", QNCCL_LANES=str(lanes),
                      QNCCL_SEGMENT_VALUES=str(width))
    cases = [Case(algo, "float32", 2 * width + 5003, "stochastic", "sum", False, seed=seed,
                  segment_values=width, lanes=lanes),
             Case(algo, "bfloat16", width + 301, "stochastic", "avg", True, seed=seed,
                  segment_values=width, lanes=lanes)]
    comms = [init_comm(), init_comm()]
    inputs = [rank_input(case, RANK) for case in cases]
    sends = [x.copy() for x in inputs]
    recvs = [send if case.inplace else np.full(send.nbytes, UNWRITTEN, np.uint8).view(send.dtype)
             for case, send in zip(cases, sends)]
    check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
    for comm, case, send, recv in zip(comms, cases, sends, recvs):
        check_nccl(lib.ncclAllReduce(ptr(send), ptr(recv), case.count, NCCL_TYPES[case.dtype],
                                     OPS[case.op], comm, STREAM), "ncclAllReduce")
    check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
    synced(*sends, *recvs)
    for case, x, send, recv in zip(cases, inputs, sends, recvs):
        send_ok = case.inplace or np.array_equal(bits_of(send), bits_of(x))
        gathered = COMM.gather((recv, send_ok), root=0)
        if RANK == 0:
            outputs, send_oks = zip(*gathered)
            check_case(case, 0, outputs, send_oks, failures)
    for comm in comms:
        check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return len(cases)


def hier(comm, failures):
    """The node layout from the host names, then hier_cases() (or, on a layout
    whose nodes differ, auto and a refused explicit hier)."""
    global NODES
    host = os.environ.get("NCCL_HOSTID") or socket.gethostname()
    NODES = COMM.allgather(host)
    members = [r for r in range(NRANKS) if NODES[r] == host]
    sizes = {NODES.count(h) for h in NODES}
    topo = ffi.new("qncclTopology_t*")
    check_nccl(lib.qncclCommTopology(comm, topo), "qncclCommTopology")
    want = (len(set(NODES)) if len(sizes) == 1 else 0, len(members), members.index(RANK),
            int(len(sizes) == 1))
    got = (topo.nodes, topo.localRanks, topo.localRank, topo.uniform)
    lines = [] if got == want else [f"qncclCommTopology: {got} (nodes, localRanks, localRank, "
                                    f"uniform); the host names say {want}"]
    for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
        for line in rank_lines:
            failures.add(f"topology rank {rank}", line)
    if RANK == 0:
        print(f"layout: {NODES}", flush=True)
    if len(set(NODES)) == 1:
        return one_node(comm, failures)
    if len(sizes) == 1:
        cases = hier_cases()
        run_cases(comm, cases, failures)
        return len(cases) + 1 + grouped(failures, "hier")
    # Uneven: auto runs flat (the emulator's auto on these nodes says the same) and
    # an explicit hier fails on every rank, naming the layout, without a call number.
    base = Case("hier", "float32", 5000, seed=9)
    x = rank_input(base, RANK)
    out = np.zeros_like(x)
    result = lib.qncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(out), x.size,
                                NCCL_TYPES["float32"], OPS["sum"], make_config(base), comm,
                                ffi.NULL)
    message = ffi.string(lib.qncclGetLastError()).decode() if result else ""
    pattern = r"needs the same number of ranks on every node.*has \d+ of its \d+ ranks"
    lines = [] if result == lib.ncclInvalidUsage and re.search(pattern, message) else [
        f"explicit hier on an uneven layout returned {result} ({message!r}); expected "
        f"ncclInvalidUsage matching {pattern!r}"]
    for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
        for line in rank_lines:
            failures.add(f"uneven rank {rank}", line)
    cases = [Case("auto", dtype, 40000, op=op, inplace=inplace, seed=5000 + i)
             for i, (dtype, op, inplace) in enumerate(
                 itertools.product(("float32", "float16", "bfloat16"), ("sum", "avg"),
                                   (False, True)))]
    run_cases(comm, cases, failures)
    return len(cases) + 2


def one_node(comm, failures):
    """Every rank on one node: an explicit hier (alone, in a group, with error feedback,
    every type, sum and avg) crosses no node link and runs exact, the real library's
    allreduce: within its float rounding of the exact sum, counted as passed through, no
    codec work, no residual."""
    import qnccl.comm
    cases = [Case("hier", dtype, 30011, op=op, seed=6000 + i, bits=3)
             for i, (dtype, op) in enumerate(itertools.product(
                 ("float32", "float16", "bfloat16"), ("sum", "avg")))]
    unit = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
    for i, case in enumerate(cases):
        x = rank_input(case, RANK)
        out = np.zeros_like(x)
        config = make_config(case)
        config.errorFeedback = i % 2
        before = qnccl.comm.stats(comm)
        grouped_call = i % 3 == 0
        if grouped_call:
            check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
        result = lib.qncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(out), x.size,
                                    NCCL_TYPES[case.dtype], OPS[case.op], config, comm, ffi.NULL)
        if grouped_call:
            check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
        check_nccl(result, "qncclAllReduce (hier on one node)")
        after = qnccl.comm.stats(comm)
        inputs = COMM.allgather(widen(x, case.dtype).astype(np.float64))
        exact = np.sum(inputs, axis=0) / (NRANKS if case.op == "avg" else 1)
        bound = (NRANKS + 1) * unit[case.dtype] * np.sum(np.abs(inputs), axis=0)
        error = np.abs(widen(out, case.dtype) - exact)
        lines = []
        if not np.all(error <= bound):
            lines.append(f"error up to {error.max():.3g}, beyond an exact sum's {bound.max():.3g}")
        moved = {k: after[k] - before[k] for k in ("calls_compressed", "calls_passed_through",
                                                   "compute_steps", "residual_buffers")}
        if moved != {"calls_compressed": 0, "calls_passed_through": 1, "compute_steps": 0,
                     "residual_buffers": 0}:
            lines.append(f"statistics moved by {moved}; expected one call passed through")
        for rank, rank_lines in enumerate(COMM.gather(lines, root=0) or []):
            for line in rank_lines:
                failures.add(case, f"rank {rank}: {line}")
    return len(cases)


def graphs(comm, failures):
    """Device buffers (QNCCL_TEST_MEMORY=device): an interposed ncclAllReduce captured into a
    CUDA graph in global mode, after one eager call sized the workspace, then replayed with
    new inputs: every replay is the emulator's next call (each takes a new number from the
    device's counter), and so is an eager call after the replays; the capture allocated
    nothing (the simulated GPU counts it). For ring, tree and SRA, on new communicators."""
    if not MEMORY.device_mode:
        failures.add("graphs", "run with QNCCL_TEST_MEMORY=device")
        return 1
    seed, count, replays = 4242, 40000, 3
    checked = 0
    for algo in ("ring", "tree", "sra"):
        os.environ.update(QNCCL_ALGO=algo, QNCCL_BITS="4", QNCCL_BUCKET_SIZE="128",
                          QNCCL_ROUNDING="stochastic", QNCCL_SEED=str(seed), QNCCL_MIN_BYTES="0")
        c = init_comm()
        case = Case(algo, "float32", count, seed=seed)
        send = rank_input(case, RANK)
        recv = np.zeros_like(send)
        pointers = (ptr(send), ptr(recv))  # uploaded now: nothing pageable during the capture

        def allreduce():
            check_nccl(lib.ncclAllReduce(*pointers, count, NCCL_TYPES["float32"], OPS["sum"], c,
                                         STREAM), "ncclAllReduce")

        def check(call, label):
            gathered = COMM.gather(recv.copy(), root=0)
            if RANK != 0:
                return
            inputs = COMM_INPUTS[call]
            want = emulate_allreduce(inputs, algo=algo, bits=4, bucket_size=128,
                                     rounding="stochastic", seed=seed, call=call)[0]
            for r, got in enumerate(gathered):
                diff = first_difference(
                    case, got, want, "float32",
                    f"{label}: rank {r} differs from the emulator's call {call}")
                if diff:
                    failures.add(f"graphs {algo}", diff)

        def new_input(call):
            x = rank_input(dataclasses.replace(case, seed=seed + call), RANK)
            send[:] = x
            everyone = COMM.gather(x, root=0)
            if RANK == 0:
                COMM_INPUTS[call] = everyone
            ptr(send)  # the upload, on the stream the replay follows

        COMM_INPUTS = {}
        new_input(0)
        allreduce()
        synced(recv)
        check(0, "the eager call before the capture")
        before = MEMORY.simulator_counters()
        graph = MEMORY.capture(allreduce)
        after = MEMORY.simulator_counters()
        made = None if before is None else \
            after["allocationsInCapture"] - before["allocationsInCapture"]
        if made:
            failures.add(f"graphs {algo}", f"{made} allocations during a global-mode capture")
        for call in range(1, replays + 1):
            new_input(call)
            MEMORY.replay(graph)
            synced(recv)
            check(call, f"replay {call}")
        new_input(replays + 1)
        allreduce()
        synced(recv)
        check(replays + 1, "the eager call after the replays")
        check_nccl(lib.ncclCommDestroy(c), "ncclCommDestroy")
        checked += replays + 2
    return checked


def released(comm, failures):
    """Memory released while calls that use it are still queued, as a program may: on new
    communicators (ring and SRA, several segments on 2 lanes, error feedback), two calls on
    one buffer with qncclCommResetErrorFeedback after each (the first call's residual
    released), then ncclCommDestroy (the workspace released), all before the stream is
    synchronized. Both calls must be the emulator's bytes: each release waits, on the
    device, for the calls before it (with device buffers, the simulated GPU's lazy schedule
    runs the calls after the releases return)."""
    checked = 0
    for algo in ("ring", "sra"):
        case = Case(algo, "float32", 30011, rounding="stochastic", bits=3, bucket=64,
                    segment_values=4000, lanes=2, seed=777)
        c = init_comm()
        config = make_config(case)
        config.errorFeedback = 1
        send = rank_input(case, RANK)
        outs = [np.zeros_like(send), np.zeros_like(send)]
        pointers = ptr(send)
        for out in outs:
            check_nccl(lib.qncclAllReduce(pointers, ptr(out), case.count,
                                          NCCL_TYPES[case.dtype], OPS[case.op], config, c,
                                          STREAM), "qncclAllReduce")
            check_nccl(lib.qncclCommResetErrorFeedback(c), "qncclCommResetErrorFeedback")
        check_nccl(lib.ncclCommDestroy(c), "ncclCommDestroy")
        synced(*outs)
        gathered = COMM.gather(outs, root=0)
        inputs = COMM.gather(send, root=0)
        if RANK == 0:
            for call in range(2):  # each call starts from a zero residual
                residuals = [np.zeros(case.count, np.float32) for _ in range(NRANKS)]
                want = emulate_allreduce(inputs, algo=algo, bits=case.bits,
                                         bucket_size=case.bucket, rounding=case.rounding,
                                         seed=case.seed, call=call,
                                         segment_values=case.segment_values,
                                         residuals=residuals)[0]
                for r, got in enumerate(gathered):
                    diff = first_difference(case, got[call], want, "float32",
                                            f"rank {r} differs from the emulator's call {call}")
                    if diff:
                        failures.add(f"released {algo}", diff)
        checked += 2
    return checked


def finish(comm, failures, program, cases):
    """Ends the job's communicator, prints the summary; the exit status (1: failures)."""
    # libqnccl's ncclCommDestroy: it also ends the communicators QNCCL split off
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    failed = COMM.bcast(len(failures.lines), root=0)
    if RANK == 0:
        print(f"SUMMARY {program}: {NRANKS} ranks, {cases} cases, {failed} failures", flush=True)
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("program", choices=("matrix", "rotated", "ordering", "misuse", "calls",
                                            "counts", "hier", "graphs", "released"))
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="hier on one host: NCCL_HOSTID=node<rank // K> for each rank")
    args = parser.parse_args()
    if args.ranks_per_node:
        os.environ["NCCL_HOSTID"] = f"node{RANK // args.ranks_per_node}"
    comm = init_comm()
    failures = Failures()
    programs = {"matrix": matrix, "rotated": rotated, "ordering": ordering, "misuse": misuse, "calls": calls,
                "counts": counts, "hier": hier, "graphs": graphs, "released": released}
    cases = programs[args.program](comm, failures)
    return finish(comm, failures, args.program, cases)


if __name__ == "__main__":
    sys.exit(main())
