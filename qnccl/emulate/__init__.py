"""Single-process numpy reference of QNCCL, bit-exact with libqnccl.so.

qnccl.emulate.codec is docs/wire-format.md in numpy: the test oracle of the
library and a tool for studying the codec's error without building anything.
"""
from .codec import (
    WIRE_VERSION,
    bucket_params,
    compressed_size,
    dequantize,
    dequantize_accumulate,
    pack_codes,
    quantize,
    rng_uniform,
    unpack_codes,
)

__all__ = [
    "WIRE_VERSION",
    "bucket_params",
    "compressed_size",
    "dequantize",
    "dequantize_accumulate",
    "pack_codes",
    "quantize",
    "rng_uniform",
    "unpack_codes",
]
