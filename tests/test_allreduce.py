"""qncclAllReduce on real MPI ranks (QNCCL's host backend) against
docs/allreduce.md: every rank byte-identical, bit for bit the emulator,
within the error bound, the error ordering of the algorithms, and the
messages of rejected configurations. Each test is one MPI job of
mpi_programs/allreduce_check.py, which prints a line per failure."""
import subprocess
from pathlib import Path

import pytest

import mpi
from mpi import HOST_NCCL, LIBQNCCL, REPO

PROGRAM = Path(__file__).resolve().parent / "mpi_programs" / "allreduce_check.py"


def _missing_build():
    if not LIBQNCCL.is_file() or not HOST_NCCL.is_file():
        return f"{LIBQNCCL} or {HOST_NCCL} is missing"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(LIBQNCCL), str(HOST_NCCL)],
                             capture_output=True, text=True).stdout
    for needed in ("qncclAllReduce", "ncclCommInitRank", "ncclSend"):
        if f" {needed}\n" not in symbols:
            return f"the build has no {needed}"
    return None


@pytest.fixture(scope="module", autouse=True)
def built():
    missing = _missing_build()
    if missing:
        pytest.fail(f"{missing}: run `make` in {REPO}")


def run_check(nprocs, *args, timeout=120):
    return mpi.run_checks(nprocs, PROGRAM, *args, timeout=timeout)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_allreduce_matches_the_emulator(nprocs):
    """ring/tree/sra/auto x float32/float16/bfloat16 x counts 0, 1, 300, 7919,
    300007 and 5003 in 6 segments, both roundings, sum and avg, in place and
    not, bits 1..8, then NaN/Inf inputs, then the tree in four pieces: 88 calls
    in one job."""
    run_check(nprocs, "matrix", timeout=150)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_rotated_allreduce_matches_the_emulator(nprocs):
    """docs/rotation.md: ring/tree/sra/auto x float32/float16/bfloat16 x counts 0, 1, 300,
    7919, 70001, 5003 in 6 segments and 2049 in 3, with blocks 2..4096 (tails that are not a
    whole block), both roundings, sum and avg, in place and not, bits 1..8, on 1..3 lanes;
    then NaN/Inf inputs: every rank byte-identical and bit for bit the emulator, within its
    error bound."""
    run_check(nprocs, "rotated", timeout=150)


def test_error_ordering_ring_tree_sra_on_8_ranks():
    """seeds/000: the more quantizations a value's path compounds, the larger
    the error; at 4 bits on 8 ranks ring > tree > SRA, nearest and stochastic."""
    out = run_check(8, "ordering")
    print("\n".join(line for line in out.splitlines() if line.startswith("error")))


def test_rejected_configurations_name_the_argument():
    """bits 0 and 9, bucketSize 0, an unknown algo, op ncclMax and datatype
    ncclInt32 fail with ncclInvalidArgument naming the argument and the
    allowed values, and do not count as calls of the random streams."""
    run_check(2, "misuse")


def test_each_communicator_counts_its_own_calls():
    """`call` of the random streams counts the communicator's calls from 0:
    two communicators alive at once count separately, and one made after
    another was destroyed starts at 0 again (its handle may be the old one's)."""
    run_check(3, "calls")


@pytest.mark.parametrize("nprocs", [3, 8])
def test_steps_and_groups_per_call(nprocs):
    """qncclCommGetStats' computeSteps and groups of one call of one segment,
    on every rank, equal docs/allreduce.md's "Steps per call" for ring, tree
    and SRA x sum/avg (8 ranks: the issue's figures; 3: a tree whose root has
    one leaf child and one missing)."""
    run_check(nprocs, "counts")


def test_lanes_run_on_threads_kept_across_calls():
    """Calls of two pipeline lanes on host buffers reuse their lane threads
    (mpi_programs/device_path_check.py, section threads; on device buffers in
    test_simdev_engine.py)."""
    mpi.run_checks(2, PROGRAM.parent / "device_path_check.py", "threads", timeout=120)
