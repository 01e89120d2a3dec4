"""cffi binding of libqnccl.so in ABI mode: no compiler needed at import.

The declarations come from the public header itself, preprocessed by `make` into
qnccl_cdef.h, so the binding cannot drift from the C API. Both files are found by
qnccl._native (QNCCL_CDEF and QNCCL_LIB override them).
"""
import cffi

from . import _native


def _built_file(relative, env):
    path = _native.path(relative, env)
    if not path.is_file():
        raise OSError(_native.missing(path, env))
    return path


def _make_ffi():
    ffi = cffi.FFI()
    ffi.cdef(_built_file("include/qnccl_cdef.h", "QNCCL_CDEF").read_text())
    return ffi


ffi = _make_ffi()


def load_library():
    """Opens libqnccl.so (QNCCL_LIB, else the package's or the source tree's)."""
    return ffi.dlopen(str(_built_file("lib/libqnccl.so", "QNCCL_LIB")))
