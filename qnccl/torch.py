"""A DistributedDataParallel communication hook that quantizes gradients with qnccl's codec.

    import qnccl.torch
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = qnccl.torch.QuantizedHookState(model, bits=4, bucket_size=128)
    ddp.register_comm_hook(state, qnccl.torch.sra_hook)

Each gradient bucket is split per parameter: 1-D parameters and parameters with fewer than
`min_numel` elements are averaged exactly (one plain all_reduce per bucket); the others are
grouped by their (bits, bucket_size) and each group is averaged with the SRA algorithm of
docs/allreduce.md, by one of two implementations of it:

- CUDA buckets: libqnccl's engine (qncclAllReduce) on the process group's own NCCL
  communicator, enqueued on PyTorch's current stream; the bucket never leaves the device and
  the hook returns as soon as the work is enqueued, like fp16_compress_hook.
- CPU buckets (gloo): the codec on this rank's pieces, the quantized bytes travelling as
  point-to-point messages of torch.distributed, on a worker thread behind a future; or, with
  QuantizedHookState(comm=...), the engine on that NCCL communicator (the host backend's).

Both give the same bytes as qnccl.emulate. See docs/torch-hook.md.

Under `qnccl run` (libqnccl.so preloaded), a process group's own policy for the NCCL calls
PyTorch makes on it, e.g. to quantize the gradients' group and nothing else:

    qnccl.torch.set_quantization(grad_group, "allreduce,reducescatter", 4)
"""
from __future__ import annotations

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:  # torch stays optional for the rest of qnccl
    raise ImportError("qnccl.torch needs PyTorch with torch.distributed: "
                      "pip install torch (CPU wheels: --index-url "
                      "https://download.pytorch.org/whl/cpu)") from exc

import collections
import operator
import queue
import threading

import numpy as np

from . import _lib
from . import codec as _codec
from . import comm as _comm
from .emulate.adaptive import AdaptiveBits as _AdaptiveBits
from .emulate.allreduce import chunks as _chunks, segments as _segments, stream_id as _stream_id

__all__ = ["QuantizedHookState", "communicator", "set_quantization", "sra_hook"]

ROUNDINGS = ("stochastic", "nearest")
_F32 = np.float32


def _int_arg(name, value, low, high=None):
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if value < low or (high is not None and value > high):
        allowed = f"{low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {allowed}, got {value}")
    return value


def _setting(name, value):
    """(bits, bucket_size) checked, or None (exact)."""
    if value is None:
        return None
    try:
        bits, bucket_size = value
    except (TypeError, ValueError):
        raise ValueError(f"per_layer[{name!r}] must be (bits, bucket_size) or None, "
                         f"got {value!r}") from None
    return (_int_arg(f"per_layer[{name!r}] bits", bits, 1, 8),
            _int_arg(f"per_layer[{name!r}] bucket_size", bucket_size, 1))


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
    seed            the codec seed of stochastic rounding
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
                 warmup_steps=0, seed=0, comm=None, adaptive=None):
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.bits = _int_arg("bits", bits, 1, 8)
        self.bucket_size = _int_arg("bucket_size", bucket_size, 1)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be 'stochastic' or 'nearest', got {rounding!r}")
        self.rounding = rounding
        self.min_numel = _int_arg("min_numel", min_numel, 0)
        self.warmup_steps = _int_arg("warmup_steps", warmup_steps, 0)
        self.seed = _int_arg("seed", seed, 0, 2**64 - 1)
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
        self.error_feedback = error_feedback
        if per_layer is not None and not callable(per_layer) and not isinstance(per_layer, dict):
            raise ValueError("per_layer must be None, a dict {name or module prefix: "
                             f"(bits, bucket_size) or None}} or a callable, got {per_layer!r}")
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
        if self._engine_comm is not None and self.error_feedback:
            _comm.reset_error_feedback(self._engine_comm)

    # ---- the engine's input buffers -------------------------------------------------------
    def _engine(self, buffer):
        """The NCCL communicator whose engine reduces `buffer`'s quantized groups, or None
        (the SRA over torch.distributed)."""
        comm = communicator(self._group()) if buffer.is_cuda else self.comm
        if comm is None or comm == self._engine_comm:
            return comm
        if self._engine_comm is not None:  # a new communicator: the residuals move along
            self._move_residuals()
        if self._engine_calls is not None:  # restored: the random streams continue
            _comm.set_call_counts(comm, self._engine_calls)
            self._engine_calls = None
        self._engine_comm = comm
        return comm

    def _input(self, names, setting, device, count):
        """The float32 buffer a quantized group is reduced in, the same one at every call:
        the engine keeps error feedback's residual per buffer address. When DDP rebuilds its
        buckets (after the first iteration) the groups change; the residuals then move to
        `residuals` by parameter name, from where the new buffers' first calls take them."""
        key = (tuple(names), setting, str(device))
        if key not in self._inputs:
            if self.error_feedback and any(set(names) & set(k[0]) for k in self._inputs):
                self._move_residuals()  # these parameters had another buffer
            self._inputs[key] = torch.empty(count, dtype=torch.float32, device=device)
        return self._inputs[key]

    def _move_residuals(self):
        """The engine's residuals into `residuals` by name; the engine's are freed."""
        if self.error_feedback and self._engine_comm is not None:
            self.residuals.update(self._engine_residuals())
            _comm.reset_error_feedback(self._engine_comm)
        self._inputs.clear()

    def _engine_residuals(self):
        """The residuals the engine holds for this state's input buffers, by name."""
        out = {}
        for (names, setting, _), z in self._inputs.items():
            try:
                values = _comm.residual(self._engine_comm, z.data_ptr(), z.numel(), "float32")
            except _lib.QncclError:
                continue  # made, never reduced with error feedback
            offset = 0
            for name in names:
                m = self._sizes[name]
                out[name] = values[offset:offset + m].copy()
                offset += m
        return out

    def _engine_call_count(self):
        """The engine's call count to save: its communicator's, or the one restored."""
        if self._engine_comm is not None:
            return _comm.call_counts(self._engine_comm)[0]
        return self._engine_calls

    def _all_residuals(self):
        residuals = dict(self.residuals)
        if self.error_feedback and self._engine_comm is not None:
            residuals.update(self._engine_residuals())
        return residuals

    # ---- checkpoints ----------------------------------------------------------------------
    _CONFIG = ("bits", "bucket_size", "rounding", "min_numel", "error_feedback", "warmup_steps",
               "seed", "adaptive")
    _COUNTERS = ("input_bytes", "quantized_input_bytes", "quantized_bytes_sent", "exact_bytes")

    def state_dict(self):
        """What a restored job needs to continue bit for bit (torch.save-able): the
        configuration, the settings decided per parameter name, the call counters, the
        error-feedback residuals (float32 tensors) and the byte counts."""
        per_layer = self.per_layer
        return {"config": {k: getattr(self, k) for k in self._CONFIG},
                "per_layer": "callable" if callable(per_layer) else
                (None if per_layer is None else {k: v for k, v in per_layer.items()}),
                "settings": dict(self._settings),
                "calls": self.calls, "bucket_calls": dict(self.bucket_calls),
                "engine_calls": self._engine_call_count(),
                "residuals": {n: torch.from_numpy(r.copy())
                              for n, r in self._all_residuals().items()},
                "counters": {k: getattr(self, k) for k in self._COUNTERS},
                "world_size": self.world_size,
                "adaptive": None if self._policy is None else self._policy.state_dict()}

    def load_state_dict(self, state_dict):
        """Restores state_dict()'s counters, residuals and per-parameter settings into this
        state, made with the same arguments for the same model (a different configuration,
        or a parameter the model lacks, raises ValueError naming it)."""
        config = state_dict["config"]
        for key in self._CONFIG:  # (a checkpoint older than adaptive bits has none)
            if config.get(key) != getattr(self, key):
                raise ValueError(f"the checkpoint's hook state has {key}={config.get(key)!r}, this "
                                 f"one {getattr(self, key)!r}: make it with the checkpoint's "
                                 "arguments")
        names = set(self._names.values()) if self._names is not None else None
        for name in list(state_dict["settings"]) + list(state_dict["residuals"]):
            if names is not None and name not in names:
                raise ValueError(f"the checkpoint's hook state has parameter {name!r}, which "
                                 "the model does not")
        self._settings = {n: (None if s is None else tuple(s))
                          for n, s in state_dict["settings"].items()}
        self.calls = int(state_dict["calls"])
        self._engine_calls = state_dict.get("engine_calls")
        self.bucket_calls = {int(k): int(v) for k, v in state_dict["bucket_calls"].items()}
        self.residuals = {n: r.detach().cpu().numpy().astype(_F32, copy=True)
                          for n, r in state_dict["residuals"].items()}
        if self._engine_comm is not None and self.error_feedback:
            _comm.reset_error_feedback(self._engine_comm)  # the restored ones replace them
        self._inputs.clear()
        self._engine_comm = None  # the next call gives the engine the restored call count
        for key in self._COUNTERS:
            setattr(self, key, state_dict["counters"][key])
        self.world_size = state_dict["world_size"]
        if self._policy is not None:
            self._policy.load_state_dict(state_dict["adaptive"])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["process_group"] = None  # not picklable: the default group after loading
        state["_names"] = None  # ids of this process's tensors: attach(model) after loading
        state["_thread"] = None  # a thread: a new one after loading
        state["residuals"] = self._all_residuals()  # the engine's, by name
        state["_engine_calls"] = self._engine_call_count()
        state["comm"] = state["_engine_comm"] = None  # this process's communicators
        state["_inputs"] = {}
        return state

    def __setstate__(self, state):
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

    def _worker(self):
        if self._thread is None:
            self._thread = _Worker()
        return self._thread


def _plain(model):
    """The module under torch.compile's wrapper (_orig_mod) and DDP's (module), either order."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


class _Worker:
    """The thread that reduces a state's host buckets. A bucket's work is a generator that
    yields where it is about to wait (for messages, a collective, the engine's peers), so
    that its first step only issues work: collectives asynchronously, its first pieces
    encoded and sent. A bucket DDP hands over gets its first step at once; otherwise the
    thread advances the oldest bucket to its next wait. So the codec of one bucket overlaps
    the transfers of the one before, every rank issues its collectives and sends in bucket
    order, and a rank only ever waits for the oldest unfinished bucket, whose messages every
    other rank has sent, or sends before it waits for anything newer: no cycle of waits."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="qnccl-hook", daemon=True).start()

    def submit(self, steps, future):
        """Runs the generator `steps`; its return value (or exception) completes `future`."""
        self._queue.put((steps, future))

    def _run(self):
        active = collections.deque()
        while True:
            try:
                item = self._queue.get(block=not active)
                active.append(item)
            except queue.Empty:  # nothing new: the oldest bucket goes on
                item = active[0]
            steps, future = item
            try:
                next(steps)
            except StopIteration as done:
                active.remove(item)
                future.set_result(done.value)
            except BaseException as error:  # the future carries it to DDP's wait
                active.remove(item)
                future.set_exception(error)


def _quantized(data, count, bits, bucket_size):
    return _codec.QuantizedArray(data=data, count=count, shape=(count,), dtype="float32",
                                 bits=bits, bucket_size=bucket_size, rounding="nearest",
                                 seed=0, stream=0)


# The tags of the hook's point-to-point messages: "QN" << 16, plus 2 per call and the phase.
_TAG = 0x514E << 16
_EXACT_TAG = 0x514F << 16  # the exact parts' (_exact_mean)
_TAG_CALLS = 1 << 15


def _sra(state, group, z, bits, bucket_size, residual):
    """The SRA average of the float32 vector z over the group (docs/allreduce.md), returned by
    this generator, which yields before each wait for messages (_Worker); fills `residual`
    (when not None) with what this rank's quantizations dropped: z - D(Q(z)) on the chunks
    it sent, N * (acc/N - D(q_r)) on its own chunk.

    The pieces travel as point-to-point messages, each sent as soon as it is encoded and
    decoded in the fixed order of the algorithm once it has arrived, so that the codec of one
    piece overlaps the transfer of another; the bytes are those of one all-to-all per phase."""
    n, r, peers, others = _ranks(group)
    call = state.calls
    state.calls += 1
    tag = _TAG + 2 * (call % _TAG_CALLS)  # + phase: calls in flight together never share one
    out = np.empty_like(z)
    for g, (start, stop) in enumerate(_segments(z.size, 0, bucket_size)):
        bounds = _chunks(stop - start, n, bucket_size)
        sizes = [_codec.compressed_size(hi - lo, bits, bucket_size) if hi > lo else 0
                 for lo, hi in bounds]

        def q(values, step):
            return _codec.quantize(values, bits, bucket_size, state.rounding, state.seed,
                                   _stream_id(call, g, r, step))

        def receive(size_of, phase):
            return _receive(group, peers, others, size_of, tag + phase,
                            lambda size: np.empty(size, np.uint8))

        # scatter-reduce: chunk k quantized for its owner k
        lo, hi = bounds[r]
        inbox = receive(lambda j: sizes[r], 0)
        sent = []
        for k in others:
            klo, khi = bounds[k]
            if khi == klo:
                continue
            values = z[start + klo:start + khi]
            qk = q(values, k)
            if residual is not None:
                residual[start + klo:start + khi] = values - _codec.dequantize(qk)
            sent.append(_post(qk.data, peers[k], group, tag))
            state.quantized_bytes_sent += sizes[k]
        yield
        mine = None
        if hi > lo:
            acc = z[start + lo:start + hi].copy()
            for j in range(n):  # the sum in increasing rank order, as every algorithm adds
                if j != r:
                    _codec.dequantize_accumulate(
                        _quantized(_arrived(inbox[j]), hi - lo, bits, bucket_size), acc)
            with np.errstate(invalid="ignore", over="ignore"):
                acc /= _F32(n)
            mine = q(acc, n)
            result = _codec.dequantize(mine)
            out[start + lo:start + hi] = result
            if residual is not None:
                with np.errstate(invalid="ignore", over="ignore"):
                    residual[start + lo:start + hi] = (acc - result) * _F32(n)

        # allgather: the owner's bytes to every other rank
        inbox = receive(sizes.__getitem__, 1)
        if mine is not None:
            for k in others:
                sent.append(_post(mine.data, peers[k], group, tag + 1))
                state.quantized_bytes_sent += sizes[r]
        yield
        for k in others:
            if k in inbox:
                klo, khi = bounds[k]
                out[start + klo:start + khi] = _codec.dequantize(
                    _quantized(_arrived(inbox[k]), khi - klo, bits, bucket_size))
        for work, _ in sent:
            work.wait()
    if residual is not None:  # docs/allreduce.md: a non-finite bucket leaves no residual, so
        residual[~np.isfinite(residual)] = 0  # a step AMP skips cannot poison the next ones
    return out


def _ranks(group):
    """(N, this rank, each group rank's global rank, the other ranks from this one + 1 on: the
    order sends go in, so that not every rank starts with the same peer)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return n, r, [dist.get_global_rank(group, k) for k in range(n)], \
        [(r + i) % n for i in range(1, n)]


def _receive(group, peers, sources, size_of, tag, empty):
    """irecvs from each group rank j of `sources` that sends something (size_of(j) > 0) into
    a new buffer empty(size): {j: (work, buffer)}."""
    return {j: _post(empty(size_of(j)), peers[j], group, tag, recv=True)
            for j in sources if size_of(j)}


def _post(data, peer, group, tag, recv=False):
    """An isend (or irecv into) of `data`, a tensor or a numpy array: (work, data)."""
    op = dist.irecv if recv else dist.isend
    tensor = torch.from_numpy(data) if isinstance(data, np.ndarray) else data
    return op(tensor, peer, group=group, tag=tag), data


def _arrived(posted):
    work, data = posted
    work.wait()
    return data


def sra_hook(state: QuantizedHookState, bucket):
    """DDP communication hook: the bucket's gradients averaged over the process group (exact
    for small and 1-D parameters and during warm-up, SRA-quantized for the rest).

    CUDA buckets: everything is enqueued on PyTorch's current stream (the exact part through
    the process group, the quantized groups through libqnccl's engine on the group's NCCL
    communicator) and the hook returns a future bound to the device, completed on that
    stream, as the futures of ProcessGroupNCCL's collectives are: the host never waits.

    Host buckets are reduced on the state's worker thread and the hook returns at once with a
    future that completes when the bucket is done, so that the backward pass goes on
    computing the next buckets meanwhile (the codec releases the GIL); the worker starts each
    bucket as it comes, so that its codec overlaps the transfers of the one before (_Worker).
    """
    if bucket.buffer().is_cuda:
        buffer = _to_end(_reduce_bucket(state, bucket))
        future = torch.futures.Future(devices=[buffer.device])
        future.set_result(buffer)  # records an event on the current stream
        return future
    future = torch.futures.Future()
    state._worker().submit(_reduce_bucket(state, bucket), future)
    return future


def _to_end(steps):
    """The return value of the generator `steps`, run without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _reduce_bucket(state, bucket):
    """The bucket's averaged gradients, in its buffer (sra_hook's work): a generator that
    yields where the host path is about to wait for messages, and returns the buffer.

    The order of the work is the same on every rank: the exact part first, then the
    quantized groups in bucket_plan's order. On the host the exact part's messages travel
    with the first group's (_exact_mean); on a device it is the process group's all_reduce,
    and the current stream waits for it before the engine's kernels, so that the
    communicator's operations (the process group's and the engine's, on two streams) run
    one after another."""
    group = state._group()
    n = dist.get_world_size(group)
    buffer = bucket.buffer()
    index = bucket.index()
    state.world_size = n
    state.input_bytes += buffer.numel() * buffer.element_size()
    seen = state.bucket_calls.get(index, 0)
    state.bucket_calls[index] = seen + 1
    if seen < state.warmup_steps or n == 1:
        state.exact_bytes += buffer.numel() * buffer.element_size()
        work = dist.all_reduce(buffer, group=group, async_op=True)
        yield  # a bucket's first step never waits (_Worker)
        work.wait()
        buffer.div_(n)
        if state._policy is not None and bucket.is_last():
            yield from _end_of_step(state, group, buffer.device)
        return buffer

    params, grads = bucket.parameters(), bucket.gradients()
    exact, groups = state.bucket_plan(params)
    if state._policy is not None and dist.get_rank(group) == 0:  # the deciding rank's own
        for _, members in groups:
            for i in members:
                state._policy.observe(state.name_of(params[i]), grads[i].reshape(-1).float())
    exact_part = None  # the host's exact mean, a generator
    if exact:
        flat = torch.cat([grads[i].reshape(-1) for i in exact])
        state.exact_bytes += flat.numel() * flat.element_size()
        if buffer.is_cuda:  # the current stream waits for the process group's stream
            dist.all_reduce(flat, group=group, async_op=True).wait()
            flat.div_(n)
        else:
            exact_part = _exact_mean(state, group, flat)
    engine = state._engine(buffer)
    if engine is not None:
        if exact_part is not None:
            next(exact_part)  # its first messages
        yield  # the engine waits for its peers: not in a bucket's first step (_Worker)
    for setting, members in groups:
        names = [state.name_of(params[i]) for i in members]
        state.quantized_input_bytes += sum(grads[i].numel() * grads[i].element_size()
                                           for i in members)
        if engine is None:
            steps = _torch_group(state, group, [grads[i] for i in members], names, setting)
            if exact_part is not None:  # the two parts' messages go in the same rounds
                steps, exact_part = _together(steps, exact_part), None
            yield from steps
        else:
            _engine_group(state, engine, [grads[i] for i in members], names, setting)
    if exact_part is not None:
        yield from exact_part
    if exact:
        _scatter(flat, [grads[i] for i in exact])
    if state._policy is not None and bucket.is_last():
        yield from _end_of_step(state, group, buffer.device)
    return buffer


def _end_of_step(state, group, device):
    """After the step's last bucket, with adaptive bits: at each decision point rank 0 of
    the group has decided from what it observed (AdaptiveBits.step), and broadcasts its
    widths; every rank takes them for the next steps. A generator like _reduce_bucket."""
    policy = state._policy
    if not policy.step():
        return
    widths = torch.tensor([policy.assignment[n] for n in policy.layers], dtype=torch.int64,
                          device=device)
    work = dist.broadcast(widths, src=dist.get_global_rank(group, 0), group=group,
                          async_op=True)
    yield
    work.wait()
    policy.assignment = dict(zip(policy.layers, widths.tolist()))
    for name in policy.layers:  # decided again from the new assignment
        state._settings.pop(name, None)


def _together(*steps):
    """Runs generators in lock step (one step of each per yield) until all have returned."""
    live = list(steps)
    while live:
        for one in list(live):
            try:
                next(one)
            except StopIteration:
                live.remove(one)
        if live:
            yield


def _exact_mean(state, group, flat):
    """The mean over the group of the host tensor `flat`, in place: a generator that yields
    after sending and before waiting, as _sra does. Rank k owns chunk k of the values: every
    rank sends it its values of that chunk, the owner adds the N of them in increasing rank
    order, divides by N and sends the mean to every rank. Two rounds of point-to-point
    messages, which go with the quantized groups' (a collective's several rounds would each
    wait behind the bucket's bulk on a slow link); every rank ends with the same bytes."""
    n, r, peers, others = _ranks(group)
    tag = _EXACT_TAG + 2 * (state._exact_calls % _TAG_CALLS)
    state._exact_calls += 1
    bounds = _chunks(flat.numel(), n, 1)
    lo, hi = bounds[r]

    def receive(size_of, phase):
        return _receive(group, peers, others, size_of, tag + phase,
                        lambda size: torch.empty(size, dtype=flat.dtype))

    inbox = receive(lambda j: hi - lo, 0)
    sent = [_post(flat[klo:khi], peers[k], group, tag)
            for k, (klo, khi) in enumerate(bounds) if k != r and khi > klo]
    yield
    mean = None
    if hi > lo:
        for j in range(n):
            part = flat[lo:hi] if j == r else _arrived(inbox[j])
            mean = part.clone() if mean is None else mean.add_(part)
        mean.div_(n)
    inbox = receive(lambda k: bounds[k][1] - bounds[k][0], 1)
    if mean is not None:
        sent += [_post(mean, peers[k], group, tag + 1) for k in others]
    yield
    for work, _ in sent:  # flat's chunks went out from flat itself
        work.wait()
    if mean is not None:
        flat[lo:hi] = mean
    for k, posted in inbox.items():
        flat[bounds[k][0]:bounds[k][1]] = _arrived(posted)
    return flat


def _scatter(flat, grads):
    """Copies the concatenation `flat` back into the gradients it was made of."""
    offset = 0
    for grad in grads:
        m = grad.numel()
        grad.copy_(flat[offset:offset + m].view_as(grad))
        offset += m


def _take_residuals(state, z, grads, names):
    """Adds to the float32 vector z (a numpy array or a tensor) the residuals `residuals`
    holds for these parameters, and drops them from there."""
    offset = 0
    for grad, name in zip(grads, names):
        m = grad.numel()
        old = state.residuals.pop(name, None)
        if old is not None and old.size == m:
            z[offset:offset + m] += old if isinstance(z, np.ndarray) else \
                torch.from_numpy(old).to(z.device)
        offset += m


def _torch_group(state, group, grads, names, setting):
    """A quantized group averaged by _sra over torch.distributed (host tensors); a generator
    like _sra."""
    z = torch.cat([g.reshape(-1) for g in grads]).to("cpu", torch.float32).numpy()
    residual = None
    if state.error_feedback:
        _take_residuals(state, z, grads, names)
        residual = np.zeros_like(z)
    out = yield from _sra(state, group, z, *setting, residual)
    _scatter(torch.from_numpy(out), grads)
    if residual is not None:
        offset = 0
        for grad, name in zip(grads, names):
            state.residuals[name] = residual[offset:offset + grad.numel()].copy()
            offset += grad.numel()


def _engine_group(state, comm, grads, names, setting):
    """A quantized group averaged by libqnccl's engine on `comm` (qncclAllReduce, SRA), in
    place in the group's input buffer, on the current stream of the gradients' device."""
    bits, bucket_size = setting
    device = grads[0].device
    z = state._input(names, setting, device, sum(g.numel() for g in grads))
    _gather(z, grads)
    if state.error_feedback:
        _take_residuals(state, z, grads, names)
    before = _comm.stats(comm)["bytes_on_wire"]
    _comm.allreduce(comm, z.data_ptr(), z.data_ptr(), z.numel(), "float32", "avg", bits=bits,
                    bucket_size=bucket_size, rounding=state.rounding, seed=state.seed,
                    algo="sra", error_feedback=state.error_feedback, stream=_stream(z))
    state.calls += 1
    state.quantized_bytes_sent += _comm.stats(comm)["bytes_on_wire"] - before
    _scatter(z, grads)


def _gather(z, grads):
    """Copies the gradients into z, one after another (converted to z's float32)."""
    offset = 0
    for grad in grads:
        m = grad.numel()
        z[offset:offset + m].copy_(grad.reshape(-1))
        offset += m


def _stream(tensor):
    """The CUDA stream the engine computes `tensor` on: PyTorch's current stream of its
    device (0 for host memory, which the engine computes before returning)."""
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


def communicator(group=None):
    """The address of `group`'s NCCL communicator (default: the world group), as
    ProcessGroupNCCL._comm_ptr() gives it, for qnccl.comm's per-communicator calls."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    try:
        backend = group._get_backend(torch.device("cuda"))
        address = backend._comm_ptr()
    except (RuntimeError, AttributeError) as exc:
        raise ValueError(f"process group {group!r} has no NCCL backend with a communicator "
                         f"({exc}); QNCCL's policy applies to NCCL process groups "
                         f"(backend='nccl')") from exc
    if not address:
        raise RuntimeError("the process group's NCCL communicator does not exist yet: "
                           "PyTorch makes it at the group's first collective, or at "
                           "init_process_group(..., device_id=...); call after that")
    return int(address)


def set_quantization(group, collectives, bits):
    """qnccl.comm.set_quantization on `group`'s NCCL communicator: the NCCL calls PyTorch
    makes for `collectives` on it (names of qnccl.comm.COLLECTIVES; PyTorch's all_to_all
    is "sendrecv" or "alltoall") run with `bits` 1..8, 0 exact, None the environment's
    policy. Call it on every rank of the group."""
    _comm.set_quantization(communicator(group), collectives, bits)
