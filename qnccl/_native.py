"""Where the compiled parts of QNCCL are, found in one place.

    libqnccl.so            lib/libqnccl.so          (QNCCL_LIB overrides)
    the cffi declarations  include/qnccl_cdef.h     (QNCCL_CDEF overrides)
    the host backend       host/libnccl.so.2        (NCCL's API over MPI, for host memory)
    the C headers          include/qnccl.h, include/nccl_abi.h

An installed package (pip install . or a wheel) carries them in qnccl/_native/; a source
tree has them in build/ once `make` has run (an editable install, `make setup`, uses those).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGED = Path(__file__).resolve().parent / "_native"
SOURCE_TREE = Path(__file__).resolve().parents[1]
SOURCE_BUILD = SOURCE_TREE / "build"


def path(relative: str, env: str = None) -> Path:
    """The file `relative` (e.g. "lib/libqnccl.so"): the variable `env` when set, else the
    package's copy, else the source tree's build; the build's path when none exists (so that
    messages name where `make` puts it)."""
    if env and os.environ.get(env):
        return Path(os.environ[env])
    for root in (PACKAGED, SOURCE_BUILD):
        if (root / relative).exists():
            return root / relative
    return SOURCE_BUILD / relative


def header() -> Path:
    """qnccl.h: the package's copy, else the source tree's."""
    packaged = PACKAGED / "include" / "qnccl.h"
    return packaged if packaged.is_file() else SOURCE_TREE / "src" / "include" / "qnccl.h"


def missing(file: Path, env: str = None) -> str:
    """What to do about a compiled file that is not there, in words."""
    if env and os.environ.get(env):
        return f"{file} does not exist: {env} names it; point {env} at the file, or unset it"
    if PACKAGED.is_dir():
        fix = "the installed qnccl package is incomplete: reinstall it (pip install qnccl-*.whl)"
    else:
        fix = f"run `make` in {SOURCE_TREE} to build it"
    return f"{file} does not exist: {fix}" + (f", or set {env} to its path" if env else "")
