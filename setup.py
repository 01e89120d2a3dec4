"""Packaging of QNCCL (the metadata is pyproject.toml's).

`pip install .`, `pip wheel .` and `python -m build --wheel` run `make native` in this tree and
put what it built into the package, qnccl/_native/ (qnccl/_native.py's PARTS: libqnccl.so
with its CUDA kernels, the host backend libnccl.so.2 over MPI and libnccl.so for -lnccl, the
cffi declarations, nccl.h and qnccl.h, the perf binaries and what `qnccl bench` runs), and a
pkg-config file. The wheel is therefore specific to this platform (and its host backend to the
MPI it was built with). `pip install -e .` (what `make setup` does) copies nothing: qnccl then
finds the tree's build/. The version is qnccl.h's QNCCL_MAJOR.MINOR.PATCH: one source for both.

The build's knobs are the Makefile's, from the environment:
  CUDA=0         a host-only library, on purpose (no kernels; no CUDA wheels fetched)
  CUDA_ARCHS     the GPU architectures (default all five: sm_70 ... sm_120; e.g. CUDA_ARCHS=90)
  CUDA_ROOT      a site-packages/nvidia folder with the CUDA 12 wheels (default: found on
                 sys.path, where the build environment installed them, scripts/build_backend.py)
  BUILD          the build folder (default build/wheel, apart from a development build's build/)
  JOBS           parallel compile jobs (default: every core)
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
# The toolkit's parts the kernels build with (Makefile, "CUDA"), by their wheels' folders.
CUDA_PARTS = ("cuda_nvrtc", "cuda_runtime", "cuda_nvcc", "cuda_cccl")


def native_module():
    """qnccl/_native.py, loaded by itself (importing qnccl would need its dependencies)."""
    spec = importlib.util.spec_from_file_location("qnccl_native", ROOT / "qnccl" / "_native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def version():
    text = (ROOT / "src" / "include" / "qnccl.h").read_text()
    return ".".join(re.search(rf"#define QNCCL_{part} (\d+)", text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


def cuda_root():
    """The site-packages/nvidia folder holding every CUDA wheel the kernels need, or None."""
    if os.environ.get("CUDA_ROOT"):
        return os.environ["CUDA_ROOT"]
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if all((root / part).is_dir() for part in CUDA_PARTS):
            return str(root)
    return None


def make_arguments():
    """The variables `make native` runs with: the build folder, this interpreter (the kernels'
    build script runs on it), the CUDA toolkit (or CUDA=0 when asked for), and the knobs the
    package's layout depends on, fixed (the environment's NCCL_INCLUDE or SANITIZE would build
    another header or an instrumented library)."""
    build = os.environ.get("BUILD") or "build/wheel"
    args = [f"BUILD={build}", f"PYTHON={sys.executable}", f"NCCL_INCLUDE={build}/include/nccl",
            "SANITIZE="]
    cuda = os.environ.get("CUDA", "1")
    if cuda not in ("0", "1"):
        raise SystemExit(f"qnccl: CUDA={cuda!r}: must be 1 (the default: with the CUDA kernels) "
                         "or 0 (a host-only library)")
    if cuda == "0":
        return args + ["CUDA=0"]
    root = cuda_root()
    if root is None:
        raise SystemExit(
            "qnccl: cannot build the CUDA kernels: the CUDA 12 toolkit's wheels ("
            + ", ".join(f"nvidia/{p}" for p in CUDA_PARTS) + ") are not on this build's "
            "sys.path. `pip install .` fetches them itself (scripts/build_backend.py); with "
            "--no-build-isolation install them first (pip install $(bash scripts/setup.sh "
            "--cuda-pins)) or set CUDA_ROOT to their site-packages/nvidia folder; or build "
            "a host-only library on purpose: CUDA=0 pip install .")
    return args + ["CUDA=1", f"CUDA_ROOT={root}"]


PKG_CONFIG = """\
# qnccl's NCCL API (nccl.h) over its host backend (libnccl.so: NCCL over MPI, host memory)
prefix=${{pcfiledir}}/../..
includedir=${{prefix}}/include
libdir=${{prefix}}/host

Name: qnccl
Description: Quantized NCCL collectives: the NCCL API of QNCCL's host backend
Version: {version}
Cflags: -I${{includedir}}
Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lnccl
"""


def strip_debug(path):
    """Drops an ELF file's debug sections (-g's line tables: two thirds of the library, 13 of
    14 parts of the host backend), as release builds of NCCL ship; symbols stay."""
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return
    subprocess.run(["strip", "--strip-debug", str(path)], check=True)


class BuildWithNative(build_py):
    """build_py, then `make native` and its outputs copied into the package."""

    def run(self):
        if not getattr(self, "editable_mode", False):
            # setuptools keeps its build folder between builds, and a wheel takes all of it:
            # a module since moved or removed would ship again
            shutil.rmtree(Path(self.build_lib) / "qnccl", ignore_errors=True)
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the tree's build/ serves an editable install
        variables = make_arguments()
        jobs = os.environ.get("JOBS") or str(os.cpu_count() or 2)
        print(f"qnccl: make native {' '.join(variables)} (the CUDA kernels take minutes)",
              flush=True)
        made = subprocess.run(["make", "-C", str(ROOT), "-j", jobs, *variables, "native"])
        if made.returncode != 0:
            raise SystemExit(f"qnccl: `make native` in {ROOT} failed (exit {made.returncode}): "
                             "the messages above say why (Debian: apt-get install g++ make "
                             "libopenmpi-dev)")
        build = variables[0].partition("=")[2]
        target = Path(self.build_lib) / "qnccl" / "_native"
        for destination, source in native_module().PARTS.items():
            if source.startswith("build/"):
                source = build + source[len("build"):]
            (target / destination).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / source, target / destination)  # (a link's file, for -lnccl)
            strip_debug(target / destination)
        pc = target / "lib" / "pkgconfig" / "qnccl.pc"
        pc.parent.mkdir(parents=True, exist_ok=True)
        pc.write_text(PKG_CONFIG.format(version=version()))


class PlatformDistribution(Distribution):
    """The package carries compiled code: its wheel is platform-specific."""

    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithNative}, distclass=PlatformDistribution)
