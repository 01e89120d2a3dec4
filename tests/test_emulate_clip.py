"""Clipped ranges for rotated buckets (docs/rotation.md, "Clipped ranges") in the emulator:
the fraction's rule and the clip's, executed literally; what clipping buys on Gaussian buckets
against Max's optimum; values past a clipped range; the clipped collectives against their
definition and their error bound. No library needed."""
import dataclasses

import numpy as np
import pytest

from conftest import DTYPES, from_float32, widen
from qnccl.emulate import codec as emu
from qnccl.emulate.allreduce import _Config, _sra, allreduce
from qnccl.emulate.collectives import allgather, reduce_scatter
from qnccl.emulate.training import EmulatedAllReduce

F32 = np.float32
SEED = 11
# the outermost level (in standard deviations) of the MSE-optimal 2^b-level uniform quantizer
# of a standard Gaussian, and that quantizer's mean squared error (Max, "Quantizing for
# minimum distortion"; recomputed by numerical integration)
MAX_LEVEL = {1: 0.7979, 2: 1.4935, 3: 2.0511, 4: 2.5140}
MAX_MSE = {1: 0.3634, 2: 0.1188, 3: 0.03744, 4: 0.01154}
# E[max |x_i|] of n standard Gaussians
LARGEST = {1: 0.797885, 64: 2.596111, 128: 2.827558, 256: 3.044225, 1024: 3.441870}


@pytest.mark.parametrize("bits,bucket", [(1, 64), (2, 128), (3, 128), (4, 1024), (2, 1)])
def test_fraction_is_the_gaussian_optimum_over_the_expected_largest(bits, bucket):
    f = emu.clip_fraction("gaussian", bits, bucket)
    want = MAX_LEVEL[bits] / LARGEST[bucket]
    assert f == F32(want) if want < 1 else f == 0


def test_fraction_interpolates_between_powers_of_two_and_stops_at_two_to_the_32():
    between = emu.clip_fraction("gaussian", 2, 192)
    assert between == F32(1.4935 / (2.827558 + (3.044225 - 2.827558) * 0.5))
    assert emu.clip_fraction("gaussian", 2, 1 << 40) == F32(1.4935 / 6.423573)
    assert emu.clip_fraction("gaussian", 5, 128) == 0  # 2.9162 / 2.8276: the whole range
    assert emu.clip_fraction("none", 2, 128) == 0


def literal_clip(lo, hi, f):
    """The page's rule, one bucket at a time in float32."""
    if f == 0 or not lo < 0 < hi:
        return lo, hi
    t = F32(f) * max(-lo, hi)
    return F32(max(lo, -t) + F32(0)), F32(min(hi, t) + F32(0))


@pytest.mark.parametrize("lo,hi", [(-3.0, 2.0), (-1.0, 5.0), (1.0, 10.0), (-10.0, -1.0),
                                   (8.0, 10.0), (0.0, 0.0), (0.0, 4.0), (-4.0, 0.0),
                                   (np.nan, np.nan), (-2.0**-149, 2.0**-149),
                                   (-3.0e38, 3.4e38)])
def test_clip_range_is_the_pages_rule(lo, hi):
    lo, hi = F32(lo), F32(hi)
    f = emu.clip_fraction("gaussian", 2, 128)
    got = emu.clip_range(np.array([lo]), np.array([hi]), f)
    want = literal_clip(lo, hi, f)
    for g, w in zip(got, want):
        assert g.view(np.uint32)[0] == np.array(w, F32).view(np.uint32)  # -0.0 never stored
    if not np.isnan(lo):
        assert lo <= got[0][0] <= got[1][0] <= hi  # a sub-range
        assert (got[0][0] < got[1][0]) == (lo < hi)  # never cut to a point


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_clipping_gaussian_buckets_nears_the_optimum(bits, rounding):
    """Nearest rounding reaches Max's optimum within 5% (whole ranges err 10x, 2x, 1.25x and
    1.05x more at 1 to 4 bits); stochastic rounding, noisier, gains over whole ranges too."""
    x = np.random.default_rng(bits).standard_normal(1 << 17).astype(F32)

    def mse(clip):
        q = emu.quantize(x, bits, 128, rounding, seed=SEED, rotation="prerotated", clip=clip)
        y = emu.dequantize(q, x.size, bits, 128, rotation="prerotated")
        return float(np.mean((y.astype(np.float64) - x) ** 2))

    clipped, whole = mse("gaussian"), mse("none")
    if rounding == "nearest":
        assert clipped <= 1.05 * MAX_MSE[bits]
        assert whole >= {1: 5, 2: 1.8, 3: 1.15, 4: 1.02}[bits] * clipped
    else:
        assert clipped < (0.6 if bits < 3 else 0.9 if bits == 3 else 1.0) * whole


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_values_past_a_clipped_range_decode_to_its_ends(rounding):
    x = np.random.default_rng(5).standard_normal(128 * 64).astype(F32)
    x[::256] = 1e3  # an outlier in every other bucket, far past the cut
    x[128::256] = -3e38  # and one near the float32 limit between them: no overflow
    q = emu.quantize(x, 2, 128, rounding, seed=SEED, rotation="prerotated", clip="gaussian")
    meta = emu.read_meta(q, x.size, 128)
    y = emu.dequantize(q, x.size, 2, 128, rotation="prerotated")
    f = emu.clip_fraction("gaussian", 2, 128)
    assert np.array_equal(meta[0::2, 1], np.full(32, F32(f) * F32(1e3)))  # cut at f M
    assert np.array_equal(meta[1::2, 0], np.full(32, -(F32(f) * F32(3e38))))
    assert np.array_equal(y[::256], meta[0::2, 1])  # past the cut: its end
    assert np.array_equal(y[128::256], meta[1::2, 0])


def test_clip_needs_a_rotation_and_a_known_name():
    x = np.ones(8, F32)
    with pytest.raises(ValueError, match="clip must be one of none, gaussian, got 'max'"):
        emu.quantize(x, 2, 8, "nearest", rotation="prerotated", clip="max")
    with pytest.raises(ValueError, match="it needs rotation='hadamard' or 'prerotated'"):
        emu.quantize(x, 2, 8, "nearest", clip="gaussian")
    with pytest.raises(ValueError, match="it needs rotation"):
        allreduce([x, x], bits=2, bucket_size=8, clip="gaussian")
    with pytest.raises(ValueError, match="it needs rotation"):
        reduce_scatter([x, x], bits=2, bucket_size=8, clip="gaussian")
    with pytest.raises(ValueError, match="it needs rotation"):
        EmulatedAllReduce(2, clip="gaussian")


def rank_inputs(rng, n, count, dtype):
    """Heavy-tailed values (Student's t, 4 degrees of freedom), one array per rank."""
    return [from_float32(rng.standard_t(4, count).astype(F32), dtype) for _ in range(n)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_clipped_sra_is_the_call_on_clipped_buckets(dtype, op):
    """The public allreduce(clip="gaussian") is the SRA step function run with the clip in its
    configuration (the setting reaches every quantization of the call), and differs from the
    unclipped call; clip_range itself is checked against the page above."""
    rng = np.random.default_rng(3)
    n, count = 3, 1500
    inputs = rank_inputs(rng, n, count, dtype)
    outs = allreduce(inputs, algo="sra", bits=2, seed=SEED, op=op, call=5, dtype=dtype,
                     rotation="prerotated", clip="gaussian")
    plain = allreduce(inputs, algo="sra", bits=2, seed=SEED, op=op, call=5, dtype=dtype,
                      rotation="prerotated")
    x = np.stack([emu.to_float32(np.asarray(a).reshape(-1), dtype) for a in inputs])
    cfg = _Config(n, 2, 128, "stochastic", SEED, 5, op == "avg", False, cubic=False,
                  clip="gaussian")
    want = emu.from_float32(_sra(cfg, x, 0)[0], dtype)
    bits = want.view(np.uint16 if want.itemsize == 2 else np.uint32)
    for out in outs:
        assert np.array_equal(np.asarray(out).reshape(-1).view(bits.dtype), bits)
    assert not np.array_equal(np.asarray(plain[0]).reshape(-1).view(bits.dtype), bits)


@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotation", ["hadamard", "prerotated"])
def test_clipped_allreduce_keeps_its_error_bound(algo, rounding, dtype, rotation):
    """Prerotated, the outliers stay where they are and the cut moves them by about half the
    bucket's range: the bound's term for it is what holds then."""
    rng = np.random.default_rng(4)
    n, count = 4, 3000
    inputs = rank_inputs(rng, n, count, dtype)
    inputs[1] = from_float32(widen(inputs[1], dtype) * np.where(np.arange(count) % 97, 1, 50),
                             dtype)  # outliers past every cut
    outs, bound = allreduce(inputs, algo=algo, bits=2, rounding=rounding, seed=SEED,
                            dtype=dtype, rotation=rotation, clip="gaussian",
                            return_bounds=True)
    exact = sum(widen(a, dtype) for a in inputs)
    err = np.abs(widen(outs[0], dtype) - exact)
    finite = np.isfinite(bound)
    assert finite.all()
    assert np.all(err <= bound)


def test_clipped_reduce_scatter_and_allgather_store_clipped_ranges():
    """The collectives take the clip too: their results differ from the unclipped ones and
    stay finite (library against emulator: tests/test_collectives.py)."""
    rng = np.random.default_rng(6)
    x = [rng.standard_normal(4 * 512).astype(F32) for _ in range(4)]
    kw = dict(bits=2, seed=SEED, rotation="hadamard")
    for fn, inputs in ((reduce_scatter, x), (allgather, [a[:512] for a in x])):
        clipped = fn(inputs, clip="gaussian", **kw)
        whole = fn(inputs, **kw)
        assert not np.array_equal(clipped[0], whole[0]), fn.__name__
        assert all(np.isfinite(c).all() for c in clipped)


def test_training_emulation_takes_the_clip():
    rng = np.random.default_rng(8)
    grads = rng.standard_normal((4, 2048)).astype(F32)
    clipped = EmulatedAllReduce(4, bits=2, rotation="hadamard", clip="gaussian", seed=SEED)
    want = allreduce(list(grads), algo="sra", bits=2, seed=SEED, op="avg", call=0,
                     rotation="hadamard", clip="gaussian")[0]
    assert np.array_equal(clipped(grads, key="g"), want)


def test_a_hierarchical_stage_clips_at_its_own_width():
    """8 bits between nodes (no cut at bucket 128) over 2 inside: only the stage inside a node
    is cut, so the clip changes the result; 2 bits over 8 inside: only the stage between."""
    rng = np.random.default_rng(9)
    x = [rng.standard_normal(4096).astype(F32) for _ in range(4)]
    kw = dict(algo="hier", nodes=[0, 0, 1, 1], seed=SEED, rotation="hadamard")
    for bits, intra in ((8, 2), (2, 8)):
        clipped = allreduce(x, bits=bits, intra_bits=intra, clip="gaussian", **kw)[0]
        whole = allreduce(x, bits=bits, intra_bits=intra, **kw)[0]
        assert not np.array_equal(clipped, whole), (bits, intra)
    cfg = _Config(4, 8, 128, "nearest", SEED, 0, False, False, cubic=False, clip="gaussian")
    assert cfg.clip_fraction() == 0 and dataclasses.replace(cfg, bits=2).clip_fraction() > 0
