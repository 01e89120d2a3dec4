"""The CUDA codec against the host codec, byte for byte, through the public
API: runs tests/gpu/codec_gpu_test.cc (built by `make` when nvcc is found as
build/bin/codec_gpu_test) on a CUDA device."""
import subprocess
from pathlib import Path

import pytest

BINARY = Path(__file__).resolve().parents[1] / "build" / "bin" / "codec_gpu_test"
SKIPPED = 77  # the binary's exit status without a CUDA device
TIMEOUT_S = 540  # below pytest-timeout's 600 s, so a hang reports its output


@pytest.mark.gpu
def test_device_codec_matches_host_codec():
    if not BINARY.exists():
        pytest.skip(f"{BINARY} is not built: the library was built without CUDA (no nvcc)")
    try:
        run = subprocess.run([str(BINARY)], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace")
        pytest.fail(f"{BINARY.name} ran past {TIMEOUT_S} s; its output so far:\n{output}")
    output = run.stdout + run.stderr
    if run.returncode == SKIPPED:
        pytest.skip(f"{BINARY.name}: {output.strip()}")
    assert run.returncode == 0, f"{BINARY.name} exited with {run.returncode}:\n{output}"
