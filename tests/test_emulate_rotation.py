"""The Hadamard rotation of the emulator (qnccl.emulate.rotation) against docs/rotation.md
executed literally, and the rotated collectives against their definition: rotate each piece,
run the call on the uniform grid, rotate back. No library needed."""
import importlib

import numpy as np
import pytest

from conftest import DTYPES, make_values, widen
from qnccl.emulate import codec as emu
from qnccl.emulate import rotation as rot
from qnccl.emulate.allreduce import _Config, _ring, _sra, _tree, allreduce, stream_id
from qnccl.emulate.collectives import allgather, alltoall, reduce_scatter, sendrecv
from qnccl.emulate.training import EmulatedAllReduce

ar = importlib.import_module("qnccl.emulate.allreduce")  # the module, not the function

F32 = np.float32
NAN32 = np.array(0x7FC00000, np.uint32).view(F32)
SEED = 11


# ---- the page, literally: one block at a time, one pair at a time ----------------------

def literal_blocks(n, block):
    """The page's cut: whole blocks, then one block per set bit of the remainder."""
    out, at = [], 0
    while n - at >= block:
        out.append((at, block))
        at += block
    size = block
    while at < n:
        size //= 2
        if (n - at) & size:
            out.append((at, size))
            at += size
    return out


def literal_signs(seed, n, block):
    """s[i] = -1 where bit 31 of hash32(...) of rng_uniform's word of i mod block is set."""
    key = int(emu.rng_key(np.uint64(seed), np.uint64(0x726F746174696F6E)))
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    out = np.empty(n, F32)
    for i in range(n):
        j = i % block
        h = int(emu._hash32(np.uint32((j * (k0 | 1) + k1) & 0xFFFFFFFF)))
        out[i] = -1.0 if h >> 31 else 1.0
    return out


def literal_butterfly(v):
    v = [F32(a) for a in v]
    h = 1
    while h < len(v):
        for j in range(len(v)):
            if not j & h:
                v[j], v[j + h] = v[j] + v[j + h], v[j] - v[j + h]
        h *= 2
    return v


def literal(x, block, seed, forward):
    x = np.asarray(x, F32)
    s = literal_signs(seed, x.size, block)
    out = np.empty_like(x)
    for start, b in literal_blocks(x.size, block):
        k = b.bit_length() - 1
        v = x[start:start + b]
        if forward:
            y = literal_butterfly([v[j] * s[start + j] for j in range(b)])
            out[start:start + b] = [a * F32(2.0 ** -((k + 1) // 2)) for a in y]
        else:
            y = literal_butterfly(v)
            out[start:start + b] = [a * F32(2.0 ** -(k // 2)) * s[start + j]
                                    for j, a in enumerate(y)]
    return out


def bits_of(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.mark.parametrize("count,block", [(1, 2), (7, 4), (64, 64), (100, 64), (1000, 256),
                                         (777, 8), (513, 2), (4096, 1024)])
def test_blocks_are_the_pages_cut(count, block):
    got = rot.blocks(count, block)
    assert got == literal_blocks(count, block)
    assert sum(b for _, b in got) == count
    assert all(a + b == c for (a, b), (c, _) in zip(got, got[1:]))


def test_signs_follow_the_seed_and_the_index_in_the_block_only():
    s = rot.signs(SEED, 3000, 4096)
    assert np.array_equal(s, literal_signs(SEED, 3000, 4096))
    assert set(np.unique(s)) == {-1.0, 1.0}
    assert abs(float(s.mean())) < 0.06  # 3000 fair signs: mean within ~3.3 sigma
    assert np.array_equal(rot.signs(SEED, 100, 4096), s[:100])  # a prefix of the same stream
    assert not np.array_equal(rot.signs(SEED + 1, 3000, 4096), s)
    # every block of 256 takes the first 256 signs again
    assert np.array_equal(rot.signs(SEED, 3000, 256), np.tile(s[:256], 12)[:3000])


@pytest.mark.parametrize("block", [2, 4, 8, 32, 256])
@pytest.mark.parametrize("count", [5, 256, 300, 1001])
def test_rotation_is_the_pages_transform_bit_for_bit(block, count):
    rng = np.random.default_rng(count * 7 + block)
    x = (rng.standard_normal(count) * 2.0 ** rng.integers(-30, 30, count)).astype(F32)
    y = rot.rotate(x[None], block, SEED)[0]
    assert np.array_equal(bits_of(y), bits_of(literal(x, block, SEED, True)))
    back = rot.unrotate(y[None], block, SEED)[0]
    assert np.array_equal(bits_of(back), bits_of(literal(y, block, SEED, False)))


@pytest.mark.parametrize("block", [2, 16, 128, 1024])
def test_small_integers_rotate_linearly_and_back_exactly(block):
    # sums of small integers and power-of-two scales are exact in float32: the rotation's
    # linearity (what lets every rank's rotated piece add up) and the inverse hold bit for bit
    rng = np.random.default_rng(block)
    a = rng.integers(-1000, 1000, (3, 2500)).astype(F32)
    ra = rot.rotate(a, block, SEED)
    assert np.array_equal(rot.unrotate(ra, block, SEED), a)
    assert np.array_equal(rot.rotate(a.sum(axis=0), block, SEED), ra.sum(axis=0))


def test_rotation_keeps_the_norm_of_even_blocks_and_spreads_a_spike():
    x = np.zeros(1024, F32)
    x[5] = 64.0
    y = rot.rotate(x, 256, SEED)
    assert np.all(np.abs(y[:256]) == 4.0)  # the spike over its whole block: 64 / sqrt(256)
    assert np.all(y[256:] == 0)
    y2 = rot.rotate(x, 128, SEED)  # k = 7: norm scaled by 1/sqrt(2)
    assert np.all(np.abs(y2[:128]) == 4.0)


def test_a_non_finite_value_poisons_its_block_only():
    x = np.ones(512, F32)
    x[300] = np.inf
    y = rot.rotate(x, 256, SEED)
    assert np.isfinite(y[:256]).all() and np.isinf(y[256:]).all()
    x[300] = np.nan
    y = rot.rotate(x, 256, SEED)
    assert np.isfinite(y[:256]).all() and np.isnan(y[256:]).all()
    back = rot.unrotate(y, 256, SEED)  # the inverse's NaNs are the canonical one
    assert np.all(back[256:].view(np.uint32) == 0x7FC00000)


def test_an_empty_segment_rotates_to_nothing():
    assert rot.rotate(np.zeros((3, 0), F32), 256, SEED).shape == (3, 0)
    assert emu.quantize(np.zeros(0, F32), 4, 128, "nearest", rotation="hadamard").size == 0


@pytest.mark.parametrize("rotation,block,match", [
    ("hadamrd", 256, "rotation must be one of none, hadamard, prerotated"),
    ("hadamard", 100, r"power of two in 2\.\.16384, got 100"),
    ("hadamard", 1, r"power of two in 2\.\.16384, got 1"),
    ("hadamard", 1 << 15, r"power of two in 2\.\.16384, got 32768"),
    ("hadamard", True, r"power of two in 2\.\.16384, got a bool \(True\)"),
    ("hadamard", 256.0, r"power of two in 2\.\.16384, got a float \(256\.0\)")])
def test_bad_settings_are_refused_with_what_is_allowed(rotation, block, match):
    error = TypeError if isinstance(block, (bool, float)) else ValueError
    with pytest.raises(error, match=match):
        allreduce([np.ones(8, F32)] * 2, rotation=rotation, rotation_block=block)
    with pytest.raises(error, match=match):
        allgather([np.ones(8, F32)] * 2, rotation=rotation, rotation_block=block)


def test_uniform_grid_on_mixed_signs():
    # grid="uniform": a bucket of both signs decodes onto min + q * (max - min) / L
    x = np.linspace(-1, 3, 256).astype(F32)
    y = emu.decode(emu.quantize(x, 4, 256, "nearest", grid="uniform"), 256, 4, 256,
                   grid="uniform")
    q = (y.astype(np.float64) + 1) / (4 / 15)
    assert np.allclose(q, np.round(q), atol=1e-4) and np.abs(y - x).max() <= 2 / 15 + 1e-6
    cubic = emu.decode(emu.quantize(x, 4, 256, "nearest"), 256, 4, 256)
    assert not np.array_equal(cubic, y)
    with pytest.raises(ValueError, match="grid must be one of auto, uniform"):
        emu.quantize(x, 4, 256, "nearest", grid="cubic")


# ---- the rotated collectives: their definition, on the emulator's own primitives ----------

def rank_inputs(rng, n, count, dtype, bucket):
    return [make_values(rng, count, dtype, bucket, specials=False) for _ in range(n)]


@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_rotated_allreduce_is_the_unrotated_call_on_rotated_segments(algo, dtype, op):
    # segments of 640 values: each rotates on its own, in blocks 256, 256, 128
    rng = np.random.default_rng(3)
    n, count, block, bucket, w = 3, 1500, 256, 128, 640
    inputs = rank_inputs(rng, n, count, dtype, bucket)
    outs = allreduce(inputs, algo=algo, bits=4, bucket_size=bucket, seed=SEED, op=op, call=5,
                     dtype=dtype, segment_values=w, rotation="hadamard", rotation_block=block)
    x = np.stack([emu.to_float32(np.asarray(a).reshape(-1), dtype) for a in inputs])
    y = np.empty(count, F32)
    for g, a in enumerate(range(0, count, w)):
        b = min(a + w, count)
        rx = np.stack([literal(r[a:b], block, SEED, True) for r in x])
        cfg = _Config(n, 4, bucket, "stochastic", SEED, 5, op == "avg", False, cubic=False)
        algorithm = {"ring": _ring, "tree": _tree, "sra": _sra}[algo]
        y[a:b] = literal(algorithm(cfg, rx, g)[0], block, SEED, False)
    want = emu.from_float32(y, dtype)
    for out in outs:
        assert np.array_equal(np.asarray(out).reshape(-1).view(want.dtype), want)


@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotated_allreduce_keeps_its_error_bound(algo, op, dtype):
    rng = np.random.default_rng(4)
    n, count, block = 4, 3000, 256  # a tail of 184 values: blocks 128, 32, 16, 8
    inputs = rank_inputs(rng, n, count, dtype, 128)
    outs, bound = allreduce(inputs, algo=algo, bits=3, op=op, seed=SEED, dtype=dtype,
                            rotation="hadamard", rotation_block=block, return_bounds=True)
    exact = sum(widen(a, dtype) for a in inputs) / (n if op == "avg" else 1)
    err = np.abs(widen(outs[0], dtype) - exact)
    finite = np.isfinite(bound)
    assert finite.mean() > 0.9
    assert np.all(err[finite] <= bound[finite])


@pytest.mark.parametrize("block", [2, 32, 256, 4096])
def test_rotation_rounding_bound_covers_a_round_trip(block):
    # one rank whose "algorithm" returns its rotated row exactly: the rotated bound is 0,
    # so rot.bound must cover the forward and inverse rotations' own rounding alone
    rng = np.random.default_rng(block)
    x = (rng.standard_normal(5000) * 2.0 ** rng.integers(-40, 40, 5000)).astype(F32)[None]
    y = rot.rotate(x, block, SEED)[0]
    back = rot.unrotate(y, block, SEED)
    err = np.abs(back.astype(np.float64) - x[0])
    bound = rot.bound(np.zeros(5000), x, y, block, False)
    assert np.all(err <= bound)
    assert err.max() > 0  # the round trip does round: the bound is not vacuous here


def test_rotation_lowers_the_error_on_heavy_tailed_gradients():
    # student-t(3) coordinates, a gradient-like tail: at 4 bits the rotated call's relative
    # L2 error is at least 25% below the cubic grid's (docs/rotation.md: 29-34% measured)
    rng = np.random.default_rng(5)
    inputs = [rng.standard_t(3, 1 << 15).astype(F32) for _ in range(8)]
    exact = np.mean(np.stack(inputs).astype(np.float64), axis=0)

    def rel(**kw):
        y = allreduce(inputs, algo="sra", bits=4, op="avg", seed=SEED, **kw)[0]
        return np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert rel(rotation="hadamard", rotation_block=256) < 0.75 * rel()


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
def test_error_feedback_pays_back_in_the_rotated_domain(monkeypatch, rounding, algo):
    # Every quantization of a send drops v - D(Q(v)) into its rank's residual, and the next
    # call adds it back; the owners' result quantizations drop d (not fed back). So over T
    # calls of one gradient (avg) the outputs add up to T times the exact mean less the mean
    # of the last residuals and of the d's, rotated back: both live in the rotated domain.
    # Only float32 rounding remains, far below one call's error.
    dropped, result = {}, ar._result

    def recording_result(cfg, acc, acc_bound, ranks, steps, edges, segment, *rest):
        y, bound = result(cfg, acc, acc_bound, ranks, steps, edges, segment, *rest)
        n = cfg.nranks if cfg.average else 1  # N * (acc / N) is acc, to rounding
        d = acc[0].astype(np.float64) - n * y.astype(np.float64)
        dropped[segment] = dropped.get(segment, 0) + d
        return y, bound

    monkeypatch.setattr(ar, "_result", recording_result)
    rng = np.random.default_rng(6)
    x = rng.standard_t(3, (4, 4096)).astype(F32)
    exact = x.astype(np.float64).mean(axis=0)
    comm = EmulatedAllReduce(4, algo=algo, bits=2, rounding=rounding, seed=SEED,
                             error_feedback=True, rotation="hadamard", rotation_block=64)
    outputs = [comm(x).astype(np.float64) for _ in range(8)]
    one = np.linalg.norm(outputs[0] - exact)
    results = np.concatenate([dropped[g] for g in sorted(dropped)])
    owed = (comm.residuals["default"].astype(np.float64).sum(axis=0) + results) / 4
    back = rot.unrotate(owed.astype(F32), 64, SEED).astype(np.float64)
    gap = np.linalg.norm(sum(outputs) - 8 * exact + back)
    assert gap < 1e-3 * one, (gap, one)
    unrotated = np.linalg.norm(sum(outputs) - 8 * exact + owed)  # the wrong domain
    assert unrotated > 0.1 * one


def test_rotated_reduce_scatter_is_its_definition():
    rng = np.random.default_rng(7)
    n, recv, block, bucket, w = 3, 700, 128, 64, 320  # segments 320, 320, 60 of each chunk
    inputs = rank_inputs(rng, n, n * recv, "float32", bucket)
    outs = reduce_scatter(inputs, algo="sra", bits=4, bucket_size=bucket, seed=SEED, op="avg",
                          call=2, segment_values=w, rotation="hadamard", rotation_block=block)
    for k in range(n):
        want = []
        for g, a in enumerate(range(0, recv, w)):
            b = min(a + w, recv)
            chunks = [literal(inputs[r][k * recv + a:k * recv + b], block, SEED, True)
                      for r in range(n)]
            acc = chunks[k].copy()
            for r in range(n):
                if r != k:
                    wire = emu.quantize(chunks[r], 4, bucket, "stochastic", SEED,
                                        stream_id(2, g, r, k), grid="uniform")
                    acc = acc + emu.decode(wire, b - a, 4, bucket, grid="uniform")
            want.append(literal(acc / F32(n), block, SEED, False))
        assert np.array_equal(bits_of(outs[k]), bits_of(np.concatenate(want))), k


def test_rotated_allgather_alltoall_and_send_are_their_definition():
    rng = np.random.default_rng(8)
    n, count, block, bucket = 3, 300, 64, 128
    inputs = rank_inputs(rng, n, n * count, "float32", bucket)

    def trip(values, stream):
        wire = emu.quantize(literal(values, block, SEED, True), 4, bucket, "stochastic", SEED,
                            stream, grid="uniform")
        return literal(emu.decode(wire, values.size, 4, bucket, grid="uniform"), block, SEED,
                       False)
    kw = dict(bits=4, bucket_size=bucket, seed=SEED, rotation="hadamard", rotation_block=block)
    gathered = allgather(inputs, call=1, **kw)
    want = np.concatenate([trip(inputs[r], stream_id(1, 0, r, 0)) for r in range(n)])
    assert all(np.array_equal(bits_of(g), bits_of(want)) for g in gathered)
    exchanged = alltoall(inputs, call=4, **kw)
    for k in range(n):
        for j in range(n):
            piece = inputs[j][k * count:(k + 1) * count]
            want = piece if j == k else trip(piece, stream_id(4, 0, j, k))
            assert np.array_equal(bits_of(exchanged[k][j * count:(j + 1) * count]),
                                  bits_of(want)), (k, j)
    got = sendrecv(inputs[0], 0, 2, n, call=3, index=1, **kw)
    assert np.array_equal(bits_of(got), bits_of(trip(inputs[0], stream_id(
        (1 << 63) | 3, 0, 0, 2 + n * 1))))


def test_adaptive_widths_are_not_taken_with_a_rotation():
    from qnccl.emulate.adaptive import AdaptiveBits
    policy = AdaptiveBits({"w": 1000}, bits=4, bucket_size=128)
    with pytest.raises(ValueError, match="adaptive widths are chosen from unrotated errors"):
        EmulatedAllReduce(2, adaptive=policy, rotation="hadamard")
