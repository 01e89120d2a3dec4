"""Where the compiled parts of QNCCL (and the tools the benchmarks run) are, in one place.

An installed package (pip install . or a wheel) carries them in qnccl/_native/, under the
names of PARTS; a source tree has them where PARTS says, once `make` has run (an editable
install, `make setup`, uses those). setup.py copies each part into the package from PARTS, so
this table is the one list of what a wheel carries.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "_native"
SOURCE_TREE = Path(__file__).resolve().parents[1]
SOURCE_BUILD = SOURCE_TREE / "build"

# The perf binaries (nccl-tests style, docs/perf.md) and the codec's benchmark.
PERF_TOOLS = ("all_reduce_perf", "reduce_scatter_perf", "all_gather_perf", "alltoall_perf",
              "sendrecv_perf", "mpi_all_reduce_perf", "codec_bench")

# qnccl/_native/<name>: its place in a source tree ("build/..." is make's BUILD folder).
PARTS = {
    "lib/libqnccl.so": "build/lib/libqnccl.so",
    # the host backend: NCCL's API over MPI for host memory, SONAME libnccl.so.2 like
    # NVIDIA's; libnccl.so beside it is what `-lnccl` finds
    "host/libnccl.so.2": "build/host/libnccl.so.2",
    "host/libnccl.so": "build/host/libnccl.so",
    "include/qnccl_cdef.h": "build/include/qnccl_cdef.h",  # the cffi declarations
    "include/qnccl.h": "src/include/qnccl.h",
    "include/nccl_abi.h": "src/include/nccl_abi.h",
    "include/nccl.h": "build/include/nccl/nccl.h",  # the NCCL API as QNCCL declares it
    **{f"bin/{tool}": f"build/bin/{tool}" for tool in PERF_TOOLS},
    # what `qnccl bench` runs besides the binaries
    "bin/netlab": "perf/netlab",
    "bin/torch_all_reduce_perf.py": "perf/torch_all_reduce_perf.py",
    "bin/gloo_ranks.py": "perf/gloo_ranks.py",
}


def installed() -> bool:
    """Whether this qnccl is an installed package (else a source tree's)."""
    return PACKAGED.is_dir()


def path(relative: str, env: str = None) -> Path:
    """The part `relative` (a key of PARTS, e.g. "lib/libqnccl.so"): the variable `env`
    when set, else the installed package's copy, else the source tree's."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    if installed():
        return PACKAGED / relative
    return SOURCE_TREE / PARTS[relative]


def header() -> Path:
    """qnccl.h, which the binding reads the library's version and limits from."""
    return path("include/qnccl.h")


def include_dirs() -> list:
    """The folders a C program adds with -I for nccl.h and qnccl.h."""
    return sorted({str(path(h).parent) for h in ("include/nccl.h", "include/qnccl.h")})


def missing(file: Path, env: str = None) -> str:
    """What to do about a part that is not there, in words."""
    if env and os.environ.get(env):
        return f"{file} does not exist: {env} names it; point {env} at the file, or unset it"
    if installed():
        fix = "the installed qnccl package is incomplete: reinstall it (pip install qnccl-*.whl)"
    else:
        fix = f"run `make` in {SOURCE_TREE} to build it"
    return f"{file} does not exist: {fix}" + (f", or set {env} to its path" if env else "")
