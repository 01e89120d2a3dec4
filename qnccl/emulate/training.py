"""Quantized allreduce in a training loop, on N virtual ranks in one process.

    ar = EmulatedAllReduce(64, algo="sra", bits=4, op="avg", error_feedback=True)
    for step in range(steps):
        grads = ...                      # N x n float32: each virtual rank's flat gradient
        mean = ar(grads, key="layer1")   # what every rank's qncclAllReduce returns

What a job does with libqnccl.so, call after call: the communicator's call counter (the
`call` of the random streams) advances once per quantized call, the first `warmup_calls`
calls are exact and take no call number (QNCCL_WARMUP_CALLS), and with error feedback every
buffer (`key`, like the library's (address, count, dtype)) keeps N float32 residuals that the
next call on it adds to its inputs (docs/allreduce.md, Error feedback). All virtual ranks are
computed at once (qnccl.emulate.allreduce.run, the allreduce emulator's own code): 64 ranks
x 2^20 values take about 3-9 s per call on a 2-core machine (SRA 3.5 s nearest / 7 s
stochastic, ring 5 / 7.4, tree 2.7 / 5.9), and 256 MiB of residuals. With `adaptive`, per-layer
widths (qnccl.emulate.adaptive): one call per width, as the DDP hook makes them.
"""
from __future__ import annotations

import numpy as np

from .. import _checks
from . import codec, rotation as rot
from .allreduce import ALGOS, OPS, _Config, auto_algo, rotated, run

__all__ = ["EmulatedAllReduce"]

F32 = np.float32


class EmulatedAllReduce:
    """One communicator of `nranks` virtual ranks running quantized allreduce on float32.

    nranks          N >= 1
    algo            "ring", "tree", "sra" or "auto" (auto_algo, per call size)
    bits, bucket_size, rounding, seed, segment_values, rotation, rotation_block, clip
                    the configuration, as in qnccl.emulate.allreduce
    op              "sum" or "avg"
    error_feedback  keep residuals per buffer key and feed them into the next call
    warmup_calls    the first K calls are exact (float32 sum in rank order, avg then / N):
                    they take no call number and leave residuals untouched
    adaptive        None, or a qnccl.emulate.adaptive.AdaptiveBits (its bits and bucket_size
                    this communicator's) over the layers a buffer holds, in order: a quantized
                    call then makes one call per width, on its layers' values in layer order
                    (each its own call number, as the DDP hook's groups), and gives the policy
                    virtual rank 0's layers (the deciding rank's own gradients) and a step

    Attributes: calls (quantized calls made: the next call's `call`), exact_calls,
    residuals (key -> N x n float32 array), residual_bytes.
    """

    def __init__(self, nranks, algo="sra", bits=4, bucket_size=128, rounding="stochastic",
                 seed=0, op="avg", error_feedback=False, warmup_calls=0, segment_values=0,
                 adaptive=None, rotation="none", rotation_block=rot.DEFAULT_BLOCK, clip="none"):
        codec.check_config(bits, bucket_size, rounding)
        rot.check(rotation, rotation_block)
        codec.check_clip(clip, rotation)
        nranks = _checks.integer("nranks", nranks, 1)
        _checks.one_of("algo", algo, ("auto", *ALGOS))
        _checks.one_of("op", op, OPS)
        _checks.boolean("error_feedback", error_feedback)
        warmup_calls = _checks.integer("warmup_calls", warmup_calls, 0)
        self.nranks, self.algo, self.bits, self.bucket_size = nranks, algo, bits, bucket_size
        self.rounding, self.seed, self.op = rounding, _checks.uint64("seed", seed), op
        self.error_feedback, self.warmup_calls = error_feedback, warmup_calls
        self.segment_values = _checks.segment_values(segment_values)
        self.rotation, self.rotation_block, self.clip = rotation, rotation_block, clip
        if adaptive is not None and (getattr(adaptive, "bits", None), getattr(
                adaptive, "bucket_size", None)) != (bits, bucket_size):
            raise ValueError("adaptive must be an AdaptiveBits with this communicator's bits "
                             f"({bits}) and bucket_size ({bucket_size}), got {adaptive!r}")
        if adaptive is not None and rotation != "none":
            raise ValueError("adaptive widths are chosen from unrotated errors on the cubic grid: "
                             "pass rotation='none' with adaptive, or adaptive=None")
        self.adaptive = adaptive
        self.calls = 0  # quantized calls so far
        self.exact_calls = 0  # warm-up calls so far
        self.residuals = {}

    @property
    def residual_bytes(self):
        """Memory held by the residuals (N x n x 4 bytes per buffer key)."""
        return sum(e.nbytes for e in self.residuals.values())

    def reset(self):
        """Clears the residuals (the call counter goes on, as on a live communicator)."""
        self.residuals.clear()

    def __call__(self, grads, key="default", return_all=False):
        """The allreduce of one buffer: `grads` holds N float32 arrays of one shape (a list or
        an N x ... array). Returns the result (the inputs' shape; every rank's is these
        bytes), or with return_all the list of the N ranks' results."""
        x = np.asarray(grads) if not isinstance(grads, np.ndarray) else grads
        if x.dtype != F32 or x.ndim < 1 or x.shape[0] != self.nranks:
            raise ValueError(f"grads must hold {self.nranks} float32 arrays of one shape, "
                             f"got {x.dtype} of shape {x.shape}")
        shape = x.shape[1:]
        x = np.ascontiguousarray(x).reshape(self.nranks, -1)
        if self.exact_calls < self.warmup_calls:
            self.exact_calls += 1
            y = x[0].copy()
            for r in range(1, self.nranks):
                y += x[r]
            if self.op == "avg":
                y /= F32(self.nranks)
        else:
            y = self._quantized(x, key)
        y = y.reshape(shape)
        return [y.copy() for _ in range(self.nranks)] if return_all else y

    def _quantized(self, x, key):
        if self.adaptive is not None:
            return self._layered(x, key)
        return self._call(x, self.bits, self._residual(key, x.shape))

    def _residual(self, key, shape):
        """The N x n residuals of buffer `key` (zeros at its first call), or None without
        error feedback."""
        if not self.error_feedback:
            return None
        e = self.residuals.get(key)
        if e is None:
            e = self.residuals[key] = np.zeros(shape, F32)
        elif e.shape != shape:
            raise ValueError(f"buffer {key!r} held {e.shape[1]} values, now {shape[1]}: "
                             "use another key, or reset()")
        return e

    def _call(self, x, bits, e):
        """One quantized call (the next call number) on N x n inputs, residuals e or None."""
        count = x.shape[1]
        algo = auto_algo(count, "float32", self.nranks) if self.algo == "auto" else self.algo
        cfg = _Config(self.nranks, bits, self.bucket_size, self.rounding, self.seed,
                      self.calls, self.op == "avg", False,
                      **rotated(self.rotation, self.rotation_block, self.clip))
        self.calls += 1
        return run(x, algo, cfg, self.segment_values, e)[0]

    def _layered(self, x, key):
        """The adaptive call: one call per width (in the order of each width's first layer),
        on its columns of x and of the buffer's residuals; the policy observes rank 0's
        layers and steps."""
        policy = self.adaptive
        counts = list(policy.layers.values())
        if x.shape[1] != sum(counts):
            raise ValueError(f"the adaptive bits' layers hold {sum(counts)} values, buffer "
                             f"{key!r} {x.shape[1]}")
        ends = np.cumsum(counts)
        spans = dict(zip(policy.layers, zip(ends - counts, ends)))
        groups = {}
        for name, bits in policy.assignment.items():
            groups.setdefault(bits, []).append(name)
        e = self._residual(key, x.shape)
        y = np.empty(x.shape[1], F32)
        for bits, names in groups.items():
            index = np.concatenate([np.arange(*spans[n]) for n in names])
            part = None if e is None else e[:, index]
            y[index] = self._call(np.ascontiguousarray(x[:, index]), bits, part)
            if e is not None:
                e[:, index] = part
        for name, (lo, hi) in spans.items():
            policy.observe(name, x[0, lo:hi])
        policy.step()
        return y
