"""The simulated GPU as a CUDA runtime and driver (docs/simulated-gpu.md):

- programs/cuda_runtime_program.c, a CUDA program of the plain runtime API linked against
  NVIDIA's libcudart.so.12, runs unchanged on it: devices, memory, streams, events, a host
  function, the library's kernels (bit for bit its host codec), a graph captured and replayed
  with new inputs; on a GPU too (marked gpu, skipped without one);
- CUDA's documented rules, one case each, answered as CUDA answers them (the capture rules on
  a GPU too), and what CUDA leaves undefined (a use after cudaFreeAsync, a CUDA call in a host
  function, a kernel reading another device's memory) caught;
- a call the simulator does not implement fails with cudaErrorNotSupported and a message
  naming it;
- the executor's rules on kernels of its own (simdev/checks/rule_kernels.cu, loaded through
  the driver API): warp operations that do not meet, lanes that leave early, parameter blocks
  above 4 KiB, reads past an allocation and vector loads from misaligned addresses end the
  launch with the GPU's error; legal half-warp masks and shuffles give the right values;
  shared memory starts as garbage; float-to-integer conversions saturate; subnormals are not
  flushed."""
import re
import shutil
import subprocess
import sys

import pytest

import simulated
from mpi import BUILD, REPO

SOURCE = REPO / "tests" / "programs" / "cuda_runtime_program.c"
KERNEL_RULES = simulated.SIMDEV / "bin" / "kernel_rules"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """The program, linked against NVIDIA's runtime and the shipped libqnccl.so: the
    simulated GPU's (env()) or a GPU's are what it finds at run time."""
    exe = tmp_path_factory.mktemp("cuda_runtime") / "cuda_runtime_program"
    cc = shutil.which("gcc") or pytest.fail("gcc not found: run `make setup`")
    built = subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
                            f"-I{REPO / 'src' / 'include'}", str(SOURCE), "-o", str(exe),
                            f"-L{BUILD / 'lib'}", "-lqnccl", *simulated.cuda_program_flags(),
                            "-lpthread"], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.fail(f"compiling {SOURCE.name} failed:\n{built.stderr}")
    return exe


def on_simulator(program, *args, **more):
    env = simulated.env(**more)
    env["LD_LIBRARY_PATH"] = f"{simulated.LIBQNCCL.parent}:{env['LD_LIBRARY_PATH']}"
    return simulated.run([program, *args], env, timeout=120)


def on_gpu(program, *args):
    return simulated.run([program, *args], {"LD_LIBRARY_PATH": str(BUILD / "lib")}, timeout=120)


def check_program(result):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"^OK: \d{2,} checks$", result.stdout, re.M), output[-4000:]
    assert "eager: kernels and copies in" in result.stdout
    assert "graph: 3 replays with new inputs, each bit-identical" in result.stdout


@pytest.mark.parametrize("schedule", ["lazy", "eager"])
def test_plain_cuda_program_runs_unchanged(program, schedule):
    check_program(on_simulator(program, SIMDEV_SCHEDULE=schedule))


@pytest.mark.gpu
def test_plain_cuda_program_on_a_gpu(program):
    check_program(on_gpu(program))


NAME_CHECK = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
name = ctypes.create_string_buffer(64)
for length, device in ((64, 1), (8, 0), (0, 0), (64, 2)):
    result = cuda.cuDeviceGetName(name, length, device)
    print(length, device, result, name.value.decode() if result == 0 else "")
"""


def test_qnccl_info_and_device_names_on_the_simulator():
    """`qnccl info` through the simulated driver: each device by its name (cuDeviceGetName),
    the library's one image and no PTX. cuDeviceGetName cuts the name to len - 1 characters
    and refuses len 0 (CUDA_ERROR_INVALID_VALUE) and a device that does not exist
    (CUDA_ERROR_INVALID_DEVICE), as the driver does."""
    env = {**simulated.env(devices=2), "QNCCL_CDEF": str(BUILD / "include" / "qnccl_cdef.h")}
    info = simulated.run([sys.executable, "-m", "qnccl", "info"], env, timeout=120)
    assert info.returncode == 0, info.stdout + info.stderr
    assert re.search(r"^GPU +2 device\(s\): QNCCL simulated GPU 0 \(simdev\), QNCCL simulated "
                     r"GPU 1 \(simdev\) \(driver CUDA 12\.9\)$", info.stdout, re.M), info.stdout
    assert re.search(r"^CUDA archs +sm_90, no PTX$", info.stdout, re.M), info.stdout
    names = simulated.run([sys.executable, "-c", NAME_CHECK], env, timeout=60)
    assert names.stdout.splitlines() == ["64 1 0 QNCCL simulated GPU 1 (simdev)",
                                         "8 0 0 QNCCL s", "0 0 1 ", "64 2 101 "], \
        names.stdout + names.stderr


# CUDA's documented answers, the same on a GPU: rule -> the lines the program prints.
DOCUMENTED = {
    "capture-sync": ["cudaStreamSynchronize -> cudaErrorStreamCaptureUnsupported",
                     "cudaStreamEndCapture -> cudaErrorStreamCaptureInvalidated"],
    "capture-malloc": ["relaxed: cudaMalloc -> cudaSuccess",
                       "relaxed: cudaStreamEndCapture -> cudaSuccess",
                       "global: cudaMalloc -> cudaErrorStreamCaptureUnsupported",
                       "global: cudaStreamEndCapture -> cudaErrorStreamCaptureInvalidated"],
    "capture-other-thread": [
        "cudaStreamIsCapturing(legacy stream) -> cudaErrorStreamCaptureImplicit",
        "cudaMalloc -> cudaErrorStreamCaptureUnsupported",
        "cudaStreamEndCapture -> cudaErrorStreamCaptureInvalidated"],
    "capture-unjoined": ["cudaStreamEndCapture -> cudaErrorStreamCaptureUnjoined"],
    "capture-implicit": ["cudaMemsetAsync(legacy stream) -> cudaErrorStreamCaptureImplicit",
                         "cudaStreamEndCapture -> cudaErrorStreamCaptureInvalidated"],
    "legacy-sync": ["the legacy stream's copy read the kernels' results"],
    "pointer-context": [
        "cuPointerGetAttributes(host memory) on a new thread -> 0: type 0, device -1; a context "
        "before no, after no",
        "cuPointerGetAttributes(device memory) on a new thread -> 0: type 2, device 0; a context "
        "before no, after no",
        "a new thread has a context: no",
        "cudaPointerGetAttributes(host memory) -> cudaSuccess",
        "then it has a context: no"],
}
# What CUDA leaves undefined or a GPU cannot promise, as the simulator answers it: rule ->
# (the lines, the message on stderr, the settings of the run).
SIMULATED = {
    # Nothing orders a non-blocking stream before the legacy stream (with the lazy schedule
    # holding the stream's work, the copy comes first every time).
    "nonblocking": (["the legacy stream's copy read bytes from before them"], None,
                    {"SIMDEV_LAZY_MS": "60000"}),
    "use-after-free-async": (["cudaStreamSynchronize -> cudaErrorIllegalAddress"],
                             r"kernel qnccl_encode_f32_4_stochastic .* touched memory the device "
                             r"may not use: .* from cudaMallocAsync on stream \d+, freed by "
                             r"cudaFreeAsync", {}),
    "host-function": (["cudaGetDevice in a host function -> cudaErrorNotPermitted"],
                      r"cudaGetDevice called from a host function", {}),
    # The codec on buffers of two devices: refused before any work (a kernel on either
    # device would reach the other's memory without peer access: kernel_rules' "peer").
    "peer": (["qncclQuantize -> 4: qncclQuantize: src is on device 0 and dst on device 1; "
              "pass both on one device (the stream must be that device's too)",
              "cudaStreamSynchronize -> cudaSuccess"], None, {"SIMDEV_DEVICES": "2"}),
    "unimplemented": (["cudaMallocManaged -> cudaErrorNotSupported"],
                      r"simdev: cudaMallocManaged is not simulated", {}),
}


def check_rule(result, rule, lines):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    printed = [line.split(": ", 1)[1] for line in result.stdout.splitlines()
               if line.startswith(f"{rule}: ")]
    assert printed == lines, output[-4000:]


@pytest.mark.parametrize("rule", DOCUMENTED)
def test_documented_rule(program, rule):
    check_rule(on_simulator(program, rule), rule, DOCUMENTED[rule])


@pytest.mark.gpu
@pytest.mark.parametrize("rule", DOCUMENTED)
def test_documented_rule_on_a_gpu(program, rule):
    check_rule(on_gpu(program, rule), rule, DOCUMENTED[rule])


@pytest.mark.parametrize("rule", SIMULATED)
def test_undefined_behaviour_is_caught(program, rule):
    lines, message, settings = SIMULATED[rule]
    result = on_simulator(program, rule, **settings)
    check_rule(result, rule, lines)
    if message:
        assert re.search(message, result.stderr), result.stderr[-4000:]


# The executor's rules: rule -> (the lines kernel_rules prints, the message on stderr).
LAUNCH_FAILED = "cuStreamSynchronize -> CUDA_ERROR_LAUNCH_FAILED"
KERNELS = {
    "copy": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS", "equal"],
             None),
    "big-params": (["cuLaunchKernel -> CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"],
                   r"big_params: 4408 bytes of parameters, more than 4096"),
    "read-past-end": (["cuLaunchKernel -> CUDA_SUCCESS",
                       "cuStreamSynchronize -> CUDA_ERROR_ILLEGAL_ADDRESS"],
                      r"kernel read_past_end .* \d+ bytes past the end of 4096 bytes from "
                      r"cuMemAlloc"),
    "misaligned": (["cuLaunchKernel -> CUDA_SUCCESS",
                    "cuStreamSynchronize -> CUDA_ERROR_MISALIGNED_ADDRESS"],
                   r"kernel misaligned_vector .* thread \(\d+,0,0\) accessed a float4 at "
                   r"0x[0-9a-f]+, which is not 16-byte aligned"),
    "divergent-syncwarp": (["cuLaunchKernel -> CUDA_SUCCESS", LAUNCH_FAILED],
                           r"lanes of a warp operation disagree: lane 0 is at rule_kernels.cu:26 "
                           r"\(__syncwarp, mask 0xffffffff\), lane 16 is at rule_kernels.cu:28"),
    "early-return": (["cuLaunchKernel -> CUDA_SUCCESS", LAUNCH_FAILED],
                     r"lane 2 returned while lane 0 waits for it at __syncwarp at "
                     r"rule_kernels.cu:35"),
    "mask-mismatch": (["cuLaunchKernel -> CUDA_SUCCESS", LAUNCH_FAILED],
                      r"disagree: lane 16 is at rule_kernels.cu:40 \(__syncwarp, mask "
                      r"0xffffffff\), lane 0 is at rule_kernels.cu:40 \(__syncwarp, mask 0xffff\)"),
    "half-warp": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS",
                   "64 of 64 lanes wrote"], None),
    "warp-sum": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS",
                  "96 of 96 lanes hold their warp's sum"], None),
    "shared-unwritten": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS",
                          "0 of 512 values read are zero"], None),
    # (1e10, -1e10, NaN, -5, 3.9, -3.9, 2^32, inf) as the GPU's cvt.rzi.s32/u32.f32 give them
    "convert": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS",
                 "int 2147483647 -2147483648 0 -5 3 -3 2147483647 2147483647; unsigned "
                 "4294967295 0 0 0 3 0 4294967295 4294967295"], None),
    "subnormal": (["cuLaunchKernel -> CUDA_SUCCESS", "cuStreamSynchronize -> CUDA_SUCCESS",
                   "subnormal results kept"], None),
    "peer": (["cuLaunchKernel -> CUDA_SUCCESS",
              "cuStreamSynchronize -> CUDA_ERROR_ILLEGAL_ADDRESS"],
             r"on device 1: .* touched memory the device may not use: .* from cuMemAlloc on "
             r"device 0"),
    "other-device": (["cuLaunchKernel -> CUDA_ERROR_INVALID_HANDLE"],
                     r"early_return: the kernel was loaded on device 0, the stream is device 1's"),
}


@pytest.mark.parametrize("lane_order", ["forward", "reverse", "random"])
@pytest.mark.parametrize("rule", KERNELS)
def test_kernel_rule(rule, lane_order):
    if not KERNEL_RULES.is_file():
        pytest.fail(f"{KERNEL_RULES} is missing: run `make simdev`")
    lines, message = KERNELS[rule]
    result = simulated.run([KERNEL_RULES, rule], simulated.env(devices=2, lane_order=lane_order),
                           timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    printed = [line.split(": ", 1)[1] for line in result.stdout.splitlines()]
    assert printed == lines, output[-4000:]
    if message:
        assert re.search(message, result.stderr), result.stderr[-4000:]
