"""The hook's host path: a quantized group averaged by the SRA algorithm over
torch.distributed's point-to-point messages (gloo), each piece sent as soon as it is encoded,
on a worker thread behind DDP's future. The work of a bucket is a generator that yields before
each wait (Worker), so that one bucket's codec overlaps the transfers of the one before.
"""
from __future__ import annotations

import atexit
import collections
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist

from .. import codec as _codec
from ..emulate.allreduce import chunks as _chunks, segments as _segments, stream_id as _stream_id
from .grads import scatter, take_residuals

_F32 = np.float32


class Worker:
    """The thread that reduces a state's host buckets. A bucket's work is a generator that
    yields where it is about to wait (for messages, a collective, the engine's peers), so
    that its first step only issues work: collectives asynchronously, its first pieces
    encoded and sent. A bucket DDP hands over gets its first step at once; otherwise the
    thread advances the oldest bucket to its next wait. So the codec of one bucket overlaps
    the transfers of the one before, every rank issues its collectives and sends in bucket
    order, and a rank only ever waits for the oldest unfinished bucket, whose messages every
    other rank has sent, or sends before it waits for anything newer: no cycle of waits.

    At interpreter exit the thread is stopped and joined before Python finalizes. A bucket's
    future completes from this thread, inside PyTorch's Future.set_result, which releases the
    GIL while it wakes the waiting backward pass and runs DDP's callbacks; the training loop
    can then finish and the interpreter finalize while this thread is still in there, and a
    daemon thread that takes the GIL back during finalization is ended by pthread_exit,
    whose unwinding through PyTorch's noexcept frames aborts the process ("terminate called
    without an active exception", exit 134, seen about once in 20 two-rank jobs). The join
    waits up to EXIT_WAIT_S: a thread still waiting for a peer by then (a job ending on an
    error mid-step) is left behind."""

    EXIT_WAIT_S = 10.0

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="qnccl-hook", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def submit(self, steps, future):
        """Runs the generator `steps`; its return value (or exception) completes `future`."""
        self._queue.put((steps, future))

    def stop(self):
        """Ends the thread once it is done with what it is in (the buckets that have not
        finished are dropped: nothing waits for them any more) and joins it."""
        atexit.unregister(self.stop)
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(self.EXIT_WAIT_S)

    def _run(self):
        active = collections.deque()
        while True:
            try:
                item = self._queue.get(block=not active)
                if item is None:
                    return
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


def _quantized(data, count, bits, bucket_size, grid):
    """A received piece as the codec's QuantizedArray; grid: the codec's rotation setting of
    its buckets ("none": the cubic grid where it applies; "prerotated": the uniform grid)."""
    return _codec.QuantizedArray(data=data, count=count, shape=(count,), dtype="float32",
                                 bits=bits, bucket_size=bucket_size, rounding="nearest",
                                 seed=0, stream=0, rotation=grid)


# The tags of the hook's point-to-point messages: "QN" << 16, plus 2 per call and the phase.
_TAG = 0x514E << 16
_EXACT_TAG = 0x514F << 16  # the exact parts' (exact_mean)
_TAG_CALLS = 1 << 15


def _sra(state, group, z, bits, bucket_size, residual):
    """The SRA average of the float32 vector z over the group (docs/allreduce.md), returned by
    this generator, which yields before each wait for messages (Worker); fills `residual`
    (when not None) with what this rank's quantizations dropped: z - D(Q(z)) on the chunks
    it sent, 0 on its own chunk (the result's error is not fed back).

    The pieces travel as point-to-point messages, each sent as soon as it is encoded and
    decoded in the fixed order of the algorithm once it has arrived, so that the codec of one
    piece overlaps the transfer of another; the bytes are those of one all-to-all per phase.

    With state.rotation (docs/rotation.md) each segment is rotated first, the algorithm runs on
    the rotated values (every bucket on the uniform grid), and the segment's result is rotated
    back: the engine's rotated allreduce, step for step."""
    n, r, peers, others = _ranks(group)
    call = state.calls
    state.calls += 1
    tag = _TAG + 2 * (call % _TAG_CALLS)  # + phase: calls in flight together never share one
    rotated = state.rotation == "hadamard"
    grid = "prerotated" if rotated else "none"
    out = np.empty_like(z)
    for g, (start, stop) in enumerate(_segments(z.size, 0, bucket_size)):
        bounds = _chunks(stop - start, n, bucket_size)
        sizes = [_codec.compressed_size(hi - lo, bits, bucket_size) if hi > lo else 0
                 for lo, hi in bounds]
        zs = z[start:stop]  # the segment, and where its result goes
        ys = out[start:stop]
        if rotated:  # in place: z is this call's own copy of the gradients
            _codec.rotate(zs, state.seed, state.rotation_block, out=zs)

        def q(values, step):
            return _codec.quantize(values, bits, bucket_size, state.rounding, state.seed,
                                   _stream_id(call, g, r, step), rotation=grid,
                                   clip=state.clip)

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
            values = zs[klo:khi]
            qk = q(values, k)
            if residual is not None:
                residual[start + klo:start + khi] = values - _codec.dequantize(qk)
            sent.append(_post(qk.data, peers[k], group, tag))
            state.quantized_bytes_sent += sizes[k]
        yield
        mine = None
        if hi > lo:
            acc = zs[lo:hi].copy()
            for j in range(n):  # the sum in increasing rank order, as every algorithm adds
                if j != r:
                    _codec.dequantize_accumulate(
                        _quantized(_arrived(inbox[j]), hi - lo, bits, bucket_size, grid), acc)
            with np.errstate(invalid="ignore", over="ignore"):
                acc /= _F32(n)
            mine = q(acc, n)
            result = _codec.dequantize(mine)
            ys[lo:hi] = result
            if residual is not None:
                residual[start + lo:start + hi] = 0

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
                ys[klo:khi] = _codec.dequantize(
                    _quantized(_arrived(inbox[k]), khi - klo, bits, bucket_size, grid))
        if rotated:
            _codec.unrotate(ys, state.seed, state.rotation_block, out=ys)
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


def together(*steps):
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


def exact_mean(state, group, flat):
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


def torch_group(state, group, grads, names, setting):
    """A quantized group averaged by _sra over torch.distributed (host tensors); a generator
    like _sra."""
    z = torch.cat([g.reshape(-1) for g in grads]).to("cpu", torch.float32).numpy()
    residual = None
    if state.error_feedback:
        take_residuals(state, z, grads, names)
        residual = np.zeros_like(z)
    out = yield from _sra(state, group, z, *setting, residual)
    scatter(torch.from_numpy(out), grads)
    if residual is not None:
        offset = 0
        for grad, name in zip(grads, names):
            state.residuals[name] = residual[offset:offset + grad.numel()].copy()
            offset += grad.numel()
