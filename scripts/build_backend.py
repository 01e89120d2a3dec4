"""The wheel's build backend: setuptools', plus the CUDA 12 toolkit the kernels compile with.

`pip install .` and `pip wheel .` build in an isolated environment from what the backend asks
for. Beyond setuptools, this one asks for the CUDA 12 toolkit's PyPI wheels (NVRTC, the
runtime, CCCL, the nvcc wheel's ptxas and crt/ headers: setup.sh's pins, `setup.sh
--cuda-pins`), so that a plain `pip install .` builds the kernels with nothing installed
first; setup.py then finds them on sys.path. With CUDA=0 in the environment (a host-only
library, on purpose) it asks for none. An editable install (`make setup`) builds nothing.
"""
import os
import subprocess
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403  (the PEP 517 hooks it does not change)

ROOT = Path(__file__).resolve().parents[1]


def cuda_wheels():
    """The CUDA toolkit wheels a build with kernels needs (none with CUDA=0)."""
    if os.environ.get("CUDA", "1") == "0":
        return []
    pins = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--cuda-pins"],
                          capture_output=True, text=True, check=True).stdout
    return pins.split()


def get_requires_for_build_wheel(config_settings=None):
    return build_meta.get_requires_for_build_wheel(config_settings) + cuda_wheels()
