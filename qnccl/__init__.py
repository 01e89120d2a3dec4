"""QNCCL: quantized NCCL collectives.

    qnccl.codec     quantize / dequantize arrays with libqnccl.so
    qnccl.comm      per-communicator statistics and error feedback's residuals
    qnccl.emulate   the numpy reference of the same arithmetic, bit for bit

Submodules load on first use, so `import qnccl` needs neither the built
library nor torch nor mpi4py.
"""
import importlib
import importlib.metadata
import re

from . import _native
from ._lib import QncclError, version


def _package_version():
    """One source: the QNCCL_MAJOR/MINOR/PATCH of qnccl.h, which packaging copies into the
    distribution's metadata; read from the header when running from a source tree that was
    never installed."""
    try:
        return importlib.metadata.version("qnccl")
    except importlib.metadata.PackageNotFoundError:
        text = _native.header().read_text()
        return ".".join(re.search(rf"#define QNCCL_{part} (\d+)", text).group(1)
                        for part in ("MAJOR", "MINOR", "PATCH"))


__version__ = _package_version()
__all__ = ["QncclError", "__version__", "codec", "comm", "emulate", "version"]

_LAZY_SUBMODULES = ("codec", "comm", "emulate")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
