"""The simulated GPU for the tests (docs/simulated-gpu.md): where `make simdev` built it and
the environment that runs a program on it: its CUDA runtime and driver first on
LD_LIBRARY_PATH, the library built against them (QNCCL_LIB), device buffers in the check
programs (QNCCL_TEST_MEMORY, tests/buffers.py), and the simulator's own settings."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mpi import BUILD, HOST_NCCL, REPO

SIMDEV = Path(os.environ.get("QNCCL_TEST_SIMDEV") or REPO / "build" / "simdev")
LIBQNCCL = SIMDEV / "lib" / "libqnccl.so"


def cuda_program_flags():
    """The compiler flags of a CUDA program of the tests: the headers and NVIDIA's
    libcudart.so.12 of the CUDA 12 wheels `make setup` installs (cuda_runtime_api.h includes
    crt/ headers of the nvcc wheel). Linked against NVIDIA's runtime, the program runs on the
    simulated GPU with LD_LIBRARY_PATH (env()) and on a GPU as it is."""
    for entry in sys.path:
        nvidia = Path(entry) / "nvidia"
        runtime = nvidia / "cuda_runtime"
        if (runtime / "include" / "cuda_runtime_api.h").is_file() and \
                (nvidia / "cuda_nvcc" / "include" / "crt").is_dir():
            # the runtime's folder as the program's run path: found on a GPU as it is; the
            # simulated GPU's environment puts its own first (LD_LIBRARY_PATH wins)
            return [f"-I{runtime / 'include'}", f"-I{nvidia / 'cuda_nvcc' / 'include'}",
                    str(runtime / "lib" / "libcudart.so.12"),
                    f"-Wl,--enable-new-dtags,-rpath,{runtime / 'lib'}"]
    pytest.fail("the CUDA 12 wheels (nvidia-cuda-runtime-cu12, nvidia-cuda-nvcc-cu12) are "
                "missing: run `make setup`")


def require():
    """Fails the test (with what to run) when the simulated GPU is not built."""
    for path in (SIMDEV / "libcudart.so.12", SIMDEV / "libcuda.so.1", LIBQNCCL):
        if not path.is_file():
            pytest.fail(f"{path} is missing: build the simulated GPU with `make simdev` in {REPO}")


def env(devices=1, lane_order="forward", schedule="lazy", **more):
    """The environment of a program on the simulated GPU (SIMDEV_DEVICES devices)."""
    require()
    library_path = ":".join(filter(None, [str(SIMDEV), str(HOST_NCCL.parent),
                                          os.environ.get("LD_LIBRARY_PATH")]))
    return {"LD_LIBRARY_PATH": library_path, "QNCCL_LIB": str(LIBQNCCL),
            "QNCCL_TEST_MEMORY": "device", "SIMDEV_DEVICES": str(devices),
            "SIMDEV_LANE_ORDER": lane_order, "SIMDEV_SCHEDULE": schedule,
            "SIMDEV_HANG_REPORT_S": "30", **more}


def run(argv, env, timeout=300):
    """Runs a program in `env` (env() for the simulated GPU) in a process group of its own;
    one that outlives `timeout` seconds is killed with its group and fails the test with
    its output so far. Returns the CompletedProcess (any exit status)."""
    proc = subprocess.Popen([str(a) for a in argv], env={**os.environ, **env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{Path(str(argv[0])).name} ran past {timeout} s and was killed; its output "
                    f"so far:\n{(out + err)[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


__all__ = ["BUILD", "LIBQNCCL", "SIMDEV", "cuda_program_flags", "env", "require", "run"]
