"""qncclReduceScatter, qncclAllGather and qncclAlltoAll on real MPI ranks (QNCCL's host
backend) against docs/collectives.md: bit for bit qnccl.emulate's reduce_scatter,
allgather and alltoall on every rank, sharing the call counter with allreduce; the
interposed entry points under each policy; the messages of rejected configurations. Each
test is one MPI job of mpi_programs/collectives_check.py, which prints a line per
failure."""
from pathlib import Path

import pytest

import mpi
from test_allreduce import built  # noqa: F401  (fails the module without a build)

PROGRAM = Path(__file__).resolve().parent / "mpi_programs" / "collectives_check.py"


def run_check(nprocs, *args, timeout=150, env=None):
    """The interposed calls' bytes are those of auto's fixed rules (QNCCL_ALGO=rule): which
    calls measured auto quantizes is tests/test_tuning.py's."""
    return mpi.run_checks(nprocs, PROGRAM, *args, timeout=timeout,
                          env={"QNCCL_ALGO": "rule", **(env or {})})


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
def test_reduce_scatter_matches_the_emulator(nprocs):
    """ring/SRA/auto x float32/float16/bfloat16 x recvcounts 0, 1, 300, 7919, 1000 in
    buckets of 1 and 5003 in segments of 960, both roundings, sum and avg, in place and
    not, bits 1..8, 1 or 2 lanes, NaN/Inf inputs, with allreduce calls in between: 64
    calls in one job."""
    run_check(nprocs, "reducescatter")


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("kind", ["allgather", "alltoall"])
def test_allgather_and_alltoall_match_the_emulator(kind, nprocs):
    """float32/float16/bfloat16 x sendcounts 0, 1, 300, 7919, 1000 in buckets of 1 and 5003
    in segments of 960, both roundings, in place and not, bits 1..8, 1 or 2 lanes, NaN/Inf
    inputs, with reduce-scatters and allreduces in between; every allgather output the
    same bytes on every rank."""
    run_check(nprocs, kind)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 8])
def test_rotated_collectives_match_the_emulator(nprocs):
    """docs/rotation.md: reduce-scatter (ring, SRA), allgather and all-to-all interleaved, each
    over the shapes and settings above with rotation blocks 2..4096 (tails that are not a
    whole block, counts 0 and 1, several segments on 1 or 2 lanes, NaN/Inf inputs): bit for
    bit the emulator's rotation="hadamard", the all-to-all's own chunk exact."""
    run_check(nprocs, "rotated")


@pytest.mark.parametrize("nprocs", [1, 2, 5])
def test_steps_and_groups_per_call(nprocs):
    """One segment: reduce-scatter SRA 3 compute steps (encode of the N-1 pieces,
    reduction, store) and ring 2(N-1) + 1, avg one more; allgather 2 (encode, decodes);
    all-to-all 3 (encodes, copy of its own chunk, decodes), 2 in place; a rotated call three
    more (the signs' table, its pieces rotated in and back out; an all-to-all alone rotates
    nothing); N - 1
    real NCCL groups each, on every rank."""
    run_check(nprocs, "counts")


@pytest.mark.parametrize("policy", [
    {},  # default: allreduce only, the others byte-identical to the real NCCL's
    {"QNCCL_COLLECTIVES": "allreduce,reducescatter", "QNCCL_REDUCESCATTER_BITS": "3"},
    {"QNCCL_COLLECTIVES": "reducescatter"},  # allreduces exact, reduce-scatters at QNCCL_BITS
    {"QNCCL_COLLECTIVES": "reducescatter,allgather,alltoall", "QNCCL_ALLGATHER_BITS": "8",
     "QNCCL_ALLTOALL_BITS": "3"},
    {"QNCCL_COLLECTIVES": "none"},
    {"QNCCL_COLLECTIVES": "allreduce,reducescatter,allgather,alltoall",
     "QNCCL_ROTATION": "hadamard", "QNCCL_ROTATION_BLOCK": "64"},
    {"QNCCL_COLLECTIVES": "allreduce,reducescatter,allgather,alltoall", "QNCCL_BITS": "2",
     "QNCCL_ROTATION": "hadamard", "QNCCL_CLIP": "gaussian"},
], ids=["default", "both-rs3", "reducescatter-only", "fsdp-ag8-a2a3", "none", "rotated",
        "rotated-clipped"])
def test_interposed_collectives_follow_the_policy(policy):
    """A plain NCCL program's ncclReduceScatter, ncclAllGather, ncclAlltoAll and
    ncclAllReduce through libqnccl: the collectives QNCCL_COLLECTIVES names are bit for bit
    the emulator (with their own bits), alone, and inside a group of all four kinds on two
    communicators at once; the others, and calls below QNCCL_MIN_BYTES, are byte-identical
    to the real NCCL's."""
    run_check(3, "interposed", env=policy)


def test_rejected_collectives_name_the_argument():
    """reduce-scatter: algo tree and hier, op ncclMax; allgather and all-to-all: an algo
    other than auto; all: errorFeedback 1 and buffers that overlap without being in place:
    ncclInvalidArgument and a message saying what is allowed; none counts as a call."""
    run_check(3, "misuse")


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 8])
def test_quantized_sends_and_receives_match_the_emulator(nprocs):
    """QNCCL_COLLECTIVES=sendrecv: PyTorch's all-to-all (a group of ncclSend/ncclRecv with
    every rank, itself included) is bit for bit emulate.alltoall(call=P2P_CALL | c); two
    sends to one peer in a group with an allreduce, and lone sends between pairs of ranks,
    are emulate.sendrecv; calls below QNCCL_MIN_BYTES and to itself stay exact."""
    run_check(nprocs, "sendrecv", env={"QNCCL_COLLECTIVES": "sendrecv,allreduce"})


@pytest.mark.parametrize("nprocs", [2, 3, 8])
def test_rotated_sends_and_receives_match_the_emulator(nprocs):
    """The same under QNCCL_ROTATION=hadamard (blocks of 64): each message's segments rotated
    by the sender, rotated back by the receiver (docs/rotation.md), bit for bit the
    emulator's rotation="hadamard"."""
    run_check(nprocs, "sendrecv", env={"QNCCL_COLLECTIVES": "sendrecv,allreduce",
                                       "QNCCL_ROTATION": "hadamard", "QNCCL_ROTATION_BLOCK": "64"})


def test_clipped_sends_and_receives_match_the_emulator():
    """Under QNCCL_CLIP=gaussian too (docs/rotation.md, "Clipped ranges"), at 2 bits."""
    run_check(3, "sendrecv", env={"QNCCL_COLLECTIVES": "sendrecv,allreduce", "QNCCL_BITS": "2",
                                  "QNCCL_ROTATION": "hadamard", "QNCCL_CLIP": "gaussian"})


def test_sends_and_receives_outside_the_policy_are_exact():
    """Without sendrecv in QNCCL_COLLECTIVES every ncclSend/ncclRecv is byte-identical to
    the real NCCL's."""
    run_check(3, "sendrecv")


@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_communicator_has_its_own_policy(nprocs):
    """Under QNCCL_COLLECTIVES=none: qnccl.comm.set_quantization quantizes one
    communicator's reduce-scatters (at its bits) while another's stay exact; a
    qnccl.comm.quantization block sets an all-to-all's bits for the calls inside it only
    (4 forward, 2 backward); 0 means exact and None the environment again; bad arguments
    fail naming what is allowed."""
    run_check(nprocs, "policy", env={"QNCCL_COLLECTIVES": "none"})
