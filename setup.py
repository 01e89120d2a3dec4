"""Packaging of QNCCL (the metadata is pyproject.toml's).

`pip install .`, `pip wheel .` and `python -m build --wheel` run `make native` in this tree
and put what it built into the package, qnccl/_native/: libqnccl.so, the host backend
(libnccl.so.2 over MPI), the cffi declarations, the C headers and codec_bench. The wheel is
therefore specific to this platform (and its host backend to the MPI it was built with).
`pip install -e .` (what `make setup` does) copies nothing: qnccl then finds the tree's
build/. The version is qnccl.h's QNCCL_MAJOR.MINOR.PATCH: one source for both.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
# qnccl/_native/<destination>: <source in this tree>
NATIVE = {
    "lib/libqnccl.so": "build/lib/libqnccl.so",
    "host/libnccl.so.2": "build/host/libnccl.so.2",
    "include/qnccl_cdef.h": "build/include/qnccl_cdef.h",
    "include/qnccl.h": "src/include/qnccl.h",
    "include/nccl_abi.h": "src/include/nccl_abi.h",
    "bin/codec_bench": "build/bin/codec_bench",
}


def version():
    text = (ROOT / "src" / "include" / "qnccl.h").read_text()
    return ".".join(re.search(rf"#define QNCCL_{part} (\d+)", text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


class BuildWithNative(build_py):
    """build_py, then `make native` and its outputs copied into the package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the tree's build/ serves an editable install
        jobs = str(os.cpu_count() or 2)
        made = subprocess.run(["make", "-C", str(ROOT), "-j", jobs, "native"])
        if made.returncode != 0:
            raise SystemExit(f"`make native` in {ROOT} failed (exit {made.returncode}): the "
                             "messages above say why; `make setup` installs what it needs")
        target = Path(self.build_lib) / "qnccl" / "_native"
        for destination, source in NATIVE.items():
            (target / destination).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / source, target / destination)


class PlatformDistribution(Distribution):
    """The package carries compiled code: its wheel is platform-specific."""

    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithNative}, distclass=PlatformDistribution)
