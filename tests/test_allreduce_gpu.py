"""The quantized allreduce on device buffers (the engine's CUDA path) through
NVIDIA's NCCL: runs tests/gpu/allreduce_gpu_test.cc (built by `make` with CUDA
is found as build/bin/allreduce_gpu_test) on a CUDA device. One rank: device
buffers give the host path's bytes for every algorithm, type, op and rounding,
mixed buffers are refused, calls do not wait for their stream, and CUDA graph
capture quantizes every captured call, on a new communicator too (no warning of a
pass-through).
With two devices, two ranks agree and match the emulator bit for bit."""
import ctypes.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import run_gpu_binary
from mpi import BUILD

REPO = Path(__file__).resolve().parents[1]
BINARY = BUILD / "bin" / "allreduce_gpu_test"
CAPTURE_WARNING = "during CUDA graph capture"  # the old pass-through warning: never printed


def nvidia_nccl():
    """Path (or soname) of NVIDIA's libnccl.so.2: QNCCL_NCCL_LIB, the
    nvidia-nccl-cu* wheel's copy, or one the dynamic linker knows; None if
    there is none. QNCCL's host backend (build/host) never counts."""
    host_backend = BUILD / "host"
    candidates = [os.environ.get("QNCCL_NCCL_LIB")]
    candidates += [str(Path(p) / "nvidia" / "nccl" / "lib" / "libnccl.so.2") for p in sys.path]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and \
                host_backend not in Path(candidate).resolve().parents:
            return candidate
    return ctypes.util.find_library("nccl")


def check_with_emulator(folder):
    """The two-rank outputs the binary wrote against qnccl.emulate.allreduce."""
    from qnccl.emulate.allreduce import allreduce

    manifest = folder / "manifest.txt"
    if not manifest.exists():
        return 0
    lines = manifest.read_text().split()
    checked = 0
    for fields in (lines[i:i + 11] for i in range(0, len(lines), 11)):
        name, algo, dtype, op, rounding, bits, bucket, seed, segment, call, count = fields
        storage = np.float32 if dtype == "float32" else np.uint16
        inputs = [np.fromfile(folder / f"{name}.in{r}", storage) for r in range(2)]
        got = np.fromfile(folder / f"{name}.out", storage)
        want = allreduce(inputs, algo=algo, bits=int(bits), bucket_size=int(bucket),
                         rounding=rounding, seed=int(seed), op=op, call=int(call),
                         segment_values=int(segment), dtype=dtype)[0]
        assert got.size == int(count)
        assert np.array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8)), \
            f"{name} ({' '.join(fields[1:])}): the device differs from the emulator"
        checked += 1
    return checked


@pytest.mark.gpu
def test_device_allreduce_matches_host_and_emulator(tmp_path):
    nccl = nvidia_nccl()
    if nccl is None:
        pytest.skip("NVIDIA's libnccl.so.2 is not available: install the nvidia-nccl-cu13 wheel "
                    "or set QNCCL_NCCL_LIB to its path")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QNCCL_")}
    env.update(QNCCL_NCCL_LIB=nccl, QNCCL_MIN_BYTES="0", QNCCL_ALGO="rule")
    run = run_gpu_binary(BINARY, tmp_path, env=env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{BINARY.name} exited with {run.returncode}:\n{output}"
    assert CAPTURE_WARNING not in run.stderr, \
        f"a captured call passed through (it must be quantized):\n{run.stderr}"
    print(run.stdout, f"emulator: {check_with_emulator(tmp_path)} two-rank cases checked")
