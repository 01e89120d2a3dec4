"""Which NCCL a library calls: its own, linked in statically, or a libnccl.so.2 beside it.

The hook's engine path hands PyTorch's NCCL communicator to libqnccl's engine, which calls the
libnccl.so.2 loaded in the process. That is PyTorch's own NCCL only when PyTorch links NCCL
dynamically (the PyPI wheels that depend on nvidia-nccl do); a PyTorch built with
USE_STATIC_NCCL carries NCCL inside libtorch_cuda.so, and any libnccl.so.2 the process also
loaded (torch loads the nvidia wheels' libraries eagerly) is a second NCCL, to which the
communicator is a stranger. The dynamic loader says which: the definition of ncclCommInitRank
that a lookup through the library's own handle finds is inside the library itself (static), or
in a libnccl.so.2 it depends on (dynamic).
"""
import ctypes
import os

_RTLD_NOLOAD = 4  # glibc's dlfcn.h


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def nccl_of(library, loaded=True):
    """Where `library` (a path) finds ncclCommInitRank: ("static", its own path), ("dynamic",
    the path of the libnccl it uses), or ("none", None) when it has no NCCL. With `loaded`,
    only a library the process has loaded already is looked at (nothing new is loaded)."""
    mode = os.RTLD_NOW | (_RTLD_NOLOAD if loaded else os.RTLD_LOCAL)
    try:
        handle = ctypes.CDLL(library, mode=mode)
    except OSError as exc:
        raise ValueError(f"{library} is not loaded in this process ({exc})") from exc
    libc = ctypes.CDLL(None)
    libc.dlsym.restype = ctypes.c_void_p
    libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    address = libc.dlsym(handle._handle, b"ncclCommInitRank")
    if not address:
        return "none", None
    info = _DlInfo()
    if not libc.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return "none", None
    found = os.path.realpath(info.dli_fname.decode())
    if found == os.path.realpath(library):
        return "static", found
    return "dynamic", found


def check_torch_nccl():
    """Raises RuntimeError, saying what to do, when PyTorch's NCCL is linked into
    libtorch_cuda.so (the engine would call another NCCL with its communicator)."""
    import torch
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    if not os.path.exists(path):
        return  # no CUDA build: no NCCL communicator to hand over
    kind, where = nccl_of(path)
    if kind == "static":
        raise RuntimeError(
            f"this PyTorch links NCCL statically ({where} defines ncclCommInitRank), so "
            "libqnccl.so's engine cannot use its NCCL communicators (it calls the "
            "libnccl.so.2 of the process, another NCCL): use a PyTorch that loads "
            "libnccl.so.2 (the PyPI wheels do), or run the job under `qnccl run` "
            "(LD_PRELOAD), where QNCCL stands in front of whichever NCCL PyTorch calls")
    if kind == "none":
        raise RuntimeError(
            f"{path} shows no ncclCommInitRank, neither its own nor a libnccl.so.2's: its NCCL, "
            "if any, is hidden inside it, and libqnccl.so's engine cannot tell whether it "
            "calls the same NCCL; use a PyTorch that loads libnccl.so.2 (the PyPI wheels do)")
