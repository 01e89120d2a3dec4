"""What libqnccl.so keeps per NCCL communicator: its policy, statistics and error
feedback's residuals.

    import qnccl.comm
    qnccl.comm.set_quantization(comm, "allreduce,reducescatter", 4)  # this communicator's own
    with qnccl.comm.quantization(comm, "alltoall", 2): ...           # for the calls inside
    qnccl.comm.reset_error_feedback()        # every communicator of this process
    qnccl.comm.stats(comm)                   # {"calls_compressed": ..., "residual_bytes": ...}
    qnccl.comm.tuning(comm)                  # measured auto's decisions, one dict per size
    qnccl.comm.allreduce(comm, send, recv, count, "float32", "avg", bits=4)  # qncclAllReduce

`comm` is an ncclComm_t: a cffi pointer, or its address as an int. In a job started with
`LD_PRELOAD=libqnccl.so` (or `qnccl run`) these reach the preloaded library, which is the
one the process's ncclAllReduce calls use, as long as it is the same file (QNCCL_LIB).
PyTorch keeps its NCCL communicators to itself: reset_error_feedback() without a
communicator is the call for it (e.g. after loading a checkpoint, or when the model's
buffers change).
"""
from __future__ import annotations

import contextlib

import numpy as np

from . import _checks, _lib

__all__ = ["ALGOS", "COLLECTIVES", "allreduce", "async_error", "call_counts", "forget",
           "get_quantization", "quantization", "reset_error_feedback", "residual",
           "set_call_counts", "set_quantization", "stats", "tuning"]

# The interposed collectives a policy names (QNCCL_COLLECTIVES), in the order of
# qncclCollective_t's flags.
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "alltoall", "sendrecv")

# qncclAlgo_t's names (qnccl.h), in the enum's order.
ALGOS = ("auto", "ring", "tree", "sra", "hier")
_EXACT_CANDIDATE = -1  # qnccl.h's QNCCL_EXACT_CANDIDATE (the cffi header has no macros)
_OPS = {"sum": "ncclSum", "avg": "ncclAvg"}
_NCCL_TYPES = {"float32": "ncclFloat32", "float16": "ncclFloat16", "bfloat16": "ncclBfloat16"}
_STATS = (("callsCompressed", "calls_compressed"), ("callsPassedThrough", "calls_passed_through"),
          ("bytesIn", "bytes_in"), ("bytesOnWire", "bytes_on_wire"),
          ("residualBuffers", "residual_buffers"), ("residualBytes", "residual_bytes"),
          ("computeSteps", "compute_steps"), ("groups", "groups"))


_COMM = "an ncclComm_t (cffi) or its address (an int in 1..2**64-1)"
_ADDRESS = "a numpy array or an address (an int in 0..2**64-1, e.g. a torch tensor's data_ptr())"


def _comm(comm):
    ffi = _lib.ffi()
    if isinstance(comm, ffi.CData):
        if comm == ffi.NULL:
            raise ValueError(f"comm must be {_COMM}, got NULL")
        if ffi.typeof(comm) is not ffi.typeof("ncclComm_t"):
            raise TypeError(f"comm must be {_COMM}, got a cffi {ffi.typeof(comm).cname}")
        return comm
    return ffi.cast("ncclComm_t", _checks.integer("comm", comm, 1, _checks.UINT64_MAX, _COMM))


def _comm_address(comm):
    """`comm`'s address, an int."""
    return int(_lib.ffi().cast("uintptr_t", _comm(comm)))


def _address(buffer, name="buffer"):
    if isinstance(buffer, int) and not isinstance(buffer, bool):
        return _checks.integer(name, buffer, 0, _checks.UINT64_MAX, _ADDRESS)
    if isinstance(buffer, np.ndarray):
        return buffer.ctypes.data
    raise TypeError(f"{name} must be {_ADDRESS}, got {_checks.describe(buffer)}")


def _stream(stream):
    """A cudaStream_t: a cffi pointer as it is, or an address (an int)."""
    ffi = _lib.ffi()
    if not isinstance(stream, ffi.CData):
        stream = _checks.integer("stream", stream, 0, _checks.UINT64_MAX,
                                 "a CUDA stream's address (an int in 0..2**64-1, 0: the "
                                 "legacy default stream) or a cffi cudaStream_t")
    return ffi.cast("cudaStream_t", stream)


def stats(comm):
    """qncclCommGetStats of `comm` as a dict (see qncclStats_t in qnccl.h)."""
    ffi, lib = _lib.ffi(), _lib.lib()
    out = ffi.new("qncclStats_t*")
    _lib.check(lib.qncclCommGetStats(_comm(comm), out))
    return {name: int(getattr(out, field)) for field, name in _STATS}


def tuning(comm):
    """qncclCommGetTuning of `comm`: measured auto's table (docs/tuning.md), one dict per
    (collective, type, size class) met so far: "collective" and "dtype" (names),
    "min_bytes"/"max_bytes" per rank, "calls", "trial_calls", "candidates" (names: "exact",
    "ring", ..., "quantized" for an allgather's or all-to-all's), "seconds" (agreed: the
    slowest rank's median trial of each, once decided), "floor_seconds" and
    "ceiling_seconds" (agreed: the slowest rank's fastest timed trial, the slowest timed
    trial of any rank; 0 for a stored decision), "choice" (a candidate's name, or
    None while trying) and "stored" (True: the decision came from QNCCL_TUNE_FILE, no trials
    ran)."""
    ffi, lib = _lib.ffi(), _lib.lib()
    count = ffi.new("int*")
    _lib.check(lib.qncclCommGetTuning(_comm(comm), ffi.NULL, 0, count))
    table = ffi.new("qncclTuning_t[]", max(count[0], 1))
    _lib.check(lib.qncclCommGetTuning(_comm(comm), table, count[0], count))
    types = {int(getattr(lib, f"nccl{name}")): name.lower()
             for name in ("Float32", "Float16", "Bfloat16")}
    rows = []
    for e in table[0:count[0]]:
        names = ["exact" if c == _EXACT_CANDIDATE else
                 "quantized" if c == lib.qncclAlgoAuto else ALGOS[c]
                 for c in e.candidates[0:e.candidateCount]]
        rows.append({"collective": COLLECTIVES[int(e.collective).bit_length() - 1],
                     "dtype": types.get(int(e.datatype), str(int(e.datatype))),
                     "min_bytes": 1 << e.sizeClass, "max_bytes": (2 << e.sizeClass) - 1,
                     "calls": int(e.calls), "trial_calls": int(e.trialCalls),
                     "candidates": names, "seconds": [float(s) for s in e.seconds[0:len(names)]],
                     "floor_seconds": [float(s) for s in e.floorSeconds[0:len(names)]],
                     "ceiling_seconds": [float(s) for s in e.ceilingSeconds[0:len(names)]],
                     "choice": names[e.choice] if e.choice >= 0 else None,
                     "stored": bool(e.stored)})
    return rows


def async_error(comm):
    """ncclCommGetAsyncError of `comm` through libqnccl (the NCCL library's answer, or the
    failure of a quantized call on it): "ncclSuccess", "ncclInProgress" or the error's name.
    Raises QncclError when the library refuses the handle (the host backend's answer for a
    destroyed or aborted communicator; NVIDIA's NCCL must not be asked about one)."""
    ffi, lib = _lib.ffi(), _lib.lib()
    state = ffi.new("ncclResult_t*")
    _lib.check(lib.ncclCommGetAsyncError(_comm(comm), state))
    return ffi.string(ffi.cast("ncclResult_t", state[0]))


def forget(comm):
    """qncclCommForget: drops what libqnccl holds for `comm` (residuals, call counts,
    statistics) without a call on it, for a communicator that was aborted or destroyed
    behind libqnccl's back (PyTorch's watchdog, without LD_PRELOAD). Raises QncclError when
    libqnccl holds nothing for it."""
    _lib.check(_lib.lib().qncclCommForget(_comm(comm)))


def reset_error_feedback(comm=None):
    """Frees the residuals of `comm`, or of every communicator of the process when None: the
    next call on each buffer starts from zero residuals."""
    lib = _lib.lib()
    if comm is None:
        _lib.check(lib.qncclResetErrorFeedback())
    else:
        _lib.check(lib.qncclCommResetErrorFeedback(_comm(comm)))


def residual(comm, buffer, count=None, dtype=None):
    """This rank's residual (a float32 array of `count` values) of the send buffer `buffer`
    on `comm`: a numpy array (its address and size; its dtype unless `dtype` names one, as
    for uint16 bits of float16/bfloat16), or an address (int, e.g. a torch tensor's
    data_ptr()) with `count` and `dtype`. Raises QncclError when that buffer has none."""
    if isinstance(buffer, np.ndarray):
        count = buffer.size if count is None else count
        dtype = dtype or np.dtype(buffer.dtype).name
    if count is None or dtype is None:
        raise ValueError("count and dtype are required when buffer is an address")
    count = _checks.count(count)
    dtype = _checks.dtype(dtype, tuple(_NCCL_TYPES))
    ffi, lib = _lib.ffi(), _lib.lib()
    address = _address(buffer)
    out = np.empty(count, np.float32)
    _lib.check(lib.qncclCommGetResidual(_comm(comm), ffi.cast("void*", address), count,
                                        getattr(lib, _NCCL_TYPES[dtype]), ffi.from_buffer("float[]", out)))
    return out


def allreduce(comm, sendbuff, recvbuff, count, dtype, op="sum", *, bits=4, bucket_size=128,
              rounding="stochastic", seed=0, algo="auto", error_feedback=False,
              segment_values=0, lanes=0, stream=0, rotation="none", rotation_block=256,
              clip="none"):
    """qncclAllReduce: the sum ("sum") or average ("avg") of `count` values of `dtype`
    ("float32", "float16", "bfloat16") over the ranks of `comm`, every transfer quantized with
    `bits` bits, `bucket_size` values per bucket, `rounding` and `seed`, by `algo` (one of
    ALGOS). The buffers are numpy arrays or addresses (ints, e.g. a torch tensor's
    data_ptr()); device buffers are computed on the CUDA stream `stream` (an address, e.g.
    torch.cuda.current_stream().cuda_stream) and the call returns once the work is enqueued.
    With error_feedback the residual of (comm, sendbuff, count, dtype) is read and rewritten
    (residual() reads it). rotation="hadamard" rotates each segment in blocks of
    `rotation_block` values first and back at the end (docs/rotation.md; host and device
    buffers); "prerotated" takes values the caller rotated (qnccl.codec.rotate) onto the
    uniform grid, rotating nothing; with either, clip="gaussian" clips every bucket's range
    (docs/rotation.md, "Clipped ranges").
    Arguments are checked in Python first (TypeError, ValueError naming the argument and the
    values allowed); QncclError carries what the library reports about the call itself (a
    communicator it does not know, buffers it cannot use)."""
    from .codec import _config  # the codec's arguments, checked there
    count = _checks.count(count)
    dtype = _checks.dtype(dtype, tuple(_NCCL_TYPES))
    _checks.one_of("op", op, tuple(_OPS))
    _checks.one_of("algo", algo, ALGOS)
    _checks.boolean("error_feedback", error_feedback)
    ffi, lib = _lib.ffi(), _lib.lib()
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec = _config(bits, bucket_size, rounding, seed, rotation, rotation_block, clip)[0]
    config.algo = ALGOS.index(algo)
    config.interAlgo = 0
    config.errorFeedback = int(error_feedback)
    config.segmentValues = _checks.segment_values(segment_values)
    config.lanes = _checks.lanes(lanes)
    send, recv = _address(sendbuff, "sendbuff"), _address(recvbuff, "recvbuff")
    _lib.check(lib.qncclAllReduce(ffi.cast("void*", send), ffi.cast("void*", recv), count,
                                  getattr(lib, _NCCL_TYPES[dtype]), getattr(lib, _OPS[op]),
                                  config, _comm(comm), _stream(stream)))


def call_counts(comm):
    """qncclCommGetCallCounts: (calls, p2p_calls), the `call` numbers of the random streams
    the next quantized collective and point-to-point calls on `comm` take."""
    ffi = _lib.ffi()
    calls, p2p = ffi.new("uint64_t*"), ffi.new("uint64_t*")
    _lib.check(_lib.lib().qncclCommGetCallCounts(_comm(comm), calls, p2p))
    return int(calls[0]), int(p2p[0])


def set_call_counts(comm, calls, p2p_calls=None):
    """qncclCommSetCallCounts: the next quantized calls on `comm` take these numbers (None:
    p2p_calls as it is), e.g. call_counts() of a checkpointed job on its new communicator,
    so that stochastic rounding continues bit for bit. Every rank sets its own."""
    calls = _checks.uint64("calls", calls)
    if p2p_calls is None:
        p2p_calls = call_counts(comm)[1]
    _lib.check(_lib.lib().qncclCommSetCallCounts(_comm(comm), calls,
                                                 _checks.uint64("p2p_calls", p2p_calls)))


def _flags(collectives):
    allowed = (f"collectives must be one or more of {', '.join(COLLECTIVES)} (a comma string "
               f"or a list of names)")
    if isinstance(collectives, str):
        names = collectives.split(",")
    elif isinstance(collectives, (list, tuple, set, frozenset)):
        names = list(collectives)
    else:
        raise TypeError(f"{allowed}, got {_checks.describe(collectives)}")
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown or not names:
        raise ValueError(f"{allowed}, got {collectives!r}")
    return sum(1 << COLLECTIVES.index(n) for n in set(names))


def _policy_bits(bits):
    """set_quantization's bits as the C API takes them: 1..8, 0 exact, -1 for None."""
    if bits is None:
        return -1
    return _checks.integer("bits", bits, 0, _checks.MAX_BITS,
                           f"0 (exact), an integer in {_checks.MIN_BITS}..{_checks.MAX_BITS} "
                           f"(quantized) or None (the environment's policy)")


def set_quantization(comm, collectives, bits):
    """qncclCommSetQuantization: the interposed calls of `collectives` (names of COLLECTIVES,
    a comma string or a list) on `comm` run with `bits` 1..8, 0 exact, None back to the
    environment's QNCCL_COLLECTIVES / QNCCL_<NAME>_BITS. Every rank must set the same."""
    value = _policy_bits(bits)
    _lib.check(_lib.lib().qncclCommSetQuantization(_comm(comm), _flags(collectives), value))


def get_quantization(comm, collective):
    """The bits an eligible interposed call of `collective` on `comm` runs with now (0: exact)."""
    _checks.one_of("collective", collective, COLLECTIVES)
    out = _lib.ffi().new("int*")
    _lib.check(_lib.lib().qncclCommGetQuantization(_comm(comm), 1 << COLLECTIVES.index(collective),
                                                   out, _lib.ffi().NULL))
    return int(out[0])


@contextlib.contextmanager
def quantization(comm, collectives, bits):
    """set_quantization for the calls issued inside the block, then each collective's bits as
    they were (e.g. an embedding's all-to-all at 4 bits forward and 2 backward)."""
    flags = _flags(collectives)
    _policy_bits(bits)  # refused before anything is changed
    names = [n for i, n in enumerate(COLLECTIVES) if flags & (1 << i)]
    before = {n: get_quantization(comm, n) for n in names}
    set_quantization(comm, names, bits)
    try:
        yield
    finally:
        for name, was in before.items():
            set_quantization(comm, [name], was)
