"""sra_hook: a DDP bucket's plan (exact and quantized parameter groups) and the path each
part takes: the process group's all_reduce or the host path's exact mean for the exact part,
the host path (host.py) or libqnccl's engine (engine.py) for the quantized groups."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .engine import CommunicatorEnded, engine_for, engine_group
from .grads import scatter
from .host import Worker, exact_mean, together, torch_group
from .state import QuantizedHookState


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
    bucket as it comes, so that its codec overlaps the transfers of the one before (host.Worker).

    When the engine's communicator was aborted (PyTorch's watchdog aborts a failed one) or
    has failed, the future fails with engine.CommunicatorEnded, which says so, and libqnccl
    drops what it held for that communicator.
    """
    if bucket.buffer().is_cuda:
        future = torch.futures.Future(devices=[bucket.buffer().device])
        try:
            future.set_result(to_end(reduce_bucket(state, bucket)))  # an event on the stream
        except CommunicatorEnded as exc:  # the backward pass raises it, with the message
            future.set_exception(exc)
        return future
    future = torch.futures.Future()
    _worker(state).submit(reduce_bucket(state, bucket), future)
    return future


def to_end(steps):
    """The return value of the generator `steps`, run without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def reduce_bucket(state, bucket):
    """The bucket's averaged gradients, in its buffer (sra_hook's work): a generator that
    yields where the host path is about to wait for messages, and returns the buffer.

    The order of the work is the same on every rank: the exact part first, then the
    quantized groups in bucket_plan's order. On the host the exact part's messages travel
    with the first group's (exact_mean); on a device it is the process group's all_reduce,
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
        yield  # a bucket's first step never waits (host.Worker)
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
            exact_part = exact_mean(state, group, flat)
    engine = engine_for(state, buffer)
    if engine is not None:
        if exact_part is not None:
            next(exact_part)  # its first messages
        yield  # the engine waits for its peers: not in a bucket's first step (host.Worker)
    for setting, members in groups:
        names = [state.name_of(params[i]) for i in members]
        state.quantized_input_bytes += sum(grads[i].numel() * grads[i].element_size()
                                           for i in members)
        if engine is None:
            steps = torch_group(state, group, [grads[i] for i in members], names, setting)
            if exact_part is not None:  # the two parts' messages go in the same rounds
                steps, exact_part = together(steps, exact_part), None
            yield from steps
        else:
            engine_group(state, engine, [grads[i] for i in members], names, setting)
    if exact_part is not None:
        yield from exact_part
    if exact:
        scatter(flat, [grads[i] for i in exact])
    if state._policy is not None and bucket.is_last():
        yield from _end_of_step(state, group, buffer.device)
    return buffer


def _end_of_step(state, group, device):
    """After the step's last bucket, with adaptive bits: at each decision point rank 0 of
    the group has decided from what it observed (AdaptiveBits.step), and broadcasts its
    widths; every rank takes them for the next steps. A generator like reduce_bucket."""
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


def _worker(state):
    """The state's worker thread, started at its first host bucket."""
    if state._thread is None:
        state._thread = Worker()
    return state._thread
