"""The CUDA side of the build: which GPU architectures libqnccl.so carries
machine code and PTX for (read from the library with NVIDIA's cuobjdump, and
as qncclCudaInfo and `qnccl info` report them), and the rule `qnccl info`
applies to say whether the installed driver runs them. Needs no GPU."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mpi import BUILD
from qnccl import _lib, cli

LIBQNCCL = BUILD / "lib" / "libqnccl.so"
# What the Makefile builds by default (CUDA_ARCHS, CUDA_PTX).
DEFAULT_SASS = ["80", "86", "89", "90", "100", "120"]
DEFAULT_PTX = ["120"]


@pytest.mark.parametrize("runtime, driver, verdict", [
    (13000, 0, "no CUDA driver"),
    (13000, 12040, "no: the driver (CUDA 12.4) is older than the kernels' runtime (CUDA 13.0)"),
    (12090, 12000, "yes (CUDA 12.0 driver, CUDA 12.9 runtime; PTX from CUDA 12.9 does not JIT"),
    (12090, 12090, "yes (CUDA 12.9 driver, CUDA 12.9 runtime)"),
    (12090, 13010, "yes (CUDA 13.1 driver, CUDA 12.9 runtime)"),
    (13000, 13000, "yes (CUDA 13.0 driver, CUDA 13.0 runtime)"),
])
def test_driver_verdict(runtime, driver, verdict):
    """A driver runs the machine code of any runtime of its major version or
    older (CUDA's minor version compatibility); PTX only up to its own version."""
    assert cli.driver_verdict(runtime, driver).startswith(verdict)


def cuda_info():
    ffi, lib = _lib.ffi(), _lib.lib()
    info = ffi.new("qncclCudaInfo_t*")
    _lib.check(lib.qncclCudaInfo(info))
    return info, ffi


def test_cuda_info_rejects_null():
    with pytest.raises(_lib.QncclError, match="info is NULL"):
        _lib.check(_lib.lib().qncclCudaInfo(_lib.ffi().NULL))


def cuobjdump():
    found = shutil.which("cuobjdump") or next(
        (str(p) for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu*/bin/cuobjdump")),
        None)
    return found or pytest.fail("cuobjdump not found: run `make setup` (installs "
                                "nvidia-cuda-cuobjdump)")


def test_library_carries_the_architectures_it_reports():
    info, ffi = cuda_info()
    if not info.compiled:
        pytest.skip("libqnccl.so was built without CUDA (no nvcc)")
    listing = subprocess.run([cuobjdump(), "--list-elf", "--list-ptx", str(LIBQNCCL)],
                             capture_output=True, text=True, check=True).stdout
    cubins = re.findall(r"^ELF file\s+\d+: .*\.sm_(\d+)\.cubin$", listing, re.M)
    ptxs = re.findall(r"^PTX file\s+\d+: .*\.sm_(\d+)\.ptx$", listing, re.M)
    sass, ptx = set(cubins), set(ptxs)
    reported_sass = ffi.string(info.sass).decode().split(",")
    reported_ptx = ffi.string(info.ptx).decode().split(",")
    assert sass == set(reported_sass), listing
    assert ptx == set(reported_ptx), listing
    # Every kernel module (one per .cu file) carries every architecture.
    modules = {cubins.count(a) for a in sass} | {ptxs.count(a) for a in ptx}
    assert len(modules) == 1 and modules.pop() >= 1, listing
    shown = subprocess.run([sys.executable, "-m", "qnccl", "info"], capture_output=True,
                           text=True, timeout=60).stdout
    row = re.search(r"^CUDA archs +(.*)$", shown, re.M)
    assert row and row.group(1) == " ".join(f"sm_{a}" for a in reported_sass) + ", PTX " + \
        " ".join(f"compute_{a}" for a in reported_ptx), shown


def test_default_build_targets_every_supported_gpu():
    """`make` without CUDA_ARCHS builds sm_80 to sm_120 machine code and PTX of the
    newest, so one library loads where PyTorch runs (the library test above then
    checks that a library carries what it says)."""
    makefile = (cli.REPO / "Makefile").read_text()
    assert re.search(r"^CUDA_ARCHS \?= (.*)$", makefile, re.M).group(1).split() == DEFAULT_SASS
    assert re.search(r"^CUDA_PTX \?= (.*)$", makefile, re.M).group(1) == \
        "$(lastword $(CUDA_ARCHS))" and DEFAULT_PTX == DEFAULT_SASS[-1:]
