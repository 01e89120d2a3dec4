"""Per-layer adaptive bits: where a fixed byte budget buys the least quantization error.

The problem of L-GreCo ("L-GreCo: An Efficient and General Framework for Layerwise-Adaptive
Gradient Compression", and §3.6 / ch. 4 of the thesis it is part of): every layer l gets a
width b_l from `choices`; a layer quantized at b costs size(l, b) wire bytes (the codec's
compressed_size) and adds error(l, b), the squared L2 error of quantizing and decoding the
layer's gradient accumulated since the last decision (nearest rounding, no error feedback:
the codec's own error, whatever the allreduce does with it). The assignment minimizes

    sum_l error(l, b_l)   subject to   sum_l size(l, b_l) <= sum_l size(l, bits)

so it sends no more bytes than every layer at the uniform `bits` and, being an exact optimum
over a set that holds the uniform assignment, never more error. (L-GreCo states the dual,
fewest bytes under the uniform assignment's error; this one compares the two at equal
bytes.) The knapsack is solved by dynamic programming over the bytes in `resolution` * L
steps of the budget, each layer's size rounded up to whole steps so that the budget holds
in bytes; the uniform assignment is kept where that rounding would make the result worse.

The gradients observed are one rank's own, before the allreduce: the averaged result has
been quantized at the current widths and sits on their grids, which would make the current
widths look exact. One rank decides (rank 0, as L-GreCo's designated worker) and every rank
uses its decision: qnccl.torch broadcasts it at each decision point; EmulatedAllReduce gives
the policy virtual rank 0's inputs.

    policy = AdaptiveBits({"emb": 3072, "fc1": 8192, "fc2": 512}, bits=4, every=100)
    for step in range(steps):
        ...
        for name, grad in my_gradients.items():        # rank 0's, before the allreduce
            policy.observe(name, grad)
        policy.step()                                  # decides every `every` steps
        policy.assignment                              # {"emb": 3, "fc1": 4, "fc2": 6}

qnccl.emulate.EmulatedAllReduce(adaptive=...) and qnccl.torch.QuantizedHookState(adaptive=...)
drive one of these (docs/accuracy.md, "Where the bits go").
"""
from __future__ import annotations

import numpy as np

from .. import _checks
from . import codec

__all__ = ["AdaptiveBits", "CHOICES", "assign_bits", "layer_errors"]

CHOICES = (2, 3, 4, 5, 6, 8)  # widths a layer may get (1 bit has no zero level)
MAX_STEPS = 1 << 20  # the DP's budget steps at most (its table: layers x steps bytes)


def layer_errors(values, choices, bucket_size):
    """Squared L2 error of each width in `choices` on the float32 array `values`, quantized
    with nearest rounding in buckets of `bucket_size` and decoded: a float64 array."""
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    out = np.empty(len(choices), np.float64)
    for j, bits in enumerate(choices):
        buf = codec.quantize(x, bits, bucket_size, "nearest")
        d = codec.dequantize(buf, x.size, bits, bucket_size).astype(np.float64) - x
        out[j] = float(np.dot(d, d))
    return out


def assign_bits(errors, sizes, budget, resolution=100, keep=None):
    """The choice per layer (indices into the columns) minimizing the summed error with the
    summed size at most `budget`: errors and sizes are L x C arrays (sizes in bytes), and
    some assignment must fit. Exact up to the discretization of sizes into
    min(resolution * L, MAX_STEPS) steps of the budget (rounded up: the result fits); `keep`,
    a choice per layer that fits (e.g. the uniform one), is returned where the discretized
    optimum has more error than it."""
    errors = np.asarray(errors, np.float64)
    sizes = np.asarray(sizes, np.int64)
    if errors.ndim != 2 or errors.shape != sizes.shape or errors.shape[0] == 0:
        raise ValueError(f"errors and sizes must be L x C arrays of one shape, got "
                         f"{errors.shape} and {sizes.shape}")
    if sizes.min(axis=1).sum() > budget:
        raise ValueError(f"no assignment fits the budget of {budget} bytes: the smallest "
                         f"needs {int(sizes.min(axis=1).sum())}")
    layers = errors.shape[0]
    steps = int(min(max(1, resolution) * layers, MAX_STEPS, budget))
    weight = -(-sizes * steps // budget)  # ceil(size / (budget / steps))
    best = np.full(steps + 1, np.inf)  # least error of the layers so far, per steps used
    best[0] = 0.0
    picks = np.zeros((layers, steps + 1), np.int16)
    for layer in range(layers):
        new = np.full(steps + 1, np.inf)
        for j in range(errors.shape[1]):
            w = int(weight[layer, j])
            if w > steps:
                continue
            cand = best[:steps + 1 - w] + errors[layer, j]
            better = cand < new[w:]
            new[w:][better] = cand[better]
            picks[layer, w:][better] = j
        best = new
    rows = np.arange(layers)
    if keep is not None:
        keep = np.asarray(keep, np.int64)
        if sizes[rows, keep].sum() > budget:
            raise ValueError(f"keep needs {int(sizes[rows, keep].sum())} bytes, over the "
                             f"budget of {budget}")
    used = int(np.argmin(best))
    if not np.isfinite(best[used]):  # rounding up left no fit
        if keep is not None:
            return keep
        raise ValueError(f"no assignment fits {steps} steps of the budget: raise resolution")
    out = np.empty(layers, np.int64)
    for layer in range(layers - 1, -1, -1):
        out[layer] = picks[layer, used]
        used -= int(weight[layer, out[layer]])
    if keep is not None and errors[rows, keep].sum() < errors[rows, out].sum():
        return keep
    return out


class AdaptiveBits:
    """Per-layer widths re-decided every `every` steps from the gradients observed since
    the last decision (module docstring).

    layers       {name: number of values}, in the order of the gradient buffer
    bits         the uniform width whose bytes are the budget (and the widths until the first
                 decision)
    bucket_size  the codec's bucket
    choices      widths a layer may get (each 1..8, `bits` among them; default 2, 3, 4, 5,
                 6, 8)
    every        steps between decisions (>= 1)
    resolution   budget steps per layer of the knapsack (>= 1)

    Attributes: assignment ({name: bits}), decisions (how many were made), steps.
    """

    def __init__(self, layers, bits=4, bucket_size=128, choices=CHOICES, every=100,
                 resolution=100):
        try:
            counts = dict(layers)
        except (TypeError, ValueError):
            raise TypeError(f"layers must be a dict {{name: count >= 1}}, got "
                            f"{_checks.describe(layers)}") from None
        if not counts:
            raise ValueError("layers must map at least one name to a count >= 1, got {}")
        self.layers = {str(k): _checks.integer(f"layers[{k!r}]", v, 1) for k, v in counts.items()}
        codec.check_config(bits, bucket_size)
        self.choices = tuple(sorted({_checks.bits(c, f"choices[{i}]")
                                     for i, c in enumerate(choices)}))
        if bits not in self.choices:
            raise ValueError(f"choices {self.choices} must hold bits={bits}, the uniform "
                             "width the assignment is measured against")
        every = _checks.integer("every", every, 1)
        resolution = _checks.integer("resolution", resolution, 1)
        self.bits, self.bucket_size = bits, bucket_size
        self.every, self.resolution = every, resolution
        self.sizes = np.array([[codec.compressed_size(n, c, bucket_size) for c in self.choices]
                               for n in self.layers.values()], np.int64)
        self.assignment = dict.fromkeys(self.layers, bits)
        self.budget = self.wire_bytes()
        self.steps = self.decisions = 0
        self._sums = {}

    def wire_bytes(self, assignment=None):
        """Bytes of one quantization of every layer at `assignment` (default: the current)."""
        a = self.assignment if assignment is None else assignment
        return int(sum(row[self.choices.index(a[name])]
                       for row, name in zip(self.sizes, self.layers)))

    def observe(self, name, values):
        """Adds a layer's gradient of this step (the deciding rank's own) to its sum: a numpy
        array, or a tensor, summed where it lives (e.g. on a GPU) until the decision reads
        it."""
        if name not in self.layers:
            raise ValueError(f"unknown layer {name!r}")
        if values.shape[0:1] != (self.layers[name],) or values.ndim != 1:
            raise ValueError(f"layer {name!r} has {self.layers[name]} values, got shape "
                             f"{tuple(values.shape)}")
        total = self._sums.get(name)
        if total is None:
            self._sums[name] = values * 1  # a copy, in the input's own kind and place
            return
        if isinstance(total, np.ndarray) and not isinstance(values, np.ndarray):
            total = self._sums[name] = values.new_tensor(total)  # restored: to the tensor's
        total += values                                           # device

    def step(self):
        """One step done. Every `every` steps it is a decision point: the policy decides if it
        observed anything since the last one (a rank that only receives the decisions
        observes nothing and keeps its assignment) and returns True; otherwise False."""
        self.steps += 1
        if self.steps % self.every:
            return False
        if self._sums:
            self.decide()
        return True

    def decide(self):
        """The assignment for the gradients observed since the last decision (a layer not
        observed keeps its width); clears them. Returns the new assignment."""
        errors = np.full(self.sizes.shape, np.inf)
        for i, (name, bits) in enumerate(self.assignment.items()):
            if name in self._sums:
                errors[i] = layer_errors(_numpy(self._sums[name]), self.choices,
                                         self.bucket_size)
            else:
                errors[i, self.choices.index(bits)] = 0.0
        uniform = [self.choices.index(self.bits)] * len(self.layers)
        picks = assign_bits(errors, self.sizes, self.budget, self.resolution, keep=uniform)
        self.assignment = {name: self.choices[j] for name, j in zip(self.layers, picks)}
        self.decisions += 1
        self._sums.clear()
        return dict(self.assignment)

    def state_dict(self):
        """What a restored job needs to decide as this one would: the assignment, the step
        and decision counts and the sums observed since the last decision (numpy)."""
        return {"assignment": dict(self.assignment), "steps": self.steps,
                "decisions": self.decisions,
                "sums": {n: _numpy(v).copy() for n, v in self._sums.items()}}

    def load_state_dict(self, state):
        unknown = set(state["assignment"]) - set(self.layers)
        if unknown:
            raise ValueError(f"the checkpoint's adaptive bits name layers this one lacks: "
                             f"{sorted(unknown)}")
        self.assignment = {**dict.fromkeys(self.layers, self.bits), **state["assignment"]}
        self.steps, self.decisions = int(state["steps"]), int(state["decisions"])
        self._sums = {n: np.array(v, np.float32) for n, v in state["sums"].items()}


def _numpy(values):
    """A float32 numpy view or copy of a numpy array or a torch tensor (from any device)."""
    if hasattr(values, "detach"):
        values = values.detach().to("cpu").numpy()
    return np.asarray(values, np.float32)
