"""Shared by the host backend's MPI test programs: the NCCL API of
build/host/libnccl.so.2 through cffi, numpy types per NCCL type, and a
collector of failures that rank 0 reports for the whole job.

Import after `from mpi4py import MPI` (which initializes MPI) in programs that
tests/test_host_backend.py launches through tests/mpi.py.
"""
import sys
import traceback
from pathlib import Path

import cffi
import ml_dtypes
import numpy as np
from mpi4py import MPI

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # conftest's helpers

from mpi import BUILD  # noqa: E402  (the build under test)

ffi = cffi.FFI()
ffi.cdef((BUILD / "include" / "qnccl_cdef.h").read_text())
lib = ffi.dlopen(str(BUILD / "host" / "libnccl.so.2"))

WORLD = MPI.COMM_WORLD
NULL = ffi.NULL

# NCCL type name -> (enum value, numpy dtype)
TYPES = {
    "int8": (lib.ncclInt8, np.int8), "uint8": (lib.ncclUint8, np.uint8),
    "int32": (lib.ncclInt32, np.int32), "uint32": (lib.ncclUint32, np.uint32),
    "int64": (lib.ncclInt64, np.int64), "uint64": (lib.ncclUint64, np.uint64),
    "float16": (lib.ncclFloat16, np.float16), "float32": (lib.ncclFloat32, np.float32),
    "float64": (lib.ncclFloat64, np.float64), "bfloat16": (lib.ncclBfloat16, ml_dtypes.bfloat16),
}
OPS = {"sum": lib.ncclSum, "prod": lib.ncclProd, "max": lib.ncclMax, "min": lib.ncclMin,
       "avg": lib.ncclAvg}


class NcclError(RuntimeError):
    def __init__(self, code, call):
        self.code = code
        self.message = ffi.string(lib.ncclGetLastError(NULL)).decode()
        super().__init__(f"{call}: {result_name(code)}: {self.message}")


def result_name(code):
    return ffi.string(ffi.cast("ncclResult_t", code))


def check(code, call="call"):
    if code != lib.ncclSuccess:
        raise NcclError(code, call)


def ptr(array, offset_elements=0):
    """char* to element `offset_elements` of a numpy array."""
    return ffi.cast("char*", ffi.from_buffer(array)) + offset_elements * array.itemsize


def new_id(root_world_rank, members, tag=77):
    """An id made by `root_world_rank` and sent to the other world ranks in `members`."""
    me = WORLD.rank
    if me == root_world_rank:
        uid = ffi.new("ncclUniqueId*")
        check(lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
        raw = bytes(ffi.buffer(uid))
        for peer in members:
            if peer != me:
                WORLD.send(raw, dest=peer, tag=tag)
    else:
        raw = WORLD.recv(source=root_world_rank, tag=tag)
    uid = ffi.new("ncclUniqueId*")
    ffi.memmove(uid, raw, len(raw))
    return uid


def init_rank(nranks, uid, rank):
    """(code, comm) of ncclCommInitRank."""
    comm = ffi.new("ncclComm_t*")
    code = lib.ncclCommInitRank(comm, nranks, uid[0], rank)
    return code, comm[0]


def world_comm():
    """A communicator of every world rank, NCCL rank == world rank."""
    uid = new_id(0, range(WORLD.size))
    code, comm = init_rank(WORLD.size, uid, WORLD.rank)
    check(code, "ncclCommInitRank")
    return comm


class Failures:
    """Collects this rank's failures; report() prints the job's and sets the exit code."""

    def __init__(self):
        self.items = []
        self.checks = 0

    def expect(self, condition, what):
        self.checks += 1
        if not condition:
            self.items.append(f"rank {WORLD.rank}: {what}")
        return condition

    def report(self):
        """Prints the job's failures on rank 0; returns the exit status for every rank."""
        everything = WORLD.gather(self.items, root=0)
        checks = WORLD.reduce(self.checks, root=0)
        status = 0
        if WORLD.rank == 0:
            failures = [item for items in everything for item in items]
            print(f"{checks} checks on {WORLD.size} ranks, {len(failures)} failed")
            for item in failures[:200]:
                print("FAIL", item)
            status = 1 if failures else 0
        return WORLD.bcast(status, root=0)


def run(main):
    """Exits with main()'s status. An exception aborts the whole job at once:
    a rank that merely exited would leave the others waiting for it."""
    try:
        status = main()
    except BaseException:  # noqa: B036 -- any failure, SystemExit included
        traceback.print_exc()
        sys.stderr.flush()
        WORLD.Abort(1)
    sys.exit(status)
