"""The CUDA codec against the host codec, byte for byte, through the public
API: runs tests/gpu/codec_gpu_test.cc (built by `make` with CUDA as
build/bin/codec_gpu_test) on a CUDA device."""
import pytest

from conftest import run_gpu_binary
from mpi import BUILD

BINARY = BUILD / "bin" / "codec_gpu_test"


@pytest.mark.gpu
def test_device_codec_matches_host_codec():
    run = run_gpu_binary(BINARY)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"{BINARY.name} exited with {run.returncode}:\n{output}"
