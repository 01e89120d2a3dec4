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


@pytest.mark.parametrize("policy", [
    {},  # default: allreduce only, reduce-scatters byte-identical to the real NCCL's
    {"QNCCL_COLLECTIVES": "allreduce,reducescatter", "QNCCL_REDUCESCATTER_BITS": "3"},
    {"QNCCL_COLLECTIVES": "reducescatter"},  # allreduces exact, reduce-scatters at QNCCL_BITS
], ids=["default", "both-rs3", "reducescatter-only"])
def test_interposed_reduce_scatter_follows_the_policy(policy):
    """A plain NCCL program's ncclReduceScatter and ncclAllReduce through libqnccl: the
    collectives QNCCL_COLLECTIVES names are bit for bit the emulator (with their own bits),
    alone, inside a group with allreduces and on two communicators at once; the others, and
    calls below QNCCL_MIN_BYTES, are byte-identical to the real NCCL's."""
    mpi.run_checks(3, PROGRAM, "interposed", timeout=150, env=policy)


def test_rejected_reduce_scatters_name_the_argument():
    """algo tree and hier, op ncclMax, errorFeedback 1 and buffers that overlap without
    being in place fail with ncclInvalidArgument and a message saying what is allowed;
    none counts as a call."""
    run_check(3, "misuse")
