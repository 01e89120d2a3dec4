"""Shared fixtures and helpers of the test suite.

Test data of the three codec types is built here without the emulator's
conversions (numpy's own float16, and bfloat16 as the top half of float32
bits), so a conversion bug in the emulator cannot hide in the data.
"""
import ctypes
import re
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# Property tests run the same examples on every machine and every run.
settings.register_profile("qnccl", derandomize=True, deadline=None, database=None,
                          print_blob=True)
settings.load_profile("qnccl")

DTYPES = ("float32", "float16", "bfloat16")
F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = 2.0**-149  # smallest float32 subnormal


def cuda_device_count():
    """CUDA devices visible through the driver API; 0 without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


# `make test` runs a file per worker, two at a time, in the collected order (--dist loadfile
# --no-loadscope-reorder). These files take minutes each (MPI jobs on the simulated GPU,
# training runs, wheel builds, long transfers), longest first: started first, they cannot
# leave one worker running alone after the other has run out of files.
LONGEST_FILES = ("test_simdev_engine.py", "test_accuracy_bench.py", "test_package.py",
                 "test_collectives.py", "test_host_backend.py", "test_allreduce.py",
                 "test_torch_perf.py", "test_codec.py", "test_bench.py", "test_perf.py")


def pytest_collection_modifyitems(config, items):
    # a stable sort: each file's tests stay together and in their order (a run that sends
    # tests, not files, to its workers, as make sanitize's do, keeps the order it was given)
    if config.getoption("dist", "no") == "loadfile":
        items.sort(key=lambda item: (LONGEST_FILES.index(item.path.name)
                                     if item.path.name in LONGEST_FILES else len(LONGEST_FILES)))
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


GPU_BINARY_SKIPPED = 77  # exit status of the tests/gpu binaries without a CUDA device
GPU_BINARY_TIMEOUT_S = 540  # below pytest-timeout's 600 s, so a hang reports its output


def run_gpu_binary(binary, *args, env=None):
    """Runs a tests/gpu binary (built by `make` with the CUDA kernels): skips when
    it is not built or finds no device, fails on a timeout; returns the
    CompletedProcess of a run that did its checks (any exit status)."""
    binary = Path(binary)
    if not binary.exists():
        pytest.skip(f"{binary} is not built: the library was built without CUDA")
    try:
        run = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                             timeout=GPU_BINARY_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace")
        pytest.fail(f"{binary.name} ran past {GPU_BINARY_TIMEOUT_S} s; its output so far:\n"
                    f"{output}")
    if run.returncode == GPU_BINARY_SKIPPED:
        pytest.skip(f"{binary.name}: {(run.stdout + run.stderr).strip()}")
    return run


def nccl_config(ffi, blocking=None):
    """An ncclConfig_t as NCCL_CONFIG_INITIALIZER makes it (NCCL 2.32.3): every
    int field NCCL_CONFIG_UNDEF_INT, then `blocking` when given."""
    config = ffi.new("ncclConfig_t*")
    for name, field in ffi.typeof("ncclConfig_t").fields:
        if field.type.cname == "int":
            setattr(config, name, -2**31)
    config.size, config.magic, config.version = ffi.sizeof("ncclConfig_t"), 0xCAFEBEEF, 23203
    if blocking is not None:
        config.blocking = blocking
    return config


# What a Python message must not say: a C function, a C field or a C type (qnccl.h's
# spellings), where the Python API has names of its own. (ncclComm_t is the cffi type a
# Python caller passes, and stays.)
C_NAMES = re.compile(r"\bqnccl[A-Z]\w*|\bnccl(?!Comm_t\b)[A-Z]\w*|\b(?:bucketSize|"
                     r"rotationBlock|segmentValues|errorFeedback|interAlgo|intraBits|"
                     r"size_t|uint64_t|int64_t|uint32_t)\b|the C type")


def assert_python_message(error, name, allowed, given):
    """`error` (an exception) says, in Python's terms, "<name> must be <allowed>..., got
    <given>": the argument as the Python API spells it, the values allowed, what was given
    (its real type), and no C name."""
    message = str(error)
    assert message.startswith(f"{name} must be {allowed}"), (
        f"{message!r} does not start with {name!r} must be {allowed!r}")
    assert message.endswith(f"got {given}"), f"{message!r} does not end with got {given!r}"
    assert not C_NAMES.search(message), f"{message!r} names C's {C_NAMES.search(message)[0]!r}"


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(scope="session")
def capi():
    """(ffi, lib) of the built libqnccl.so; fails with the build hint when missing."""
    from qnccl import _lib
    return _lib.ffi(), _lib.lib()


# ---- values of the three codec types ---------------------------------------

def bfloat16_bits(values):
    """bfloat16 bits (uint16) of float32 `values`, truncated: exact for values
    whose low 16 bits are zero, and any bf16 pattern is reachable."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_float32(values, dtype):
    """float32 `values` in the storage of `dtype` (float16: numpy's rounding;
    bfloat16: truncated bits)."""
    values = np.asarray(values, np.float32)
    if dtype == "float32":
        return values
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16)
    return bfloat16_bits(values)


def widen(values, dtype):
    """Exact float64 values of an array of `dtype` storage (float16 or uint16 bits for bfloat16)."""
    values = np.asarray(values)
    if dtype == "bfloat16":
        values = (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    with np.errstate(invalid="ignore"):  # signaling NaNs
        return values.astype(np.float64)


def special_values(dtype):
    """Storage values that stress the codec, in this order for every dtype:
    NaN, a negative NaN with a payload, +Inf, -Inf, -0, +0, the smallest
    subnormal, a negative subnormal, the largest subnormal, the smallest
    normal, the largest finite value and its negative."""
    bits = {"float32": [0x7FC00000, 0xFFA00001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000000,
                        0x00000001, 0x80000003, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF],
            "float16": [0x7E00, 0xFD01, 0x7C00, 0xFC00, 0x8000, 0x0000, 0x0001, 0x8003,
                        0x03FF, 0x0400, 0x7BFF, 0xFBFF],
            "bfloat16": [0x7FC0, 0xFF81, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x8003,
                         0x007F, 0x0080, 0x7F7F, 0xFF7F]}[dtype]
    if dtype == "float32":
        return np.array(bits, np.uint32).view(np.float32)
    values = np.array(bits, np.uint16)
    return values.view(np.float16) if dtype == "float16" else values


_EXPONENTS = {"float32": (-140, 120), "float16": (-22, 10), "bfloat16": (-140, 120)}


def make_values(rng, count, dtype, bucket_size, specials=True):
    """`count` values of `dtype` storage: each bucket gets its own random scale
    (subnormal to huge) and offset, bucket 1 is constant, and with `specials` a
    few special_values() are sprinkled in."""
    buckets = -(-count // bucket_size)
    low, high = _EXPONENTS[dtype]
    scale = np.repeat(2.0 ** rng.uniform(low, high, buckets), bucket_size)[:count]
    offset = np.repeat(rng.standard_normal(buckets) * rng.choice([0, 1, 10], buckets),
                       bucket_size)[:count]
    values = (offset + rng.standard_normal(count)) * scale
    if buckets > 2:
        values[bucket_size:2 * bucket_size] = values[bucket_size]
    values = from_float32(np.clip(values, -F32_MAX, F32_MAX), dtype)
    if specials and count >= 64:
        extra = special_values(dtype)
        positions = rng.choice(count, size=count // 64, replace=False)
        values[positions] = extra[rng.integers(0, extra.size, positions.size)]
    return values


# ---- what a quantized allreduce puts on the wire ------------------------------

def sent_bytes(count, dtype, nranks, rank, algo="auto", bits=4, bucket_size=128,
               segment_values=0):
    """Bytes rank `rank` sends in one quantized allreduce of `count` values
    (docs/allreduce.md: per segment, ring sends 2(N-1) chunks, tree every piece
    of the segment to its parent and to each child, SRA every other chunk and then its
    own N-1 times; empty chunks send nothing): what qncclStats_t.bytesOnWire
    adds up for the call."""
    from qnccl.emulate.allreduce import auto_algo, chunks, segments, tree_pieces
    from qnccl.emulate.codec import compressed_size

    if algo == "auto":
        algo = auto_algo(count, dtype, nranks)
    sent = 0
    for start, stop in segments(count, segment_values, bucket_size):
        if nranks == 1:
            break
        m = stop - start
        sizes = [compressed_size(hi - lo, bits, bucket_size) for lo, hi in
                 chunks(m, nranks, bucket_size)]
        if algo == "ring":
            sent += sum(sizes[(rank - s) % nranks] + sizes[(rank + 1 - s) % nranks]
                        for s in range(nranks - 1))
        elif algo == "tree":
            messages = (rank > 0) + sum(c < nranks for c in (2 * rank + 1, 2 * rank + 2))
            sent += messages * sum(compressed_size(hi - lo, bits, bucket_size)
                                   for lo, hi in tree_pieces(m, bucket_size))
        elif algo == "sra":
            sent += sum(size for k, size in enumerate(sizes) if k != rank)
            sent += (nranks - 1) * sizes[rank]
        else:
            raise ValueError(f"algo must be auto, ring, tree or sra, got {algo!r}")
    return sent
