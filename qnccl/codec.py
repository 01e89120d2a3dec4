"""Quantize and dequantize arrays with libqnccl.so (docs/wire-format.md).

    q = qnccl.codec.quantize(x, bits=4, bucket_size=128)   # a QuantizedArray
    y = qnccl.codec.dequantize(q)                          # shape and dtype of x
    qnccl.codec.dequantize_accumulate(q, acc)              # acc += y, in place
    z = qnccl.codec.rotate(x, seed=7, rotation_block=256)  # float32, rotated (docs/rotation.md)
    x2 = qnccl.codec.unrotate(z, seed=7, rotation_block=256)

Arrays of float32, float16 or bfloat16 values: numpy arrays (bfloat16 as
ml_dtypes.bfloat16, or uint16 bits with dtype="bfloat16"; CPU objects with
__dlpack__ too), torch tensors on the CPU or a CUDA device (torch.bfloat16
included), CuPy arrays and anything else with a C-contiguous
__cuda_array_interface__ (qnccl/_arrays.py). Device memory is processed on the
GPU, ordered on the array's stream: PyTorch's current stream of the tensor's
device, or the stream the interface names (CuPy's current one). What this
module allocates is of the input's kind: numpy, torch (on the same device) or
CuPy. qnccl.emulate computes the same bytes in numpy.

Bad arguments are refused in Python before the library sees them
(qnccl/_checks.py): TypeError for a wrong type, ValueError for a value out of
range, each naming the argument as spelled here, the values allowed and what
was given. QncclError is what the library itself reports (a failed CUDA call,
a device it cannot use).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import numpy as np

from . import _arrays, _checks, _lib
from .emulate import codec as _emulator
from .emulate import rotation as _rotation

_NCCL_TYPE_NAMES = {"float32": "ncclFloat32", "float16": "ncclFloat16", "bfloat16": "ncclBfloat16"}
_ROUNDING_NAMES = {"nearest": "qncclRoundNearest", "stochastic": "qncclRoundStochastic"}
_CLIP_NAMES = {"none": "qncclClipNone", "gaussian": "qncclClipGaussian"}
_ROTATION_NAMES = {"none": "qncclRotationNone", "hadamard": "qncclRotationHadamard",
                   "prerotated": "qncclRotationPrerotated"}


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedArray:
    """The wire bytes of a quantized array and everything needed to decode them."""

    data: Any  # uint8 array of the packed bytes, of the input's kind (numpy, torch, CuPy)
    count: int
    shape: Tuple[int, ...]
    dtype: str  # "float32", "float16" or "bfloat16": the type that was quantized
    bits: int
    bucket_size: int
    rounding: str
    seed: int
    stream: int
    wire_version: int = _emulator.WIRE_VERSION
    # "hadamard": rotated before quantizing; "prerotated": rotated by the caller, on the uniform
    # grid (docs/rotation.md)
    rotation: str = "none"
    rotation_block: int = _rotation.DEFAULT_BLOCK
    clip: str = "none"  # "gaussian": the rotated buckets' ranges were clipped

    @property
    def nbytes(self):
        return _arrays.nbytes(self.data)

    @property
    def ratio(self):
        """Bytes of the input per byte of the quantized form (1.0 for an empty array)."""
        itemsize = 4 if self.dtype == "float32" else 2
        return self.count * itemsize / self.nbytes if self.nbytes else 1.0

    def _host_bytes(self):
        return _arrays.to_numpy(self.data)

    @property
    def meta(self):
        """(min, max) of every bucket: float32 array of shape (buckets, 2)."""
        return _emulator.read_meta(self._host_bytes(), self.count, self.bucket_size)

    @property
    def codes(self):
        """The code of every value, unpacked: uint8 array of `count` values."""
        meta_bytes = len(self.meta) * _emulator.META_BYTES
        return _emulator.unpack_codes(self._host_bytes()[meta_bytes:], self.count, self.bits)


def _config(bits, bucket_size, rounding="nearest", seed=0, rotation="none",
            rotation_block=_rotation.DEFAULT_BLOCK, clip="none"):
    """The qncclCodecConfig_t of the arguments, each checked first in Python's terms
    (qnccl/_checks.py: the library refuses none of them then). A rotation_block of 0 is the
    default (256), as in C; the config holds the block it stands for."""
    lib = _lib.lib()
    config = _lib.ffi().new("qncclCodecConfig_t*")
    config.bits = _checks.bits(bits)
    config.bucketSize = _checks.bucket_size(bucket_size)
    config.rounding = getattr(lib, _ROUNDING_NAMES[_checks.rounding(rounding)])
    config.seed = _checks.uint64("seed", seed)
    config.rotation = getattr(lib, _ROTATION_NAMES[_checks.rotation(rotation)])
    config.rotationBlock = _checks.rotation_block(rotation_block, zero_is_default=True)
    config.clip = getattr(lib, _CLIP_NAMES[_checks.clip(clip, rotation)])
    return config


def _config_of(q):
    """The codec config that decodes q."""
    return _config(q.bits, q.bucket_size, q.rounding, q.seed, q.rotation, q.rotation_block)


def compressed_size(count, bits, bucket_size):
    """Bytes that `count` values take quantized at `bits` bits, `bucket_size` values per bucket."""
    size = _lib.ffi().new("size_t*")
    _lib.check(_lib.lib().qncclCompressedSize(_checks.count(count), _config(bits, bucket_size),
                                               size))
    return int(size[0])


# ---- arrays as the C API takes them -------------------------------------------

def _require_cuda(what):
    compiled = _lib.ffi().new("int*")
    _lib.check(_lib.lib().qncclCudaCompiled(compiled))
    if not compiled[0]:
        raise RuntimeError(f"{what} is in device memory but this libqnccl.so was built without "
                           "CUDA: run `make setup` (it installs the CUDA 12 wheels) and `make`, "
                           "or pass host arrays")


def _memory(array, what, writable):
    """_arrays.adopt, then the C pointer and stream of it."""
    memory = _arrays.adopt(array, what, writable)
    if memory.device:
        _require_cuda(what)
    return memory


def _ptr(memory):
    return _lib.ffi().cast("void*", memory.address)


def _stream(memory):
    return _lib.ffi().cast("cudaStream_t", memory.stream)


def _output(array, dtype, q, src, what, allowed):
    """The memory of `out`/`acc` and its codec type, checked against q and `allowed`."""
    dst = _memory(array, what, writable=True)
    if dst.count != q.count:
        raise ValueError(f"{what} holds {dst.count} values; the quantized array has {q.count}")
    if dst.device != src.device:
        raise ValueError(f"{what} and the quantized data must both be in host memory or both "
                         "in device memory")
    # uint16 bits are taken to be of q's type unless dtype (or the array) says otherwise
    implied = dtype if dtype is not None else (
        q.dtype if dst.numpy_dtype == np.uint16 and dst.implied is None else None)
    try:
        name = _arrays.codec_type(dst, implied, what)
    except (TypeError, ValueError):
        name = None
    if name not in allowed:
        bits = " (16-bit types also as uint16 bits)" if set(allowed) - {"float32"} else ""
        raise ValueError(f"{what} must be {_checks.with_article(_checks.alternatives(allowed))} "
                         f"array{bits}, got {_checks.describe(dst.source)}"
                         + (f" with dtype={dtype!r}" if dtype is not None else ""))
    return dst, name


def _quantized_bytes(q):
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"q must be a QuantizedArray (from quantize), got {_checks.describe(q)}")
    return _memory(q.data, "q.data", writable=False)


# ---- the codec ----------------------------------------------------------------

def quantize(array, bits=4, bucket_size=128, rounding="stochastic", seed=0, stream=0, dtype=None,
             rotation="none", rotation_block=_rotation.DEFAULT_BLOCK, clip="none"):
    """Quantizes `array` (see the module doc for the types taken).

    rounding: "stochastic" (unbiased) or "nearest". The random numbers of
    stochastic rounding are a pure function of (seed, stream, element index):
    give independent calls different streams. dtype: "bfloat16" or "float16"
    for arrays of uint16 bits; otherwise it must agree with the array or be None.
    rotation: "none", "hadamard" (docs/rotation.md: the array rotated in blocks of
    rotation_block values (0: 256), signs from `seed`, every bucket on the uniform grid; the
    QuantizedArray remembers it, and dequantize rotates back; host arrays only, so far) or
    "prerotated" (values the caller rotated, qnccl.emulate.rotation: the uniform grid, nothing
    rotated here nor by dequantize; device arrays too).
    clip: "none", or with a rotation "gaussian" (docs/rotation.md, "Clipped ranges": every
    bucket's range cut where a Gaussian's quantizes best; dequantize needs nothing more).
    """
    config = _config(bits, bucket_size, rounding, seed, rotation, rotation_block, clip)
    random_stream = _checks.uint64("stream", stream)
    src = _memory(array, "array", False)  # a non-contiguous input is copied
    name = _arrays.codec_type(src, dtype)
    size = compressed_size(src.count, bits, bucket_size)
    data = _arrays.empty(src, (size,), "uint8")
    dst = _memory(data, "data", writable=True)
    lib = _lib.lib()
    _lib.check(lib.qncclQuantize(_ptr(src), src.count, getattr(lib, _NCCL_TYPE_NAMES[name]),
                                 config, random_stream, _ptr(dst), size, _stream(src)))
    return QuantizedArray(data=data, count=src.count, shape=src.shape, dtype=name,
                          bits=config.bits, bucket_size=config.bucketSize, rounding=rounding,
                          seed=config.seed, stream=random_stream, rotation=rotation,
                          rotation_block=config.rotationBlock, clip=clip)


def dequantize(q, dtype=None, out=None):
    """The values of `q`, in q's shape and type (or `dtype`), written to a new
    array or to `out` (C-contiguous, writable, q.count values of float32,
    float16 or bfloat16; uint16 bits are of `dtype`, default q.dtype). Returns it."""
    src = _quantized_bytes(q)
    if dtype is not None:
        dtype = _checks.dtype(dtype, _emulator.DTYPES)
    if out is None:
        out = _arrays.empty(src, q.shape, q.dtype if dtype is None else dtype)
    dst, name = _output(out, dtype, q, src, "out", _emulator.DTYPES)
    lib = _lib.lib()
    _lib.check(lib.qncclDequantize(_ptr(src), q.nbytes, q.count, _config_of(q),
                                   _ptr(dst), getattr(lib, _NCCL_TYPE_NAMES[name]),
                                   _stream(dst)))
    return out


def _rotation_config(seed, rotation_block):
    """The codec config of qncclRotate / qncclUnrotate (bits and bucket size unused); a
    rotation_block of 0 is the default, as in C."""
    return _config(4, 128, "nearest", seed, "hadamard", rotation_block)


def rotate(array, seed=0, rotation_block=_rotation.DEFAULT_BLOCK, dtype=None, out=None):
    """The forward rotation of `array` (docs/rotation.md): its values rotated as one segment in
    blocks of rotation_block (a power of two, 2..16384), with the signs of `seed`, as float32
    values in a new array of its shape or in `out` (C-contiguous, writable, as many float32
    values; the array itself when it is float32: in place). The values a collective quantizes
    with rotation="prerotated"; qnccl.emulate.rotation.rotate computes the same bytes. Host
    arrays."""
    config = _rotation_config(seed, rotation_block)
    src = _memory(array, "array", False)
    name = _arrays.codec_type(src, dtype)
    if out is None:
        out = _arrays.empty(src, src.shape, "float32")
    dst = _float32_output(out, src)
    lib = _lib.lib()
    _lib.check(lib.qncclRotate(_ptr(src), src.count, getattr(lib, _NCCL_TYPE_NAMES[name]),
                               config, _lib.ffi().cast("float*", dst.address), _stream(src)))
    return out


def unrotate(values, seed=0, rotation_block=_rotation.DEFAULT_BLOCK, dtype=None, out=None):
    """The inverse of rotate(values, seed, rotation_block): float32 `values` rotated back, into
    a new array of `dtype` (float32, the default, float16 or bfloat16) and their shape, or into
    `out` (C-contiguous, writable, as many values of float32, float16 or bfloat16, uint16 bits
    of `dtype`; `values` itself when float32: in place). Every NaN comes out as the canonical
    one. Host arrays."""
    config = _rotation_config(seed, rotation_block)
    src = _memory(values, "values", False)
    if src.numpy_dtype != np.float32:
        raise ValueError(f"values must be a float32 array (rotate's output), got "
                         f"{_checks.describe(src.source)}")
    if dtype is not None:
        dtype = _checks.dtype(dtype, _emulator.DTYPES)
    if out is None:  # of the type asked for (bfloat16 as uint16 bits without ml_dtypes)
        name = "float32" if dtype is None else dtype
        out = _arrays.empty(src, src.shape, name)
        dst = _memory(out, "out", writable=True)
    else:
        dst = _memory(out, "out", writable=True)
        if dst.count != src.count:
            raise ValueError(f"out holds {dst.count} values; values has {src.count}")
        name = _arrays.codec_type(dst, dtype, "out")
    lib = _lib.lib()
    _lib.check(lib.qncclUnrotate(_lib.ffi().cast("float*", src.address), src.count, config,
                                 _ptr(dst), getattr(lib, _NCCL_TYPE_NAMES[name]), _stream(dst)))
    return out


def _float32_output(out, src):
    """The memory of rotate's `out`: writable float32, as many values as the input."""
    dst = _memory(out, "out", writable=True)
    if dst.numpy_dtype != np.float32:
        raise ValueError(f"out must be a float32 array, got {_checks.describe(dst.source)}")
    if dst.count != src.count:
        raise ValueError(f"out holds {dst.count} values; the array has {src.count}")
    return dst


def dequantize_accumulate(q, acc):
    """acc += the values of `q`, in place (added in float32, stored in acc's
    type). `acc`: C-contiguous, writable, q.count values of float32 or of q's
    type (uint16 bits for 16-bit types). Returns acc."""
    src = _quantized_bytes(q)
    allowed = tuple(dict.fromkeys(("float32", q.dtype)))
    dst, name = _output(acc, None, q, src, "acc", allowed)
    lib = _lib.lib()
    _lib.check(lib.qncclDequantizeAccumulate(_ptr(src), q.nbytes, q.count,
                                             _config_of(q), _ptr(dst),
                                             getattr(lib, _NCCL_TYPE_NAMES[name]),
                                             _stream(dst)))
    return acc
