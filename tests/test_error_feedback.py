"""Error feedback in libqnccl.so (docs/allreduce.md, "Error feedback"): on real MPI ranks
of QNCCL's host backend, the library's outputs and residuals are bit for bit the
emulator's call after call, each result is the owner's full sum less what the ranks' sends
left in their residuals, to within one quantization of that sum (and not without feedback), QNCCL_ERROR_FEEDBACK and quantized ops turn it on, statistics count the
residuals and resets free them. Each MPI test is one job of
mpi_programs/error_feedback_check.py, which prints a line per failure."""
import re
from pathlib import Path

import numpy as np
import pytest

import mpi
from conftest import assert_python_message

PROGRAM = Path(__file__).resolve().parent / "mpi_programs" / "error_feedback_check.py"


def run_check(nprocs, program, env=None, timeout=180):
    return mpi.run_checks(nprocs, PROGRAM, program, timeout=timeout, env=env)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5])
def test_library_matches_the_emulator_call_after_call(nprocs):
    """ring/tree/SRA x float32/float16/bfloat16, sum/avg, both roundings, 2 and 3 bits,
    buffers in segments, in place and not, NaN/Inf in one call: 4 calls per buffer, each
    rank's output and residual checked against qnccl.emulate.allreduce(residuals=)."""
    run_check(nprocs, "emulator")


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 8])
def test_rotated_calls_keep_residuals_in_the_rotated_domain(nprocs):
    """The same cases with a Hadamard rotation in blocks of 256, 64 and 8 (docs/rotation.md):
    each rank's output and its residuals, which live in the rotated domain, bit for bit
    qnccl.emulate.allreduce(rotation="hadamard", residuals=) call after call."""
    run_check(nprocs, "rotated")


@pytest.mark.parametrize("nprocs", [1, 4])
def test_bookkeeping_over_40_calls(nprocs):
    """After each call, result (avg: times N) = sum_r z_r - sum_r e_r,new to within one
    quantization of that sum and the float32 rounding, both computed from the data, and
    every value's owner holds a zero residual; without feedback the check fails."""
    out = run_check(nprocs, "bookkeeping")
    print("\n".join(line for line in out.splitlines() if line.startswith("bookkeeping")))


@pytest.mark.parametrize("nprocs", [3, 4])
def test_switching_algorithms_on_one_buffer(nprocs):
    """ring, SRA and tree in turn on one buffer with error feedback, as auto's measurements
    run them: every call rewrites every residual (an owner's to 0), so outputs and residuals
    stay the emulator's call after call (checked to fail when the owner's residual is left
    as it was)."""
    run_check(nprocs, "switching")


def test_environment_quantized_ops_statistics_and_reset():
    """QNCCL_ERROR_FEEDBACK=1 on the interposed ncclAllReduce; a quantized op's own
    errorFeedback; qncclCommGetStats' residual figures; both resets; bad requests."""
    run_check(3, "interposer", env={"QNCCL_ERROR_FEEDBACK": "1", "QNCCL_BITS": "3",
                                    "QNCCL_ALGO": "ring", "QNCCL_SEED": "5"})


@pytest.mark.parametrize("nprocs, warnings", [(4, 0), (8, 8)])
def test_ring_at_two_bits_warns_from_8_ranks(nprocs, warnings):
    """Residuals of a 2-bit ring grow without bound from 8 ranks on (docs/allreduce.md): each
    rank warns once per communicator, and not for 3 bits or SRA."""
    out = run_check(nprocs, "ring_warning")
    lines = re.findall(r"QNCCL WARN .*error feedback on the ring algorithm at 2 bits over "
                       rf"{nprocs} ranks", out)
    assert len(lines) == warnings, out[-4000:]


@pytest.mark.parametrize("nprocs", [1, 3])
def test_call_counts_continue_the_random_streams(nprocs):
    """qncclCommGetCallCounts / SetCallCounts: the next calls take the numbers set, on the
    communicator and on a new one (what a job restored from a checkpoint does)."""
    run_check(nprocs, "call_counts")


# ---- single-process checks of the C API --------------------------------------------------

def config(capi, algo, error_feedback):
    ffi, lib = capi
    c = ffi.new("qncclAllReduceConfig_t*")
    c.codec.bits, c.codec.bucketSize, c.codec.rounding = 4, 128, lib.qncclRoundStochastic
    c.algo = {"ring": lib.qncclAlgoRing, "tree": lib.qncclAlgoTree, "sra": lib.qncclAlgoSra}[algo]
    c.errorFeedback = error_feedback
    return c


@pytest.mark.parametrize("algo, nranks", [("ring", 4), ("sra", 4), ("tree", 4), ("ring", 1)])
def test_workspace_grows_by_one_float32_chunk(capi, algo, nranks):
    """Ring and SRA stage z = x + e of one input chunk before encoding it (tree encodes
    only sums): the workspace grows by that chunk, at most a segment / N of float32."""
    from qnccl import _lib
    ffi, lib = capi
    count = 1 << 20
    sizes = []
    for feedback in (0, 1):
        size = ffi.new("size_t*")
        _lib.check(lib.qncclAllReduceWorkspaceSize(count, lib.ncclFloat32,
                                                   config(capi, algo, feedback), nranks, size))
        sizes.append(size[0])
    buckets = count // 128
    chunk = min(count, (buckets // nranks + 1) * 128)
    grown = sizes[1] - sizes[0]
    if algo == "tree":
        assert grown == 0
    else:
        assert 4 * chunk <= grown < 4 * chunk + 256, (sizes, chunk)  # the wire area re-aligns


def test_bad_error_feedback_values_are_refused(capi):
    from qnccl import QncclError, _lib
    ffi, lib = capi
    size = ffi.new("size_t*")
    for value in (2, -1):
        with pytest.raises(QncclError, match=rf"errorFeedback = {value}; allowed: 0 \(off\) or "
                                             r"1 \(on\)"):
            _lib.check(lib.qncclAllReduceWorkspaceSize(100, lib.ncclFloat32,
                                                       config(capi, "ring", value), 2, size))


def test_resets_and_lookups_check_their_arguments(capi):
    """NULL communicators and outputs fail with a message, not a crash; the process-wide
    reset works with no communicator at all."""
    import qnccl.comm
    from qnccl import QncclError, _lib
    ffi, lib = capi
    with pytest.raises(QncclError, match="qncclCommResetErrorFeedback: comm is NULL"):
        _lib.check(lib.qncclCommResetErrorFeedback(ffi.NULL))
    with pytest.raises(QncclError, match="qncclCommGetResidual: comm is NULL"):
        _lib.check(lib.qncclCommGetResidual(ffi.NULL, ffi.NULL, 1, lib.ncclFloat32,
                                            ffi.new("float[1]")))
    qnccl.comm.reset_error_feedback()
    with pytest.raises(TypeError, match="comm must be an ncclComm_t"):
        qnccl.comm.stats("comm")
    with pytest.raises(ValueError, match="count and dtype are required"):
        qnccl.comm.residual(1, 12345)
    with pytest.raises(ValueError, match=re.escape("dtype must be one of float32, float16, "
                                                   "bfloat16, got 'int32'")):
        qnccl.comm.residual(1, np.zeros(3, np.int32))


COMM = "an ncclComm_t (cffi) or its address (an int in 1..2**64-1)"
ADDRESS = "a numpy array or an address (an int in 0..2**64-1, e.g. a torch tensor's data_ptr())"
BLOCK = "0 (the default, 256) or a power of two in 2..16384"
LANES = "0 (auto: 2 on device buffers, 1 on host buffers) or an integer in 1..8"
SEGMENT = "0 (the default, 2**22) or an integer in 1..2**64-1"
COUNT = "an integer in 0..2**60-1"
POLICY_BITS = "0 (exact), an integer in 1..8 (quantized) or None (the environment's policy)"


@pytest.mark.parametrize("kwargs, error, name, allowed, given", [
    ({"comm": 0}, ValueError, "comm", COMM, "0"),
    ({"comm": "comm"}, TypeError, "comm", COMM, "a str ('comm')"),
    ({"count": -1}, ValueError, "count", COUNT, "-1"),
    ({"count": 8.0}, TypeError, "count", COUNT, "a float (8.0)"),
    ({"dtype": "int8"}, ValueError, "dtype", "one of float32, float16, bfloat16", "'int8'"),
    ({"op": "max"}, ValueError, "op", "one of sum, avg", "'max'"),
    ({"algo": "butterfly"}, ValueError, "algo", "one of auto, ring, tree, sra, hier",
     "'butterfly'"),
    ({"error_feedback": 1}, TypeError, "error_feedback", "True or False", "an int (1)"),
    ({"bits": 9}, ValueError, "bits", "an integer in 1..8", "9"),
    ({"bits": "4"}, TypeError, "bits", "an integer in 1..8", "a str ('4')"),
    ({"bucket_size": 0}, ValueError, "bucket_size", "an integer in 1..2**64-1", "0"),
    ({"rounding": "up"}, ValueError, "rounding", "one of nearest, stochastic", "'up'"),
    ({"seed": -1}, ValueError, "seed", "an integer in 0..2**64-1", "-1"),
    ({"lanes": -1}, ValueError, "lanes", LANES, "-1"),
    ({"lanes": 9}, ValueError, "lanes", LANES, "9"),
    ({"segment_values": -1}, ValueError, "segment_values", SEGMENT, "-1"),
    ({"rotation": "walsh"}, ValueError, "rotation", "one of none, hadamard, prerotated",
     "'walsh'"),
    ({"rotation": "hadamard", "rotation_block": 3}, ValueError, "rotation_block", BLOCK, "3"),
    ({"rotation": "none", "clip": "gaussian"}, ValueError, "clip='gaussian' clips rotated "
     "buckets' ranges; it needs rotation='hadamard' or 'prerotated'", " (or clip='none')",
     "'gaussian'"),
    ({"sendbuff": [0.0] * 8}, TypeError, "sendbuff", ADDRESS, "a list"),
    ({"recvbuff": (0.0,) * 8}, TypeError, "recvbuff", ADDRESS, "a tuple"),
    ({"sendbuff": -8}, ValueError, "sendbuff", ADDRESS, "-8"),
    ({"stream": "default"}, TypeError, "stream", "a CUDA stream's address", "a str ('default')"),
])
def test_python_allreduce_names_what_is_wrong(kwargs, error, name, allowed, given):
    """qnccl.comm.allreduce refuses a bad argument itself, before the library sees it:
    the argument as the Python API spells it, what is allowed (range or names), what was
    given (its real type), and no C name (qncclAllReduce, bucketSize, size_t)."""
    import qnccl.comm
    x = np.zeros(8, np.float32)
    args = {"comm": 1, "sendbuff": x, "recvbuff": x, "count": 8, "dtype": "float32",
            "op": "avg", **kwargs}
    with pytest.raises(error) as caught:
        qnccl.comm.allreduce(args.pop("comm"), args.pop("sendbuff"), args.pop("recvbuff"),
                             args.pop("count"), args.pop("dtype"), args.pop("op"), **args)
    if name.startswith("clip="):  # a combination, not one argument's range
        assert str(caught.value) == f"{name}{allowed}" and given in str(caught.value)
    else:
        assert_python_message(caught.value, name, allowed, given)


@pytest.mark.parametrize("call, error, name, allowed, given", [
    (lambda comm: comm.call_counts(0), ValueError, "comm", COMM, "0"),
    (lambda comm: comm.set_call_counts(1, -1, 0), ValueError, "calls",
     "an integer in 0..2**64-1", "-1"),
    (lambda comm: comm.set_call_counts(1, 0, 2**64), ValueError, "p2p_calls",
     "an integer in 0..2**64-1", str(2**64)),
    (lambda comm: comm.set_quantization(1, "allreduce", 9), ValueError, "bits",
     POLICY_BITS, "9"),
    (lambda comm: comm.set_quantization(1, "allreduce", -1), ValueError, "bits",
     POLICY_BITS, "-1"),
    (lambda comm: comm.set_quantization(1, "allreduce", 4.0), TypeError, "bits",
     POLICY_BITS, "a float (4.0)"),
    (lambda comm: comm.set_quantization(1, 1, 4), TypeError, "collectives",
     "one or more of allreduce, reducescatter, allgather, alltoall, sendrecv", "an int (1)"),
    (lambda comm: comm.set_quantization(1, "allreduce,gather", 4), ValueError, "collectives",
     "one or more of allreduce, reducescatter, allgather, alltoall, sendrecv",
     "'allreduce,gather'"),
    (lambda comm: comm.get_quantization(1, "gather"), ValueError, "collective",
     "one of allreduce, reducescatter, allgather, alltoall, sendrecv", "'gather'"),
    (lambda comm: comm.quantization(1, "alltoall", 9).__enter__(), ValueError, "bits",
     POLICY_BITS, "9"),
    (lambda comm: comm.residual(1, [0.0] * 4, 4, "float32"), TypeError, "buffer", ADDRESS,
     "a list"),
    (lambda comm: comm.residual(1, 4096, -4, "float32"), ValueError, "count", COUNT, "-4"),
    (lambda comm: comm.residual(1, np.zeros(4, np.float64)), ValueError, "dtype",
     "one of float32, float16, bfloat16", "'float64'"),
    (lambda comm: comm.reset_error_feedback(1.5), TypeError, "comm", COMM, "a float (1.5)"),
])
def test_python_communicator_calls_name_what_is_wrong(call, error, name, allowed, given):
    """The rest of qnccl.comm likewise: a NULL communicator, call counters, a policy's bits
    and collectives, a residual's buffer, count and type are refused in Python's terms
    (the communicator address 1 is never reached)."""
    import qnccl.comm
    with pytest.raises(error) as caught:
        call(qnccl.comm)
    assert_python_message(caught.value, name, allowed, given)


def test_residuals_of_moving_buffers_stay_bounded():
    """3,000 calls on freshly allocated 256 KiB buffers (8 alive at a time): under
    QNCCL_ERROR_FEEDBACK_MAX_BYTES the least recently used residuals go, with one warning,
    and each rank's resident memory stays flat (docs/allreduce.md, "Error feedback")."""
    result = mpi.run_python(2, PROGRAM, "moving", timeout=300,
                            env={"QNCCL_ERROR_FEEDBACK_MAX_BYTES": "4M"})
    assert "SUMMARY moving" in result.stdout and " 0 failures" in result.stdout, \
        result.stdout[-4000:]
    assert result.stdout.count("QNCCL_ERROR_FEEDBACK_MAX_BYTES=4194304 bytes") == 2, \
        "want one warning per rank:\n" + result.stdout[-4000:]
    print("\n".join(line for line in result.stdout.splitlines() if line.startswith("moving:")))
