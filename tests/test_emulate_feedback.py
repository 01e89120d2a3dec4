"""Error feedback in the allreduce emulator (docs/allreduce.md, Error feedback) and the
training-loop communicator qnccl.emulate.training.EmulatedAllReduce. No library needed."""
import importlib
import itertools

import numpy as np
import pytest

from qnccl.emulate import EmulatedAllReduce, codec
from qnccl.emulate.allreduce import _Config, _inputs, allreduce, run

ar = importlib.import_module("qnccl.emulate.allreduce")  # the module, not the function

F32 = np.float32
U = 2.0**-24
ALGOS = ("ring", "tree", "sra")
ROUNDINGS = ("nearest", "stochastic")
OPS = ("sum", "avg")


def inputs(rng, nranks, count, scale=1.0):
    return [(rng.standard_normal(count) * scale).astype(F32) for _ in range(nranks)]


# ---- without feedback nothing changes ---------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
def test_zero_residuals_change_nothing(algo):
    """allreduce with zero residuals gives the bytes of allreduce without them (which
    test_emulate_allreduce.py checks against the page executed literally), and so does the
    training-loop communicator's path (run): several N, bits, both roundings, sum and avg,
    several segments, uneven chunks, empty chunks, a NaN."""
    rng = np.random.default_rng(11)
    for n, bits, rounding, op in itertools.product((1, 2, 3, 5, 8), (1, 3, 4, 8), ROUNDINGS,
                                                   OPS):
        count = int(rng.integers(0, 700))
        xs = inputs(rng, n, count, rng.uniform(0.01, 100))
        if count > 100 and n > 1:
            xs[n - 1][77] = np.nan
        kw = dict(algo=algo, bits=bits, bucket_size=16, rounding=rounding, op=op, call=5,
                  seed=9, segment_values=256)
        ref = allreduce(xs, **kw)[0]
        cfg = _Config(n, bits, 16, rounding, 9, 5, op == "avg", False)
        loop = run(_inputs(xs, None)[0], algo, cfg, 256, np.zeros((n, count), F32))[0]
        e = [np.zeros(count, F32) for _ in range(n)]
        with_zero = allreduce(xs, residuals=e, **kw)
        assert ref.tobytes() == loop.tobytes() == with_zero[0].tobytes(), (n, bits, rounding, op)
        assert all(o.tobytes() == ref.tobytes() for o in with_zero)


def test_residuals_change_the_inputs_only():
    """allreduce with residuals e is allreduce without them of float32 inputs x + e."""
    rng = np.random.default_rng(2)
    xs = inputs(rng, 5, 900)
    for algo in ALGOS:
        e = [(rng.standard_normal(900) * 0.1).astype(F32) for _ in range(5)]
        z = [x + r for x, r in zip(xs, e)]
        got = allreduce(xs, algo=algo, bits=3, bucket_size=32, residuals=e, call=2)[0]
        assert got.tobytes() == allreduce(z, algo=algo, bits=3, bucket_size=32, call=2)[0].tobytes()


def test_residual_arguments_are_checked():
    xs = inputs(np.random.default_rng(0), 2, 10)
    with pytest.raises(ValueError, match="one array per rank"):
        allreduce(xs, residuals=[np.zeros(10, F32)])
    with pytest.raises(ValueError, match="float32"):
        allreduce(xs, residuals=[np.zeros(10), np.zeros(10)])
    with pytest.raises(ValueError, match="return_bounds"):
        allreduce(xs, residuals=[np.zeros(10, F32)] * 2, return_bounds=True)


# ---- instrumentation: every quantization, with its rank and its bucket's step --------------

class Recorder:
    """Wraps the emulator's quantization (_qd) and final quantization (_result): counts
    per (rank, index) how often a rank quantizes it, records the largest residual one
    quantization may leave there (rho * step + the codec's float32 slack; 0 for the
    owner's result, which error feedback leaves alone), and adds up what the results'
    quantizations dropped, in units of the sum (`dropped`) -- one segment only."""

    def __init__(self, monkeypatch, nranks, count, rho):
        self.count = np.zeros((nranks, count), np.int64)
        self.limit = np.zeros((nranks, count))
        self.dropped = np.zeros(count)
        self.rho, self.scale = rho, 1.0
        qd, result = ar._qd, ar._result

        def counting_qd(v, ranks, steps, edges, cfg, segment):
            assert segment == 0
            y = qd(v, ranks, steps, edges, cfg, segment)
            m = v.shape[1]
            cid = np.searchsorted(np.asarray(edges), np.arange(m), side="right") - 1
            step = self.steps(v, cfg)
            for i in range(v.shape[0]):
                rank = np.asarray(ranks)[i, cid]
                sel = rank >= 0
                np.add.at(self.count, (rank[sel], np.arange(m)[sel]), 1)
                self.limit[rank[sel], np.arange(m)[sel]] = step[i][sel] * self.scale
            return y

        def counting_result(cfg, acc, *args):
            self.scale = 0.0
            try:
                y, bound = result(cfg, acc, *args)
            finally:
                self.scale = 1.0
            n = cfg.nranks if cfg.average else 1  # N * (acc / N) is acc to rounding
            self.dropped += acc[0].astype(np.float64) - n * y.astype(np.float64)
            return y, bound

        monkeypatch.setattr(ar, "_qd", counting_qd)
        monkeypatch.setattr(ar, "_result", counting_result)

    def steps(self, v, cfg):
        b = cfg.bucket_size
        m = v.shape[1]
        starts = np.arange(0, m, b)
        lo = np.minimum.reduceat(v, starts, axis=1)
        hi = np.maximum.reduceat(v, starts, axis=1)
        step = codec.grid_step(codec.bucket_params(lo, hi, cfg.bits))
        mag = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
        per_bucket = self.rho * step + 12 * U * mag + 2.0**-148
        return np.repeat(per_bucket, b, axis=1)[:, :m]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_each_rank_quantizes_each_index_once(monkeypatch, algo, n):
    count = 1000  # uneven chunks; for N = 13 some are empty
    rec = Recorder(monkeypatch, n, count, 1.0)
    rng = np.random.default_rng(n)
    e = [np.full(count, 0, F32) for _ in range(n)]
    allreduce(inputs(rng, n, count), algo=algo, bits=2, bucket_size=64, residuals=e,
              rounding="stochastic", op="avg")
    assert (rec.count == 1).all()


# ---- the bookkeeping identity over 20 calls ------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("op", OPS)
def test_bookkeeping_identity(monkeypatch, algo, rounding, op):
    """sum_t result_t = sum_t sum_r x_r,t - sum_r e_r,T - sum_t d_t (avg: divided by N),
    d_t what call t's result quantizations dropped, within the float32 rounding the doc
    derives: per call and index (N + 2) u (sum_r |z_r| + sum_r |e_r,new|) (+ N 2^-149 for
    avg), enlarged by 1% for second-order terms; every residual is within one step
    (nearest: half) of its bucket, 0 at the values a rank owns and nonzero at most others."""
    calls, count = 20, 700
    for n in (1, 2, 3, 5, 8):
        rng = np.random.default_rng(100 * n)
        rho = 0.5 if rounding == "nearest" else 1.0
        rec = Recorder(monkeypatch, n, count, rho)
        e = [np.zeros(count, F32) for _ in range(n)]
        total_y = np.zeros(count)
        total_x = np.zeros(count)
        abs_x = np.zeros(count)
        bound = np.zeros(count)
        for t in range(calls):
            xs = inputs(rng, n, count, scale=10.0 ** rng.uniform(-2, 2))
            z = np.stack([x + r for x, r in zip(xs, e)])  # what the call adds first
            y = allreduce(xs, algo=algo, bits=2, bucket_size=32, rounding=rounding, op=op,
                          call=t, seed=3, residuals=e)[0]
            enew = np.stack(e).astype(np.float64)
            assert (np.abs(enew) <= rec.limit).all()
            assert np.count_nonzero(enew) >= 0.5 * enew.size * (n - 1) / n
            per_call = (n + 2) * U * (np.abs(z).sum(0) + np.abs(enew).sum(0))
            if op == "avg":
                per_call += n * 2.0**-149
            bound += per_call
            total_y += y.astype(np.float64) * (n if op == "avg" else 1)
            xs64 = np.stack(xs).astype(np.float64)
            total_x += xs64.sum(0)
            abs_x += np.abs(xs64).sum(0)
        rhs = total_x - np.stack(e).astype(np.float64).sum(0) - rec.dropped
        float64_slack = 2.0**-45 * (abs_x + np.abs(total_y))  # the test's own float64 sums
        err = np.abs(total_y - rhs)
        monkeypatch.undo()  # the next N gets a fresh Recorder
        assert (err <= 1.01 * bound + float64_slack).all(), (n, float(np.max(err / bound)))


def test_non_finite_bucket_leaves_zero_residual():
    n, count = 4, 256
    xs = inputs(np.random.default_rng(5), n, count)
    xs[2][40] = np.inf
    for algo in ALGOS:
        e = [np.ones(count, F32) for _ in range(n)]
        y = allreduce(xs, algo=algo, bits=4, bucket_size=32, residuals=e)[0]
        assert np.isnan(y[32:64]).all()
        assert all(np.isfinite(r).all() for r in e)
        # rank 2's quantizations of bucket 1 saw the Inf, and so did the quantizations of
        # every partial sum that holds rank 2's values there; their residuals are 0
        k = next(c for c, (lo, hi) in enumerate(ar.chunks(count, n, 32)) if lo <= 32 < hi)
        saw = {"ring": [2, (k - 1) % n], "tree": [2, 0], "sra": [2, k]}[algo]
        assert (np.stack(e)[saw, 32:64] == 0).all()
        # the next call on the same buffer is finite again
        xs2 = inputs(np.random.default_rng(6), n, count)
        assert np.isfinite(allreduce(xs2, algo=algo, bits=4, bucket_size=32, residuals=e)[0]).all()


# ---- error feedback helps ------------------------------------------------------------------

def mean_error(monkeypatch, feedback, rounding, calls=50, n=8, count=4096, bits=2):
    """Ring, the same inputs every call: after call t, the RMS error of the mean of the
    results against the exact sum, and of that mean with the results' own rounding (the
    owners' final quantizations, which error feedback leaves alone) put back: what the
    ranks' sends dropped, sum_r e_r,t / t by the bookkeeping."""
    rng = np.random.default_rng(42)
    xs = inputs(rng, n, count)
    exact = np.stack(xs).astype(np.float64).sum(0)
    e = [np.zeros(count, F32) for _ in range(n)] if feedback else None
    result, dropped = ar._result, []

    def recording_result(cfg, acc, *args):
        y, bound = result(cfg, acc, *args)
        dropped.append(acc[0].astype(np.float64) - y)  # op sum: acc is the full sum
        return y, bound

    monkeypatch.setattr(ar, "_result", recording_result)
    total = np.zeros(count)
    errors, sends = {}, {}
    for t in range(1, calls + 1):
        total += allreduce(xs, algo="ring", bits=bits, bucket_size=128, rounding=rounding,
                           call=t, residuals=e)[0]
        errors[t] = np.sqrt(np.mean((total / t - exact) ** 2))
        sends[t] = np.sqrt(np.mean(((total + np.sum(dropped, axis=0)) / t - exact) ** 2))
    monkeypatch.undo()
    return errors, sends


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_error_feedback_pays_back_what_the_sends_drop(monkeypatch, rounding):
    """Same inputs every call, ring, 8 ranks. With feedback the error of the mean that the
    ranks' sends cause, sum_r e_r,T / T, falls like 1/T once the residuals have settled, and
    the mean's whole error (which keeps the results' own rounding) is well below that
    without feedback, which stays flat (nearest) or falls like 1/sqrt(T) (stochastic).
    Nearest at 2 bits; stochastic at 3, since at 2 bits ring's stochastic residuals grow
    from call to call (the instability docs/allreduce.md warns of)."""
    bits = 2 if rounding == "nearest" else 3
    with_fb, sends = mean_error(monkeypatch, True, rounding, bits=bits)
    without, _ = mean_error(monkeypatch, False, rounding, bits=bits)
    # the numerator settles: T * error(T) changes by < 10% from T = 20 to 50 (observed
    # +2% nearest, -3% stochastic), and the error falls 5x from T = 5 (observed 8x, 10x)
    assert 50 * sends[50] < 1.1 * 20 * sends[20]
    assert sends[50] < sends[5] / 5
    if rounding == "nearest":
        assert without[50] == pytest.approx(without[1], rel=1e-9)  # flat
        assert with_fb[50] < without[50] / 3  # observed / 4.3
    else:
        assert with_fb[50] < 0.8 * without[50]  # observed 0.71
        # without: about 1/sqrt(10) = 0.32 from T = 5 to 50 (observed 0.32)
        assert without[5] / 5 < without[50] < without[5] / 2


# ---- the DDP hook's SRA ------------------------------------------------------------------

# ---- EmulatedAllReduce -------------------------------------------------------------------

def test_emulated_allreduce_counts_calls_and_warms_up():
    n, count = 4, 1000
    rng = np.random.default_rng(3)
    comm = EmulatedAllReduce(n, algo="sra", bits=3, op="avg", warmup_calls=2,
                             error_feedback=True, seed=1)
    batches = [np.stack(inputs(rng, n, count)) for _ in range(5)]
    results = []
    for t, x in enumerate(batches):
        outs = comm(x, key="w", return_all=True)
        assert all(o.tobytes() == outs[0].tobytes() for o in outs)
        results.append(outs[0])
        if t < 2:  # exact: float32 sum in rank order, / N; no call number, no residual
            want = x[0].copy()
            for r in range(1, n):
                want += x[r]
            want /= F32(n)
            assert outs[0].tobytes() == want.tobytes()
            assert comm.calls == 0 and comm.residual_bytes == 0
    assert comm.calls == 3 and comm.exact_calls == 2
    # the quantized calls are calls 0, 1, 2 of allreduce with residuals
    e = [np.zeros(count, F32) for _ in range(n)]
    for call, x in enumerate(batches[2:]):
        want = allreduce(list(x), algo="sra", bits=3, op="avg", seed=1, call=call, residuals=e)
        assert want[0].tobytes() == results[2 + call].tobytes()
    assert comm(batches[0], key="other").shape == (count,)
    assert comm.residual_bytes == 2 * n * count * 4
    np.testing.assert_array_equal(comm.residuals["w"], np.stack(e))
    comm.reset()
    assert comm.residual_bytes == 0 and comm.calls == 4
    with pytest.raises(ValueError, match="float32"):
        comm(batches[0].astype(np.float64))


def test_emulated_allreduce_without_feedback_is_allreduce():
    n, count = 6, 2000
    rng = np.random.default_rng(4)
    comm = EmulatedAllReduce(n, algo="ring", bits=4, op="sum", rounding="stochastic")
    for call in range(3):
        x = np.stack(inputs(rng, n, count)).reshape(n, 40, 50)
        got = comm(x)
        assert got.shape == (40, 50)
        want = allreduce(list(x), algo="ring", bits=4, op="sum", call=call)[0]
        assert got.tobytes() == want.tobytes()
    assert comm.residual_bytes == 0


def test_emulated_allreduce_64_ranks():
    n, count = 64, 1 << 15
    x = np.random.default_rng(5).standard_normal((n, count)).astype(F32)
    comm = EmulatedAllReduce(n, algo="ring", bits=4, error_feedback=True)
    y = comm(x)
    exact = x.astype(np.float64).mean(0)
    assert np.abs(y - exact).max() < 1.0
    assert comm.residual_bytes == n * count * 4
    # one call of allreduce() agrees on a slice of it
    small = x[:, :1024]
    assert (EmulatedAllReduce(n, algo="sra", bits=4)(small).tobytes()
            == allreduce(list(small), algo="sra", bits=4, op="avg")[0].tobytes())
