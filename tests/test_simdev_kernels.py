"""The CUDA path's own test programs (tests/gpu, built against NVIDIA's libcudart.so.12) run
unchanged on the simulated GPU (docs/simulated-gpu.md), whose executor runs the library's
real kernels:

- codec_gpu_test: the CUDA codec against the host codec byte for byte, every bits value,
  buckets from 1 to 2^20 (powers of two, one pass; others, two), all three types, both
  roundings, both grids (the cubic one, and a rotated call's uniform one: prerotated), counts 0, 1, 9, 4099 and the prime 40009, misaligned pointers, a count whose
  grid-stride loops wrap, device calls that return behind a held stream; once per lane
  order, since code that depends on an order the hardware does not promise gives
  different bytes under another;
- allreduce_gpu_test: the engine's device path (the host backend's communicators) against
  its host path, every algorithm, type, op and rounding, error feedback, reduce-scatter,
  allgather, all-to-all, CUDA graph capture and replays; and two devices in one process,
  both ranks' calls in one group, bit for bit qnccl.emulate."""
from pathlib import Path

import pytest

import simulated
from test_allreduce_gpu import CAPTURE_WARNING, check_with_emulator


def run(binary, *args, **env):
    path = simulated.SIMDEV / "bin" / binary
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make simdev`")
    return simulated.run([path, *args], env)


@pytest.mark.parametrize("lane_order", ["forward", "reverse", "random"])
def test_kernels_match_the_host_codec(lane_order):
    result = run("codec_gpu_test", "--counts", "0,1,9,4099,40009", "--wrap",
                 **simulated.env(lane_order=lane_order))
    output = result.stdout + result.stderr
    assert result.returncode == 0 and " 0 failed" in result.stdout, output[-6000:]
    print(result.stdout.splitlines()[-1])


def test_device_path_matches_the_host_path_and_the_emulator(tmp_path):
    result = run("allreduce_gpu_test", tmp_path,
                 **simulated.env(devices=2, QNCCL_NCCL_LIB=str(simulated.HOST_NCCL),
                                 QNCCL_MIN_BYTES="0", QNCCL_ALGO="rule"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert CAPTURE_WARNING not in result.stderr, result.stderr[-4000:]
    assert "2 ranks: 6 cases, ranks identical" in result.stdout, output[-4000:]
    assert check_with_emulator(Path(tmp_path)) == 6
    print(result.stdout)
