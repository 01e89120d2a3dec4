"""The allreduce emulator (qnccl.emulate.allreduce) against docs/allreduce.md:
a literal rank-by-rank execution of the page (per-rank buffers, messages,
steps), the codec applied once for one rank, the error bound against exact
sums, and the error ordering of the algorithms that seeds/000 reports
(ring > recursive/tree > one-shot). No library needed."""
import itertools

import numpy as np
import pytest

from conftest import DTYPES, from_float32, make_values, widen
from qnccl.emulate import codec as emu
from qnccl.emulate import hierarchical
from qnccl.emulate.allreduce import (allreduce, auto_algo, chunks, quantizations_per_value,
                                     segment_length, segments, stream_id)

F32 = np.float32
ALGOS = ("ring", "tree", "sra")
MASK64 = 2**64 - 1


def storage_bits(values):
    values = np.ascontiguousarray(values).reshape(-1)
    return values.view({2: np.uint16, 4: np.uint32}[values.itemsize])


def rank_inputs(rng, nranks, count, dtype="float32", scale=1.0):
    """Standard normal inputs, one array per rank, in `dtype` storage."""
    return [from_float32(rng.standard_normal(count) * scale, dtype) for _ in range(nranks)]


def exact_sum(inputs, dtype):
    """float64 sum of the widened inputs, and the bound on that sum's own
    rounding ((N-1) 2^-53 sum |x|), for comparisons against float32 results."""
    x = np.stack([widen(a, dtype).reshape(-1) for a in inputs])
    return x.sum(axis=0), (len(inputs) - 1) * 2.0**-53 * np.abs(x).sum(axis=0)


def relative_error(output, inputs, dtype="float32", op="sum"):
    exact, _ = exact_sum(inputs, dtype)
    if op == "avg":
        exact = exact / len(inputs)
    return np.abs(widen(output, dtype) - exact).mean() / np.abs(exact).mean()


# ---- docs/allreduce.md executed literally ------------------------------------

def _mix64(z):
    """splitmix64's finalizer with Python integers (independent of the emulator's)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _stream(call, segment, rank, step):
    return _mix64(_mix64(_mix64(call) ^ segment) ^ (rank << 32 | step))


def literal_allreduce(inputs, algo, bits, bucket, rounding, seed, op, call, segment_values, dtype):
    """Every rank's output, computed as the page reads: per-rank accumulators,
    messages handed from sender to receiver step by step, every chunk
    (empty ones too: zero values quantize to zero bytes)."""
    x = np.stack([emu.to_float32(np.asarray(a).reshape(-1), dtype) for a in inputs])
    n_ranks, n = x.shape
    width = max(bucket, (segment_values or 2**22) // bucket * bucket)
    out = np.zeros((n_ranks, n), F32)
    for g, first in enumerate(range(0, n, width)):
        m = min(width, n - first)
        xs, ys = x[:, first:first + m], out[:, first:first + m]
        u = -(-m // bucket)

        def chunk(k):
            k %= n_ranks
            return slice(bucket * (k * u // n_ranks), min(bucket * ((k + 1) * u // n_ranks), m))

        def q(values, rank, step):
            return emu.quantize(values, bits, bucket, rounding, seed, _stream(call, g, rank, step))

        def d(wire, values):
            return emu.decode(wire, values, bits, bucket)

        def add(acc, wire):
            with np.errstate(invalid="ignore", over="ignore"):
                total = acc + d(wire, acc.size)
            return np.where(np.isnan(total), np.array(0x7FC00000, np.uint32).view(F32), total)

        def finish(acc):
            with np.errstate(invalid="ignore", over="ignore"):
                return acc / F32(n_ranks) if op == "avg" else acc

        def size(k):
            c = chunk(k)
            return c.stop - c.start if c.stop > c.start else 0

        if algo == "ring":
            acc = [None] * n_ranks
            for s in range(n_ranks - 1):
                sent = [q(xs[r, chunk(r - s)] if s == 0 else acc[r], r, s)
                        for r in range(n_ranks)]
                for r in range(n_ranks):  # receive chunk r - s - 1 from the left
                    acc[r] = add(xs[r, chunk(r - s - 1)], sent[(r - 1) % n_ranks])
            held = [q(finish(xs[r, chunk(r + 1)] if n_ranks == 1 else acc[r]), r, n_ranks - 1)
                    for r in range(n_ranks)]
            for r in range(n_ranks):
                ys[r, chunk(r + 1)] = d(held[r], size(r + 1))
            for s in range(n_ranks - 1):
                held = [held[(r - 1) % n_ranks] for r in range(n_ranks)]  # forwarded unchanged
                for r in range(n_ranks):
                    ys[r, chunk(r - s)] = d(held[r], size(r - s))
        elif algo == "tree":
            up, down = {}, {}
            for r in reversed(range(n_ranks)):
                acc = xs[r]
                for c in sorted(c for c in (2 * r + 1, 2 * r + 2) if c < n_ranks):
                    acc = add(acc, up[c])
                if r:
                    up[r] = q(acc, r, 0)
                else:
                    down[0] = q(finish(acc), 0, 1)
            for r in range(n_ranks):  # parents before children
                if r:
                    down[r] = down[(r - 1) // 2]  # forwarded unchanged
                ys[r] = d(down[r], m)
        else:  # sra
            to_owner = {(j, k): q(xs[j, chunk(k)], j, k)
                        for j in range(n_ranks) for k in range(n_ranks) if j != k}
            result = []
            for r in range(n_ranks):
                acc = xs[r, chunk(r)]
                for j in range(n_ranks):
                    if j != r:
                        acc = add(acc, to_owner[j, r])
                result.append(q(finish(acc), r, n_ranks))
            for r, k in itertools.product(range(n_ranks), repeat=2):
                ys[r, chunk(k)] = d(result[k], size(k))
    return [emu.from_float32(y, dtype) for y in out]


# ---- random streams and the choice of algorithm -----------------------------------

def test_stream_id_is_the_documented_formula():
    for call, segment, rank, step in [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0),
                                      (0, 0, 0, 1), (7, 3, 127, 128), (2**64 - 1, 2**40, 2**32 - 1,
                                                                        2**32 - 1)]:
        assert stream_id(call, segment, rank, step) == _stream(call, segment, rank, step)
    streams = {stream_id(c, g, r, s) for c, g, r, s in itertools.product(range(3), range(3),
                                                                             range(9), range(10))}
    assert len(streams) == 3 * 3 * 9 * 10
    with pytest.raises(ValueError, match="rank"):
        stream_id(0, 0, 2**32, 0)


def test_auto_algo_follows_the_table():
    assert auto_algo(10**9, "float32", 1) == "ring"
    for dtype, itemsize in (("float32", 4), ("float16", 2), ("bfloat16", 2)):
        below = (64 << 10) // itemsize - 1
        assert auto_algo(below, dtype, 2) == "tree"
        assert auto_algo(below, dtype, 64) == "tree"
        assert auto_algo(below + 1, dtype, 2) == "sra"
        assert auto_algo(below + 1, dtype, 16) == "sra"
        assert auto_algo(below + 1, dtype, 17) == "ring"
    assert auto_algo(0, np.float16, 4) == "tree"


def test_segments_and_chunks_follow_the_page():
    assert segment_length(0, 128) == 2**22
    assert segment_length(300, 128) == 256
    assert segment_length(5, 128) == 128
    assert segments(700, 300, 128) == [(0, 256), (256, 512), (512, 700)]
    assert segments(0, 0, 128) == []
    # 3 buckets over 8 ranks: chunks 2, 5 and 7 hold one bucket each
    assert chunks(300, 8, 128) == [(0, 0), (0, 0), (0, 128), (128, 128), (128, 128),
                                      (128, 256), (256, 256), (256, 300)]
    assert chunks(1, 3, 128) == [(0, 0), (0, 0), (0, 1)]


# ---- bit for bit the page ------------------------------------------------------------

# (N, count, bucket, segment_values): empty chunks, partial buckets, several segments
SHAPES = [(1, 1000, 128, 0), (1, 1000, 100, 256), (2, 1, 128, 0), (2, 1001, 16, 0),
          (3, 7919, 64, 2000), (4, 300, 128, 0), (5, 1000, 7, 300), (8, 300, 128, 0),
          (8, 5000, 32, 1024), (7, 0, 128, 0), (6, 129, 1, 50)]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("nranks,count,bucket,segment_values", SHAPES)
def test_emulator_is_the_literal_algorithm_bit_for_bit(rng, algo, nranks, count, bucket,
                                                       segment_values):
    for dtype, rounding, op in [("float32", "stochastic", "sum"), ("float16", "nearest", "avg"),
                                ("bfloat16", "stochastic", "avg"), ("float32", "nearest", "sum")]:
        inputs = [make_values(rng, count, dtype, bucket, specials=False) for _ in range(nranks)]
        config = dict(bits=int(rng.integers(1, 9)), bucket_size=bucket, rounding=rounding,
                      seed=int(rng.integers(0, 2**63)), op=op, call=int(rng.integers(0, 100)),
                      segment_values=segment_values)
        got = allreduce(inputs, algo=algo, dtype=dtype, **config)
        expected = literal_allreduce(inputs, algo, config["bits"], bucket, rounding,
                                     config["seed"], op, config["call"], segment_values, dtype)
        assert len(got) == nranks
        for r in range(nranks):
            assert got[r].shape == (count,) and got[r].dtype == inputs[0].dtype
            differ = np.flatnonzero(storage_bits(got[r]) != storage_bits(expected[r]))
            assert differ.size == 0, (
                f"{algo} N={nranks} {dtype} {config}: rank {r} differs at {differ[:5]}: "
                f"emulator {storage_bits(got[r])[differ[0]]:#x}, page "
                f"{storage_bits(expected[r])[differ[0]]:#x}")


@pytest.mark.parametrize("algo,step", [("ring", 0), ("tree", 1), ("sra", 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_rank_quantizes_once(rng, algo, step, dtype):
    """N = 1: the output is D(Q(x)) with the stream of the one quantization
    (ring: step N-1 = 0, tree: the root's step 1, SRA: step N = 1), per segment."""
    x = make_values(rng, 3000, dtype, 64, specials=True)
    for segment_values, call in ((0, 0), (1000, 5)):
        (got,) = allreduce([x], algo=algo, bits=3, bucket_size=64, seed=11, call=call,
                           segment_values=segment_values, dtype=dtype)
        bounds = segments(x.size, segment_values, 64)
        expected = np.concatenate([
            emu.dequantize(emu.quantize(x[lo:hi], 3, 64, "stochastic", 11,
                                        stream_id(call, g, 0, step), dtype=dtype),
                           hi - lo, 3, 64, dtype).view(x.dtype)
            for g, (lo, hi) in enumerate(bounds)])
        assert np.array_equal(storage_bits(got), storage_bits(expected))


@pytest.mark.parametrize("dtype", DTYPES)
def test_hierarchical_on_one_node_is_exact(rng, dtype):
    """Every rank on one node (one rank too): nothing crosses a node link, and the
    hierarchical call is the real library's exact allreduce: the correctly rounded sum
    (average); error feedback's residuals stay untouched."""
    for nranks in (1, 4):
        inputs = rank_inputs(rng, nranks, 1500, dtype)
        residuals = [rng.standard_normal(1500).astype(F32) for _ in range(nranks)]
        kept = [r.copy() for r in residuals]
        for op in ("sum", "avg"):
            outs = allreduce(inputs, algo="hier", nodes=["n"] * nranks, op=op, dtype=dtype,
                             intra_bits=3, residuals=residuals)
            total = np.stack([widen(a, dtype) for a in inputs]).sum(0)
            if op == "avg":
                total /= nranks
            expected = emu.from_float32(total.astype(F32), dtype)
            for out in outs:
                assert np.array_equal(storage_bits(out), storage_bits(expected))
            # the bound covers the real library's own order, rounding to the type each time
            _, bound = allreduce(inputs, algo="hier", nodes=["n"] * nranks, op=op,
                                 dtype=dtype, return_bounds=True)
            acc = widen(inputs[0], dtype)
            for a in inputs[1:]:
                acc = widen(emu.from_float32((acc + widen(a, dtype)).astype(F32), dtype), dtype)
            if op == "avg":
                acc = widen(emu.from_float32((acc / F32(nranks)).astype(F32), dtype), dtype)
            exact = np.stack([widen(a, dtype) for a in inputs]).astype(np.float64).sum(0)
            exact /= nranks if op == "avg" else 1
            assert np.all(np.abs(acc - exact) <= bound)
        assert all(np.array_equal(a, b) for a, b in zip(residuals, kept))


def test_every_rank_gets_the_same_output_of_the_input_type(rng):
    import ml_dtypes
    for algo, dtype in itertools.product(ALGOS + ("auto",), DTYPES):
        inputs = rank_inputs(rng, 5, 1234, dtype)
        outs = allreduce(inputs, algo=algo, bucket_size=32, dtype=dtype)
        assert len(outs) == 5
        for out in outs:
            assert out.dtype == inputs[0].dtype and out.shape == (1234,)
            assert np.array_equal(storage_bits(out), storage_bits(outs[0]))
        assert outs[0] is not outs[1]  # separate buffers, as on separate ranks
    # typed bfloat16 arrays and 2-D inputs keep their type and shape
    typed = [a.view(ml_dtypes.bfloat16).reshape(2, 617) for a in rank_inputs(rng, 3, 1234,
                                                                             "bfloat16")]
    outs = allreduce(typed, algo="ring")
    assert outs[0].dtype == ml_dtypes.bfloat16 and outs[0].shape == (2, 617)


def test_random_streams_depend_on_call_and_seed_only_when_stochastic(rng):
    inputs = rank_inputs(rng, 4, 4096)
    for algo in ALGOS:
        base = allreduce(inputs, algo=algo, call=3, seed=1)[0]
        assert np.array_equal(base, allreduce(inputs, algo=algo, call=3, seed=1)[0])
        assert not np.array_equal(base, allreduce(inputs, algo=algo, call=4, seed=1)[0])
        assert not np.array_equal(base, allreduce(inputs, algo=algo, call=3, seed=2)[0])
        near = allreduce(inputs, algo=algo, rounding="nearest", call=3, seed=1)[0]
        assert np.array_equal(near, allreduce(inputs, algo=algo, rounding="nearest", call=9,
                                                 seed=7)[0])


def test_empty_and_single_value_buffers(rng):
    for algo, nranks in itertools.product(ALGOS, (1, 2, 5)):
        outs = allreduce([np.zeros(0, F32)] * nranks, algo=algo, return_bounds=True)
        assert [o.shape for o in outs[0]] == [(0,)] * nranks and outs[1].shape == (0,)
        values = [np.array([v], F32) for v in rng.standard_normal(nranks)]
        (out, *_), bound = allreduce(values, algo=algo, return_bounds=True)
        # a bucket of one value has min == max: every quantization is exact,
        # only the float32 additions round
        assert abs(float(out[0]) - float(np.sum(np.asarray(values, np.float64)))) <= bound[0]
        assert bound[0] < 1e-5


# ---- nan and infinity -------------------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_non_finite_input_poisons_exactly_its_bucket(rng, algo, dtype):
    bucket, count = 32, 32 * 20
    inputs = rank_inputs(rng, 5, count, dtype)
    poisoned = [3, 100, 600]  # buckets 0, 3 and 18, on ranks 4, 1 and 2
    for rank, i, value in zip((4, 1, 2), poisoned, (np.nan, np.inf, -np.inf)):
        inputs[rank][i] = from_float32(np.array([value]), dtype)[0]
    outs, bound = allreduce(inputs, algo=algo, bucket_size=bucket, dtype=dtype,
                               return_bounds=True)
    nan_bits = emu.CANONICAL_NAN_BITS[dtype]
    bad = np.zeros(count, bool)
    for i in poisoned:
        bad[i // bucket * bucket:(i // bucket + 1) * bucket] = True
    for out in outs:
        assert np.all(storage_bits(out)[bad] == nan_bits)
        assert np.all(np.isfinite(widen(out, dtype)[~bad]))
    assert np.all(np.isinf(bound[bad])) and np.all(np.isfinite(bound[~bad]))


# ---- error against the exact sum ----------------------------------------------------

def offset_values(rng, count, dtype, bucket):
    """Values around +-10^4 spread by 10^-3..1: the float32 rounding of the
    codec's own formulas (u max|x| per operation) exceeds half a step here."""
    del bucket
    offset = rng.choice([-1e4, 1e4]) + rng.standard_normal(count) * rng.choice([1e-3, 1e-2, 1])
    return from_float32(offset, dtype)


def wide_values(rng, count, dtype, bucket):
    """Each bucket of each rank its own scale, subnormal to 2^120 (conftest)."""
    return make_values(rng, count, dtype, bucket, specials=False)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 8])
def test_error_is_within_the_returned_bound(rng, algo, nranks):
    """|output - exact| <= bound for nearest and stochastic rounding, sum and
    avg, every type. Where the steps dominate (wide_values) the bound is not
    loose: some element comes within a factor 2 of it. (Where the codec's
    float32 rounding dominates, offset_values, its 12 u M per quantization is
    a proof, not an estimate, and about 10 times the typical error.)"""
    for values, dtype, rounding, op, bits in [(wide_values, "float32", "nearest", "sum", 4),
                                              (wide_values, "float32", "nearest", "avg", 2),
                                              (wide_values, "float16", "nearest", "sum", 8),
                                              (wide_values, "bfloat16", "nearest", "avg", 4),
                                              (wide_values, "float32", "stochastic", "sum", 3),
                                              (offset_values, "float32", "nearest", "sum", 8),
                                              (offset_values, "float32", "stochastic", "avg", 6)]:
        inputs = [values(rng, 3000, dtype, 64) for _ in range(nranks)]
        outs, bound = allreduce(inputs, algo=algo, bits=bits, bucket_size=64,
                                rounding=rounding, op=op, dtype=dtype, segment_values=1024,
                                return_bounds=True)
        exact, exact_slack = exact_sum(inputs, dtype)
        if op == "avg":
            exact, exact_slack = exact / nranks, exact_slack / nranks
        with np.errstate(invalid="ignore"):
            error = np.abs(widen(outs[0], dtype) - exact)
        finite = np.isfinite(bound)
        assert finite.mean() > 0.95  # only float16 sums past 65504 overflow
        assert np.all(~np.isfinite(widen(outs[0], dtype)[~finite]))
        where = f"{values.__name__} {algo} N={nranks} {dtype} {rounding} {op} {bits} bits"
        over = np.flatnonzero(error[finite] > bound[finite] + exact_slack[finite])
        assert over.size == 0, (
            f"{where}: {over.size} values exceed the bound, e.g. error "
            f"{error[finite][over[0]]:.6g} > bound {bound[finite][over[0]]:.6g}")
        if values is wide_values:
            assert np.max(error[finite] / np.maximum(bound[finite], 1e-300)) > 0.5, where


def test_bounds_scale_as_the_algorithms_compound_errors(rng):
    """Per element, the bound sums N quantizations for every algorithm, but
    ring quantizes partial sums of up to N inputs, so its bound grows
    fastest; SRA quantizes single inputs and one sum."""
    inputs = rank_inputs(rng, 16, 1 << 14)
    mean_bound = {algo: allreduce(inputs, algo=algo, rounding="nearest",
                                     return_bounds=True)[1].mean() for algo in ALGOS}
    assert mean_bound["ring"] > mean_bound["tree"] > mean_bound["sra"]
    assert quantizations_per_value("ring", 16) == 16
    assert quantizations_per_value("tree", 16) == 5
    assert quantizations_per_value("sra", 16) == 2


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_error_ordering_ring_tree_sra_at_4_bits_8_ranks(rng, rounding):
    """seeds/000, 4.2: more quantizations of partial sums, more error; ring
    (N of them on a path) > tree (log N) > SRA (2), on the same data."""
    inputs = rank_inputs(rng, 8, 1 << 16)
    error = {algo: relative_error(allreduce(inputs, algo=algo, bits=4,
                                               rounding=rounding)[0], inputs)
             for algo in ALGOS}
    assert error["ring"] > 1.15 * error["tree"] > 1.15**2 * error["sra"], error


def test_sra_error_is_flat_in_n_while_ring_error_grows(rng):
    error = {}
    for nranks in (2, 8, 32):
        inputs = rank_inputs(rng, nranks, 1 << 13)
        for algo in ("ring", "sra"):
            error[algo, nranks] = relative_error(allreduce(inputs, algo=algo, bits=4)[0],
                                                 inputs)
    assert error["sra", 32] < 1.25 * error["sra", 2], error
    assert error["ring", 8] > 1.5 * error["ring", 2], error
    assert error["ring", 32] > 2 * error["ring", 8], error


# ---- average ----------------------------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
def test_average_is_the_sum_divided_before_the_final_quantization(rng, algo):
    """Dividing by a power of two scales every step of the final quantization
    exactly, so avg == sum / N bit for bit at N = 4; at N = 3 both are within
    their bounds of the exact average."""
    inputs = rank_inputs(rng, 4, 5000)
    total = allreduce(inputs, algo=algo, call=2)[0]
    mean = allreduce(inputs, algo=algo, call=2, op="avg")[0]
    assert np.array_equal(mean, total / F32(4))
    inputs = rank_inputs(rng, 3, 5000, scale=100.0)
    (total, *_), total_bound = allreduce(inputs, algo=algo, rounding="nearest",
                                            return_bounds=True)
    (mean, *_), mean_bound = allreduce(inputs, algo=algo, rounding="nearest", op="avg",
                                          return_bounds=True)
    exact, _ = exact_sum(inputs, "float32")
    assert np.all(np.abs(mean - exact / 3) <= mean_bound)
    # the avg bound: the sum's up to the last quantization, over N, plus that quantization's
    assert mean_bound.mean() < 0.75 * total_bound.mean()
    assert np.abs(mean - total / F32(3)).max() <= (total_bound / 3 + mean_bound).max()


# ---- arguments ----------------------------------------------------------------------

def test_rejected_arguments_name_the_argument(rng):
    x = rank_inputs(rng, 2, 10)
    with pytest.raises(ValueError, match="algo must be one of auto, ring, tree, sra"):
        allreduce(x, algo="recursive-doubling")
    with pytest.raises(ValueError, match="op must be one of sum, avg, got 'max'"):
        allreduce(x, op="max")
    with pytest.raises(ValueError, match=r"bits must be an integer in 1\.\.8, got 0"):
        allreduce(x, bits=0)
    with pytest.raises(ValueError, match=r"bucket_size must be an integer in 1\.\.2\*\*64-1"):
        allreduce(x, bucket_size=0)
    with pytest.raises(ValueError, match="rank 1 has"):
        allreduce([x[0], x[1][:5]])
    with pytest.raises(ValueError, match="one array per rank"):
        allreduce([])
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        allreduce([np.zeros(3, np.int32)] * 2)


# ---- the hierarchical algorithm (docs/allreduce.md, Hierarchical) -------------------------



@pytest.mark.parametrize("inter", ["ring", "tree", "sra"])
@pytest.mark.parametrize("intra_bits", [0, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_hierarchical_paths_agree_and_bound_holds(inter, intra_bits, dtype):
    """With bounds and with error feedback (residuals zero) the call gives the same bytes;
    |output - exact| <= bound; on nodes in round-robin order too (local index and node
    order follow the ranks)."""
    rng = np.random.default_rng(intra_bits + 7)
    for nodes in ([0, 0, 1, 1, 2, 2], ["b", "a", "b", "a", "b", "a"]):
        for count in (0, 2, 5, 1001):
            xs = [from_float32(rng.standard_normal(count), dtype) for _ in range(6)]
            out, bound = allreduce(xs, algo="hier", nodes=nodes, inter_algo=inter,
                                   intra_bits=intra_bits, dtype=dtype, op="avg",
                                   bucket_size=16, return_bounds=True, call=3)
            es = [np.zeros(count, np.float32) for _ in range(6)]
            fast = allreduce(xs, algo="hier", nodes=nodes, inter_algo=inter,
                             intra_bits=intra_bits, dtype=dtype, op="avg", bucket_size=16,
                             residuals=es, call=3)
            assert np.array_equal(np.asarray(out[0]).view(np.uint8),
                                  np.asarray(fast[0]).view(np.uint8))
            exact = np.mean([widen(x, dtype).astype(np.float64) for x in xs], axis=0)
            assert (np.abs(widen(out[0], dtype) - exact) <= bound).all()


def test_hierarchical_layout_rules():
    lay = hierarchical.layout(["x", "y", "x", "y"], 4)
    assert lay.members == ((0, 2), (1, 3)) and lay.hierarchical
    assert lay.cross(0) == (0, 1) and lay.cross(1) == (2, 3)
    assert not hierarchical.layout([0, 0, 0, 0], 4).hierarchical  # one node
    assert not hierarchical.layout([0, 1, 2, 3], 4).hierarchical  # one rank per node
    assert not hierarchical.layout([0, 0, 1], 3).uniform
    xs = [np.ones(300, np.float32)] * 3
    # auto on an uneven layout is the flat algorithm, bit for bit
    flat = allreduce(xs, algo="auto", seed=1)
    assert np.array_equal(allreduce(xs, algo="auto", nodes=[0, 0, 1], seed=1)[0], flat[0])
    with pytest.raises(ValueError, match="same number of ranks on every node"):
        allreduce(xs, algo="hier", nodes=[0, 0, 1])
    with pytest.raises(ValueError, match="needs nodes"):
        allreduce(xs, algo="hier")
    with pytest.raises(ValueError, match="intra_bits"):
        allreduce(xs[:2], algo="hier", nodes=[0, 1], intra_bits=9)


@pytest.mark.parametrize("feedback", [False, True])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("algo", ["ring", "tree", "sra"])
def test_coordinates_zero_on_every_rank_stay_exactly_zero(algo, bits, rounding, feedback):
    """Wire format 2: zero is a level of every bucket holding both signs, so a coordinate whose
    inputs are all zero is exactly zero in every partial sum, every result and every residual,
    call after call (ReLU units inactive on the whole batch give such coordinates)."""
    n, count = 6, 3000
    rng = np.random.default_rng(bits)
    dead = rng.random(count) < 0.4
    residuals = [np.zeros(count, np.float32) for _ in range(n)] if feedback else None
    for call in range(3):
        xs = [np.where(dead, 0, rng.standard_normal(count)).astype(np.float32) for _ in range(n)]
        out = allreduce(xs, algo=algo, bits=bits, bucket_size=64, rounding=rounding,
                        op="avg", call=call, residuals=residuals)
        for y in out:
            assert np.all(y[dead].view(np.uint32) == 0)
            # not trivially zero: the live coordinates mostly decode to nonzero levels
            assert np.count_nonzero(y[~dead]) > 0.25 * np.count_nonzero(~dead)
        if feedback:
            assert all(np.all(e[dead] == 0) for e in residuals)
