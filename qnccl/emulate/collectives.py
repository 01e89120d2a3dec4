"""Numpy emulation of QNCCL's quantized reduce-scatter, allgather and all-to-all
(docs/collectives.md) on N virtual ranks:

    outs = reduce_scatter([x0, x1, x2, x3], algo="sra", bits=4)   # x_r: 4 * recvcount values
    outs = allgather([x0, x1, x2, x3], bits=8)                    # every rank: 4 * sendcount
    outs = alltoall([x0, x1, x2, x3], bits=4)                     # x_r: 4 * count per peer

Like qnccl.emulate.allreduce, every virtual rank does what a real one does: the same
segments, the same quantizations with the same random streams
(stream(call, segment, rank, step)), the same float32 additions in the same order. A
collective's buffer holds one chunk per rank (chunk k: values [k*count, (k+1)*count));
segment g is values [g*W, (g+1)*W) of every chunk (W as for allreduce), and every
quantized piece is quantized from its own first value on, buckets included.

    reduce-scatter  owner k's output is the sum of every rank's chunk k.
        sra:  rank j != k quantizes its chunk k (step k) and sends it to k; k adds the
              decoded pieces to its own values, in increasing j.
        ring: chunk k's partial sum starts at rank k+1 and travels right: at hop s rank
              (k+1+s) mod N quantizes it (step s) and the next rank adds its own values
              to the decoded bytes; after N-1 hops the owner k holds the sum.
        avg divides the float32 sum by N; the result is stored in the data type (a NaN
        sum as the canonical NaN).
    allgather       rank r quantizes its input once (step 0); every rank, itself
        included, decodes every rank's bytes, so all outputs are the same bytes.
    all-to-all      rank j quantizes its chunk k (step k) for every k != j and rank k
        decodes it into its chunk j; a rank's own chunk is copied exactly.
    send/receive    a quantized ncclSend of point-to-point call c quantizes each segment
        with stream(P2P_CALL | c, g, rank, peer + N * i), its i-th send to that peer in
        the call; a group's sends and receives on a communicator are one call, c counts
        them per rank. PyTorch's all-to-all (a group of ncclSend/ncclRecv to and from
        every rank) is alltoall(call=P2P_CALL | c).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import _checks
from . import codec, rotation as rot
from .allreduce import AUTO_SRA_MAX_RANKS, F32, OPS, _Config, _inputs, _qd, direct_sends, segments

REDUCE_SCATTER_ALGOS = ("ring", "sra")
P2P_CALL = 1 << 63  # the `call` bit of point-to-point calls' random streams


def auto_reduce_scatter_algo(nranks):
    """The algorithm qncclAlgoAuto runs for a reduce-scatter: SRA's direct sends up to
    16 ranks (every contribution quantized once), the ring beyond."""
    nranks = _checks.integer("nranks", nranks, 1)
    return "sra" if nranks <= AUTO_SRA_MAX_RANKS else "ring"


def _chunked(inputs, dtype, what):
    """(N x N x count float32 inputs, codec type name, storage dtype, the raw inputs as
    N x N*count storage values): every rank's input holds one chunk per rank."""
    x, name, out_dtype, _ = _inputs(inputs, dtype)
    n, total = x.shape
    if total % n:
        raise ValueError(f"every rank's input must hold N * {what} values (N = {n}), got "
                         f"{total}")
    raw = np.stack([np.ascontiguousarray(np.asarray(a)).reshape(-1) for a in inputs])
    return x.reshape(n, n, total // n), name, out_dtype, raw.view(codec.storage_dtype(name))


def _common(bits, bucket_size, rounding, seed, call, segment_values, rotation, rotation_block,
            clip, op="sum"):
    """The checked seed and call, and the call's _Rotation."""
    codec.check_config(bits, bucket_size, rounding)
    _checks.segment_values(segment_values)
    rot.check(rotation, rotation_block)
    codec.check_clip(clip, rotation)
    _checks.one_of("op", op, OPS)
    seed = _checks.uint64("seed", seed)
    turn = _Rotation(rotation, rotation_block, seed, clip)
    return seed, _checks.uint64("call", call), turn


class _Rotation:
    """A call's rotation, or none: of each segment [a, b) of its pieces (the last axis)."""

    def __init__(self, rotation, block, seed, clip):
        self.on, self.block, self.seed = rotation == "hadamard", block, seed
        self.cubic = rotation == "none"  # "prerotated": the uniform grid, nothing rotated here
        self.clip = clip  # the rotated buckets' ranges (codec.CLIPS)

    def forward(self, x):
        return rot.rotate(np.ascontiguousarray(x), self.block, self.seed) if self.on else x

    def inverse(self, y):
        return rot.unrotate(np.ascontiguousarray(y), self.block, self.seed) if self.on else y


def _quantize_pieces(cfg, pieces, ranks, steps, g):
    """D(Q(piece)) of every piece (P x m float32, each quantized from its start) by
    ranks[p] with step steps[p] (rank -1: not quantized, the result unused)."""
    p, m = pieces.shape
    return _qd(np.ascontiguousarray(pieces), np.asarray(ranks).reshape(p, 1),
               np.asarray(steps).reshape(p, 1), [0, m], cfg, g)


def _rs_sra(cfg, z, g):
    n, _, m = z.shape
    y = _quantize_pieces(cfg, z.reshape(n * n, m), *direct_sends(n), g)
    y = y.reshape(n, n, m)
    owners = np.arange(n)
    acc = z[owners, owners].copy()  # owner k's own chunk k
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(n):  # acc_k = acc_k + D(q_r,k) in increasing r, r != k
            others = owners != r
            acc[others] += y[r, others]
    return acc


def _rs_ring(cfg, z, g):
    n, _, m = z.shape
    k = np.arange(n)
    partial = z[(k + 1) % n, k].copy()  # chunk k starts at rank k + 1
    with np.errstate(invalid="ignore", over="ignore"):
        for s in range(n - 1):
            y = _quantize_pieces(cfg, partial, (k + 1 + s) % n, np.full(n, s), g)
            partial = z[(k + 2 + s) % n, k] + y
    return partial


_REDUCE_SCATTER = {"ring": _rs_ring, "sra": _rs_sra}


def reduce_scatter(inputs: Sequence[np.ndarray], algo: str = "auto", bits: int = 4,
                   bucket_size: int = 128, rounding: str = "stochastic", seed: int = 0,
                   op: str = "sum", call: int = 0, segment_values: int = 0, dtype=None,
                   rotation: str = "none", rotation_block: int = rot.DEFAULT_BLOCK,
                   clip: str = "none"):
    """What a quantized ncclReduceScatter returns on every rank: rank k's recvcount values,
    the sum (or average) of chunk k of every rank's input (N * recvcount values each, one
    dtype: float32, float16, bfloat16). algo: "ring", "sra" or "auto"
    (auto_reduce_scatter_algo); the other arguments as for allreduce (a rotation rotates
    each chunk on its own, and each owner rotates its result back; clip="gaussian" clips the
    rotated buckets' ranges)."""
    seed, call, turn = _common(bits, bucket_size, rounding, seed, call, segment_values, rotation,
                               rotation_block, clip, op)
    z, name, out_dtype, _ = _chunked(inputs, dtype, "recvcount")
    n, _, count = z.shape
    if algo == "auto":
        algo = auto_reduce_scatter_algo(n)
    _checks.one_of("algo", algo, ("auto", *REDUCE_SCATTER_ALGOS))
    cfg = _Config(n, bits, bucket_size, rounding, seed, call, op == "avg", False,
                  cubic=turn.cubic, clip=turn.clip)
    out = np.empty((n, count), F32)
    spans = segments(count, segment_values, bucket_size)
    for g, (a, b) in enumerate(spans):
        out[:, a:b] = _REDUCE_SCATTER[algo](cfg, turn.forward(z[:, :, a:b]), g)
    if op == "avg":
        with np.errstate(invalid="ignore", over="ignore"):
            out /= F32(n)
    for a, b in spans:
        out[:, a:b] = turn.inverse(out[:, a:b])
    out[np.isnan(out)] = codec._NAN32  # accumulate's canonical NaN
    return [codec.from_float32(out[r], name).view(out_dtype) for r in range(n)]


def allgather(inputs: Sequence[np.ndarray], bits: int = 4, bucket_size: int = 128,
              rounding: str = "stochastic", seed: int = 0, call: int = 0,
              segment_values: int = 0, dtype=None, rotation: str = "none",
              rotation_block: int = rot.DEFAULT_BLOCK, clip: str = "none"):
    """What a quantized ncclAllGather returns on every rank: rank r's sendcount values
    quantized once and decoded, in rank order (N * sendcount values, the same bytes on
    every rank; with a rotation, each rank's piece rotated and every decoded one rotated
    back)."""
    seed, call, turn = _common(bits, bucket_size, rounding, seed, call, segment_values, rotation,
                               rotation_block, clip)
    x, name, out_dtype, _ = _inputs(inputs, dtype)
    n, count = x.shape
    cfg = _Config(n, bits, bucket_size, rounding, seed, call, False, False, cubic=turn.cubic,
                  clip=turn.clip)
    out = np.empty((n, count), F32)
    for g, (a, b) in enumerate(segments(count, segment_values, bucket_size)):
        out[:, a:b] = turn.inverse(_quantize_pieces(cfg, turn.forward(x[:, a:b]), np.arange(n),
                                                    np.zeros(n, np.int64), g))
    gathered = codec.from_float32(out.reshape(-1), name).view(out_dtype)
    return [gathered.copy() for _ in range(n)]


def alltoall(inputs: Sequence[np.ndarray], bits: int = 4, bucket_size: int = 128,
             rounding: str = "stochastic", seed: int = 0, call: int = 0,
             segment_values: int = 0, dtype=None, rotation: str = "none",
             rotation_block: int = rot.DEFAULT_BLOCK, clip: str = "none"):
    """What a quantized ncclAlltoAll returns on every rank: rank k's chunk j is rank j's
    chunk k (count values each), quantized by j and decoded by k; its own chunk exact
    (with a rotation, each sent chunk rotated and each received one rotated back)."""
    seed, call, turn = _common(bits, bucket_size, rounding, seed, call, segment_values, rotation,
                               rotation_block, clip)
    z, name, out_dtype, raw = _chunked(inputs, dtype, "count")
    n, _, count = z.shape
    cfg = _Config(n, bits, bucket_size, rounding, seed, call, False, False, cubic=turn.cubic,
                  clip=turn.clip)
    ranks, steps = direct_sends(n)
    y = np.empty((n, n, count), F32)  # [sender j, chunk k]
    for g, (a, b) in enumerate(segments(count, segment_values, bucket_size)):
        pieces = turn.forward(z[:, :, a:b].reshape(n * n, b - a))
        y[:, :, a:b] = turn.inverse(_quantize_pieces(cfg, pieces, ranks, steps, g)
                                    ).reshape(n, n, b - a)
    stored = codec.from_float32(y.transpose(1, 0, 2).reshape(-1), name).reshape(n, n, count)
    raw = raw.reshape(n, n, count)
    for r in range(n):
        stored[r, r] = raw[r, r]  # a rank's own chunk is copied, bit for bit
    return [stored[r].reshape(-1).view(out_dtype) for r in range(n)]


def sendrecv(x: np.ndarray, rank: int, peer: int, nranks: int, call: int = 0, index: int = 0,
             bits: int = 4, bucket_size: int = 128, rounding: str = "stochastic",
             seed: int = 0, segment_values: int = 0, dtype=None, rotation: str = "none",
             rotation_block: int = rot.DEFAULT_BLOCK, clip: str = "none"):
    """What a quantized ncclRecv on `peer` receives when `rank` (of `nranks`) sends x with
    ncclSend in its point-to-point call `call` (counted from 0 per rank and
    communicator), as its index-th send to that peer in the call (with a rotation: the
    message rotated, the received one rotated back)."""
    seed, call, turn = _common(bits, bucket_size, rounding, seed, call, segment_values, rotation,
                               rotation_block, clip)
    nranks = _checks.integer("nranks", nranks, 1)
    rank = _checks.integer("rank", rank, 0, nranks - 1)
    peer = _checks.integer("peer", peer, 0, nranks - 1)
    index = _checks.integer("index", index, 0)
    if peer == rank:
        raise ValueError("a send to the rank itself is not quantized: it is copied exactly")
    x1, name, out_dtype, _ = _inputs([x], dtype, "x")
    cfg = _Config(nranks, bits, bucket_size, rounding, seed, P2P_CALL | call, False, False,
                  cubic=turn.cubic, clip=turn.clip)
    out = np.empty(x1.shape[1], F32)
    for g, (a, b) in enumerate(segments(x1.shape[1], segment_values, bucket_size)):
        out[a:b] = turn.inverse(_quantize_pieces(cfg, turn.forward(x1[:, a:b]), [rank],
                                                 [peer + nranks * index], g))[0]
    return codec.from_float32(out, name).view(out_dtype)
