"""The host backend's nonblocking communicators and calls from a second thread,
as NVIDIA's NCCL specifies them, on every rank of this MPI job.

    host_backend_nonblocking.py SECTION

Sections (one per pytest case):

protocol  ncclCommInitRankConfig with blocking = 0 answers ncclInProgress and
          the communicator reports ncclInProgress until its rendezvous ends;
          a query or a collective before that is refused (ncclInvalidArgument,
          "not ready"). Ungrouped collectives, grouped sends and receives and
          a group of collectives answer ncclInProgress, results appear once
          ncclCommGetAsyncError says ncclSuccess, and match numpy; a group
          mixing blocking and nonblocking communicators is refused.
          ncclCommSplit answers ncclSuccess while the parent is in progress
          (NCCL 2.28 does not pass its group's ncclInProgress on), leaves
          *newcomm NULL until the parent is ready (as NCCL does), and the child
          inherits the mode.
          ncclCommFinalize answers ncclInProgress, then ncclSuccess.
          NCCL_COMM_BLOCKING=0 makes ncclCommInitRank nonblocking.
abort     ncclCommAbort from a second thread while the first waits in a
          blocking receive its peer never sends: the wait ends within seconds
          with an error. The same for a nonblocking receive, its progress in
          the background: ncclCommGetAsyncError reports the error.
revoke    ncclCommRevoke (NCCL 2.28.7) from a second thread while the first waits in a
          receive its peer never sends (blocking: in the call; nonblocking: in the
          background): the receive ends with an error, the revoke returns once it did,
          the communicator reports ncclSuccess and refuses operations ("revoked"), a
          second revoke is refused, ncclCommAbort follows; flags other than
          NCCL_REVOKE_DEFAULT are refused. No warning: no group held the
          communicator when it was aborted.
held      ncclCommAbort from a second thread while the first thread's group is open
          with a send on the communicator: NVIDIA's NCCL frees the communicator under
          that group; the backend stays safe (the group's end fails: not a live
          communicator) and warns on stderr (the test reads it).
watchdog  a thread polls ncclCommGetAsyncError on every communicator while the
          main thread runs collectives on them (run under ThreadSanitizer by
          `make sanitize`).

Counts every ncclInProgress answer and prints it; exits non-zero on any failure.
"""
import os
import sys
import threading
import time

import numpy as np

from host_backend_lib import NULL, WORLD, Failures, check, ffi, lib, new_id, ptr, run
from conftest import nccl_config  # noqa: E402  (tests/ is on the path once host_backend_lib is in)

F = Failures()
RANK, N = WORLD.rank, WORLD.size
SUCCESS, IN_PROGRESS = lib.ncclSuccess, lib.ncclInProgress
REVOKE_DEFAULT = 0  # NCCL_REVOKE_DEFAULT (a macro: not in the cffi declarations)
answered_in_progress = 0


def answered(code, what, allowed=(IN_PROGRESS,)):
    """Checks a call's answer; counts ncclInProgress."""
    global answered_in_progress
    answered_in_progress += code == IN_PROGRESS
    F.expect(code in allowed, f"{what} answered {code}, expected one of {allowed}")
    return code


def wait_ready(comm, what, timeout=30.0):
    """Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress."""
    state = ffi.new("ncclResult_t*")
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        check(lib.ncclCommGetAsyncError(comm, state), "ncclCommGetAsyncError")
        polls += 1
        if state[0] != IN_PROGRESS or time.monotonic() > deadline:
            break
        time.sleep(0.0005)
    F.expect(state[0] == SUCCESS, f"{what}: ncclCommGetAsyncError reports {state[0]} after "
                                  f"{polls} polls, expected ncclSuccess")
    return polls


def make_comm(blocking, uid=None):
    uid = uid if uid is not None else new_id(0, range(N))
    comm = ffi.new("ncclComm_t*")
    code = lib.ncclCommInitRankConfig(comm, N, uid[0], RANK, nccl_config(ffi, blocking))
    if blocking:
        check(code, "ncclCommInitRankConfig (blocking)")
    else:
        answered(code, "ncclCommInitRankConfig (blocking = 0)")
    return comm[0]


def rank_values(rank, count=1000):
    return (np.arange(count, dtype=np.float32) % 7) + rank


def protocol():
    comm = make_comm(0)
    count = ffi.new("int*")
    code = lib.ncclCommCount(comm, count)
    # The rendezvous may have ended already on a fast machine: then the query works.
    F.expect(code in (SUCCESS, lib.ncclInvalidArgument), f"ncclCommCount while in progress: {code}")
    if code == lib.ncclInvalidArgument:
        F.expect("not ready" in ffi.string(lib.ncclGetLastError(NULL)).decode(),
                 "the refusal of a call before readiness says the communicator is not ready")
    wait_ready(comm, "nonblocking creation")
    check(lib.ncclCommCount(comm, count), "ncclCommCount")
    F.expect(count[0] == N, f"ncclCommCount {count[0]} != {N}")

    # A call before readiness is refused. Rank 0 posts the allreduce only once
    # every other rank has tried its second call, so theirs is still in
    # progress then (rank 0 makes no second call: whether its own would be
    # refused depends on timing, and a collective run on one rank only would
    # pair with the next one of the others).
    x = rank_values(RANK)

    def first_allreduce():
        answered(lib.ncclAllReduce(ptr(x), ptr(x), x.size, lib.ncclFloat32, lib.ncclSum, comm,
                                   NULL), "ungrouped ncclAllReduce")
    if RANK != 0:
        first_allreduce()
        y = rank_values(RANK)
        code = lib.ncclAllReduce(ptr(y), ptr(y), y.size, lib.ncclFloat32, lib.ncclSum, comm, NULL)
        F.expect(code == lib.ncclInvalidArgument,
                 f"a second call before readiness answered {code}, not ncclInvalidArgument")
    WORLD.Barrier()
    if RANK == 0:
        first_allreduce()
    wait_ready(comm, "ncclAllReduce")
    want = sum(rank_values(r) for r in range(N))
    F.expect(np.array_equal(x, want), "nonblocking ncclAllReduce: result differs from numpy")

    # A ring of sends and receives and a group of two collectives.
    send = rank_values(RANK, 257)
    recv = np.zeros_like(send)
    check(lib.ncclGroupStart())
    check(lib.ncclSend(ptr(send), send.size, lib.ncclFloat32, (RANK + 1) % N, comm, NULL))
    check(lib.ncclRecv(ptr(recv), recv.size, lib.ncclFloat32, (RANK - 1) % N, comm, NULL))
    answered(lib.ncclGroupEnd(), "ncclGroupEnd of sends and receives")
    wait_ready(comm, "grouped send/recv")
    F.expect(np.array_equal(recv, rank_values((RANK - 1) % N, 257)), "grouped recv: wrong bytes")
    a, b = rank_values(RANK, 64), rank_values(RANK, 64) * 2
    check(lib.ncclGroupStart())
    check(lib.ncclAllReduce(ptr(a), ptr(a), a.size, lib.ncclFloat32, lib.ncclMax, comm, NULL))
    check(lib.ncclAllReduce(ptr(b), ptr(b), b.size, lib.ncclFloat32, lib.ncclAvg, comm, NULL))
    answered(lib.ncclGroupEnd(), "ncclGroupEnd of two collectives")
    wait_ready(comm, "group of collectives")
    F.expect(np.array_equal(a, rank_values(N - 1, 64)), "grouped max: wrong result")
    F.expect(np.array_equal(b, sum(rank_values(r, 64) * 2 for r in range(N)) / np.float32(N)),
             "grouped avg: wrong result")

    blocking = make_comm(1)
    check(lib.ncclGroupStart())
    check(lib.ncclAllReduce(ptr(a), ptr(a), a.size, lib.ncclFloat32, lib.ncclSum, comm, NULL))
    check(lib.ncclAllReduce(ptr(b), ptr(b), b.size, lib.ncclFloat32, lib.ncclSum, blocking, NULL))
    code = lib.ncclGroupEnd()
    F.expect(code == lib.ncclInvalidArgument and "not allowed in the same group" in
             ffi.string(lib.ncclGetLastError(NULL)).decode(),
             f"a group mixing blocking and nonblocking communicators answered {code}")
    check(lib.ncclCommDestroy(blocking), "ncclCommDestroy (blocking)")

    child = ffi.new("ncclComm_t*")
    answered(lib.ncclCommSplit(comm, 0, N - RANK, child, NULL), "ncclCommSplit",
             allowed=(SUCCESS,))
    wait_ready(comm, "the parent of a nonblocking split")
    F.expect(child[0] != NULL, "the split's communicator is still NULL once the parent is ready")
    wait_ready(child[0], "the split's communicator")
    z = rank_values(RANK, 10)
    answered(lib.ncclAllReduce(ptr(z), ptr(z), z.size, lib.ncclFloat32, lib.ncclSum, child[0],
                               NULL), "ncclAllReduce on the split (nonblocking, inherited)")
    wait_ready(child[0], "ncclAllReduce on the split")
    F.expect(np.array_equal(z, sum(rank_values(r, 10) for r in range(N))), "split: wrong sum")
    answered(lib.ncclCommFinalize(child[0]), "ncclCommFinalize")
    wait_ready(child[0], "ncclCommFinalize")
    check(lib.ncclCommDestroy(child[0]), "ncclCommDestroy (split)")
    answered(lib.ncclCommFinalize(comm), "ncclCommFinalize")
    wait_ready(comm, "ncclCommFinalize")
    check(lib.ncclCommDestroy(comm), "ncclCommDestroy")

    os.environ["NCCL_COMM_BLOCKING"] = "0"
    uid = new_id(0, range(N))
    plain = ffi.new("ncclComm_t*")
    answered(lib.ncclCommInitRank(plain, N, uid[0], RANK), "ncclCommInitRank, NCCL_COMM_BLOCKING=0")
    del os.environ["NCCL_COMM_BLOCKING"]
    wait_ready(plain[0], "ncclCommInitRank with NCCL_COMM_BLOCKING=0")
    check(lib.ncclCommDestroy(plain[0]))


def receive_while(comm, blocking, name, call):
    """Rank 0 receives from rank 1, which never sends; a second thread of rank 0 calls
    `call` (ncclCommAbort, ncclCommRevoke) after 0.3 s: the receive ends with an error
    within seconds (nonblocking: in the background), and the call returns within 2 s."""
    buf = np.zeros(16, np.float32)
    took = []

    def end_it():
        begin = time.monotonic()
        check(call(), name)
        took.append(time.monotonic() - begin)
    ender = threading.Timer(0.3, end_it)
    ender.start()
    start = time.monotonic()
    code = lib.ncclRecv(ptr(buf), buf.size, lib.ncclFloat32, 1, comm, NULL)
    if blocking:
        elapsed = time.monotonic() - start
        F.expect(code != SUCCESS and elapsed < 5,
                 f"blocking receive during {name} from another thread: answered {code} "
                 f"after {elapsed:.2f} s (expected an error within seconds)")
    else:
        answered(code, "nonblocking ncclRecv")
    ender.join()
    F.expect(took and took[0] < 2, f"{name} took {took} s with a receive in flight")
    return buf


def abort_from_thread(blocking):
    """receive_while with ncclCommAbort; the handle then answers nothing."""
    comm = make_comm(blocking)
    if not blocking:
        wait_ready(comm, "creation")
    if RANK == 0 and N > 1:
        receive_while(comm, blocking, "ncclCommAbort", lambda: lib.ncclCommAbort(comm))
        state = ffi.new("ncclResult_t*")
        F.expect(lib.ncclCommGetAsyncError(comm, state) == lib.ncclInvalidArgument,
                 "the handle of an aborted communicator still answers")
    WORLD.Barrier()
    if RANK != 0:
        check(lib.ncclCommDestroy(comm), "ncclCommDestroy")


def revoke_from_thread(blocking):
    """receive_while with ncclCommRevoke; the communicator then reports ncclSuccess and
    refuses operations and a second revoke; bad flags are refused."""
    comm = make_comm(blocking)
    if not blocking:
        wait_ready(comm, "creation")
    if RANK == 0 and N > 1:
        buf = receive_while(comm, blocking, "ncclCommRevoke",
                            lambda: lib.ncclCommRevoke(comm, REVOKE_DEFAULT))
        state = ffi.new("ncclResult_t*")
        check(lib.ncclCommGetAsyncError(comm, state), "ncclCommGetAsyncError after the revoke")
        F.expect(state[0] == SUCCESS, f"a revoked, quiescent communicator reports {state[0]}")
        code = lib.ncclSend(ptr(buf), buf.size, lib.ncclFloat32, 1, comm, NULL)
        F.expect(code == lib.ncclInvalidUsage and "revoked" in last_error(),
                 f"a send on a revoked communicator: {code} {last_error()!r}")
        code = lib.ncclCommRevoke(comm, REVOKE_DEFAULT)
        F.expect(code == lib.ncclInvalidUsage and "revoked already" in last_error(),
                 f"a second revoke: {code} {last_error()!r}")
        check(lib.ncclCommAbort(comm), "ncclCommAbort after the revoke")
    WORLD.Barrier()
    if RANK != 0:
        code = lib.ncclCommRevoke(comm, 1)
        F.expect(code == lib.ncclInvalidArgument and "NCCL_REVOKE_DEFAULT" in last_error(),
                 f"revokeFlags 1: {code} {last_error()!r}")
        check(lib.ncclCommDestroy(comm), "ncclCommDestroy")


def abort_under_open_group():
    """Rank 0 opens a group with a send to rank 1; a second thread aborts the
    communicator; the group's end fails without touching it."""
    comm = make_comm(1)
    if RANK == 0 and N > 1:
        buf = np.zeros(16, np.float32)
        check(lib.ncclGroupStart(), "ncclGroupStart")
        check(lib.ncclSend(ptr(buf), buf.size, lib.ncclFloat32, 1, comm, NULL), "ncclSend")
        aborter = threading.Thread(target=lambda: check(lib.ncclCommAbort(comm), "ncclCommAbort"))
        aborter.start()
        aborter.join()
        code = lib.ncclGroupEnd()
        F.expect(code == lib.ncclInvalidArgument and "not a live communicator" in last_error(),
                 f"the group's end after its communicator was aborted: {code} {last_error()!r}")
    WORLD.Barrier()
    if RANK != 0:
        check(lib.ncclCommDestroy(comm), "ncclCommDestroy")


def last_error():
    return ffi.string(lib.ncclGetLastError(NULL)).decode()


def watchdog():
    comms = [make_comm(0), make_comm(1)]
    wait_ready(comms[0], "creation")
    stop = threading.Event()
    polls = [0]

    def poll():
        state = ffi.new("ncclResult_t*")
        while not stop.is_set():
            for c in comms:
                check(lib.ncclCommGetAsyncError(c, state), "ncclCommGetAsyncError (watchdog)")
                F.expect(state[0] in (SUCCESS, IN_PROGRESS), f"watchdog saw {state[0]}")
                polls[0] += 1
    thread = threading.Thread(target=poll)
    thread.start()
    for step in range(20):
        for c in comms:
            x = rank_values(RANK, 500) + step
            code = lib.ncclAllReduce(ptr(x), ptr(x), x.size, lib.ncclFloat32, lib.ncclSum, c, NULL)
            if code == IN_PROGRESS:
                answered(code, "ncclAllReduce")
                wait_ready(c, "ncclAllReduce")
            else:
                check(code, "ncclAllReduce (blocking)")
            F.expect(np.array_equal(x, sum(rank_values(r, 500) + step for r in range(N))),
                     f"step {step}: wrong sum")
    stop.set()
    thread.join()
    F.expect(polls[0] > 0, "the watchdog thread never polled")
    for c in comms:
        check(lib.ncclCommDestroy(c))


def main():
    section = sys.argv[1]
    {"protocol": protocol, "abort": lambda: (abort_from_thread(1), abort_from_thread(0)),
     "revoke": lambda: (revoke_from_thread(1), revoke_from_thread(0)),
     "held": abort_under_open_group, "watchdog": watchdog}[section]()
    total = WORLD.reduce(answered_in_progress, root=0)
    if RANK == 0:
        print(f"ncclInProgress answers: {total}")
    return F.report()


if __name__ == "__main__":
    run(main)
