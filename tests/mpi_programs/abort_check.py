"""libqnccl.so's ncclCommAbort while a quantized call of another thread is inside its
ncclGroupEnd, on 2 ranks over the host backend.

    mpirun -np 2 python abort_check.py MODE

NVIDIA's NCCL frees an aborted communicator at once, even while another thread's group
holds operations on it (posted, or in an ncclGroupEnd that has not returned): that
group's end then uses freed memory. The host backend keeps the communicator alive but
reports such an abort on stderr ("QNCCL WARN host backend: ncclCommAbort(...) while a
group holds operations on it"); the test fails on that line. libqnccl's abort must
first stop its own group with ncclCommRevoke and wait for the group's end to return.

Rank 1 makes the communicator and one quantized call with rank 0, then stays away
(a peer that is gone): rank 0's next quantized ncclAllReduce waits in the first
step's ncclGroupEnd for it, and a second thread of rank 0 aborts the communicator
0.5 s later, as PyTorch's watchdog does. MODE says what happens:

abort     the call ends with an error saying the communicator was aborted, the abort
          returns within seconds (ncclCommRevoke stopped the group; the group would give
          up by itself only after QNCCL_HOST_INIT_TIMEOUT=30 s) with ncclSuccess.
destroy   ncclCommDestroy instead: it may not stop the group, so it returns once the
          group gave up by itself (QNCCL_HOST_INIT_TIMEOUT=2 s without progress), the
          call failing the same way.
split     (QNCCL_ALGO=hier) rank 0's quantized call is the communicator's first, alone:
          it waits in the ncclCommSplit that finds the node layout (an NCCL init of a
          child, which NVIDIA's NCCL would also run on the freed parent); the abort revokes
          the parent, the split fails, and then the abort proceeds.

Prints one line per failure, then a summary; exits non-zero on any failure.
"""
import sys
import threading
import time

import numpy as np

from allreduce_check import COMM, RANK, check_nccl, ffi, lib
from interposer_check import init_comm, require

COUNT = 4096  # small messages: MPI sends them eagerly, so the cancelled ones leave nothing
failures = []


def expect(condition, what):
    if not condition:
        failures.append(f"FAIL rank {RANK}: {what}")
        print(failures[-1], flush=True)


def allreduce(comm, x):
    return lib.ncclAllReduce(ffi.from_buffer(x), ffi.from_buffer(x), x.size, lib.ncclFloat32,
                             lib.ncclSum, comm, ffi.NULL)


def stats(comm):
    s = ffi.new("qncclStats_t*")
    check_nccl(lib.qncclCommGetStats(comm, s), "qncclCommGetStats")
    return s


def main():
    mode = sys.argv[1]
    name = {"abort": "ncclCommAbort", "destroy": "ncclCommDestroy",
            "split": "ncclCommAbort"}[mode]
    release = getattr(lib, name)
    result, comm = init_comm(algo="hier" if mode == "split" else "ring", bits=4, min_bytes=0,
                             warmup_calls=0)
    require(result, "ncclCommInitRank")
    x = np.linspace(-1, 1, COUNT, dtype=np.float32) * (RANK + 1)
    if mode != "split":
        check_nccl(allreduce(comm, x), "the first quantized ncclAllReduce")
        expect(stats(comm).callsCompressed == 1, "the first call was not quantized")
    if RANK == 0:
        answers = {}

        def end_it():
            begin = time.monotonic()
            answers["code"] = release(comm)
            answers["took"] = time.monotonic() - begin
            answers["returned"] = time.monotonic()
        ender = threading.Timer(0.5, end_it)
        ender.start()
        code = allreduce(comm, x)
        call_returned = time.monotonic()
        message = ffi.string(lib.qncclGetLastError()).decode()
        ender.join()
        expect(answers["code"] == lib.ncclSuccess,
               f"{name} answered {answers['code']}")
        expect(code != lib.ncclSuccess, "the call on the aborted communicator succeeded")
        want = "was revoked (ncclCommRevoke)" if mode == "split" else "was aborted or destroyed"
        expect(want in message, f"the call's message lacks {want!r}: {message!r}")
        bound = 6.0 if mode == "destroy" else 3.0
        expect(answers["took"] < bound, f"{name} took {answers['took']:.2f} s "
               f"(at most {bound} s)")
        # The group's end returned before the real NCCL let the communicator go; the call
        # itself returns just after (it takes the communicator's lock to say why).
        expect(answers["returned"] <= call_returned + 1.0,
               f"{name} returned {answers['returned'] - call_returned:.2f} s "
               f"after the call")
    COMM.Barrier()  # rank 0 is done with the communicator
    if RANK != 0:
        check_nccl(lib.ncclCommAbort(comm), "ncclCommAbort (rank 1, no call in flight)")
    total = COMM.allreduce(len(failures))
    if RANK == 0:
        print(f"SUMMARY abort_check {mode}: {total} failures", flush=True)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
