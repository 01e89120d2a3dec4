"""Randomized Hadamard rotation of a collective's pieces: docs/rotation.md in numpy.

    y = rotate(x, block=256, seed=7)       # rows of float32 values, each rotated
    x2 = unrotate(y, block=256, seed=7)    # x again (up to float32 rounding)

Each segment of a piece (an allreduce's buffer; a reduce-scatter's, allgather's or
all-to-all's per-rank chunk; a send's message) rotates on its own: its n values are cut into
blocks from its start, n // B blocks of B values, then the remainder n mod B as blocks of its
binary digits, largest first (100 = 64 + 32 + 4). A block of b = 2^k values rotates as

    forward   y = 2^-ceil(k/2)  * H_b (s * x)
    inverse   x = 2^-floor(k/2) * s * (H_b y)

with s[i] = -1 where bit 31 of the random word of rng_uniform(seed, ROTATION_STREAM, i mod B)
is set (i: the value's index in the segment), else +1 (the signs repeat every B values), and
H_b the unnormalized Walsh-Hadamard butterfly: for h = 1, 2, 4, .., b/2, every pair (j, j + h)
with bit h of j clear becomes (v[j] + v[j+h], v[j] - v[j+h]), float32. The two scales multiply to 1/b, so the inverse
undoes the forward exactly in real arithmetic; being powers of two they round nothing (bar
subnormals). A NaN the inverse leaves is the canonical NaN. The signs depend on the seed and
the position only, never on the rank or the call: every rank rotates alike, sums of rotated
pieces are rotated sums, and error feedback's residuals stay in one rotated domain from call
to call.
"""
from __future__ import annotations

import numpy as np

from .. import _checks
from . import codec

F32 = np.float32
# "prerotated": the caller rotated the values (qnccl.torch's hook rotates each segment itself):
# every bucket on the uniform grid, as a rotated call's, with nothing rotated here
ROTATIONS = _checks.ROTATIONS  # ("none", "hadamard", "prerotated")
MIN_BLOCK, MAX_BLOCK = _checks.MIN_ROTATION_BLOCK, _checks.MAX_ROTATION_BLOCK  # 2, 16384
DEFAULT_BLOCK = _checks.DEFAULT_ROTATION_BLOCK  # 256
ROTATION_STREAM = 0x726F746174696F6E  # "rotation" in ASCII: the signs' random stream


def check(rotation, block, rotations=ROTATIONS):
    """ValueError (TypeError for a wrong type) unless (rotation, block) is a valid setting,
    rotation one of `rotations`."""
    _checks.rotation(rotation, rotations)
    _checks.rotation_block(block)


def blocks(count, block):
    """The (start, size) of each block of a piece of `count` values."""
    full = count // block
    out = [(j * block, block) for j in range(full)]
    at, rest = full * block, count % block
    size = block // 2
    while rest:
        if rest & size:
            out.append((at, size))
            at += size
            rest -= size
        size //= 2
    return out


def signs(seed, count, block):
    """s[0..count) of a segment in blocks of `block`: +1 or -1 as float32."""
    key = codec.rng_key(np.uint64(seed), np.uint64(ROTATION_STREAM))
    u = codec.uniform_from_key(key, np.arange(count, dtype=np.uint64) % np.uint64(block))
    return np.where(u >= F32(0.5), F32(-1), F32(1))  # u >= 1/2: bit 31 of the word


def _butterfly(v, size):
    """H_size on the last axis of v (..., m * size): every size-block, float32."""
    lead = v.shape[:-1]
    h = 1
    while h < size:
        t = v.reshape(*lead, -1, 2, h)
        a, b = t[..., 0, :], t[..., 1, :]
        v = np.stack((a + b, a - b), axis=-2).reshape(*lead, -1)
        h *= 2
    return v


def _apply(x, block, seed, forward, what):
    source, x = x, np.asarray(x)
    if x.dtype != F32:
        raise ValueError(f"{what} must be a float32 array (rotation works on float32 values), "
                         f"got {_checks.describe(source)}")
    _checks.rotation_block(block, name="block")
    if x.size == 0:
        return x.copy()
    flat = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    n = flat.shape[-1]
    s = signs(seed, n, block)
    out = np.empty_like(flat)
    with np.errstate(invalid="ignore", over="ignore"):
        for start, length, size in _runs(n, block):
            k = size.bit_length() - 1
            span = slice(start, start + length)
            v = flat[:, span]
            scale = F32(2.0 ** -((k + 1) // 2 if forward else k // 2))
            if forward:
                out[:, span] = _butterfly(v * s[span], size) * scale
            else:
                out[:, span] = _butterfly(v, size) * scale * s[span]
    if not forward:  # whatever NaN the butterfly kept, the canonical one
        out[np.isnan(out)] = codec._NAN32
    return out.reshape(x.shape)


def _runs(count, block):
    """(start, length, block size) of runs of equal blocks: the full blocks as one run."""
    full = count // block
    head = [(0, full * block, block)] if full else []
    return head + [(start, size, size) for start, size in blocks(count, block)[full:]]


def rotate(x, block, seed):
    """The forward rotation of each row (last axis) of float32 `x`, as a new array."""
    return _apply(x, block, seed, True, "x")


def unrotate(y, block, seed):
    """The inverse rotation of each row (last axis) of float32 `y`, as a new array."""
    return _apply(y, block, seed, False, "y")


_U32 = 2.0**-24
_TINY = 2.0**-150  # a power-of-two scale rounding into the subnormals


def bound(rotated_bound, x, y, block, average):
    """The bound on |unrotate(y) - exact sum (avg: mean) of the unrotated inputs| from the
    rotated domain's: `rotated_bound` (n values) bounds |y - exact sum of the rotated rows of
    x| (x: N x n float32, the widened inputs before rotation; y: the rotated result). Adds
    each rank's forward rotation rounding and the inverse's: a butterfly of depth k moves
    an output by at most ((1 + u)^k - 1) times the sum of its block's magnitudes, and the
    inverse maps an error e of a block to at most 2^-floor(k/2) sum |e| per value."""
    nranks, n = x.shape
    ax = np.abs(x.astype(np.float64))
    ay = np.abs(y.astype(np.float64))
    out = np.empty(n)
    for start, length, size in _runs(n, block):
        k = size.bit_length() - 1
        grow = k * _U32 / (1 - k * _U32)  # gamma_k: bounds (1 + u)^k - 1 from above
        fwd, inv = 2.0 ** -((k + 1) // 2), 2.0 ** -(k // 2)
        m = length // size
        span = slice(start, start + length)
        forward = (fwd * grow * ax[:, span].reshape(nranks, m, size).sum(axis=2)
                   + _TINY).sum(axis=0)  # each rank's rotation rounding, per block
        if average:
            forward /= nranks
        total = rotated_bound[span].reshape(m, size).sum(axis=1) + size * forward
        rounding = grow * ay[span].reshape(m, size).sum(axis=1)
        out[span] = np.repeat(inv * (total + rounding) + _TINY, size)
    return out
