"""libqnccl.so's NCCL entry points on real ranks, called from Python.

    mpirun -np 4 python interposer_check.py

A preloaded libqnccl.so puts its ncclCommInitRank, ncclCommInitRankConfig,
ncclCommInitAll, ncclCommSplit, ncclAllReduce, ncclRedOpDestroy and
ncclCommDestroy in front of NCCL's; this program calls exactly those, through
the cffi binding, over QNCCL's host backend (loaded first, as in
allreduce_check.py, whose helpers it uses). The QNCCL_* variables are set in
the process environment while each communicator is made, so one job tries
several configurations. Sections, in this order on every rank:

ops     a communicator made with QNCCL_ENABLE=0: quantized ops
        (qncclRedOpCreateQuantized) with ring, tree, SRA and auto, float32,
        float16 and bfloat16, sum and avg, below QNCCL_MIN_BYTES, all quantize
        (the emulator's bytes; call numbers count only quantized calls, plain
        calls in between pass through exact, so does a PreMulSum op of the
        real NCCL); op values avoid NCCL's and PreMulSum's; an op with int32 is
        rejected with ncclInvalidArgument and is no call; a destroyed op's value
        goes to the real NCCL, which rejects it.
env     a communicator made (ncclCommInitRankConfig) with QNCCL_WARMUP_CALLS=2, QNCCL_MIN_BYTES=1K,
        QNCCL_ALGO=ring, QNCCL_BITS=3, QNCCL_BUCKET_SIZE=32 and a 64-bit seed:
        the first two eligible calls and calls below 1 KiB come out exact, the
        rest quantized with that configuration (call numbers from 0 after the
        warm-up), while the `ops` communicator keeps its own count.
split   ncclCommSplit reads the environment again: a child (2 ranks, order by
        key reversed) with another configuration counts its calls from 0 and
        is destroyed while its parent goes on; a bad QNCCL_* value fails
        ncclCommSplit, ncclCommInitRank and ncclCommInitRankConfig with
        ncclInvalidArgument and a message naming the variable, on every rank.
one     ncclCommInitAll(1): a communicator of one rank is exact under every QNCCL_ALGO
        (nothing crosses a link); a quantized op, the application's own request, is still
        quantized there; ncclCommAbort.
nonblocking  a nonblocking communicator (blocking = 0) made under QNCCL_ALGO=hier and
        QNCCL_DEBUG=INFO: libqnccl asks it nothing while its creation is in progress
        (NCCL refuses queries then; the test reads the log for a rank of -1) and
        reports it once it is ready; its first eligible allreduce finds the node
        layout with an ncclCommSplit of the nonblocking communicator, which answers
        ncclSuccess while the child is still being made (as NCCL 2.28 does), and,
        every rank on one node, runs exact.
values  op values anywhere in the positive int range reach the real NCCL untouched:
        the host backend spreads PreMulSum values over it as NVIDIA's NCCL does
        (they differ between communicators and land all over the range), and
        PreMulSum averages through libqnccl come out exact on every one of 24
        split communicators; raw values across [5, INT_MAX] (around the range
        QNCCL once reserved too) come back with the real library's own
        "unknown reduction op" message, counted as passed through.

Each communicator's qncclCommGetStats is checked after its calls:
compressed and passed-through calls, input bytes, and bytes sent
(conftest.sent_bytes). Prints one line per failure, then a summary; exits
non-zero on any failure.
"""
import contextlib
import dataclasses
import os
import sys
import time

import numpy as np

from allreduce_check import (COMM, NRANKS, NCCL_TYPES, OPS, RANK, UNWRITTEN, Case, Failures,
                             bits_of, check_case, check_nccl, ffi, lib, make_config, nccl,
                             rank_input)
from conftest import from_float32, nccl_config, sent_bytes
from qnccl.emulate import allreduce as emulate_allreduce

TYPES = dict(NCCL_TYPES, int32=lib.ncclInt32)
EXACT_OPS = dict(OPS, max=lib.ncclMax)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
# Every variable of the interposer's configuration (docs/environment.md).
CONFIG_VARIABLES = ("QNCCL_ENABLE", "QNCCL_BITS", "QNCCL_BUCKET_SIZE", "QNCCL_ROUNDING",
                    "QNCCL_ALGO", "QNCCL_MIN_BYTES", "QNCCL_SEED", "QNCCL_ERROR_FEEDBACK",
                    "QNCCL_WARMUP_CALLS", "QNCCL_DEBUG", "QNCCL_COLLECTIVES")

failures = Failures()
checks = 0


def expect(condition, label, what):
    global checks
    checks += 1
    if not condition:
        failures.add(label, f"rank {RANK}: {what}")
    return condition


def require(result, what):
    """A call every rank must pass; on failure the others would wait forever."""
    if result != lib.ncclSuccess:
        print(f"FAIL [N={NRANKS}] rank {RANK}: {what} returned {result}: "
              f"{ffi.string(lib.qncclGetLastError()).decode()}", flush=True)
        COMM.Abort(1)


@contextlib.contextmanager
def qnccl_env(**settings):
    """The process environment holds exactly `settings` of the QNCCL_* configuration."""
    saved = {name: os.environ.pop(name, None) for name in CONFIG_VARIABLES}
    os.environ.update({f"QNCCL_{k.upper()}": str(v) for k, v in settings.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def new_id():
    uid = ffi.new("ncclUniqueId*")
    if RANK == 0:
        check_nccl(nccl.ncclGetUniqueId(uid), "ncclGetUniqueId")
    ffi.memmove(uid, COMM.bcast(bytes(ffi.buffer(uid)), root=0), ffi.sizeof("ncclUniqueId"))
    return uid[0]


def init_comm(with_config=False, **settings):
    """(result, communicator) of libqnccl's ncclCommInitRank (ncclCommInitRankConfig
    `with_config`) over all ranks, made under the QNCCL_* `settings`."""
    uid, comm = new_id(), ffi.new("ncclComm_t*")
    with qnccl_env(**settings):
        if with_config:
            result = lib.ncclCommInitRankConfig(comm, NRANKS, uid, RANK, nccl_config(ffi))
        else:
            result = lib.ncclCommInitRank(comm, NRANKS, uid, RANK)
    return result, comm[0]


def allreduce(comm, x, dtype, op, inplace=False):
    """(result, output, send buffer afterwards) of libqnccl's ncclAllReduce on this rank."""
    send = x.copy()
    recv = send if inplace else np.full(x.nbytes, UNWRITTEN, np.uint8).view(x.dtype)
    result = lib.ncclAllReduce(ffi.from_buffer(send), ffi.from_buffer(recv), x.size,
                               TYPES[dtype], op, comm, ffi.NULL)
    return result, recv, send


# ---- expected results and counters ---------------------------------------------------

@dataclasses.dataclass
class Tally:
    """What qncclCommGetStats of one communicator should say on this rank."""
    nranks: int
    rank: int
    compressed: int = 0
    passed: int = 0
    bytes_in: int = 0
    wire: int = 0

    def add_compressed(self, case):
        self.compressed += 1
        self.bytes_in += case.count * ITEMSIZE[case.dtype]
        self.wire += sent_bytes(case.count, case.dtype, self.nranks, self.rank, case.algo,
                                case.bits, case.bucket, case.segment_values)

    def check(self, comm, label):
        stats = ffi.new("qncclStats_t*")
        require(lib.qncclCommGetStats(comm, stats), f"qncclCommGetStats ({label})")
        got = (stats.callsCompressed, stats.callsPassedThrough, stats.bytesIn, stats.bytesOnWire)
        want = (self.compressed, self.passed, self.bytes_in, self.wire)
        expect(got == want, f"stats of {label}",
               "(compressed, passed through, bytes in, bytes on wire) = "
               f"{got}, expected {want}")


def quantized(comm, tally, case, call, op=None):
    """One quantized ncclAllReduce of `case` (with `op`, else its sum/avg): rank 0
    checks every rank's bytes against the emulator's call number `call`."""
    x = rank_input(case, RANK)
    result, out, send = allreduce(comm, x, case.dtype, OPS[case.op] if op is None else op,
                                  case.inplace)
    require(result, f"ncclAllReduce {case}")
    send_ok = case.inplace or np.array_equal(bits_of(send), bits_of(x))
    gathered = COMM.gather((out, send_ok), root=0)
    if RANK == 0:
        global checks
        checks += 1
        outputs, send_oks = zip(*gathered)
        check_case(case, call, outputs, send_oks, failures)
    tally.add_compressed(case)
    return call + 1


def small_integers(count, rank):
    """Rank `rank`'s integer-valued input: sums of any order are exact in every type."""
    return np.random.default_rng([count, rank]).integers(-8, 9, count)


def exact(comm, tally, label, dtype, count, op="sum", inplace=False, nccl_op=None, scale=1):
    """One ncclAllReduce that must come out exact (passed through), on integer-valued
    inputs: the sum (times `scale` for a PreMulSum `nccl_op`), average or maximum."""
    def storage(values):
        return values.astype(np.int32) if dtype == "int32" else from_float32(values, dtype)

    everyone = np.stack([small_integers(count, r) for r in range(NRANKS)])
    want = {"sum": everyone.sum(0) * scale, "avg": everyone.sum(0) / NRANKS,
            "max": everyone.max(0)}[op]
    result, out, _ = allreduce(comm, storage(everyone[RANK]), dtype,
                               EXACT_OPS[op] if nccl_op is None else nccl_op, inplace)
    require(result, f"ncclAllReduce ({label})")
    expect(np.array_equal(bits_of(out), bits_of(storage(want))), label,
           "not the exact result: the call was not passed through unchanged")
    tally.passed += 1


# ---- sections ------------------------------------------------------------------------

def quantized_op(comm, case):
    config = ffi.new("qncclQuantizedOpConfig_t*")
    config.allreduce = make_config(case)[0]
    config.reduction = OPS[case.op]
    op = ffi.new("ncclRedOp_t*")
    require(lib.qncclRedOpCreateQuantized(op, config, comm), f"qncclRedOpCreateQuantized {case}")
    return op[0]


def ops_section():
    result, comm = init_comm(enable=0)
    require(result, "ncclCommInitRank (QNCCL_ENABLE=0)")
    tally = Tally(NRANKS, RANK)
    cases = [Case("ring", "float32", 5000, "stochastic", "sum", bits=3, bucket=64, seed=11),
             Case("tree", "float16", 3001, "stochastic", "avg", inplace=True, bits=5, seed=12),
             Case("sra", "bfloat16", 4099, "nearest", "sum", bits=2, bucket=32, seed=13),
             Case("auto", "float32", 300, "stochastic", "avg", bits=8, bucket=16, seed=14,
                  segment_values=100)]
    ops = [quantized_op(comm, case) for case in cases]
    premul_scalar = np.array([2.0], np.float32)
    premul = ffi.new("ncclRedOp_t*")  # the real NCCL's own op (not intercepted)
    check_nccl(nccl.ncclRedOpCreatePreMulSum(premul, ffi.from_buffer(premul_scalar),
                                             lib.ncclFloat32, lib.ncclScalarHostImmediate, comm),
               "ncclRedOpCreatePreMulSum")
    expect(len(set(ops)) == len(ops) and min(ops) >= lib.ncclNumOps and premul[0] not in ops,
           "op values", f"quantized ops {ops} collide with NCCL's (< {lib.ncclNumOps}), with "
                        f"each other or with PreMulSum op {premul[0]}")
    call = 0
    for case, op in zip(cases, ops):
        call = quantized(comm, tally, case, call, op)
        exact(comm, tally, "QNCCL_ENABLE=0: plain float32 sum", "float32", 1 << 17)
    exact(comm, tally, "PreMulSum op of the real NCCL", "float32", 5000, nccl_op=premul[0],
          scale=2)
    require(lib.ncclRedOpDestroy(premul[0], comm), "ncclRedOpDestroy (PreMulSum, forwarded)")
    tally.check(comm, "the QNCCL_ENABLE=0 communicator")

    x = small_integers(1000, RANK).astype(np.int32)
    result, _, _ = allreduce(comm, x, "int32", ops[0])
    expect(result == lib.ncclInvalidArgument, "quantized op with int32",
           f"returned {result}, expected ncclInvalidArgument ({lib.ncclInvalidArgument})")
    require(lib.ncclRedOpDestroy(ops[1], comm), "ncclRedOpDestroy (quantized op)")
    result, _, _ = allreduce(comm, rank_input(cases[1], RANK), "float16", ops[1])
    expect(result == lib.ncclInvalidArgument, "destroyed quantized op",
           f"returned {result}, expected ncclInvalidArgument ({lib.ncclInvalidArgument}) from "
           "the real NCCL, which the op's value now goes to")
    tally.passed += 1
    # rejected calls are no calls: the next quantized call is still number `call`
    call = quantized(comm, tally, dataclasses.replace(cases[0], seed=15, count=777), call,
                     quantized_op(comm, dataclasses.replace(cases[0], seed=15)))
    tally.check(comm, "the QNCCL_ENABLE=0 communicator after rejected calls (QNCCL's own "
                      "rejection counts as no call; a destroyed op's value is passed through)")
    return comm, tally, call


ENV_CONFIG = dict(warmup_calls=2, min_bytes="1K", algo="ring", bits=3, bucket_size=32,
                  seed=2**64 - 59)


def env_case(dtype, count, op="sum", inplace=False):
    return Case("ring", dtype, count, "stochastic", op, inplace, bits=3, bucket=32,
                seed=ENV_CONFIG["seed"])


def env_section(ops_comm, ops_tally, ops_call):
    result, comm = init_comm(with_config=True, **ENV_CONFIG)
    require(result, f"ncclCommInitRankConfig ({ENV_CONFIG})")
    tally = Tally(NRANKS, RANK)
    exact(comm, tally, "warm-up call 1 of 2", "float32", 1000)
    exact(comm, tally, "below QNCCL_MIN_BYTES (no warm-up call)", "float32", 255, inplace=True)
    exact(comm, tally, "warm-up call 2 of 2", "float16", 600, op="avg")
    exact(comm, tally, "float32 max", "float32", 1000, op="max")
    call = quantized(comm, tally, env_case("float32", 3000), 0)
    # the other communicator counts its own calls
    ops_call = quantized(ops_comm, ops_tally, Case("sra", "float32", 2000, bits=4, seed=16),
                         ops_call, quantized_op(ops_comm, Case("sra", "float32", 0, seed=16)))
    call = quantized(comm, tally, env_case("bfloat16", 2000, "avg", inplace=True), call)
    call = quantized(comm, tally, env_case("float16", 512), call)  # exactly QNCCL_MIN_BYTES
    tally.check(comm, f"the communicator of {ENV_CONFIG}")
    ops_tally.check(ops_comm, "the QNCCL_ENABLE=0 communicator, beside another")
    return comm, tally, call


CHILD_CONFIG = dict(bits=8, algo="tree", min_bytes=0, seed=5, bucket_size=16)


def split_section(parent, parent_tally, parent_call):
    color, key = RANK % 2, NRANKS - RANK
    child = ffi.new("ncclComm_t*")
    with qnccl_env(**CHILD_CONFIG):
        require(lib.ncclCommSplit(parent, color, key, child, ffi.NULL), "ncclCommSplit")
    child_rank = ffi.new("int*")
    check_nccl(nccl.ncclCommUserRank(child[0], child_rank), "ncclCommUserRank")
    members = len(range(color, NRANKS, 2))
    tally = Tally(members, child_rank[0])
    for call, count in enumerate((2000, 10)):
        case = Case("tree", "float32", count, "stochastic", "avg" if call else "sum", bits=8,
                    bucket=16, seed=5)
        x = rank_input(case, RANK)
        result, out, _ = allreduce(child[0], x, "float32", OPS[case.op])
        require(result, f"ncclAllReduce on the split communicator ({case})")
        tally.add_compressed(case)
        gathered = COMM.gather((color, child_rank[0], x, out), root=0)
        if RANK == 0:
            for group in (0, 1):
                ranks = sorted((g for g in gathered if g[0] == group), key=lambda g: g[1])
                expected = emulate_allreduce(
                    [g[2] for g in ranks], algo="tree", bits=8, bucket_size=16,
                    rounding="stochastic", seed=5, op=case.op, call=call)[0]
                for _, r, _, got in ranks:
                    expect(np.array_equal(bits_of(got), bits_of(expected)),
                           f"split color {group} {case}",
                           f"child rank {r}'s output is not the emulator's (2 ranks in key "
                           f"order, call {call}, {CHILD_CONFIG})")
    tally.check(child[0], f"the split communicator of {CHILD_CONFIG}")
    parent_tally.check(parent, "the parent, after its child's calls")
    require(lib.ncclCommDestroy(child[0]), "ncclCommDestroy (split communicator)")
    parent_call = quantized(parent, parent_tally, env_case("float32", 3000, "avg"), parent_call)

    bad = ffi.new("ncclComm_t*")
    with qnccl_env(algo="butterfly"):
        result = lib.ncclCommSplit(parent, 0, RANK, bad, ffi.NULL)
    rejected(result, "QNCCL_ALGO", "ncclCommSplit with QNCCL_ALGO=butterfly")
    parent_call = quantized(parent, parent_tally, env_case("float16", 4000), parent_call)
    parent_tally.check(parent, "the parent, after a failed split")

    result, _ = init_comm(bits=0)
    rejected(result, "QNCCL_BITS", "ncclCommInitRank with QNCCL_BITS=0")
    result, _ = init_comm(with_config=True, rounding="round-half-up")
    rejected(result, "QNCCL_ROUNDING", "ncclCommInitRankConfig with QNCCL_ROUNDING=round-half-up")


def rejected(result, variable, label):
    message = ffi.string(lib.qncclGetLastError()).decode() if result else ""
    expect(result == lib.ncclInvalidArgument and variable in message, label,
           f"returned {result} ({message!r}); expected ncclInvalidArgument "
           f"({lib.ncclInvalidArgument}) and a message naming {variable}")


def one_rank_section():
    """A communicator of one rank: nothing crosses a link, so every QNCCL_ALGO passes the
    call through and the input comes back untouched; a quantized op (an explicit request)
    is quantized once, as the emulator says."""
    for algo in ("auto", "rule", "ring", "tree", "sra", "hier"):
        comm = ffi.new("ncclComm_t*")
        with qnccl_env(min_bytes=0, bits=5, algo=algo, debug="INFO"):
            require(lib.ncclCommInitAll(comm, 1, ffi.NULL), "ncclCommInitAll(1)")
        tally = Tally(1, 0)
        case = Case("ring", "float32", 1000, bits=5)
        x = rank_input(case, RANK)
        result, out, _ = allreduce(comm[0], x, "float32", lib.ncclSum)
        require(result, f"ncclAllReduce on a one-rank communicator (QNCCL_ALGO={algo})")
        tally.passed += 1
        expect(np.array_equal(bits_of(out), bits_of(x)),
               f"one-rank communicator, QNCCL_ALGO={algo}", "output is not the input (exact)")
        if algo == "ring":
            result, out, _ = allreduce(comm[0], x, "float32", quantized_op(comm[0], case))
            require(result, "ncclAllReduce with a quantized op on a one-rank communicator")
            tally.add_compressed(case)
            expect(np.array_equal(bits_of(out), bits_of(emulate_allreduce([x], bits=5)[0])),
                   "one-rank communicator, a quantized op", "output is not the emulator's")
        tally.check(comm[0], f"a one-rank communicator, QNCCL_ALGO={algo}")
        require(lib.ncclCommAbort(comm[0]), "ncclCommAbort (one rank)")


def wait_ready(comm, what):
    """Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress; every
    rank must then see ncclSuccess (else the others would wait forever)."""
    state, deadline = ffi.new("ncclResult_t*"), time.monotonic() + 60
    while True:
        require(lib.ncclCommGetAsyncError(comm, state), f"ncclCommGetAsyncError ({what})")
        if state[0] != lib.ncclInProgress or time.monotonic() > deadline:
            break
        time.sleep(0.0005)
    if state[0] != lib.ncclSuccess:
        print(f"FAIL [N={NRANKS}] rank {RANK}: {what}: the communicator reports {state[0]}: "
              f"{ffi.string(lib.qncclGetLastError()).decode()}", flush=True)
        COMM.Abort(1)


def nonblocking_section():
    """See the module's doc: creation, a first allreduce that splits, the exact sum."""
    uid, comm = new_id(), ffi.new("ncclComm_t*")
    with qnccl_env(algo="hier", min_bytes=0, debug="INFO"):
        result = lib.ncclCommInitRankConfig(comm, NRANKS, uid, RANK, nccl_config(ffi, blocking=0))
    expect(result in (lib.ncclSuccess, lib.ncclInProgress), "nonblocking creation",
           f"ncclCommInitRankConfig answered {result}")
    wait_ready(comm[0], "nonblocking creation")
    count = 4096
    everyone = np.stack([small_integers(count, r) for r in range(NRANKS)]).astype(np.float32)
    result, out, _ = allreduce(comm[0], everyone[RANK], "float32", lib.ncclSum)
    expect(result in (lib.ncclSuccess, lib.ncclInProgress), "nonblocking allreduce",
           f"ncclAllReduce answered {result}: {ffi.string(lib.qncclGetLastError()).decode()}")
    wait_ready(comm[0], "the first allreduce of a nonblocking communicator")
    expect(np.array_equal(out, everyone.sum(0)), "nonblocking allreduce",
           "not the exact sum (a hierarchical call on one node)")
    tally = Tally(NRANKS, RANK, passed=1)
    tally.check(comm[0], "a nonblocking communicator")
    require(lib.ncclCommDestroy(comm[0]), "ncclCommDestroy (nonblocking)")


# Raw op values no communicator made: spread over [ncclNumOps, INT_MAX], with
# the ends and the values around 0x7f000000.
RAW_OP_VALUES = (5, 6, 1000, 2**20 + 1, 2**24 + 3, 2**30, 0x7EFFFFFF, 0x7F000000, 0x7F000001,
                 0x7F123456, 0x7FFFFFFE, 0x7FFFFFFF)


def op_values_section(parent):
    """PreMulSum averages on split communicators, then raw op values, all through
    libqnccl's ncclAllReduce on an eligible float32 buffer."""
    values, children = [], []
    for i in range(24):  # all alive at once: a freed address may come back with its values
        child = ffi.new("ncclComm_t*")
        with qnccl_env(min_bytes=0):
            require(lib.ncclCommSplit(parent, 0, RANK, child, ffi.NULL), f"ncclCommSplit {i}")
        children.append(child)
        tally = Tally(NRANKS, RANK)
        scalar = np.array([1.0 / NRANKS], np.float32)
        op = ffi.new("ncclRedOp_t*")
        check_nccl(nccl.ncclRedOpCreatePreMulSum(op, ffi.from_buffer(scalar), lib.ncclFloat32,
                                                 lib.ncclScalarHostImmediate, child[0]),
                   "ncclRedOpCreatePreMulSum")
        values.append(op[0])
        # Integer-valued inputs times 1/N with N a power of two: the average is exact.
        exact(child[0], tally, f"PreMulSum average, op value {op[0]:#x}", "float32", 4096,
              nccl_op=op[0], scale=scalar[0])
        require(lib.ncclRedOpDestroy(op[0], child[0]), "ncclRedOpDestroy (PreMulSum)")
        tally.check(child[0], f"split communicator {i} (one PreMulSum average)")
    for child in children:
        require(lib.ncclCommDestroy(child[0]), "ncclCommDestroy (split)")
    expect(len(set(values)) == len(values) and min(values) < 2**30 <= max(values)
           and max(values) - min(values) > 2**29, "PreMulSum op values",
           f"values {[hex(v) for v in values]} are not spread over the positive int range "
           "as NVIDIA's NCCL spreads them (one per communicator)")

    tally = Tally(NRANKS, RANK)
    x = small_integers(4096, RANK).astype(np.float32)
    for value in RAW_OP_VALUES:
        result, _, _ = allreduce(parent, x, "float32", value)
        message = ffi.string(nccl.ncclGetLastError(ffi.NULL)).decode()
        expect(result == lib.ncclInvalidArgument and f"unknown reduction op {value}" in message,
               f"raw op value {value:#x}",
               f"returned {result} with the real library's message {message!r}; expected "
               "ncclInvalidArgument from the host backend (the value reached it untouched)")
        tally.passed += 1
    tally.check(parent, "the communicator given raw op values")


def main():
    ops_comm, ops_tally, ops_call = ops_section()
    env_comm, env_tally, env_call = env_section(ops_comm, ops_tally, ops_call)
    split_section(env_comm, env_tally, env_call)
    one_rank_section()
    nonblocking_section()
    with qnccl_env(min_bytes=0):
        result, values_comm = init_comm()
    require(result, "ncclCommInitRank (op values)")
    op_values_section(values_comm)
    require(lib.ncclCommDestroy(values_comm), "ncclCommDestroy (op values)")
    for comm in (ops_comm, env_comm):
        require(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    failed = COMM.allreduce(len(failures.lines))
    total = COMM.allreduce(checks)
    if RANK == 0:
        print(f"SUMMARY interposer: {NRANKS} ranks, {total} checks, {failed} failures",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
