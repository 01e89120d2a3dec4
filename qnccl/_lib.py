"""The loaded libqnccl.so, and its error convention turned into an exception.

The cffi binding lives in bindings/qnccl_ffi.py at the repository root (not a
package), so it is loaded from its path, once, on first use.
"""
import functools
import importlib.util
from pathlib import Path

BINDINGS_PATH = Path(__file__).resolve().parents[1] / "bindings" / "qnccl_ffi.py"


class QncclError(RuntimeError):
    """A QNCCL call failed: `code` is its ncclResult_t, `name` that value's name
    and `message` what qncclGetLastError() said about it."""

    def __init__(self, code, name, message):
        super().__init__(f"{name} ({code}): {message}")
        self.code = code
        self.name = name
        self.message = message


@functools.lru_cache(maxsize=None)
def _bindings():
    spec = importlib.util.spec_from_file_location("qnccl_ffi", BINDINGS_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ffi():
    """The cffi.FFI holding the declarations of the public C API."""
    return _bindings().ffi


@functools.lru_cache(maxsize=None)
def lib():
    """The libqnccl.so handle, opened on first use."""
    return _bindings().load_library()


def check(result):
    """Raises QncclError for an ncclResult_t other than ncclSuccess."""
    if result == 0:
        return
    message = lib().qncclGetLastError()
    raise QncclError(int(result), ffi().string(ffi().cast("ncclResult_t", result)),
                     ffi().string(message).decode(errors="replace") if message else "")


def version():
    """Version of the loaded library, "major.minor.patch"."""
    code = ffi().new("int*")
    check(lib().qncclGetVersion(code))
    return f"{code[0] // 10000}.{code[0] // 100 % 100}.{code[0] % 100}"
