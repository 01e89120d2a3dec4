"""QNCCL: quantized NCCL collectives.

    qnccl.codec     quantize / dequantize arrays with libqnccl.so
    qnccl.comm      per-communicator statistics and error feedback's residuals
    qnccl.emulate   the numpy reference of the same arithmetic, bit for bit

Submodules load on first use, so `import qnccl` needs neither the built
library nor torch nor mpi4py.
"""
import importlib

from ._lib import QncclError, version

__version__ = "0.1.0"
__all__ = ["QncclError", "__version__", "codec", "comm", "emulate", "version"]

_LAZY_SUBMODULES = ("codec", "comm", "emulate")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
