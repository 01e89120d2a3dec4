"""libqnccl.so driven the way PyTorch's ProcessGroupNCCL drives NCCL, over the
host backend: the entry points libqnccl.so exports through it, the others
(ncclRedOpCreatePreMulSum, ncclCommFinalize) straight from the real NCCL, as
a preloaded program's calls resolve.

    mpirun -np N python process_group_check.py MODE OUTDIR
    mpirun -np N python process_group_check.py fault SECONDS

MODE is `blocking` or `nonblocking` (ncclConfig_t.blocking). The job, with
QNCCL_BITS=4 and QNCCL_MIN_BYTES=16K set by the test:

- creates a communicator with ncclCommInitRankConfig and polls
  ncclCommGetAsyncError until it is ready (nonblocking: ncclInProgress first),
  splits it (ranks in reverse order) and polls the parent, then the child;
- starts a watchdog thread that polls ncclCommGetAsyncError on every live
  communicator until the end and fails on any error;
- runs 4 steps of coalesced in-place ncclAvg buckets (ncclGroupStart, five
  allreduces of float32/float16/bfloat16, three above QNCCL_MIN_BYTES and two
  below, ncclGroupEnd, then polling to ncclSuccess) on the parent and the
  child, a fifth step with the buckets of both in one group (the parent's
  first on even ranks, the child's first on odd ones), and a float32
  PreMulSum average (ncclRedOpCreatePreMulSum by 1/N) on each;
- aborts the child from the watchdog thread while the parent keeps working
  (2 more steps), then ncclCommFinalize (polled) and ncclCommDestroy.

Each rank writes every output to OUTDIR/<name>.r<rank>.bin; the test checks
them bit for bit across ranks, against the other MODE's run and against the
emulator. Prints the number of ncclInProgress answers seen. With
QNCCL_TEST_MEMORY=device the buckets are device memory on a stream, as
PyTorch's are (the simulated GPU in CI).

`fault`: rank 1 alone has QNCCL_HOST_ISA set to a name no CPU has, so its
quantized call fails before any transfer; the others must fail with a message
within SECONDS (QNCCL_HOST_INIT_TIMEOUT), and ncclCommGetAsyncError on rank 1
must report its failure. Then a second thread aborts a communicator during a
quantized call whose peer (rank 1) never joins: the call must end within
seconds.
"""
import os
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from allreduce_check import COMM, NRANKS, RANK, STREAM, ffi, lib, nccl, ptr, synced
from conftest import nccl_config

SUCCESS, IN_PROGRESS = lib.ncclSuccess, lib.ncclInProgress
TYPES = {"float32": (lib.ncclFloat32, np.float32), "float16": (lib.ncclFloat16, np.float16),
         "bfloat16": (lib.ncclBfloat16, np.uint16)}
# (name, dtype, count): three above QNCCL_MIN_BYTES=16K, two below.
BUCKETS = (("b0", "float32", 70001), ("b1", "float16", 40000), ("b2", "bfloat16", 9000),
           ("b3", "float32", 1000), ("b4", "float16", 300))
in_progress_answers = 0
failures = []


def fail(what):
    failures.append(f"rank {RANK}: {what}")
    print(f"FAIL rank {RANK}: {what}", flush=True)


def answered(code, what):
    global in_progress_answers
    in_progress_answers += code == IN_PROGRESS
    if code not in (SUCCESS, IN_PROGRESS):
        fail(f"{what} answered {code}: {ffi.string(lib.qncclGetLastError()).decode()}")
        COMM.Abort(1)
    return code


def wait_ready(comm, what, timeout=60):
    state = ffi.new("ncclResult_t*")
    deadline = time.monotonic() + timeout
    while True:
        if lib.ncclCommGetAsyncError(comm, state) != SUCCESS:
            fail(f"{what}: ncclCommGetAsyncError failed")
            COMM.Abort(1)
        if state[0] != IN_PROGRESS:
            break
        if time.monotonic() > deadline:
            fail(f"{what}: still in progress after {timeout} s")
            COMM.Abort(1)
        time.sleep(0.0002)
    if state[0] != SUCCESS:
        fail(f"{what}: ncclCommGetAsyncError reports {state[0]}")
        COMM.Abort(1)


def new_comm(blocking):
    uid = ffi.new("ncclUniqueId*")
    if RANK == 0 and nccl.ncclGetUniqueId(uid) != SUCCESS:
        COMM.Abort(1)
    ffi.memmove(uid, COMM.bcast(bytes(ffi.buffer(uid)), root=0), ffi.sizeof("ncclUniqueId"))
    comm = ffi.new("ncclComm_t*")
    answered(lib.ncclCommInitRankConfig(comm, NRANKS, uid[0], RANK, nccl_config(ffi, blocking)),
             "ncclCommInitRankConfig")
    wait_ready(comm[0], "creation")
    return comm[0]


def values(name, dtype, count, step, rank):
    """Rank `rank`'s input of bucket `name` at `step`: the test recomputes it."""
    x = np.random.default_rng([zlib.crc32(name.encode()), step, rank]).standard_normal(count)
    x = x.astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16) if dtype == "bfloat16" else x.astype(
        TYPES[dtype][1])


class Watchdog(threading.Thread):
    """Polls every live communicator, as ProcessGroupNCCL's watchdog does."""

    def __init__(self):
        super().__init__(daemon=True)
        self.comms, self.lock, self.stop, self.polls = {}, threading.Lock(), threading.Event(), 0

    def run(self):
        state = ffi.new("ncclResult_t*")
        while not self.stop.is_set():
            with self.lock:
                for name, comm in self.comms.items():
                    if lib.ncclCommGetAsyncError(comm, state) != SUCCESS or \
                            state[0] not in (SUCCESS, IN_PROGRESS):
                        fail(f"watchdog: communicator {name} reports {state[0]}")
                    self.polls += 1
            time.sleep(0.0005)

    def abort(self, name):
        """Aborts a communicator from this thread's side, as the watchdog would."""
        with self.lock:
            comm = self.comms.pop(name)
            result = [None]

            def run_abort():
                result[0] = lib.ncclCommAbort(comm)
            t = threading.Thread(target=run_abort)
            t.start()
            t.join()
            if result[0] != SUCCESS:
                fail(f"ncclCommAbort of {name} answered {result[0]}")


def coalesced_step(comms, step, outdir):
    """One group of every bucket on each of `comms` ({label: comm}, issued in
    that order), then polled to readiness."""
    buffers = {label: [values(name, dtype, count, step, RANK) for name, dtype, count in BUCKETS]
               for label in comms}
    if lib.ncclGroupStart() != SUCCESS:
        COMM.Abort(1)
    for label, comm in comms.items():
        for (name, dtype, count), x in zip(BUCKETS, buffers[label]):
            code = lib.ncclAllReduce(ptr(x), ptr(x), count, TYPES[dtype][0], lib.ncclAvg, comm,
                                     STREAM)
            if code != SUCCESS:
                fail(f"grouped ncclAllReduce {label} {name}: {code}")
    answered(lib.ncclGroupEnd(), "ncclGroupEnd")
    for label, comm in comms.items():
        wait_ready(comm, f"{label} step {step}")
        synced(*buffers[label])  # device buffers: the stream's work, then the bytes
        for (name, _, _), x in zip(BUCKETS, buffers[label]):
            x.tofile(outdir / f"{label}.s{step}.{name}.r{RANK}.bin")


def premul_average(comm, label, nranks, outdir):
    scalar = np.array([1.0 / nranks], np.float32)
    op = ffi.new("ncclRedOp_t*")
    answered(nccl.ncclRedOpCreatePreMulSum(op, ffi.from_buffer(scalar), lib.ncclFloat32,
                                          lib.ncclScalarHostImmediate, comm), "PreMulSum")
    x = values("premul", "float32", 40000, 0, RANK)
    answered(lib.ncclAllReduce(ptr(x), ptr(x), x.size, lib.ncclFloat32, op[0], comm, STREAM),
             "PreMulSum ncclAllReduce")
    wait_ready(comm, f"{label} PreMulSum")
    synced(x)
    x.tofile(outdir / f"{label}.premul.r{RANK}.bin")
    if lib.ncclRedOpDestroy(op[0], comm) != SUCCESS:
        fail("ncclRedOpDestroy")


def process_group(mode, outdir):
    blocking = 1 if mode == "blocking" else 0
    parent = new_comm(blocking)
    child = ffi.new("ncclComm_t*")
    answered(lib.ncclCommSplit(parent, 0, NRANKS - RANK, child, ffi.NULL), "ncclCommSplit")
    wait_ready(parent, "the split's parent")
    while child[0] == ffi.NULL:  # NCCL fills it in once the split ends
        time.sleep(0.0005)
    wait_ready(child[0], "the split")
    watchdog = Watchdog()
    watchdog.comms.update(parent=parent, child=child[0])
    watchdog.start()
    for step in range(4):
        coalesced_step({"parent": parent}, step, outdir)
        coalesced_step({"child": child[0]}, step, outdir)
    # One group over both communicators, issued in another order on odd ranks:
    # run communicator after communicator, it would deadlock.
    both = {"parent": parent, "child": child[0]}
    coalesced_step(both if RANK % 2 == 0 else dict(reversed(both.items())), 4, outdir)
    premul_average(parent, "parent", NRANKS, outdir)
    premul_average(child[0], "child", NRANKS, outdir)
    watchdog.abort("child")  # the parent keeps working
    for step in range(5, 7):
        coalesced_step({"parent": parent}, step, outdir)
    watchdog.stop.set()
    watchdog.join()
    answered(nccl.ncclCommFinalize(parent), "ncclCommFinalize")
    wait_ready(parent, "ncclCommFinalize")
    if lib.ncclCommDestroy(parent) != SUCCESS:
        fail("ncclCommDestroy")
    if watchdog.polls == 0:
        fail("the watchdog never polled")


def fault(seconds):
    comm = new_comm(1)
    x = values("fault", "float32", 1 << 16, 0, RANK)
    if RANK == 1:
        os.environ["QNCCL_HOST_ISA"] = "no-such-isa"
    start = time.monotonic()
    code = lib.ncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(x), x.size, lib.ncclFloat32,
                             lib.ncclSum, comm, ffi.NULL)
    elapsed = time.monotonic() - start
    message = ffi.string(lib.qncclGetLastError()).decode()
    state = ffi.new("ncclResult_t*")
    lib.ncclCommGetAsyncError(comm, state)
    if code == SUCCESS or not message or elapsed > seconds + 10:
        fail(f"a quantized call with a fault on rank 1 answered {code} after {elapsed:.1f} s "
             f"({message!r}); expected an error with a message within {seconds} s")
    if state[0] == SUCCESS:
        fail("ncclCommGetAsyncError reports success after the quantized call failed")
    print(f"rank {RANK}: fault: answered {code} after {elapsed:.2f} s: {message}", flush=True)
    if RANK == 1:
        # The real NCCL checks each operation's communicator through the exported
        # ncclCommGetAsyncError, which libqnccl.so answers: a call QNCCL passes through
        # (int32) fails with the quantized call's error, before it waits for any peer.
        n = np.zeros(16, np.int32)
        passed = lib.ncclAllReduce(ffi.from_buffer(n), ffi.from_buffer(n), n.size, lib.ncclInt32,
                                   lib.ncclSum, comm, ffi.NULL)
        why = ffi.string(nccl.ncclGetLastError(comm)).decode()  # the real library's words
        if passed != state[0] or "ncclCommGetAsyncError reports" not in why:
            fail(f"a passed-through call after the failure answered {passed} ({why!r}); "
                 f"expected {state[0]} from ncclCommGetAsyncError")
    os.environ.pop("QNCCL_HOST_ISA", None)
    lib.ncclCommAbort(comm)
    COMM.Barrier()

    # Abort from a second thread while a quantized call waits for rank 1, which never joins.
    comm = new_comm(1)
    if RANK != 1:
        took = []
        timer = threading.Timer(0.5, lambda: took.append(lib.ncclCommAbort(comm)))
        timer.start()
        start = time.monotonic()
        code = lib.ncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(x), x.size, lib.ncclFloat32,
                                 lib.ncclSum, comm, ffi.NULL)
        elapsed = time.monotonic() - start
        timer.join()
        if code == SUCCESS or elapsed > 5 or took != [SUCCESS]:
            fail(f"a quantized call during an abort from another thread answered {code} after "
                 f"{elapsed:.1f} s (abort: {took}); expected an error within seconds")
        print(f"rank {RANK}: abort during a quantized call: answered {code} after "
              f"{elapsed:.2f} s", flush=True)
    COMM.Barrier()
    if RANK == 1:
        lib.ncclCommAbort(comm)


def main():
    mode = sys.argv[1]
    if mode == "fault":
        fault(float(sys.argv[2]))
    else:
        process_group(mode, Path(sys.argv[2]))
    total = COMM.reduce(in_progress_answers, root=0)
    bad = COMM.allreduce(len(failures))
    if RANK == 0:
        print(f"ncclInProgress answers: {total}", flush=True)
        print(f"SUMMARY process group ({mode}): {NRANKS} ranks, {bad} failures", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
