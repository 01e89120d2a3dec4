"""Single-process numpy reference of QNCCL, bit-exact with libqnccl.so.

qnccl.emulate.codec is docs/wire-format.md in numpy: the test oracle of the
library and a tool for studying the codec's error without building anything.
qnccl.emulate.allreduce is docs/allreduce.md on N virtual ranks: the bytes
qncclAllReduce produces on N real ranks, and the error each algorithm implies.
(The package attribute `allreduce` is that module's function; import its other
helpers with `from qnccl.emulate.allreduce import chunks, segments, ...`.)
qnccl.emulate.collectives is docs/collectives.md on N virtual ranks: quantized
reduce-scatter, allgather, all-to-all and point-to-point sends.
qnccl.emulate.training.EmulatedAllReduce is a communicator of N virtual ranks in a
training loop: call counter, warm-up calls and error feedback's residuals per buffer.
qnccl.emulate.adaptive.AdaptiveBits picks per-layer widths under the byte budget of
uniform ones (L-GreCo's knapsack); EmulatedAllReduce and the DDP hook both take one.
qnccl.emulate.rotation is docs/rotation.md: the randomized Hadamard rotation that every
emulated collective applies with rotation="hadamard".
"""
from .allreduce import allreduce, auto_algo, stream_id
from .collectives import P2P_CALL, allgather, alltoall, reduce_scatter, sendrecv
from .training import EmulatedAllReduce
from .codec import (
    WIRE_VERSION,
    bucket_params,
    compressed_size,
    dequantize,
    dequantize_accumulate,
    grid_step,
    pack_codes,
    quantize,
    rng_uniform,
    unpack_codes,
)

__all__ = [
    "EmulatedAllReduce",
    "P2P_CALL",
    "WIRE_VERSION",
    "allgather",
    "allreduce",
    "alltoall",
    "auto_algo",
    "bucket_params",
    "compressed_size",
    "dequantize",
    "dequantize_accumulate",
    "grid_step",
    "pack_codes",
    "quantize",
    "reduce_scatter",
    "rng_uniform",
    "sendrecv",
    "stream_id",
    "unpack_codes",
]
