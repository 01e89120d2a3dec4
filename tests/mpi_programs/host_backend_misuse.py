"""Misuse of the host backend: each case must return its documented NCCL code
and message, within a bound, on every rank involved; none may hang.

Run with 4 ranks and QNCCL_HOST_INIT_TIMEOUT=2 (the timeout cases wait for it).

Usage (under tests/mpi.py): host_backend_misuse.py
"""
import os
import time

import numpy as np

from host_backend_lib import (NULL, WORLD, Failures, check, ffi, init_rank, lib, new_id, ptr,
                              result_name, run, world_comm)

T = float(os.environ["QNCCL_HOST_INIT_TIMEOUT"])
FAST = 0.9 * T  # errors found without waiting for any timeout
RANK = WORLD.rank
F = Failures()
keep_alive = []  # buffers of operations abandoned on timeout: MPI may still touch them


def last_error():
    return ffi.string(lib.ncclGetLastError(NULL)).decode()


def expect(what, call, want_code, fragment, within, at_least=0.0):
    """Runs call() (returns an ncclResult_t); checks code, message and time."""
    started = time.monotonic()
    code = call()
    elapsed = time.monotonic() - started
    message = last_error() if code != lib.ncclSuccess else ""
    F.expect(code == want_code and fragment in message and at_least <= elapsed < within,
             f"{what}: got {result_name(code)} {message!r} after {elapsed:.2f} s; want "
             f"{result_name(want_code)} with {fragment!r} in [{at_least}, {within}) s")
    return code


def init_call(nranks, uid, rank):
    def call():
        code, comm = init_rank(nranks, uid, rank)
        if code == lib.ncclSuccess:
            lib.ncclCommDestroy(comm)
        return code
    return call


# ---- rendezvous ---------------------------------------------------------------

def mismatched_nranks():
    members = [0, 1, 2]
    if RANK in members:
        uid = new_id(0, members)
        nranks = 2 if RANK == 1 else 3
        expect("nranks mismatch", init_call(nranks, uid, RANK), lib.ncclInvalidUsage,
               "ranks disagree on nranks: world rank 1 passed nranks=2", FAST)


def duplicate_rank():
    uid = new_id(0, range(4))
    rank = 2 if RANK == 3 else RANK
    expect("duplicate rank", init_call(4, uid, rank), lib.ncclInvalidUsage,
           "rank 2 was passed by two processes", FAST)


def rank_out_of_range():
    uid = new_id(0, range(4))
    rank = 7 if RANK == 3 else RANK
    fragment = "rank 7 with nranks 4" if RANK == 3 else "world rank 3 passed rank 7, outside 0..3"
    expect("rank out of range", init_call(4, uid, rank), lib.ncclInvalidArgument, fragment, FAST)


def missing_rank():
    members = [0, 1, 2]  # world rank 3 never calls ncclCommInitRank
    if RANK in members:
        uid = new_id(0, members)
        expect("missing rank", init_call(4, uid, RANK), lib.ncclSystemError,
               "ranks 3 (of 4) did not call ncclCommInitRank within 2 s", T + 1.5, at_least=T)


def absent_root():
    members = [0, 1, 2, 3]  # world rank 0 makes the id but never joins
    uid = new_id(0, members)
    if RANK != 0:
        expect("absent root", init_call(4, uid, RANK), lib.ncclSystemError,
               "no verdict from the rendezvous root (world rank 0", 2 * T + 1.5, at_least=2 * T)


def late_root():
    """World rank 1 gives up waiting for a root that comes 2T + 0.5 s late with
    world rank 2: the root must not enter MPI_Comm_create_group without rank 1
    (which would hang), but fail itself and rank 2 after waiting T for rank 1."""
    members = [0, 1, 2]
    if RANK not in members:
        return
    uid = new_id(0, members)
    if RANK == 1:
        expect("early member of a late root", init_call(3, uid, 1), lib.ncclSystemError,
               "no verdict from the rendezvous root", 2 * T + 1.5, at_least=2 * T)
        return
    time.sleep(2 * T + 0.5)
    expect("late root", init_call(3, uid, RANK), lib.ncclSystemError,
           "world ranks 1 gave up before the communicator was complete", T + 1.5, at_least=T)


def foreign_id():
    uid = ffi.new("ncclUniqueId*")  # zeros: not made by ncclGetUniqueId
    expect("foreign id", init_call(4, uid, RANK), lib.ncclInvalidArgument,
           "commId was not made by the host backend's ncclGetUniqueId", FAST)


def bad_timeout_setting():
    uid = new_id(0, range(4))
    os.environ["QNCCL_HOST_INIT_TIMEOUT"] = "soon"
    expect("bad QNCCL_HOST_INIT_TIMEOUT", init_call(4, uid, RANK), lib.ncclInvalidArgument,
           "QNCCL_HOST_INIT_TIMEOUT='soon': expected a positive number of seconds", FAST)
    os.environ["QNCCL_HOST_INIT_TIMEOUT"] = str(T)


def bad_config():
    uid = new_id(0, range(4))
    config = ffi.new("ncclConfig_t*")  # zeros: not from NCCL_CONFIG_INITIALIZER
    comm = ffi.new("ncclComm_t*")
    expect("config without magic", lambda: lib.ncclCommInitRankConfig(comm, 4, uid[0], RANK,
                                                                       config),
           lib.ncclInvalidArgument, "config was not initialized with NCCL_CONFIG_INITIALIZER",
           FAST)


def init_all():
    comm = ffi.new("ncclComm_t*")
    expect("ncclCommInitAll(0)", lambda: lib.ncclCommInitAll(comm, 0, NULL),
           lib.ncclInvalidArgument, "ndev=0: must be >= 1", FAST)


# ---- arguments of calls on a communicator --------------------------------------

def bad_arguments(comm):
    x = np.zeros(8, np.float32)
    f32, inv = lib.ncclFloat32, lib.ncclInvalidArgument
    cases = [
        ("send to peer 4", lambda: lib.ncclSend(ptr(x), 8, f32, 4, comm, NULL), inv,
         "ncclSend: peer 4 is outside 0..3"),
        ("recv from peer -1", lambda: lib.ncclRecv(ptr(x), 8, f32, -1, comm, NULL), inv,
         "ncclRecv: peer -1 is outside 0..3"),
        ("NULL sendbuff", lambda: lib.ncclAllReduce(NULL, ptr(x), 8, f32, lib.ncclSum, comm, NULL),
         inv, "ncclAllReduce: sendbuff is NULL with count 8"),
        ("NULL recvbuff", lambda: lib.ncclAllGather(ptr(x), NULL, 2, f32, comm, NULL), inv,
         "ncclAllGather: recvbuff is NULL with count 2"),
        ("NULL send buffer", lambda: lib.ncclSend(NULL, 8, f32, 1, comm, NULL), inv,
         "ncclSend: sendbuff is NULL with count 8"),
        ("unknown datatype", lambda: lib.ncclAllReduce(ptr(x), ptr(x), 8, 99, lib.ncclSum, comm,
                                                       NULL), inv, "unknown datatype 99"),
        ("fp8 e4m3", lambda: lib.ncclAllReduce(ptr(x), ptr(x), 8, lib.ncclFloat8e4m3, lib.ncclSum,
                                               comm, NULL), inv,
         "datatype ncclFloat8e4m3 is not supported by the host backend"),
        ("fp8 e5m2", lambda: lib.ncclBroadcast(ptr(x), ptr(x), 8, lib.ncclFloat8e5m2, 0, comm,
                                               NULL), inv,
         "datatype ncclFloat8e5m2 is not supported by the host backend"),
        ("unknown op", lambda: lib.ncclAllReduce(ptr(x), ptr(x), 8, f32, 17, comm, NULL), inv,
         "unknown reduction op 17"),
        ("op past PreMulSum ops", lambda: lib.ncclReduce(ptr(x), ptr(x), 8, f32, 1000, 0, comm,
                                                         NULL), inv, "unknown reduction op 1000"),
        ("root out of range", lambda: lib.ncclReduce(ptr(x), ptr(x), 8, f32, lib.ncclSum, 9, comm,
                                                     NULL), inv, "ncclReduce: root 9 is outside"),
        ("count too large", lambda: lib.ncclAllReduce(ptr(x), ptr(x), 2**62, f32, lib.ncclSum,
                                                      comm, NULL), inv, "is too large"),
        ("NULL comm", lambda: lib.ncclAllReduce(ptr(x), ptr(x), 8, f32, lib.ncclSum, NULL, NULL),
         inv, "ncclAllReduce: comm is NULL"),
        ("ncclGroupEnd without start", lib.ncclGroupEnd, lib.ncclInvalidUsage,
         "no ncclGroupStart is open"),
        ("destroy built-in op", lambda: lib.ncclRedOpDestroy(lib.ncclSum, comm), inv,
         "built-in ops cannot be destroyed"),
    ]
    for what, call, code, fragment in cases:
        expect(what, call, code, fragment, FAST)
    expect("count 0 with NULL buffers",
           lambda: lib.ncclAllReduce(NULL, NULL, 0, f32, lib.ncclSum, comm, NULL),
           lib.ncclSuccess, "", FAST)
    F.expect("invalid argument" in ffi.string(lib.ncclGetErrorString(inv)).decode(),
             "ncclGetErrorString(ncclInvalidArgument)")


def premul_misuse(comm):
    scalar = np.array([2.0], np.float32)
    op = ffi.new("ncclRedOp_t*")
    expect("device scalar", lambda: lib.ncclRedOpCreatePreMulSum(
        op, ptr(scalar), lib.ncclFloat32, lib.ncclScalarDevice, comm), lib.ncclInvalidArgument,
        "ncclScalarDevice: the host backend has no device memory", FAST)
    check(lib.ncclRedOpCreatePreMulSum(op, ptr(scalar), lib.ncclFloat32,
                                       lib.ncclScalarHostImmediate, comm))
    x = np.ones(4, np.float64)
    expect("PreMulSum on another type", lambda: lib.ncclAllReduce(
        ptr(x), ptr(x), 4, lib.ncclFloat64, op[0], comm, NULL), lib.ncclInvalidArgument,
        "was created for ncclFloat32, not ncclFloat64", FAST)
    check(lib.ncclRedOpDestroy(op[0], comm))
    expect("destroy an op twice", lambda: lib.ncclRedOpDestroy(op[0], comm),
           lib.ncclInvalidArgument, "was not created on this communicator", FAST)
    y = np.ones(4, np.float32)
    expect("use a destroyed op", lambda: lib.ncclAllReduce(
        ptr(y), ptr(y), 4, lib.ncclFloat32, op[0], comm, NULL), lib.ncclInvalidArgument,
        "unknown reduction op", FAST)


def failed_group(comm):
    """An invalid call drops its whole group: the valid allreduce does not run."""
    x = np.ones(8, np.float32)
    check(lib.ncclGroupStart())
    check(lib.ncclAllReduce(ptr(x), ptr(x), 8, lib.ncclFloat32, lib.ncclSum, comm, NULL))
    F.expect(lib.ncclSend(ptr(x), 8, lib.ncclFloat32, 5, comm, NULL) == lib.ncclInvalidArgument,
             "bad peer inside a group")
    expect("group with an invalid call", lib.ncclGroupEnd, lib.ncclInvalidArgument,
           "the group was dropped: one of its calls failed: ncclSend: peer 5", FAST)
    F.expect((x == 1).all(), "a dropped group still ran its allreduce")


def split_with_bad_color(comm):
    """A rank with an invalid color fails alone; the others still get their communicator."""
    new = ffi.new("ncclComm_t*")
    color = -5 if RANK == 1 else 0
    code = expect("split", lambda: lib.ncclCommSplit(comm, color, 0, new, NULL),
                  lib.ncclInvalidArgument if RANK == 1 else lib.ncclSuccess,
                  "color -5: must be >= 0 or NCCL_SPLIT_NOCOLOR" if RANK == 1 else "", FAST)
    if code == lib.ncclSuccess:
        count = ffi.new("int*")
        check(lib.ncclCommCount(new[0], count))
        F.expect(count[0] == 3, f"split without the bad rank has {count[0]} ranks")
        check(lib.ncclCommDestroy(new[0]))


# ---- point-to-point that never completes ----------------------------------------

def p2p_timeout(comm):
    """Rank 0 waits for a message rank 1 never sends; rank 1 sends 4 MiB (too
    big to complete unmatched) that rank 2 never receives."""
    if RANK in (0, 1):
        buf = np.zeros(1 << 20, np.float32)
        keep_alive.append(buf)
        call = (lambda: lib.ncclRecv(ptr(buf), 16, lib.ncclFloat32, 1, comm, NULL)) if RANK == 0 \
            else (lambda: lib.ncclSend(ptr(buf), buf.size, lib.ncclFloat32, 2, comm, NULL))

        def grouped():
            check(lib.ncclGroupStart())
            check(call())
            return lib.ncclGroupEnd()
        what = "recv from rank 1" if RANK == 0 else "send to rank 2"
        expect("p2p timeout", grouped, lib.ncclSystemError,
               f"1 point-to-point operation(s) made no progress for 2 s (QNCCL_HOST_INIT_TIMEOUT)"
               f": {what}", T + 1.5, at_least=T)
        err = ffi.new("ncclResult_t*")
        check(lib.ncclCommGetAsyncError(comm, err))
        F.expect(err[0] == lib.ncclSystemError, "async error after a p2p timeout")
        x = np.ones(4, np.float32)
        # As NCCL: a call on a failed communicator returns its error.
        expect("collective on a failed communicator", lambda: lib.ncclAllReduce(
            ptr(x), ptr(x), 4, lib.ncclFloat32, lib.ncclSum, comm, NULL), lib.ncclSystemError,
            "the communicator is unusable after an earlier error", FAST)
    check(lib.ncclCommAbort(comm), "ncclCommAbort")


def after_destroy():
    comm = world_comm()
    x = np.ones(4, np.float32)
    check(lib.ncclCommFinalize(comm))
    expect("collective after finalize", lambda: lib.ncclAllReduce(
        ptr(x), ptr(x), 4, lib.ncclFloat32, lib.ncclSum, comm, NULL), lib.ncclInvalidUsage,
        "the communicator was finalized", FAST)
    check(lib.ncclCommDestroy(comm))
    count = ffi.new("int*")
    expect("query a destroyed comm", lambda: lib.ncclCommCount(comm, count),
           lib.ncclInvalidArgument, "is not a live communicator", FAST)
    expect("collective on a destroyed comm", lambda: lib.ncclAllReduce(
        ptr(x), ptr(x), 4, lib.ncclFloat32, lib.ncclSum, comm, NULL), lib.ncclInvalidArgument,
        "is not a live communicator", FAST)
    expect("destroy twice", lambda: lib.ncclCommDestroy(comm), lib.ncclInvalidArgument,
           "is not a live communicator", FAST)


def main():
    assert WORLD.size == 4, "run with 4 ranks"
    for case in (mismatched_nranks, duplicate_rank, rank_out_of_range, missing_rank, absent_root,
                 late_root, foreign_id, bad_timeout_setting, bad_config, init_all):
        case()
        WORLD.Barrier()
    comm = world_comm()
    for case in (bad_arguments, premul_misuse, failed_group, split_with_bad_color, p2p_timeout):
        case(comm)
        WORLD.Barrier()
    after_destroy()
    return F.report()


if __name__ == "__main__":
    run(main)
