"""The reduce-scatter, allgather and all-to-all emulator (qnccl.emulate.collectives)
against docs/collectives.md executed literally: per-rank buffers, one codec.quantize and
codec.decode per piece sent, the additions in the documented order. No library needed."""
import itertools

import numpy as np
import pytest

from conftest import DTYPES, make_values, widen
from qnccl.emulate import codec as emu
from qnccl.emulate.allreduce import segments, stream_id
from qnccl.emulate.collectives import (allgather, alltoall, auto_reduce_scatter_algo,
                                       reduce_scatter)

F32 = np.float32
NAN32 = np.array(0x7FC00000, np.uint32).view(F32)


def storage_bits(values):
    values = np.ascontiguousarray(values).reshape(-1)
    return values.view({2: np.uint16, 4: np.uint32}[values.itemsize])


def assert_same_bits(got, expected, what):
    assert len(got) == len(expected)
    for r, (a, b) in enumerate(zip(got, expected)):
        differ = np.flatnonzero(storage_bits(a) != storage_bits(b))
        assert differ.size == 0, f"{what}: rank {r} differs at {differ[:5]}"


class Page:
    """The page's primitives for one call: Q with stream(call, segment, rank, step), D,
    acc + D(q) in float32 with the canonical NaN."""

    def __init__(self, bits, bucket, rounding, seed, call):
        self.bits, self.bucket, self.rounding, self.seed, self.call = (bits, bucket, rounding,
                                                                       seed, call)

    def q(self, values, g, rank, step):
        return emu.quantize(np.asarray(values, F32), self.bits, self.bucket, self.rounding,
                            self.seed, stream_id(self.call, g, rank, step))

    def d(self, wire, count):
        return emu.decode(wire, count, self.bits, self.bucket)

    def add(self, acc, wire):
        with np.errstate(invalid="ignore", over="ignore"):
            total = acc + self.d(wire, acc.size)
        return np.where(np.isnan(total), NAN32, total)


def literal_reduce_scatter(inputs, algo, page, op, segment_values, dtype):
    n = len(inputs)
    x = [emu.to_float32(np.asarray(a).reshape(-1), dtype) for a in inputs]
    count = x[0].size // n
    out = [np.zeros(count, F32) for _ in range(n)]
    for g, (a, b) in enumerate(segments(count, segment_values, page.bucket)):
        def piece(rank, k):
            return x[rank][k * count + a:k * count + b]
        for k in range(n):  # chunk k, owned by rank k
            if algo == "sra":
                acc = piece(k, k)
                for j in range(n):
                    if j != k:
                        acc = page.add(acc, page.q(piece(j, k), g, j, k))
            else:
                acc = piece((k + 1) % n, k)
                for s in range(n - 1):
                    wire = page.q(acc, g, (k + 1 + s) % n, s)
                    acc = page.add(piece((k + 2 + s) % n, k), wire)
            if op == "avg":
                with np.errstate(invalid="ignore", over="ignore"):
                    acc = acc / F32(n)
                acc = np.where(np.isnan(acc), NAN32, acc)
            out[k][a:b] = acc
    return [emu.from_float32(y, dtype) for y in out]


def literal_allgather(inputs, page, segment_values, dtype):
    x = [emu.to_float32(np.asarray(a).reshape(-1), dtype) for a in inputs]
    count = x[0].size
    gathered = np.zeros(len(x) * count, F32)
    for g, (a, b) in enumerate(segments(count, segment_values, page.bucket)):
        for r, values in enumerate(x):  # every rank decodes rank r's one encoding
            gathered[r * count + a:r * count + b] = page.d(page.q(values[a:b], g, r, 0), b - a)
    return [emu.from_float32(gathered, dtype) for _ in x]


def literal_alltoall(inputs, page, segment_values, dtype):
    n = len(inputs)
    raw = [np.asarray(a).reshape(-1) for a in inputs]
    x = [emu.to_float32(a, dtype) for a in raw]
    count = x[0].size // n
    out = [storage_bits(raw[r]).copy() for r in range(n)]  # own chunks stay as they are
    for g, (a, b) in enumerate(segments(count, segment_values, page.bucket)):
        for j, k in itertools.product(range(n), repeat=2):  # j sends its chunk k to k
            if j != k:
                wire = page.q(x[j][k * count + a:k * count + b], g, j, k)
                decoded = emu.from_float32(page.d(wire, b - a), dtype)
                out[k][j * count + a:j * count + b] = storage_bits(decoded)
    return out


# (N, count per chunk, bucket, segment_values): empty, partial buckets, several segments
SHAPES = [(1, 1000, 128, 0), (2, 0, 128, 0), (2, 1, 128, 0), (3, 777, 64, 300),
          (4, 513, 128, 0), (5, 100, 7, 30), (8, 300, 32, 64)]
CASES = [("float32", "stochastic", "sum"), ("float16", "nearest", "avg"),
         ("bfloat16", "stochastic", "avg"), ("float32", "nearest", "sum")]


def config(rng, bucket, rounding):
    return dict(bits=int(rng.integers(1, 9)), bucket=bucket, rounding=rounding,
                seed=int(rng.integers(0, 2**63)), call=int(rng.integers(0, 100)))


def emulator_kwargs(c):
    return dict(bits=c["bits"], bucket_size=c["bucket"], rounding=c["rounding"], seed=c["seed"],
                call=c["call"])


@pytest.mark.parametrize("algo", ["ring", "sra"])
@pytest.mark.parametrize("nranks,count,bucket,segment_values", SHAPES)
def test_reduce_scatter_is_the_literal_algorithm_bit_for_bit(rng, algo, nranks, count, bucket,
                                                            segment_values):
    for dtype, rounding, op in CASES:
        inputs = [make_values(rng, nranks * count, dtype, bucket, specials=False)
                  for _ in range(nranks)]
        c = config(rng, bucket, rounding)
        got = reduce_scatter(inputs, algo=algo, op=op, segment_values=segment_values,
                             dtype=dtype, **emulator_kwargs(c))
        expected = literal_reduce_scatter(inputs, algo, Page(**c), op, segment_values, dtype)
        assert all(o.shape == (count,) for o in got)
        assert_same_bits(got, expected, f"{algo} N={nranks} {dtype} {op} {c}")


@pytest.mark.parametrize("nranks,count,bucket,segment_values", SHAPES)
def test_allgather_is_the_literal_algorithm_and_every_rank_holds_the_same_bytes(
        rng, nranks, count, bucket, segment_values):
    for dtype, rounding, _ in CASES:
        inputs = [make_values(rng, count, dtype, bucket) for _ in range(nranks)]
        c = config(rng, bucket, rounding)
        got = allgather(inputs, segment_values=segment_values, dtype=dtype, **emulator_kwargs(c))
        assert_same_bits(got, literal_allgather(inputs, Page(**c), segment_values, dtype),
                         f"N={nranks} {dtype} {c}")
        assert all(storage_bits(o).tobytes() == storage_bits(got[0]).tobytes() for o in got)


@pytest.mark.parametrize("nranks,count,bucket,segment_values", SHAPES)
def test_alltoall_is_the_literal_algorithm_and_keeps_the_own_chunk_exact(
        rng, nranks, count, bucket, segment_values):
    for dtype, rounding, _ in CASES:
        inputs = [make_values(rng, nranks * count, dtype, bucket) for _ in range(nranks)]
        c = config(rng, bucket, rounding)
        got = alltoall(inputs, segment_values=segment_values, dtype=dtype, **emulator_kwargs(c))
        assert_same_bits(got, literal_alltoall(inputs, Page(**c), segment_values, dtype),
                         f"N={nranks} {dtype} {c}")
        for r in range(nranks):  # own chunk: the input's bits, NaN payloads included
            own = slice(r * count, (r + 1) * count)
            assert (storage_bits(got[r])[own] == storage_bits(inputs[r])[own]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_sra_reduce_scatter_error_is_one_quantization_per_contribution(rng, dtype):
    """Nearest rounding: |output - exact| <= sum over the N-1 quantized pieces of half
    their bucket's widest cell (emu.grid_step: the step of a uniform grid, the top cell of a
    cubic one), plus the float32 additions' and the store's rounding."""
    n, count, bucket, bits = 6, 1000, 64, 4
    inputs = [make_values(rng, n * count, dtype, bucket, specials=False) for _ in range(n)]
    got = reduce_scatter(inputs, algo="sra", bits=bits, bucket_size=bucket, rounding="nearest",
                         dtype=dtype)
    x = np.stack([widen(a, dtype) for a in inputs]).reshape(n, n, count)
    store = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    for k in range(n):
        exact = x[:, k].sum(axis=0)
        bound = np.zeros(count)
        for j in range(n):
            if j == k:
                continue
            piece = x[j, k]
            starts = np.arange(0, count, bucket)
            lo, hi = np.minimum.reduceat(piece, starts), np.maximum.reduceat(piece, starts)
            widest = emu.grid_step(emu.bucket_params(lo.astype(np.float32),
                                                     hi.astype(np.float32), bits))
            step = np.repeat(widest, bucket)[:count]
            bound += step / 2 + 12 * 2.0**-24 * np.repeat(np.maximum(abs(lo), abs(hi)),
                                                          bucket)[:count]
        total = np.abs(x[:, k]).sum(axis=0)
        bound += n * 2.0**-24 * (total + bound) + store * (np.abs(exact) + bound) + 2.0**-133
        err = np.abs(widen(got[k], dtype) - exact)
        assert (err <= bound).all(), (k, float(np.max(err / bound)))


def test_ring_reduce_scatter_compounds_more_error_than_sra(rng):
    n, count = 8, 4096
    inputs = [rng.standard_normal(n * count).astype(F32) for _ in range(n)]
    exact = np.stack(inputs).astype(np.float64).reshape(n, n, count).sum(axis=0)
    err = {}
    for algo in ("ring", "sra"):
        out = np.stack(reduce_scatter(inputs, algo=algo, bits=4, rounding="stochastic"))
        err[algo] = np.abs(out - exact).mean()
    assert err["ring"] > 1.5 * err["sra"], err


def test_arguments_are_checked():
    xs = [np.zeros(10, F32)] * 3
    with pytest.raises(ValueError, match=r"N \* recvcount values \(N = 3\), got 10"):
        reduce_scatter(xs)
    with pytest.raises(ValueError, match=r"N \* count values"):
        alltoall(xs)
    with pytest.raises(ValueError, match="algo must be one of auto, ring, sra"):
        reduce_scatter([np.zeros(9, F32)] * 3, algo="tree")
    with pytest.raises(ValueError, match="op must be"):
        reduce_scatter([np.zeros(9, F32)] * 3, op="max")
    with pytest.raises(ValueError, match="bits"):
        allgather(xs, bits=9)
    assert auto_reduce_scatter_algo(16) == "sra" and auto_reduce_scatter_algo(17) == "ring"
