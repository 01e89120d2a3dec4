"""Numpy emulation of QNCCL's quantized allreduce: docs/allreduce.md, rank by rank.

    outs = allreduce([x0, x1, x2, x3], algo="sra", bits=4)        # one array per rank
    outs, bound = allreduce(xs, rounding="nearest", return_bounds=True)
    outs = allreduce(xs, residuals=es)   # error feedback: es (N float32 arrays) rewritten

Every virtual rank does what the engine (src/engine/) does on a real one:
the same segments and chunks, the same quantizations with the same random
streams, the same float32 additions in the same order, and the output decoded
from the same wire bytes. So for the same inputs and configuration the
emulator's outputs are bit for bit those of qncclAllReduce on N real ranks,
and the emulator is the oracle of the multi-process tests. It is also a tool
for studying how the algorithms' errors grow with the rank count (seeds/000,
section 3.4) in one process, at 8..128 virtual ranks.

The arithmetic is the codec emulator's (qnccl/emulate/codec.py): a
quantization and its decode, D(Q(v)), are codec.encode_values and
codec.decode_values on v's buckets (the wire bytes pack exactly these codes
and metadata), `acc = acc + D(q)` is a float32 addition, the output is the
final result decoded into the output type. Each algorithm is written once,
for all virtual ranks at a time: a step quantizes every rank's chunk in one
numpy pass (O(N n) values quantized in all), and the same code tracks the
error bound or error feedback's residuals when asked.

Error bound (return_bounds=True). The exact sum S[i] = sum_r x_r[i] of finite
inputs and the output y[i] satisfy |y[i] - S[i]| <= bound[i], where bound[i]
adds, along everything that flows into element i (not only one input's path:
every quantization whose chunk holds i contributes, N of them for each
algorithm, see `quantizations_per_value`):

  * each quantization of a value v in a bucket with metadata (min, max):
        step/2 (nearest) or step (stochastic)  +  12 u M  +  2^-148
    with step = s/sigma of the bucket (wire-format.md), M = max(|min|, |max|),
    u = 2^-24. The last two terms cover the float32 rounding of the codec's
    own formulas: t = (sigma x - a) * inv carries a relative error of 3u, so
    rint(t) may land up to 3uL codes past the nearest one (3u L s <= 6uM); the
    decoder's q*s and a + q*s round by at most u|q s| <= 2uM and u(M + s)
    each; the step d/L itself is within 2u of exact (covered above), and
    subnormal operands add at most a few 2^-150 in absolute terms.
    Sum: below 10uM + 2^-148; 12uM leaves a margin. With a clipped range
    (clip="gaussian"), step and M are the clipped bucket's, and a value past
    it adds its distance to the clipped range, at most max(hi - max', min' -
    lo) of the bucket's unclipped [lo, hi].
  * each float32 addition acc = acc + D(q) with result a: u|a|. (A sum
    that lands in the subnormal range is exact, so no absolute term.)
  * avg: the bound of the full sum is divided by N, then the float32
    division acc / N adds u|acc / N| + 2^-150; the final quantization then
    adds its own term.
  * the store of the decoded float32 result y into the output type:
    float16 2^-11|y| + 2^-25, bfloat16 2^-8|y| + 2^-134, float32 nothing.

Additions are exact in the error analysis (errors add, nothing multiplies
them), so the bound is the plain sum of these terms. It is infinite where
the output is not finite.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from .. import _checks
from . import codec, hierarchical, rotation as rot
from .codec import _mix64 as mix64  # the splitmix64 finalizer of wire-format.md

F32 = np.float32
ALGOS = ("ring", "tree", "sra")  # the flat algorithms; "hier" runs one between nodes
OPS = ("sum", "avg")
DEFAULT_SEGMENT_VALUES = 1 << 22  # QNCCL_DEFAULT_SEGMENT_VALUES of qnccl.h
AUTO_TREE_BELOW_BYTES = 64 << 10  # auto: tree below this many bytes per rank
AUTO_SRA_MAX_RANKS = 16  # auto: SRA up to this many ranks, ring beyond

_U32 = 2.0**-24  # unit roundoff of float32
# Per-quantization slack of the codec's float32 formulas (module docstring).
_CODEC_REL_SLACK = 12 * _U32
_CODEC_ABS_SLACK = 2.0**-148
# Rounding of the decoded float32 result into the output type: (relative, absolute).
_STORE_SLACK = {"float32": (0.0, 0.0), "float16": (2.0**-11, 2.0**-25),
                "bfloat16": (2.0**-8, 2.0**-134)}


# ---- random streams, algorithm choice, segments and chunks ----------------------

def stream_id(call, segment, rank, step):
    """The random stream of one quantization (docs/allreduce.md, Random streams):

        stream(call, segment, rank, step)
            = mix64(mix64(mix64(call) ^ segment) ^ (rank << 32 | step))

    `call` counts the communicator's quantized allreduce calls from 0, `rank`
    is the quantizing rank and `step` numbers its quantizations in the segment."""
    for name, value, limit in (("call", call, 2**64), ("segment", segment, 2**64),
                               ("rank", rank, 2**32), ("step", step, 2**32)):
        _checks.integer(name, value, 0, limit - 1)
    return int(_streams(call, segment, rank, step))


def auto_algo(count, dtype, nranks):
    """The algorithm qncclAlgoAuto runs (docs/allreduce.md, Choosing an algorithm):
    ring for one rank, tree below 64 KiB per rank, SRA up to 16 ranks, else ring."""
    itemsize = 4 if _dtype_name(dtype) == "float32" else 2
    nranks = _checks.integer("nranks", nranks, 1)
    if nranks == 1:
        return "ring"
    if count * itemsize < AUTO_TREE_BELOW_BYTES:
        return "tree"
    return "sra" if nranks <= AUTO_SRA_MAX_RANKS else "ring"


def quantizations_per_value(algo, nranks):
    """How many quantizations one input value passes through on its way to the
    output (docs/allreduce.md): N for ring, depth + 1 <= floor(log2 N) + 1 for
    tree (the deepest rank's), 2 for SRA (1 for N = 1, where SRA sends
    nothing). Every output element is touched by N quantizations in all three
    algorithms; what differs is how many of them an input value compounds."""
    if algo == "ring":
        return nranks
    if algo == "tree":
        return nranks.bit_length()  # floor(log2 N) + 1
    if algo == "sra":
        return 2 if nranks > 1 else 1
    _checks.one_of("algo", algo, ALGOS)


def segment_length(segment_values, bucket_size):
    """W: segment_values (0: 2^22) rounded down to a multiple of the bucket
    size, at least one bucket."""
    want = segment_values or DEFAULT_SEGMENT_VALUES
    return max(bucket_size, want // bucket_size * bucket_size)


def segments(count, segment_values, bucket_size):
    """(start, stop) of every segment of a `count`-value buffer."""
    w = segment_length(segment_values, bucket_size)
    return [(start, min(start + w, count)) for start in range(0, count, w)]


def chunks(count, nranks, bucket_size):
    """(start, stop) of chunks 0..N-1 of a segment of `count` values: chunk k holds
    buckets [k*u/N, (k+1)*u/N) of the u = ceil(count/B) buckets (may be empty)."""
    u = -(-count // bucket_size)
    edges = [min(bucket_size * (k * u // nranks), count) for k in range(nranks + 1)]
    return list(zip(edges[:-1], edges[1:]))


TREE_PIECE_VALUES = 1 << 18


def tree_pieces(count, bucket_size):
    """(start, stop) of the pieces the tree moves a segment of `count` values in
    (src/engine/tree.cc): 2^18 values rounded down to whole buckets, at least one
    bucket. Each piece is quantized on the segment's stream from its first value
    on, so the pieces change the bytes sent, not the values."""
    p = max(bucket_size, TREE_PIECE_VALUES // bucket_size * bucket_size)
    return [(start, min(start + p, count)) for start in range(0, count, p)]


# ---- the public entry point ----------------------------------------------------------

@dataclass(frozen=True)
class _Config:
    nranks: int  # avg divides by this (a stage: the whole communicator's rank count)
    bits: int
    bucket_size: int
    rounding: str
    seed: int
    call: int
    average: bool
    bounds: bool
    # The random streams of a stage of the hierarchical algorithm: its virtual rank r
    # quantizes as communicator rank stream_ranks[r], its step s as step_base + s.
    stream_ranks: Optional[tuple] = None
    step_base: int = 0
    # Hadamard rotation of the inputs in blocks of this many values (0: none, or done by
    # the caller); a rotated call's buckets are all on the uniform grid (docs/rotation.md).
    rotation_block: int = 0
    cubic: bool = True
    # a rotated call's bucket ranges: codec.CLIPS ("gaussian": clipped at the fraction of
    # the stage's own bits and bucket size, clip_fraction())
    clip: str = "none"

    def clip_fraction(self):
        return codec.clip_fraction(self.clip, self.bits, self.bucket_size)


def rotated(rotation, block, clip="none"):
    """_Config's rotation fields for a call's rotation and clip settings (checked)."""
    rot.check(rotation, block)
    codec.check_clip(clip, rotation)
    on = rotation == "hadamard"
    return {"rotation_block": block if on else 0, "cubic": rotation == "none", "clip": clip}


def _stream_ranks(cfg, ranks):
    """The communicator ranks whose random streams the virtual `ranks` use."""
    if cfg.stream_ranks is None:
        return ranks
    return np.asarray(cfg.stream_ranks, np.int64)[np.asarray(ranks)]


def _dtype_name(dtype):
    return _checks.dtype(dtype, codec.DTYPES)


def _inputs(inputs, dtype, what="inputs"):
    """(N x n float32 widened inputs, codec type name, storage dtype, shape); `what` names
    the inputs in messages ("x" for sendrecv's one array)."""
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError(f"{what} must hold one array per rank (a list, or an N x ... array), "
                        f"got {_checks.describe(inputs)}")
    given = list(inputs)
    arrays = [np.asarray(x) for x in given]
    if not arrays:
        raise ValueError(f"{what} must hold one array per rank, got none")
    first = arrays[0]
    for r, a in enumerate(arrays):
        if a.shape != first.shape or a.dtype != first.dtype:
            raise ValueError(f"every rank's input must have the shape and dtype of rank 0's "
                             f"({first.shape}, {first.dtype}); rank {r} has ({a.shape}, "
                             f"{a.dtype})")
    name = codec.dtype_name(first.dtype, dtype, f"{what}[0]" if what == "inputs" else what,
                            given[0])
    x = np.empty((len(arrays), first.size), F32)
    for r, a in enumerate(arrays):
        x[r] = codec.to_float32(np.ascontiguousarray(a).reshape(-1), name)
    return x, name, first.dtype, first.shape


def _residual_views(residuals, nranks, count):
    """Flat writable float32 views of the N residual arrays (ValueError if they do not fit)."""
    views = []
    if len(residuals) != nranks:
        raise ValueError(f"residuals must hold one array per rank ({nranks}), got {len(residuals)}")
    for r, e in enumerate(residuals):
        if (not isinstance(e, np.ndarray) or e.dtype != F32 or e.size != count
                or not e.flags.c_contiguous or not e.flags.writeable):
            raise ValueError(f"residuals[{r}] must be a C-contiguous writable float32 array of "
                             f"{count} values")
        views.append(e.reshape(-1))
    return views


@dataclass(frozen=True)
class _Hier:
    """A hierarchical call's plan: the layout, the inter algorithm, the intra bits."""
    layout: hierarchical.Layout
    inter: str
    intra_bits: int
    dtype: str


def _plan(algo, nodes, inter_algo, intra_bits, count, name, nranks):
    """(the algorithm run, its _Hier plan or None), as the engine resolves them."""
    _checks.one_of("inter_algo", inter_algo, ("auto", *ALGOS))
    intra_bits = _checks.integer("intra_bits", intra_bits, 0, _checks.MAX_BITS,
                                 f"0 (exact) or an integer in 1..{_checks.MAX_BITS}")
    lay = None if nodes is None else hierarchical.layout(nodes, nranks)
    if algo == "hier" and lay is not None and len(lay.members) == 1:
        return "exact", None  # nothing crosses a node link
    if algo == "auto":
        algo = "hier" if lay is not None and lay.hierarchical else auto_algo(count, name, nranks)
    if algo != "hier":
        _checks.one_of("algo", algo, ("auto", *ALGOS, "hier"))
        return algo, None
    if lay is None:
        raise ValueError("algo='hier' needs nodes=[the node of each rank]")
    hierarchical.check_uniform(lay)
    nodes_count = len(lay.members)
    inter = (auto_algo(count // lay.local_ranks, name, nodes_count) if inter_algo == "auto"
             else inter_algo)
    return algo, _Hier(lay, inter, intra_bits, name)


def allreduce(inputs: Sequence[np.ndarray], algo: str = "auto", bits: int = 4,
              bucket_size: int = 128, rounding: str = "stochastic", seed: int = 0,
              op: str = "sum", call: int = 0, segment_values: int = 0, dtype=None,
              return_bounds: bool = False, residuals=None, nodes=None,
              inter_algo: str = "auto", intra_bits: int = 0, rotation: str = "none",
              rotation_block: int = rot.DEFAULT_BLOCK, clip: str = "none"):
    """What qncclAllReduce returns on every rank of an N-rank communicator.

    inputs          one array per rank (a list, or an N x ... array), all of one
                    shape and dtype: float32, float16, bfloat16 (ml_dtypes), or
                    uint16 bits with dtype="float16"/"bfloat16"
    algo            "ring", "tree", "sra", "hier" or "auto" (hier on a layout that
                    allows it, else auto_algo)
    bits, bucket_size, rounding, seed
                    the codec configuration (qncclCodecConfig_t)
    op              "sum" or "avg"
    call            the communicator's count of earlier quantized allreduce
                    calls (the `call` of the random streams)
    segment_values  qncclAllReduceConfig_t.segmentValues (0: 2^22)
    residuals       None (no error feedback), or error feedback's residuals e_r: one
                    float32 array of the inputs' size per rank (zeros before the first
                    call on a buffer), read and then rewritten in place by the call
                    (docs/allreduce.md, Error feedback). Not with return_bounds.
    nodes           None (every rank on one node), or the node (any label) of each
                    rank: the layout of the hierarchical algorithm (qnccl.emulate.
                    hierarchical), which auto picks for >= 2 nodes of >= 2 ranks each
    inter_algo      hier: the flat algorithm between nodes ("auto": auto_algo for one
                    rank's shard of the buffer over the nodes)
    intra_bits      hier: 0 (exact reduce-scatter inside a node) or 1..8
    rotation, rotation_block
                    "none", or "hadamard": every rank rotates its widened input in
                    blocks of rotation_block values (qnccl.emulate.rotation), the call
                    runs on the rotated values (residuals too), and the result is
                    rotated back before its store into the output type; or
                    "prerotated": inputs the caller rotated, on the uniform grid, with
                    nothing rotated
    clip            "none", or with a rotation "gaussian": every bucket's stored range
                    clipped (codec.clip_range; docs/rotation.md, "Clipped ranges")

    Returns the list of the N ranks' outputs (each of the inputs' shape and
    dtype; identical, as every rank decodes the same bytes), and with
    return_bounds also the float64 bound (inputs' shape) on |output - exact
    sum (or average)| described in the module docstring.
    """
    codec.check_config(bits, bucket_size, rounding)
    fields = rotated(rotation, rotation_block, clip)
    _checks.one_of("op", op, OPS)
    seed, call = _checks.uint64("seed", seed), _checks.uint64("call", call)
    segment_values = _checks.segment_values(segment_values)
    x, name, out_dtype, shape = _inputs(inputs, dtype)
    nranks, count = x.shape
    algo, hier = _plan(algo, nodes, inter_algo, intra_bits, count, name, nranks)
    if algo == "exact":
        return _exact(inputs, x, name, out_dtype, shape, op, return_bounds)
    cfg = _Config(nranks, bits, bucket_size, rounding, seed, call, op == "avg", return_bounds,
                  **fields)
    flat = e = None
    if residuals is not None:
        if return_bounds:
            raise ValueError("return_bounds is not available with residuals")
        flat = _residual_views(residuals, nranks, count)
        e = np.stack(flat) if nranks else np.empty((0, count), F32)
    y, bound = run(x, algo, cfg, segment_values, e, hier)
    if flat is not None:
        for r in range(nranks):
            flat[r][:] = e[r]
    out = codec.from_float32(y, name).view(out_dtype).reshape(shape)
    outputs = [out.copy() for _ in range(nranks)]
    if not return_bounds:
        return outputs
    rel, tiny = _STORE_SLACK[name]
    bound = bound + rel * np.abs(y.astype(np.float64)) + tiny
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(codec.to_float32(out.reshape(-1), name)) & np.isfinite(bound)
    return outputs, np.where(finite, bound, np.inf).reshape(shape)


def _exact(inputs, x, name, out_dtype, shape, op, return_bounds):
    """The hierarchical algorithm on one node crosses no node link: the call is the real
    library's exact allreduce, here the correctly rounded sum (or average), which the real
    library's own summation order may miss by its rounding; on one rank the input itself,
    bit for bit (avg: divided by 1 in float32)."""
    if len(inputs) == 1 and op == "sum":
        out = np.array(inputs[0], copy=True)
    elif len(inputs) == 1:  # the division by 1 quiets a signalling NaN
        with np.errstate(invalid="ignore"):
            out = codec.from_float32(x[0] / F32(1), name).view(out_dtype).reshape(shape)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            total = x.astype(np.float64).sum(axis=0)
            if op == "avg":
                total /= len(inputs)
        out = codec.from_float32(total.astype(F32), name).view(out_dtype).reshape(shape)
    outputs = [out.copy() for _ in range(len(inputs))]
    if not return_bounds:
        return outputs
    rel, tiny = _STORE_SLACK[name]
    add_rel, add_tiny = hierarchical._SUM_SLACK[name]  # each of its N - 1 additions
    with np.errstate(invalid="ignore", over="ignore"):
        y = codec.to_float32(out.reshape(-1), name).astype(np.float64)
        slack = (len(inputs) - 1) * (add_rel * np.abs(x).astype(np.float64).sum(axis=0)
                                     + add_tiny)
        bound = slack + rel * np.abs(y) + tiny
    return outputs, np.where(np.isfinite(y) & np.isfinite(bound), bound, np.inf).reshape(shape)


# ---- quantizations of rows of values --------------------------------------------------
# All virtual ranks at once: a quantization is D(Q(v)) evaluated straight from the formulas
# of codec.quantize and codec.decode (the wire bytes are a lossless packing of the metadata
# and codes, so the decoded values are the same bits). Chunks start on bucket boundaries, so
# quantizing a whole row of a segment bucket by bucket, with each chunk's own stream and
# positions counted from the chunk's start, is quantizing chunk by chunk.

_ROW_BLOCK_VALUES = 1 << 18  # values per block in _qd (cache-sized temporaries)


def _streams(call, segment, ranks, steps):
    """stream_id for arrays of ranks and steps (uint64), unchecked."""
    inner = mix64(mix64(np.uint64(call)) ^ np.uint64(segment))
    word = (np.asarray(ranks, np.uint64) << np.uint64(32)) | np.asarray(steps, np.uint64)
    return mix64(inner ^ word)


def _qd(v, ranks, steps, edges, cfg, segment):
    """D(Q(v)) of the float32 rows v (R x m, one segment), where row i's chunk c = values
    [edges[c], edges[c+1]) is quantized by rank ranks[i, c] with step steps[i, c]
    (ranks[i, c] = -1: not a quantization, the values there are not used)."""
    rows, m = v.shape
    out = np.empty_like(v)
    if m == 0 or rows == 0:
        return out
    bsz = cfg.bucket_size
    edges = np.asarray(edges, np.int64)
    position = np.arange(m, dtype=np.int64)
    cid = np.searchsorted(edges, position, side="right") - 1  # chunk of each position
    index = (position - edges[cid]).astype(np.uint32)  # position within its chunk
    keys = None
    if cfg.rounding == "stochastic":
        streams = _streams(cfg.call, segment, _stream_ranks(cfg, np.maximum(ranks, 0)),
                           cfg.step_base + np.asarray(steps))
        keys = codec.rng_key(cfg.seed, streams)  # R x C
    # blocks of whole buckets, about _ROW_BLOCK_VALUES values each (cache-sized temporaries)
    cols = min(m, max(bsz, _ROW_BLOCK_VALUES // bsz * bsz))
    block = max(1, _ROW_BLOCK_VALUES // cols)
    for r0 in range(0, rows, block):
        for c0 in range(0, m, cols):
            c1 = min(c0 + cols, m)
            k = None if keys is None else keys[r0:r0 + block][:, cid[c0:c1]]
            out[r0:r0 + block, c0:c1] = _qd_block(v[r0:r0 + block, c0:c1], k, index[c0:c1], cfg)
    return out


def _bucket_meta(x, bsz):
    """(lo, hi) of every bucket of the rows x (R x m, buckets from column 0), as the wire's
    metadata holds them: R x nb x 1 float32, NaN for a bucket holding NaN or Inf; and x
    padded to whole buckets (R x nb x bsz) with each row's last value."""
    nr, m = x.shape
    nb = -(-m // bsz)
    pad = nb * bsz - m
    if pad:  # pad the last bucket with its last value: min and max unchanged
        x = np.concatenate([x, np.repeat(x[:, -1:], pad, axis=1)], axis=1)
    x = x.reshape(nr, nb, bsz)
    with np.errstate(invalid="ignore"):
        nonfinite = ~np.isfinite(x).all(axis=2)
        lo = np.where(nonfinite, codec._NAN32, x.min(axis=2) + F32(0.0))[:, :, None]
        hi = np.where(nonfinite, codec._NAN32, x.max(axis=2) + F32(0.0))[:, :, None]
    return lo, hi, x


def _qd_block(x, keys, index, cfg):
    """D(Q(x)) of rows x (buckets from column 0); keys: rng_uniform's key of each value."""
    nr, m = x.shape
    lo, hi, x = _bucket_meta(x, cfg.bucket_size)
    lo, hi = codec.clip_range(lo, hi, cfg.clip_fraction())
    p = codec.bucket_params(lo, hi, cfg.bits, cfg.cubic)  # (nr, nb, 1): one per bucket
    u = None
    if keys is not None:
        u = codec.uniform_from_key(keys, index[None, :])  # index < 2^32
        pad = x.shape[1] * x.shape[2] - m
        if pad:
            u = np.concatenate([u, np.zeros((nr, pad), F32)], axis=1)
        u = u.reshape(x.shape)
    y = codec.decode_values(codec.encode_values(x, p, u), p)
    return y.reshape(nr, -1)[:, :m]


def _qbound(v, cfg):
    """Per value of the rows v (R x m, buckets from column 0): the most one quantization
    (and its decode) can move it (module docstring); NaN in a non-finite bucket."""
    nr, m = v.shape
    whole_lo, whole_hi, _ = _bucket_meta(v, cfg.bucket_size)
    lo, hi = codec.clip_range(whole_lo, whole_hi, cfg.clip_fraction())
    p = codec.bucket_params(lo, hi, cfg.bits, cfg.cubic)
    step = codec.grid_step(p)
    magnitude = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
    cut = np.maximum(whole_hi.astype(np.float64) - hi, lo - whole_lo.astype(np.float64))
    per_bucket = (step * (0.5 if cfg.rounding == "nearest" else 1.0) + cut
                  + _CODEC_REL_SLACK * magnitude + _CODEC_ABS_SLACK)
    return np.broadcast_to(per_bucket, (nr, lo.shape[1], cfg.bucket_size)).reshape(nr, -1)[:, :m]


def direct_sends(n):
    """(ranks, steps), N x N: rank j quantizes its chunk k with step k to send it straight to
    rank k (SRA's scatter, the direct reduce-scatter, all-to-all); its own chunk (j = k) is
    not sent (rank -1)."""
    j = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    return np.where(j == k, -1, np.broadcast_to(j, (n, n))), np.broadcast_to(k, (n, n))


def _dropped(v, y):
    """The residual of one quantization: v - D(Q(v)) in float32; 0 where that is not finite
    (a bucket holding NaN/Inf decodes to NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        e = v - y
    e[~np.isfinite(e)] = 0
    return e


def _added(acc, where=None):
    """The bound a float32 addition adds, from its result acc: u |acc| (where `where`)."""
    term = _U32 * np.abs(acc.astype(np.float64))
    return term if where is None else np.where(where, term, 0.0)


def _result(cfg, acc, acc_bound, ranks, steps, edges, segment, e, owner_of):
    """The owners' final quantization of the full sums acc (1 x m): avg, Q, and a zero
    residual (error feedback does not feed the result's error back); and the bound of the
    decoded result (None without bounds)."""
    if cfg.average:
        with np.errstate(invalid="ignore", over="ignore"):
            acc = acc / F32(cfg.nranks)
        if acc_bound is not None:
            acc_bound = acc_bound / cfg.nranks + 2.0**-150 + _added(acc)
    y = _qd(acc, ranks, steps, edges, cfg, segment)
    if e is not None:
        e[owner_of, np.arange(acc.shape[1])] = 0
    return y[0], None if acc_bound is None else (acc_bound + _qbound(acc, cfg))[0]


# ---- the three algorithms, one segment at a time ---------------------------------------
# Each takes the cfg, the segment's float32 inputs z (N x m: widen(x_r) + e_r), the segment
# number g, the residuals e (N x m float32, rewritten where a rank quantizes; None without
# error feedback) and the inputs' bounds zb (N x m float64, None without bounds), and
# returns the decoded result every rank outputs (m float32 values) and its bound.

def _ring(cfg, z, g, e=None, zb=None):
    """Chunk k starts at rank k and travels right: at step s rank (k+s) mod N quantizes it
    with stream (.., rank, s) and rank (k+s+1) mod N adds its own values; after N-1 hops rank
    (k-1) mod N owns the full sum and quantizes it with step N-1. The allgather forwards
    those bytes unchanged."""
    n, m = z.shape
    bounds = chunks(m, n, cfg.bucket_size)
    edges = [lo for lo, _ in bounds] + [m]
    k = np.arange(n)
    partial = np.empty((1, m), F32)
    pb = None if zb is None else np.empty((1, m))
    for c, (lo, hi) in enumerate(bounds):  # chunk c starts at rank c
        partial[0, lo:hi] = z[c, lo:hi]
        if pb is not None:
            pb[0, lo:hi] = zb[c, lo:hi]
    for s in range(n - 1):
        ranks = ((k + s) % n)[None, :]
        y = _qd(partial, ranks, np.full((1, n), s), edges, cfg, g)
        if pb is not None:
            pb += _qbound(partial, cfg)  # the message's bound
        if e is not None:
            dropped = _dropped(partial[0], y[0])
        with np.errstate(invalid="ignore", over="ignore"):
            for c, (lo, hi) in enumerate(bounds):
                if e is not None:
                    e[(c + s) % n, lo:hi] = dropped[lo:hi]
                np.add(z[(c + s + 1) % n, lo:hi], y[0, lo:hi], out=partial[0, lo:hi])
                if pb is not None:
                    pb[0, lo:hi] += zb[(c + s + 1) % n, lo:hi]
        if pb is not None:
            pb += _added(partial)
    cid = np.searchsorted(np.asarray(edges), np.arange(m), side="right") - 1
    ranks = ((k + n - 1) % n)[None, :]
    return _result(cfg, partial, pb, ranks, np.full((1, n), n - 1), edges, g, e,
                   (cid + n - 1) % n)


def _tree(cfg, z, g, e=None, zb=None):
    """Heap-ordered binary tree over the whole segment: rank r adds its children's decoded
    partial sums (lower child first) to its own values and sends Q(acc; step 0) to its
    parent; the root quantizes once with step 1."""
    n, m = z.shape
    edges = [0, m]
    decoded = [None] * n  # D(message) each non-root rank sends to its parent
    message_bound = [None] * n

    def gather(first, last):  # ranks [first, last) add their children's messages
        acc = z[first:last].copy()
        accb = None if zb is None else zb[first:last].copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for i, r in enumerate(range(first, last)):
                for child in (2 * r + 1, 2 * r + 2):
                    if child < n:
                        acc[i] += decoded[child]
                        if accb is not None:
                            accb[i] += message_bound[child] + _added(acc[i])
                        decoded[child] = message_bound[child] = None
        return acc, accb

    for level in range(n.bit_length() - 1, 0, -1):  # deepest level first; the root below
        first, last = (1 << level) - 1, min((1 << (level + 1)) - 1, n)
        acc, accb = gather(first, last)
        ranks = np.arange(first, last)[:, None]
        y = _qd(acc, ranks, np.zeros_like(ranks), edges, cfg, g)
        if e is not None:
            e[first:last] = _dropped(acc, y)
        qb = None if accb is None else accb + _qbound(acc, cfg)
        for i, r in enumerate(range(first, last)):
            decoded[r] = y[i]
            message_bound[r] = None if qb is None else qb[i]
    acc, accb = gather(0, 1)
    return _result(cfg, acc, accb, np.zeros((1, 1), np.int64), np.ones((1, 1), np.int64),
                   edges, g, e, np.zeros(m, np.int64))


def _sra(cfg, z, g, e=None, zb=None):
    """Rank j sends Q(z_j[chunk k]; stream step k) to owner k; the owner adds them to its
    own values in increasing j, quantizes the sum with step N and sends the bytes to
    everyone."""
    n, m = z.shape
    edges = [lo for lo, _ in chunks(m, n, cfg.bucket_size)] + [m]
    y = _qd(z, *direct_sends(n), edges, cfg, g)
    cid = np.searchsorted(np.asarray(edges), np.arange(m), side="right") - 1
    cols = np.arange(m)
    if e is not None:
        e[:] = _dropped(z, y)  # the own chunks are cleared by _result below
    acc = z[cid, cols].copy()  # owner k's values of chunk k
    accb = None
    if zb is not None:
        accb = zb[cid, cols].copy()
        message_bound = zb + _qbound(z, cfg)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(n):  # acc_k = acc_k + D(q_r) in increasing r, r != k
            np.add(acc, y[r], out=acc, where=cid != r)
            if accb is not None:
                accb += np.where(cid != r, message_bound[r], 0.0) + _added(acc, cid != r)
    del y
    return _result(cfg, acc[None, :], None if accb is None else accb[None, :],
                   np.arange(n)[None, :], np.full((1, n), n), edges, g, e, cid)


_ALGORITHMS = {"ring": _ring, "tree": _tree, "sra": _sra}


def run(x, algo, cfg, segment_values, residuals=None, hier=None):
    """The float32 result (n values) of the call on the widened inputs x (N x n) for every
    rank, and with cfg.bounds its bound (float64, before the store into the output type);
    with residuals (N x n float32, updated in place) the call runs with error feedback
    (docs/allreduce.md, Error feedback). A rotated call (cfg.rotation_block) rotates each
    segment of the inputs, runs on the rotated values (residuals in that domain), and
    rotates the segment's result back (docs/rotation.md)."""
    nranks, count = x.shape
    out = np.empty(count, F32)
    bound = np.zeros(count) if cfg.bounds else None
    block = cfg.rotation_block
    for g, (start, stop) in enumerate(segments(count, segment_values, cfg.bucket_size)):
        x_g = np.ascontiguousarray(x[:, start:stop])
        z = rot.rotate(x_g, block, cfg.seed) if block else x_g
        if hier is not None:  # its stages add the residuals
            e = None if residuals is None else residuals[:, start:stop]
            # rotated values are float32: so is the exact stage's sum inside a node
            dtype = "float32" if block else hier.dtype
            y, b = hierarchical.segment(z, dtype, cfg, g, hier.layout, hier.inter,
                                        hier.intra_bits, _ALGORITHMS, _qd, _qbound, _dropped, e)
        else:
            e = None
            if residuals is not None:
                with np.errstate(invalid="ignore", over="ignore"):
                    z = z + residuals[:, start:stop]  # z_r = widen(x_r) + e_r
                e = np.empty((nranks, stop - start), F32)
            zb = np.zeros(z.shape) if cfg.bounds else None
            y, b = _ALGORITHMS[algo](cfg, z, g, e, zb)
            if e is not None:
                residuals[:, start:stop] = e
        if block:
            if b is not None:
                b = rot.bound(b, x_g, y, block, cfg.average)
            y = rot.unrotate(y, block, cfg.seed)
        out[start:stop] = y
        if bound is not None:
            bound[start:stop] = b
    return out, bound
