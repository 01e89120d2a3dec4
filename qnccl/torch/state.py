"""QuantizedHookState: the hook's configuration, its per-parameter decisions, its counters."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _checks
from .. import comm as _comm
from ..emulate import rotation as _rotation
from ..emulate.adaptive import AdaptiveBits as _AdaptiveBits
from . import checkpoint, engine

ROUNDINGS = ("stochastic", "nearest")
ROTATIONS = ("none", "hadamard")
CLIPS = ("none", "gaussian")


def _setting(name, value):
    """(bits, bucket_size) checked, or None (exact)."""
    if value is None:
        return None
    allowed = f"per_layer[{name!r}] must be (bits, bucket_size) or None"
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{allowed}, got {_checks.describe(value)}")
    if len(value) != 2:
        raise ValueError(f"{allowed}, got {value!r}")
    return (_checks.bits(value[0], f"per_layer[{name!r}] bits"),
            _checks.bucket_size(value[1], f"per_layer[{name!r}] bucket_size"))


class QuantizedHookState:
    """State of sra_hook: configuration, random-stream call counter, residuals, byte counts.

    model           the module whose parameters DDP reduces (the DDP wrapper is accepted too);
                    it gives the parameter names per_layer refers to
    process_group   the group DDP uses (None: the default group, looked up at the first call)
    bits            1..8, bucket_size >= 1: the default codec configuration
    rounding        "stochastic" or "nearest"
    min_numel       parameters with fewer elements (and every 1-D parameter) are exact
    per_layer       None, a dict {parameter name or module prefix: (bits, bucket_size) or None}
                    (longest prefix on module boundaries wins; None: exact), or a callable
                    (name, parameter) -> (bits, bucket_size) or None, consulted for the
                    parameters that are not exact by the rule above
    adaptive        None, True or a dict of qnccl.emulate.adaptive.AdaptiveBits options (every:
                    steps between decisions, default 100; choices: widths, default 2, 3, 4, 5,
                    6, 8; resolution): per-layer widths of the quantized parameters at no more
                    wire bytes than `bits` everywhere, re-decided every `every` steps by rank 0
                    of the group from its own gradients and broadcast to every rank at the end
                    of the step (excludes per_layer)
    error_feedback  keep per-rank float32 residuals of what the quantizations dropped
    warmup_steps    the first K calls of each bucket index are exact (plain allreduce mean)
    seed            the codec seed of stochastic rounding, and of the rotation's signs
    rotation        "none" or "hadamard": each quantized group rotated in blocks of
                    rotation_block values (a power of two, 2..16384) before it is quantized,
                    every bucket on the uniform grid, and rotated back after (docs/rotation.md;
                    on both paths, the same bytes); excludes error_feedback (residuals would
                    live in each group's rotated domain, which checkpoints and DDP's rebuilt
                    buckets do not keep) and adaptive (its widths come from unrotated errors)
    clip            "none", or with rotation="hadamard" "gaussian": every rotated bucket's
                    range clipped where a Gaussian's quantizes best (docs/rotation.md,
                    "Clipped ranges"; pays with Adam-like optimizers, costs under plain SGD)
    comm            None, or an NCCL communicator (cffi ncclComm_t or its address) of the
                    process group's ranks in the same order, e.g. one of QNCCL's host backend:
                    CPU buckets then go through libqnccl's engine on it, as CUDA buckets go
                    through the engine on the group's own NCCL communicator

    Checkpoints: state_dict() / load_state_dict() carry, keyed by parameter names, the
    per-parameter settings decided so far, the call counters, the residuals and the byte
    counts, so that a restored job continues bit for bit; torch.save(state) works too (the
    process group is left out, as PowerSGDState does; a callable per_layer must be a
    module-level function), and a state loaded that way needs attach(model) (and its comm,
    if it had one). Where the engine runs, it keeps the residuals (per communicator and
    input buffer) and counts the calls of the random streams itself; the checkpoint carries
    both (state_dict() reads them back), and the restored state gives them to the engine of
    its new communicator at its first call there.
    """

    def __init__(self, model, process_group=None, bits=4, bucket_size=128,
                 rounding="stochastic", min_numel=1024, per_layer=None, error_feedback=False,
                 warmup_steps=0, seed=0, comm=None, adaptive=None, rotation="none",
                 rotation_block=_rotation.DEFAULT_BLOCK, clip="none"):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {_checks.describe(model)}")
        self.bits = _checks.bits(bits)
        self.bucket_size = _checks.bucket_size(bucket_size)
        self.rounding = _checks.one_of("rounding", rounding, ROUNDINGS)
        self.min_numel = _checks.integer("min_numel", min_numel, 0)
        self.warmup_steps = _checks.integer("warmup_steps", warmup_steps, 0)
        self.seed = _checks.uint64("seed", seed)
        self.error_feedback = _checks.boolean("error_feedback", error_feedback)
        _rotation.check(rotation, rotation_block, ROTATIONS)
        if rotation != "none" and error_feedback:
            raise ValueError("rotation and error_feedback exclude each other in the hook (its "
                             "residuals would live in each group's rotated domain): pass "
                             "rotation='none' or error_feedback=False")
        if rotation != "none" and adaptive not in (None, False):
            raise ValueError("rotation and adaptive exclude each other (adaptive widths come "
                             "from unrotated errors on the cubic grid): pass rotation='none' "
                             "or adaptive=None")
        _checks.clip(clip, rotation, ROTATIONS)
        self.rotation, self.rotation_block, self.clip = rotation, rotation_block, clip
        if per_layer is not None and not callable(per_layer) and not isinstance(per_layer, dict):
            raise TypeError("per_layer must be None, a dict {name or module prefix: "
                            f"(bits, bucket_size) or None}} or a callable, got "
                            f"{_checks.describe(per_layer)}")
        if isinstance(per_layer, dict):
            per_layer = {str(k): _setting(k, v) for k, v in per_layer.items()}
        self.per_layer = per_layer
        self.process_group = process_group
        self.comm = None if comm is None else _comm._comm_address(comm)
        self.attach(model)
        self.adaptive, self._policy = self._adaptive_policy(adaptive, _plain(model))
        self._settings = {}  # parameter name -> (bits, bucket_size) or None, as decided
        self.calls = 0  # quantized SRA calls so far: the `call` of the random streams
        self.bucket_calls = {}  # bucket index -> hook calls so far (warm-up)
        self.residuals = {}  # parameter name -> float32 numpy residual (error feedback); where
        # the engine runs, the ones it does not hold yet (restored, or left by rebuilt buckets)
        self.input_bytes = 0  # gradient bytes handed to the hook
        self.quantized_input_bytes = 0  # of those, the bytes that took the quantized path
        self.quantized_bytes_sent = 0  # wire bytes this rank sent to other ranks (both phases)
        self.exact_bytes = 0  # bytes given to plain all_reduce (exact parts, warm-up)
        self.world_size = None  # set at the first call
        self._thread = None  # the worker that reduces host buckets (sra_hook)
        self._exact_calls = 0  # exact means so far (host): their messages' tags
        self._engine_comm = None  # the communicator the engine ran on
        self._engine_calls = None  # restored: the engine's call count to continue from
        self._inputs = {}  # engine: (names, setting, device) -> float32 input buffer

    # ---- configuration ------------------------------------------------------------------
    def attach(self, model, comm=None):
        """The model whose parameters the buckets hold (its DDP wrapper, or a torch.compile'd
        module, is accepted too): names are those of the plain module; and, unless None, the
        NCCL communicator host buckets are reduced on (as QuantizedHookState's comm)."""
        if comm is not None:
            self.comm = _comm._comm_address(comm)
        model = _plain(model)
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._sizes = {n: p.numel() for n, p in model.named_parameters()}

    def _adaptive_policy(self, adaptive, model):
        """(the adaptive option as given, checked, or None; its AdaptiveBits or None)."""
        if adaptive is None or adaptive is False:
            return None, None
        if self.per_layer is not None:
            raise ValueError("per_layer and adaptive exclude each other: give the widths, or "
                             "let adaptive choose them")
        options = {} if adaptive is True else adaptive
        if not isinstance(options, dict) or set(options) - {"every", "choices", "resolution"}:
            raise ValueError("adaptive must be None, True or a dict with keys every, choices, "
                             f"resolution, got {adaptive!r}")
        options = {"every": 100, **options}
        layers = {n: p.numel() for n, p in model.named_parameters()
                  if p.dim() > 1 and p.numel() >= self.min_numel}
        if not layers:
            raise ValueError(f"adaptive: the model has no parameter of 2 or more dimensions "
                             f"and at least min_numel={self.min_numel} elements to quantize")
        try:
            policy = _AdaptiveBits(layers, bits=self.bits, bucket_size=self.bucket_size,
                                   **options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"adaptive: {error}") from None
        return dict(options), policy

    def name_of(self, param):
        if self._names is None:
            raise ValueError("this QuantizedHookState was loaded with torch.load and does not "
                             "know the model's parameters: call state.attach(model) first")
        try:
            return self._names[id(param)]
        except KeyError:
            raise ValueError("a bucket holds a parameter that is not in the model given to "
                             "QuantizedHookState") from None

    def setting(self, param):
        """(bits, bucket_size) of the parameter's quantization, or None when it is exact."""
        name = self.name_of(param)
        if name not in self._settings:
            self._settings[name] = self._decide(name, param)
        return self._settings[name]

    def _decide(self, name, param):
        if param.dim() <= 1 or param.numel() < self.min_numel:
            return None
        if self._policy is not None:
            return (self._policy.assignment[name], self.bucket_size)
        if callable(self.per_layer):
            return _setting(name, self.per_layer(name, param))
        if self.per_layer:
            best = None
            for prefix in self.per_layer:
                if name == prefix or name.startswith(prefix + ".") or prefix == "":
                    if best is None or len(prefix) > len(best):
                        best = prefix
            if best is not None:
                return self.per_layer[best]
        return (self.bits, self.bucket_size)

    def bucket_plan(self, params):
        """(exact parameter indices, [((bits, bucket_size), [indices])]) for a bucket's
        parameter list, each quantized group one SRA call (consecutive `call` numbers). The
        order is the parameters' names': members by name, groups by their first member's, so
        that the quantized bytes do not depend on the order DDP put the bucket in (it rebuilds
        its buckets after the first iteration, so a job restored from a checkpoint starts in
        another order than the one that never stopped)."""
        names = [self.name_of(p) for p in params]
        exact, groups = [], {}
        for i in sorted(range(len(params)), key=names.__getitem__):
            s = self.setting(params[i])
            if s is None:
                exact.append(i)
            else:
                groups.setdefault(s, []).append(i)
        return exact, sorted(groups.items(), key=lambda item: names[item[1][0]])

    def reset(self):
        """Clears the error-feedback residuals (the engine's too)."""
        self.residuals.clear()
        engine.reset(self)

    # ---- checkpoints (checkpoint.py) ------------------------------------------------------
    def state_dict(self):
        """What a restored job needs to continue bit for bit (torch.save-able): the
        configuration, the settings decided per parameter name, the call counters, the
        error-feedback residuals (float32 tensors) and the byte counts."""
        return checkpoint.state_dict(self)

    def load_state_dict(self, state_dict):
        """Restores state_dict()'s counters, residuals and per-parameter settings into this
        state, made with the same arguments for the same model (a different configuration,
        or a parameter the model lacks, raises ValueError naming it)."""
        checkpoint.load_state_dict(self, state_dict)

    def __getstate__(self):
        return checkpoint.pickled(self)

    def __setstate__(self, state):
        # a state pickled before rotations (or clips) existed was an unrotated (unclipped) one
        self.__dict__.update({"rotation": "none", "rotation_block": _rotation.DEFAULT_BLOCK,
                              "clip": "none"})
        self.__dict__.update(state)

    def report(self):
        """Byte counts so far. input_per_sent: gradient bytes of the quantized path per byte
        this rank sent for it; compression: what an uncompressed SRA (reduce-scatter +
        allgather, 2*(N-1)/N of its input per rank) would have sent per byte sent."""
        q = self.quantized_bytes_sent
        n = self.world_size or 1
        plain = 2 * (n - 1) / n * self.quantized_input_bytes
        return {"input_bytes": self.input_bytes,
                "quantized_input_bytes": self.quantized_input_bytes,
                "quantized_bytes_sent": q, "exact_bytes": self.exact_bytes,
                "calls": self.calls,
                "input_per_sent": self.quantized_input_bytes / q if q else float("nan"),
                "compression": plain / q if q else float("nan")}

    def _group(self):
        return self.process_group if self.process_group is not None else dist.group.WORLD


def _plain(model):
    """The module under torch.compile's wrapper (_orig_mod) and DDP's (module), either order."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
