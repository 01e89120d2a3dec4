"""cffi binding of libqnccl.so in ABI mode: no compiler needed at import.

The declarations come from the public header itself, preprocessed by `make`
into build/include/qnccl_cdef.h, so the binding cannot drift from the C API.

    QNCCL_CDEF  path of the preprocessed header (default <repo>/build/include/qnccl_cdef.h)
    QNCCL_LIB   path of libqnccl.so            (default <repo>/build/lib/libqnccl.so)
"""
import os
from pathlib import Path

import cffi

REPO_ROOT = Path(__file__).resolve().parents[1]


def _built_file(env_var, default):
    path = Path(os.environ.get(env_var) or default)
    if not path.is_file():
        raise OSError(f"{path} does not exist: run `make` in {REPO_ROOT} to build it, "
                      f"or set {env_var} to its path")
    return path


def _make_ffi():
    header = _built_file("QNCCL_CDEF", REPO_ROOT / "build" / "include" / "qnccl_cdef.h")
    ffi = cffi.FFI()
    ffi.cdef(header.read_text())
    return ffi


ffi = _make_ffi()


def load_library():
    """Opens libqnccl.so (QNCCL_LIB, else the one `make` built in this repository)."""
    return ffi.dlopen(str(_built_file("QNCCL_LIB", REPO_ROOT / "build" / "lib" / "libqnccl.so")))
