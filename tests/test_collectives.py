"""qncclReduceScatter on real MPI ranks (QNCCL's host backend) against
docs/collectives.md: bit for bit qnccl.emulate.reduce_scatter on every rank, sharing
the call counter with allreduce, and the messages of rejected configurations. Each
test is one MPI job of mpi_programs/collectives_check.py, which prints a line per
failure."""
from pathlib import Path

import pytest

import mpi
from test_allreduce import built  # noqa: F401  (fails the module without a build)

PROGRAM = Path(__file__).resolve().parent / "mpi_programs" / "collectives_check.py"


def run_check(nprocs, *args, timeout=150):
    return mpi.run_checks(nprocs, PROGRAM, *args, timeout=timeout)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_reduce_scatter_matches_the_emulator(nprocs):
    """ring/SRA/auto x float32/float16/bfloat16 x recvcounts 0, 1, 300, 7919, 1000 in
    buckets of 1 and 5003 in segments of 960, both roundings, sum and avg, in place and
    not, bits 1..8, 1 or 2 lanes, NaN/Inf inputs, with allreduce calls in between: 64
    calls in one job."""
    run_check(nprocs, "reducescatter")


@pytest.mark.parametrize("nprocs", [1, 2, 5])
def test_reduce_scatter_steps_and_groups_per_call(nprocs):
    """One segment: SRA 3 compute steps (encode of the N-1 pieces, reduction, store) and
    ring 2(N-1) + 1, avg one more, N - 1 real NCCL groups, on every rank."""
    run_check(nprocs, "counts")


def test_rejected_reduce_scatters_name_the_argument():
    """algo tree and hier, op ncclMax, errorFeedback 1 and buffers that overlap without
    being in place fail with ncclInvalidArgument and a message saying what is allowed;
    none counts as a call."""
    run_check(3, "misuse")
