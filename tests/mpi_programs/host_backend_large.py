"""Transfers longer than one MPI message (kMaxMessageBytes = 1 GiB in
src/host_backend/host.h): int8 buffers of 2^30 + 3 elements go as two
messages per rank block. Covers the piecewise paths: AllReduce in place,
ReduceScatter (one MPI_Reduce per rank and piece), AllGather in place (the
rank-block type), grouped send/recv. Needs about 12 GiB of memory in all.

Usage (under tests/mpi.py, 2 ranks): host_backend_large.py
"""
import numpy as np

from host_backend_lib import NULL, WORLD, Failures, check, lib, ptr, run, world_comm

COUNT = (1 << 30) + 3
RANK, N = WORLD.rank, WORLD.size
F = Failures()


def pattern(rank, count=COUNT, start=0):
    """Elements [start, start + count) of rank `rank`'s int8 input, which has
    period 251 so that a misplaced piece shows."""
    period = (np.arange(start, start + 251) % 251 % 7 - 3 + rank).astype(np.int8)
    return np.resize(np.tile(period, 4096), count)  # resize copies 1 MiB blocks: fast


def all_reduce(comm):
    buf = pattern(RANK)
    check(lib.ncclAllReduce(ptr(buf), ptr(buf), COUNT, lib.ncclInt8, lib.ncclSum, comm, NULL),
          "ncclAllReduce")
    expected = pattern(0)
    expected += pattern(1)
    F.expect(np.array_equal(buf, expected), "large in-place allreduce")


def reduce_scatter(comm):
    send = pattern(RANK, 2 * COUNT)
    recv = np.zeros(COUNT, np.int8)
    check(lib.ncclReduceScatter(ptr(send), ptr(recv), COUNT, lib.ncclInt8, lib.ncclMax, comm,
                                NULL), "ncclReduceScatter")
    del send
    expected = np.maximum(pattern(0, start=RANK * COUNT), pattern(1, start=RANK * COUNT))
    F.expect(np.array_equal(recv, expected), "large reduce-scatter")


def all_gather(comm):
    buf = np.zeros(N * COUNT, np.int8)
    buf[RANK * COUNT:(RANK + 1) * COUNT] = pattern(RANK)
    check(lib.ncclAllGather(ptr(buf, RANK * COUNT), ptr(buf), COUNT, lib.ncclInt8, comm, NULL),
          "ncclAllGather")
    for r in range(N):
        F.expect(np.array_equal(buf[r * COUNT:(r + 1) * COUNT], pattern(r)),
                 f"large in-place allgather: block of rank {r}")


def send_recv(comm):
    peer = 1 - RANK
    send, recv = pattern(RANK), np.zeros(COUNT, np.int8)
    check(lib.ncclGroupStart())
    check(lib.ncclRecv(ptr(recv), COUNT, lib.ncclInt8, peer, comm, NULL))
    check(lib.ncclSend(ptr(send), COUNT, lib.ncclInt8, peer, comm, NULL))
    check(lib.ncclGroupEnd(), "ncclGroupEnd")
    del send
    F.expect(np.array_equal(recv, pattern(peer)), "large send/recv")


def main():
    assert N == 2, "run with 2 ranks"
    comm = world_comm()
    for case in (all_reduce, reduce_scatter, all_gather, send_recv):
        case(comm)
    check(lib.ncclCommDestroy(comm))
    return F.report()


if __name__ == "__main__":
    run(main)
