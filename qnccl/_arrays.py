"""The arrays qnccl.codec takes and returns, in one place.

    numpy arrays (and array-likes, and CPU objects with __dlpack__)    host memory
    torch tensors, on the CPU or a CUDA device                          their own memory
    CuPy arrays, and anything else with __cuda_array_interface__        device memory

adopt() turns one into a Memory: where its elements are, their numpy view type (16-bit
floats that numpy lacks, torch's bfloat16, as uint16 bits with the codec type implied), the
CUDA stream its work is ordered on: PyTorch's current stream of the tensor's device for a
torch tensor, the interface's "stream" for the others (CuPy puts its current stream there),
none for host memory. empty() makes a result of the same kind, on the same device. Neither
imports torch or CuPy unless such an array is handed in.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _checks
from .emulate import codec as _emulator

# torch dtype name -> (numpy view type, codec type it implies or None)
_TORCH_TYPES = {"float32": (np.float32, None), "float16": (np.float16, None),
                "bfloat16": (np.uint16, "bfloat16"), "uint8": (np.uint8, None)}


@dataclasses.dataclass(frozen=True)
class Memory:
    address: int
    numpy_dtype: np.dtype  # as viewed (uint16 for 16-bit float bits)
    shape: Tuple[int, ...]
    device: bool
    stream: int  # cudaStream_t of device work on it (0: the legacy default; host: 0)
    kind: str  # "numpy", "torch" or "cupy": what empty() makes next to it
    implied: Optional[str]  # the codec type uint16 bits are (torch's bfloat16), else None
    owner: Any  # keeps the memory alive while it is used
    source: Any  # the object handed in (what messages describe: a list, not its float64 copy)

    @property
    def count(self):
        return int(np.prod(self.shape, dtype=np.int64))


def _is_torch(array):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(array, torch.Tensor)


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def _torch(tensor, what, writable):
    import torch
    name = str(tensor.dtype).replace("torch.", "")
    if name not in _TORCH_TYPES:
        raise TypeError(f"{what} must be a torch.Tensor of dtype torch.float32, torch.float16 "
                        f"or torch.bfloat16, got {_checks.describe(tensor)}")
    t = tensor.detach()
    if not t.is_contiguous():
        if writable:
            raise ValueError(f"{what} must be a contiguous tensor: it is written in place")
        t = t.contiguous()
    view, implied = _TORCH_TYPES[name]
    stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0
    return Memory(t.data_ptr(), np.dtype(view), tuple(t.shape), t.is_cuda, stream, "torch",
                  implied, t, tensor)


def _cuda_interface(array, what, writable):
    interface = array.__cuda_array_interface__
    dtype, shape = np.dtype(interface["typestr"]), tuple(interface["shape"])
    strides = interface.get("strides")
    address, readonly = interface["data"]
    strided = strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize)
    if strided or (writable and readonly):
        kind = "C-contiguous writable" if writable else "C-contiguous"
        flaw = "non-contiguous" if strided else "read-only"
        raise ValueError(f"{what} must be a {kind} device array, got a {flaw} "
                         f"{_checks.describe(array).split(' ', 1)[1]}")
    stream = interface.get("stream") or 0  # None: the producer needs no synchronization
    return Memory(address, dtype, shape, True, int(stream), "cupy", None, array, array)


def _host(array, what, writable):
    source = array
    if not isinstance(array, np.ndarray) and hasattr(array, "__dlpack_device__"):
        device_type, _ = array.__dlpack_device__()
        if device_type != 1:  # kDLCPU
            raise TypeError(f"{what} is on DLPack device type {device_type}: the codec takes "
                            "host memory through DLPack, device memory through "
                            "__cuda_array_interface__ (CuPy) or as a torch tensor")
        array = np.from_dlpack(array)
    if writable:
        if not (isinstance(array, np.ndarray) and array.flags.c_contiguous
                and array.flags.writeable):
            raise ValueError(f"{what} must be a C-contiguous writable array (numpy, torch "
                             f"tensor or device array), got {_checks.describe_layout(array)}")
    else:
        array = np.ascontiguousarray(array)  # any array-like; a non-contiguous one is copied
    return Memory(array.ctypes.data, array.dtype, array.shape, False, 0, "numpy", None, array,
                  source)


def adopt(array, what, writable):
    """The Memory of `array` (named `what` in messages); `writable`: it is written in place."""
    if _is_torch(array):
        return _torch(array, what, writable)
    if hasattr(array, "__cuda_array_interface__"):
        return _cuda_interface(array, what, writable)
    return _host(array, what, writable)


def codec_type(memory, dtype, what="array"):
    """The codec type of `memory`'s elements (the array named `what` in messages): `dtype`
    (a name) must agree with typed elements and is needed for bare uint16 bits, unless the
    array itself implies it."""
    if memory.implied is not None and dtype is None:
        dtype = memory.implied
    return _emulator.dtype_name(memory.numpy_dtype, dtype, what, memory.source)


def empty(like, shape, name):
    """An uninitialized array of codec type `name` (or "uint8") of `like`'s kind and device."""
    if like.kind == "torch":
        import torch
        return torch.empty(shape, dtype=getattr(torch, name), device=like.owner.device)
    if not like.device:
        return np.empty(shape, _emulator.storage_dtype(name) if name != "uint8" else np.uint8)
    try:
        import cupy
    except ImportError:
        raise TypeError("device arrays (__cuda_array_interface__) need CuPy to allocate "
                        "results: install cupy, or pass torch tensors or numpy arrays") from None
    return cupy.empty(shape, np.uint16 if name == "bfloat16" else name)


def to_numpy(array):
    """A host numpy copy (or view) of an array this module handles (torch's bfloat16 as
    uint16 bits)."""
    if _is_torch(array):
        import torch
        t = array.detach().cpu()
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 \
            else t.numpy()
    if isinstance(array, np.ndarray):
        return array
    return array.get()  # CuPy


def nbytes(array):
    """Bytes of an array this module handles."""
    return int(array.numel() * array.element_size()) if _is_torch(array) else int(array.nbytes)
