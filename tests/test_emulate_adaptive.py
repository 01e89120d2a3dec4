"""qnccl.emulate.adaptive: per-layer widths under the byte budget of uniform bits (L-GreCo's
problem at equal bytes), and EmulatedAllReduce driving it.

The knapsack is checked against brute force where its discretization is exact, and on
random instances for the two guarantees that hold always: the bytes fit the budget and the
error is at most the uniform assignment's."""
import itertools

import numpy as np
import pytest

from qnccl import emulate
from qnccl.emulate import codec
from qnccl.emulate.adaptive import CHOICES, AdaptiveBits, assign_bits, layer_errors


def brute_force(errors, sizes, budget):
    best = None
    for picks in itertools.product(range(errors.shape[1]), repeat=errors.shape[0]):
        rows = np.arange(len(picks))
        if sizes[rows, picks].sum() <= budget:
            e = errors[rows, picks].sum()
            if best is None or e < best:
                best = e
    return best


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_is_optimal_where_its_steps_are_exact(seed):
    """Sizes in whole steps of the budget (resolution * L steps): the DP's optimum is brute
    force's."""
    rng = np.random.default_rng(seed)
    layers, choices, resolution, unit = 5, 4, 20, 8
    steps = layers * resolution
    sizes = np.sort(rng.integers(1, 40, (layers, choices)), axis=1) * unit
    errors = np.sort(rng.random((layers, choices)), axis=1)[:, ::-1].copy()
    budget = steps * unit
    picks = assign_bits(errors, sizes, budget, resolution)
    rows = np.arange(layers)
    assert sizes[rows, picks].sum() <= budget
    assert errors[rows, picks].sum() == pytest.approx(brute_force(errors, sizes, budget),
                                                      rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_fits_the_budget_and_is_near_brute_force(seed):
    """Any sizes: the result fits in bytes, never has more error than `keep` (the middle
    column, the "uniform" one, which fits), and loses little to the exact optimum."""
    rng = np.random.default_rng(100 + seed)
    layers, choices = 6, 3
    sizes = np.sort(rng.integers(100, 5000, (layers, choices)), axis=1)
    errors = np.sort(rng.random((layers, choices)), axis=1)[:, ::-1].copy()
    budget = int(sizes[:, 1].sum())
    picks = assign_bits(errors, sizes, budget, keep=[1] * layers)
    rows = np.arange(layers)
    assert sizes[rows, picks].sum() <= budget
    assert errors[rows, picks].sum() <= errors[:, 1].sum() + 1e-12
    assert errors[rows, picks].sum() <= brute_force(errors, sizes, budget) * 1.05


def test_knapsack_refuses_what_cannot_fit():
    with pytest.raises(ValueError, match="no assignment fits the budget of 10 bytes"):
        assign_bits([[1.0, 0.5]], [[20, 40]], 10)
    with pytest.raises(ValueError, match="L x C arrays of one shape"):
        assign_bits([[1.0, 0.5]], [[20]], 100)
    with pytest.raises(ValueError, match="keep needs 40 bytes, over the budget of 30"):
        assign_bits([[1.0, 0.5]], [[20, 40]], 30, keep=[1])


def test_layer_errors_are_the_codecs_squared_error():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(np.float32)
    errors = layer_errors(x, (2, 4, 8), 128)
    for e, bits in zip(errors, (2, 4, 8)):
        y = codec.dequantize(codec.quantize(x, bits, 128, "nearest"), x.size, bits, 128)
        assert e == pytest.approx(np.sum((y.astype(np.float64) - x) ** 2), rel=1e-12)
    assert errors[0] > errors[1] > errors[2] > 0


def layers_of_two_kinds(rng, n=4096):
    """A layer of Gaussian values and one of the same size whose buckets hold nearly equal
    values (a tiny spread on a large offset): the second needs far fewer bits."""
    rough = rng.standard_normal(n).astype(np.float32)
    smooth = (1.0 + 1e-3 * rng.standard_normal(n)).astype(np.float32)
    return {"rough": rough, "smooth": smooth}


def test_policy_moves_bits_to_where_the_error_is():
    rng = np.random.default_rng(2)
    grads = layers_of_two_kinds(rng)
    policy = AdaptiveBits({k: v.size for k, v in grads.items()}, bits=4, every=2)
    assert policy.assignment == {"rough": 4, "smooth": 4}
    for step in range(2):
        for name, g in grads.items():
            policy.observe(name, g)
        assert policy.step() == (step == 1)
    assert policy.decisions == 1
    assert policy.step() is False and policy.step() is True  # a point, nothing observed
    assert policy.decisions == 1
    assert policy.assignment["rough"] > 4 > policy.assignment["smooth"]
    assert policy.wire_bytes() <= policy.budget == policy.wire_bytes(
        dict.fromkeys(grads, 4))
    summed = {k: 2 * v for k, v in grads.items()}  # what it saw: the two steps' sum
    err = {k: dict(zip(CHOICES, layer_errors(v, CHOICES, 128))) for k, v in summed.items()}
    assert (sum(err[k][b] for k, b in policy.assignment.items())
            < sum(err[k][4] for k in grads))


def test_equal_layers_keep_the_uniform_width():
    """Two layers alike: no split of the budget beats uniform bits, and uniform is kept."""
    rng = np.random.default_rng(3)
    g = rng.standard_normal(2048).astype(np.float32)
    policy = AdaptiveBits({"a": 2048, "b": 2048}, bits=4, every=1)
    policy.observe("a", g)
    policy.observe("b", g)
    policy.step()
    assert policy.assignment == {"a": 4, "b": 4}


def test_a_layer_not_observed_keeps_its_width():
    rng = np.random.default_rng(4)
    grads = layers_of_two_kinds(rng)
    policy = AdaptiveBits({**{k: v.size for k, v in grads.items()}, "idle": 512}, bits=4,
                          every=1)
    for name, g in grads.items():
        policy.observe(name, g)
    policy.step()
    assert policy.assignment["idle"] == 4
    assert policy.wire_bytes() <= policy.budget


def test_state_dict_continues_the_same_decisions():
    rng = np.random.default_rng(5)
    grads = layers_of_two_kinds(rng)
    layers = {k: v.size for k, v in grads.items()}
    one, two = AdaptiveBits(layers, every=3), AdaptiveBits(layers, every=3)
    for name, g in grads.items():
        one.observe(name, g)
    one.step()
    two.load_state_dict(one.state_dict())
    for policy in (one, two):
        for _ in range(2):
            for name, g in grads.items():
                policy.observe(name, g * 0.5)
            policy.step()
    assert one.decisions == two.decisions == 1 and one.assignment == two.assignment


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers={}), "at least one name"),
    (dict(layers={"a": 0}), r"layers\['a'\] must be an integer >= 1, got 0"),
    (dict(layers={"a": 8}, bits=9), r"bits must be an integer in 1\.\.8, got 9"),
    (dict(layers={"a": 8}, bits=7), "must hold bits=7"),
    (dict(layers={"a": 8}, choices=(2, 4, 9)), r"choices\[2\] must be an integer in 1\.\.8, got 9"),
    (dict(layers={"a": 8}, every=0), "every must be an integer >= 1, got 0"),
    (dict(layers={"a": 8}, resolution=-1), "resolution must be an integer >= 1, got -1"),
    (dict(layers={"a": 8}, bucket_size=0), r"bucket_size must be an integer in 1\.\.2\*\*64-1"),
])
def test_bad_arguments_name_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveBits(**kwargs)


def test_observe_checks_the_layer():
    policy = AdaptiveBits({"a": 8})
    with pytest.raises(ValueError, match="unknown layer 'b'"):
        policy.observe("b", np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="layer 'a' has 8 values, got shape"):
        policy.observe("a", np.zeros(9, np.float32))


# ----------------------------------------------------------- in EmulatedAllReduce

def rank_inputs(rng, nranks, layers):
    parts = []
    for name, n in layers.items():
        scale = 1e-3 if name == "smooth" else 1.0
        parts.append(1.0 + scale * rng.standard_normal((nranks, n)) if name == "smooth"
                     else rng.standard_normal((nranks, n)))
    return np.concatenate(parts, axis=1).astype(np.float32)


@pytest.mark.parametrize("algo", ["ring", "sra"])
@pytest.mark.parametrize("error_feedback", [False, True])
def test_one_width_is_the_plain_call(algo, error_feedback):
    """A policy whose only choice is the uniform width: every call is the plain
    communicator's call, bytes and residuals (one group, all layers in order)."""
    rng = np.random.default_rng(6)
    layers = {"a": 700, "b": 300, "c": 1000}
    kw = dict(algo=algo, bits=4, rounding="nearest", error_feedback=error_feedback)
    plain = emulate.EmulatedAllReduce(4, **kw)
    layered = emulate.EmulatedAllReduce(4, adaptive=AdaptiveBits(layers, choices=(4,),
                                                                 every=1), **kw)
    for _ in range(3):
        x = rank_inputs(rng, 4, layers)
        assert np.array_equal(plain(x, key="m"), layered(x, key="m"))
    assert layered.calls == plain.calls == 3
    if error_feedback:
        assert np.array_equal(layered.residuals["m"], plain.residuals["m"])


def test_mixed_widths_are_one_call_per_width():
    """After a decision the buffer goes as one call per width (layers in order, call
    numbers in the order of each width's first layer): the same bytes as those calls made
    through qnccl.emulate.allreduce. The decision is rank 0's gradients'."""
    rng = np.random.default_rng(7)
    layers = {"rough": 2048, "smooth": 2048, "rough2": 1024}
    policy = AdaptiveBits(layers, bits=4, every=1)
    ar = emulate.EmulatedAllReduce(4, algo="sra", bits=4, rounding="stochastic", seed=9,
                                   adaptive=policy)
    ar(rank_inputs(rng, 4, layers), key="m")  # call 0, uniform; then the decision
    widths = dict(policy.assignment)
    assert widths["rough"] > 4 > widths["smooth"]
    x = rank_inputs(rng, 4, layers)
    got = ar(x, key="m")
    spans = {"rough": (0, 2048), "smooth": (2048, 4096), "rough2": (4096, 5120)}
    order = list(dict.fromkeys(widths[n] for n in layers))
    for call, bits in enumerate(order, start=1):
        names = [n for n in layers if widths[n] == bits]
        index = np.concatenate([np.arange(*spans[n]) for n in names])
        want = emulate.allreduce(list(x[:, index]), algo="sra", bits=bits, rounding="stochastic",
                                 seed=9, op="avg", call=call)
        assert all(np.array_equal(got[index], w) for w in want), bits
    assert ar.calls == 1 + len(order)


def test_adaptive_must_match_the_communicator():
    with pytest.raises(ValueError, match="this communicator's bits"):
        emulate.EmulatedAllReduce(4, bits=4, adaptive=AdaptiveBits({"a": 8}, bits=3))
    ar = emulate.EmulatedAllReduce(2, bits=4, adaptive=AdaptiveBits({"a": 8}))
    with pytest.raises(ValueError, match="layers hold 8 values, buffer 'k' 9"):
        ar(np.zeros((2, 9), np.float32), key="k")
