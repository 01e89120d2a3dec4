"""The host backend (build/host/libnccl.so.2, docs/host-backend.md): the NCCL
API for host memory over MPI. Each test is one MPI job of a program in
mpi_programs/ that checks a whole matrix and prints every failure; rank 0's
summary line says how many checks ran and failed."""
import re
from pathlib import Path

import pytest

import mpi
from mpi import BUILD, HOST_NCCL, REPO

PROGRAMS = Path(__file__).resolve().parent / "mpi_programs"
CDEF = BUILD / "include" / "qnccl_cdef.h"


@pytest.fixture(scope="module", autouse=True)
def built():
    for path in (HOST_NCCL, CDEF):
        if not path.is_file():
            pytest.fail(f"{path} is missing: run `make` in {REPO}")


def run_program(nprocs, name, timeout, env=None):
    result = mpi.run_python(nprocs, PROGRAMS / name, timeout=timeout, env=env)
    summary = [line for line in result.stdout.splitlines() if " checks on " in line]
    assert summary and summary[-1].endswith(" 0 failed"), result.stdout[-6000:]
    print(summary[-1])


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 8])
def test_api_matches_numpy(nprocs):
    """AllReduce, Reduce, ReduceScatter x 10 types x sum/prod/max/min/avg/
    PreMulSum, AllGather, Broadcast, Bcast, AlltoAll x 10 types; in and out of
    place; counts 0, 1, 13, 3000: bit-exact against numpy. Then grouped
    send/recv in both orders, ordering per peer, self-send, nested groups,
    collectives inside a group, lone send/recv, ncclCommSplit with
    NCCL_SPLIT_NOCOLOR, communicators of world subsets (two at once, NCCL
    ranks in reverse world order) while other ranks do nothing,
    ncclCommInitAll of one rank,
    the query functions and ncclGetVersion."""
    run_program(nprocs, "host_backend_api.py", timeout=120)


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_nonblocking_protocol(nprocs):
    """Nonblocking communicators as NCCL specifies them: creation, ungrouped and
    grouped operations and finalize answer ncclInProgress, a split ncclSuccess (the
    child appears once the parent is ready, as NCCL 2.28 does); all complete in the
    background, seen through ncclCommGetAsyncError; calls before readiness and groups
    mixing modes are refused; NCCL_COMM_BLOCKING=0 sets the default; results match numpy
    (mpi_programs/host_backend_nonblocking.py, section protocol)."""
    result = mpi.run_python(nprocs, PROGRAMS / "host_backend_nonblocking.py", "protocol",
                            timeout=60)
    assert result.stdout.rstrip().endswith(" 0 failed"), result.stdout[-6000:]
    answers = [line for line in result.stdout.splitlines() if "ncclInProgress answers" in line]
    assert answers and int(answers[0].split()[-1]) >= 8 * nprocs, result.stdout[-3000:]


@pytest.mark.parametrize("section", ["abort", "revoke", "held", "watchdog"])
def test_calls_from_another_thread(section):
    """ncclCommAbort from a second thread ends a blocking wait on the
    communicator within seconds and returns at once with a nonblocking
    operation in flight; ncclCommRevoke ends them the same way without freeing
    anything; an abort under another thread's open group warns on stderr
    (NVIDIA's NCCL frees the communicator under it; the backend stays safe); a
    watchdog thread polls ncclCommGetAsyncError while collectives run
    (QNCCL_HOST_INIT_TIMEOUT=60: none of this may rely on the timeout)."""
    result = mpi.run_python(4, PROGRAMS / "host_backend_nonblocking.py", section, timeout=60,
                            env={"QNCCL_HOST_INIT_TIMEOUT": "60"})
    # (mpirun passes stderr on after stdout: the warnings come after the summary)
    assert re.search(r"^\d+ checks on 4 ranks, 0 failed$", result.stdout, re.M), \
        result.stdout[-6000:]
    warned = re.findall(r"^QNCCL WARN host backend: (ncclComm\w+)\(0x[0-9a-f]+\) while a group "
                        r"holds operations on it", result.stdout, re.M)
    # A blocking receive outside a group is a group of its own: aborting it warns too.
    expected = {"abort": ["ncclCommAbort"], "held": ["ncclCommAbort"]}.get(section, [])
    assert warned == expected, result.stdout[-6000:]


@pytest.mark.serial  # late ranks and give-up times, in seconds
def test_misuse_fails_fast_with_a_message():
    """Rendezvous: nranks mismatch, duplicate rank, rank out of range, a rank
    that never arrives, an absent root, a root so late that a member gave up
    (QNCCL_HOST_INIT_TIMEOUT=2), a foreign id, a malformed timeout setting, a
    config without NCCL_API_MAGIC, ncclCommInitAll(2); calls: bad peer/root, NULL
    buffers, unknown type/op, fp8, oversized count, PreMulSum misuse, a group
    with an invalid call, ncclGroupEnd without start, an invalid split color;
    point-to-point whose peer never posts (send and receive) times out and
    leaves the communicator unusable; finalized and destroyed communicators.
    Each must return its NCCL code and message within its bound."""
    run_program(4, "host_backend_misuse.py", timeout=90, env={"QNCCL_HOST_INIT_TIMEOUT": "2"})


def available_memory_gib():
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


@pytest.mark.slow
@pytest.mark.skipif(available_memory_gib() < 14, reason="needs 14 GiB of free memory")
def test_transfers_longer_than_one_mpi_message():
    """int8 buffers of 2^30 + 3 elements (over the 1 GiB message limit):
    AllReduce in place, ReduceScatter, AllGather in place, send/recv."""
    run_program(2, "host_backend_large.py", timeout=150)
