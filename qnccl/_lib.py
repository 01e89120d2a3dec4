"""The loaded libqnccl.so, and its error convention turned into an exception.

The cffi binding (qnccl/_ffi.py) is imported on first use, so that `import qnccl` needs
neither cffi nor the built library.
"""
import functools
import importlib


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
    return importlib.import_module("._ffi", __package__)


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
