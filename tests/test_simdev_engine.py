"""The engine's device path on the simulated GPU (docs/simulated-gpu.md), through real MPI
jobs: every rank's buffers are device memory (tests/buffers.py), its calls run the
library's kernels on its stream, and its communicators are the host backend's, which
stages device buffers through pinned memory in stream order. The check programs are the
host path's (mpi_programs/): every output bit for bit qnccl.emulate on every rank, as
there.

- qncclAllReduce: ring, tree, SRA and auto x float32/float16/bfloat16 x counts 0 to 786k,
  sum and avg, in and out of place, bits 1..8, 1 to 3 pipeline lanes, NaN/Inf (the matrix
  of test_allreduce.py) on 1, 2, 3, 4 and 8 ranks; the hierarchical algorithm on two
  emulated nodes; error feedback call after call;
- reduce-scatter, allgather and all-to-all, and quantized grouped sends and receives;
- rotated (docs/rotation.md): the allreduce, error feedback and the other collectives;
- the interposer: a plain NCCL program's collectives under a policy, PyTorch's
  ProcessGroupNCCL pattern (nonblocking communicators, watchdog, coalesced buckets,
  PreMulSum, abort), an FSDP step of a C program of the CUDA runtime API;
- CUDA graphs: a captured quantized call replayed with new inputs, each replay the
  emulator's next call, nothing allocated during the global-mode capture;
- measured auto (docs/tuning.md): trials timed by events, the agreement in device memory,
  no trial inside a capture."""
import re
import subprocess
import sys

import pytest

import mpi
import simulated
from test_fsdp_program import check_quantized_step, compile_program
from test_interposer import check_process_group

PROGRAMS = mpi.REPO / "tests" / "mpi_programs"
RANKS = [1, 2, 3, 4, 8]


def run_check(nprocs, program, *args, timeout=300, **env):
    # Interposed calls by auto's fixed rules: measured auto is tests/test_tuning.py's.
    return mpi.run_checks(nprocs, PROGRAMS / program, *args, timeout=timeout,
                          env=simulated.env(**{"QNCCL_ALGO": "rule", **env}))


@pytest.mark.parametrize("nprocs", RANKS)
def test_allreduce(nprocs):
    run_check(nprocs, "allreduce_check.py", "matrix")


def test_allreduce_eager_schedule():
    """The same matrix with every stream's work run as soon as it can (the lazy schedule's
    opposite): a result that depends on the schedule shows as a difference."""
    run_check(4, "allreduce_check.py", "matrix", SIMDEV_SCHEDULE="eager")


def test_hierarchical_on_two_emulated_nodes():
    run_check(4, "allreduce_check.py", "hier", "--ranks-per-node", "2")


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("kind", ["reducescatter", "allgather", "alltoall"])
def test_collectives(kind, nprocs):
    run_check(nprocs, "collectives_check.py", kind)


@pytest.mark.parametrize("nprocs", RANKS)
def test_grouped_sends_and_receives(nprocs):
    run_check(nprocs, "collectives_check.py", "sendrecv", QNCCL_COLLECTIVES="sendrecv,allreduce")


@pytest.mark.parametrize("nprocs", RANKS)
def test_error_feedback(nprocs):
    run_check(nprocs, "error_feedback_check.py", "emulator")


def test_error_feedback_switching_algorithms():
    """ring, SRA and tree in turn on one device buffer: the device's clear of an owner's
    residual (cudaMemsetAsync on the call's stream) is what keeps the emulator's residuals."""
    run_check(3, "error_feedback_check.py", "switching")


def test_call_counters_across_checkpoints():
    """qncclCommGetCallCounts/SetCallCounts read and set the device's counters."""
    run_check(3, "error_feedback_check.py", "call_counts")


def test_communicators_count_their_own_calls():
    run_check(3, "allreduce_check.py", "calls")


@pytest.mark.parametrize("nprocs", [1, 3, 4])
def test_rotated_allreduce(nprocs):
    """docs/rotation.md on the device: test_allreduce.py's rotated matrix (every algorithm
    and type, tails that are not a whole block, blocks of 2 to 16384: those past a warp's
    tile of 1024 take their stages across tiles), bit for bit the emulator."""
    run_check(nprocs, "allreduce_check.py", "rotated")


@pytest.mark.parametrize("nprocs", [2, 5])
def test_rotated_collectives(nprocs):
    run_check(nprocs, "collectives_check.py", "rotated")


def test_rotated_sends_and_receives():
    """Interposed under QNCCL_ROTATION=hadamard: sends rotated on the device, receives
    rotated back there."""
    run_check(3, "collectives_check.py", "sendrecv", QNCCL_COLLECTIVES="sendrecv,allreduce",
              QNCCL_ROTATION="hadamard", QNCCL_ROTATION_BLOCK="2048")


def test_rotated_error_feedback():
    """Residuals in the rotated domain, in device memory, call after call."""
    run_check(3, "error_feedback_check.py", "rotated")


@pytest.mark.parametrize("nprocs", [2, 4])
def test_graph_replays(nprocs):
    run_check(nprocs, "allreduce_check.py", "graphs")


@pytest.mark.parametrize("nprocs", [1, 3])
def test_memory_released_under_queued_calls(nprocs):
    run_check(nprocs, "allreduce_check.py", "released")


def test_memory_released_without_memory_pools():
    """A device without stream-ordered allocation: the workspace and residuals come from
    cudaMalloc, and cudaFree must wait for the calls queued before it."""
    run_check(3, "allreduce_check.py", "released", SIMDEV_MEMORY_POOLS="0")


def test_allreduce_without_memory_pools():
    run_check(2, "allreduce_check.py", "matrix", SIMDEV_MEMORY_POOLS="0")


def test_interposed_collectives_under_a_policy():
    run_check(3, "collectives_check.py", "interposed",
              QNCCL_COLLECTIVES="reducescatter,allgather,alltoall", QNCCL_ALLGATHER_BITS="8",
              QNCCL_ALLTOALL_BITS="3")


@pytest.mark.serial  # tuning_check's skewed timings (tests/test_tuning.py)
def test_measured_auto_on_device_buffers(tmp_path):
    """Measured auto with device buffers (mpi_programs/tuning_check.py): trials timed by CUDA
    events, read at the deciding call, the agreements in device memory, every rank deciding
    alike under skewed timings; QNCCL_TUNE_FILE's decisions; a call captured into a graph is
    no trial and runs the rule."""
    run_check(4, "tuning_check.py", timeout=300, TUNE_DIR=str(tmp_path))


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_process_group(tmp_path, nprocs):
    check_process_group(tmp_path, nprocs, simulated.env())


@pytest.fixture(scope="module")
def fsdp_program(tmp_path_factory):
    return compile_program(tmp_path_factory.mktemp("fsdp_device"), "-DFSDP_DEVICE",
                           *simulated.cuda_program_flags())


@pytest.mark.parametrize("nranks", [2, 4])
def test_fsdp_step_of_a_cuda_program(fsdp_program, tmp_path, nranks):
    check_quantized_step(fsdp_program, tmp_path, nranks, simulated.env())


@pytest.mark.parametrize("nprocs", [1, 2])
def test_perf_binary_on_device_memory(nprocs):
    """all_reduce_perf on device memory under `qnccl run` (ring, 4 bits), in and out of
    place, every checked call within its error bound: its inputs must reach the device
    before its calls, which run on a non-blocking stream. A cudaMemcpy from pageable memory
    may return before its bytes land (CUDA's API synchronization behaviour), and the
    simulated GPU lets them land late: on an H200 the first in-place call read stale bytes.
    One rank passes every call through (nothing crosses a link): exact, and checked alike.
    The plain NCCL's calls interleaved with QNCCL's (--interleave, as the GPU checklist times
    them) run on the same stream and buffers."""
    perf = simulated.SIMDEV / "bin" / "all_reduce_perf"
    if not perf.is_file():
        pytest.fail(f"{perf} is missing: build the simulated GPU with `make simdev`")
    argv = [sys.executable, "-m", "qnccl", "run", "--algo", "ring", "--bits", "4", "--debug",
            "INFO", "--", perf, "-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1",
            "--memory", "device", "--interleave", "2"]
    result = mpi.run(nprocs, argv, timeout=300, env=simulated.env())
    ran = r"compressed=[1-9]" if nprocs > 1 else r"compressed=0 passed_through=[1-9]"
    assert "# Check: OK" in result.stdout and re.search(ran, result.stdout), \
        result.stdout[-4000:]
    assert len(re.findall(r"^#  plain:  out-of-place .*  in-place ", result.stdout, re.M)) == 2, \
        result.stdout[-4000:]


# The device path's rules (mpi_programs/device_path_check.py): section -> (ranks, settings).
DEVICE_PATH = {
    "codec": (1, {"SIMDEV_DEVICES": "2"}),
    "context": (2, {"SIMDEV_DEVICES": "2", "QNCCL_TEST_DEVICE": "1"}),
    "legacy": (2, {}),
    "histories": (3, {}),
    "streams": (2, {}),
    "retired": (2, {}),
    "layout": (4, {}),
    "kernels": (1, {"SIMDEV_DEVICES": "2"}),
    "threads": (2, {}),
    "launches": (3, {}),
    "ops": (2, {}),
}


@pytest.mark.parametrize("section", DEVICE_PATH)
def test_device_path(section):
    """Each rule of the device path that a GPU cluster would break on (the program's
    docstring): the buffer's device, the caller's context, the legacy stream beside a
    capture, decisions independent of a rank's history, no NCCL init inside a capture,
    kernels loaded before any call, quantized ops passed through on bfloat16."""
    nprocs, settings = DEVICE_PATH[section]
    mpi.run_checks(nprocs, PROGRAMS / "device_path_check.py", section, timeout=300,
                   env=simulated.env(**settings))
