"""The hook's engine path: a quantized group averaged by libqnccl's engine (qncclAllReduce,
SRA) on an NCCL communicator, in place in a float32 input buffer, on the current stream.

CUDA buckets use the process group's own NCCL communicator; host buckets the one given as
QuantizedHookState(comm=...). The engine keeps error feedback's residuals per communicator and
input buffer address, and counts the calls of the random streams itself: so each group keeps
one input buffer (the same address at every call), and the functions here move the residuals
and the call count between the engine and the state, by parameter name, when the buffers or
the communicator change and for checkpoints.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _lib
from .. import comm as _comm
from .grads import gather, scatter, take_residuals
from .linkage import check_torch_nccl


class CommunicatorEnded(RuntimeError):
    """The NCCL communicator of the engine path was aborted or failed (PyTorch's watchdog
    aborts a failed one): the quantized groups cannot run on it. `gone`: it no longer exists
    (aborted or destroyed), so libqnccl has dropped what it held for it."""

    def __init__(self, message, gone):
        super().__init__(message)
        self.gone = gone


def engine_for(state, buffer):
    """The NCCL communicator whose engine reduces `buffer`'s quantized groups, or None (the
    SRA over torch.distributed). A new communicator takes over the residuals and, after a
    restore, the call count to continue from. Raises CommunicatorEnded, after dropping what
    libqnccl held for it, when the communicator was aborted or has failed."""
    if buffer.is_cuda and state._engine_comm is None:
        check_torch_nccl()  # once: a stranger's communicator would crash the engine
    comm = None
    try:
        comm = communicator(state._group()) if buffer.is_cuda else state.comm
        if comm is not None:
            _check_alive(comm)
    except CommunicatorEnded as exc:
        if exc.gone:
            _forget(state, comm)
        raise
    if comm is None or comm == state._engine_comm:
        return comm
    if state._engine_comm is not None:  # a new communicator: the residuals move along
        _move_residuals(state)
    if state._engine_calls is not None:  # restored: the random streams continue
        _comm.set_call_counts(comm, state._engine_calls)
        state._engine_calls = None
    state._engine_comm = comm
    return comm


def _check_alive(comm):
    """Raises CommunicatorEnded when the NCCL library refuses `comm` (gone) or says it failed
    (still there: the job aborts it, and libqnccl then sees or is told). Only
    for a communicator known to exist (PyTorch answered for it; the host backend answers
    for any handle): NVIDIA's NCCL frees an aborted one, and must not be asked about it."""
    try:
        state = _comm.async_error(comm)
    except _lib.QncclError as exc:
        raise CommunicatorEnded(f"QNCCL: the NCCL communicator {comm:#x} of the hook's engine "
                                f"path is gone ({exc.message}): it was destroyed or aborted; "
                                f"the quantized groups cannot run on it", gone=True) from exc
    if state not in ("ncclSuccess", "ncclInProgress"):
        raise CommunicatorEnded(f"QNCCL: the NCCL communicator {comm:#x} of the hook's engine "
                                f"path reports {state} (ncclCommGetAsyncError): it failed, and "
                                f"the job has to abort it (PyTorch's watchdog does); the "
                                f"quantized groups cannot run on it", gone=False)


def _forget(state, comm):
    """Drops what libqnccl holds for the communicator that is gone, `comm` (None: unknown,
    PyTorch no longer says) and the one the engine ran on (its residuals are lost: a restart
    restores them from a checkpoint); the next communicator starts anew."""
    for ended in {state._engine_comm, comm} - {None}:
        try:
            _comm.forget(ended)
        except _lib.QncclError:
            pass  # nothing held: the engine never ran on it
    state._engine_comm = None
    state._inputs.clear()


def engine_group(state, comm, grads, names, setting):
    """A quantized group averaged by the engine on `comm`, on the current stream of the
    gradients' device."""
    bits, bucket_size = setting
    device = grads[0].device
    z = _input(state, names, setting, device, sum(g.numel() for g in grads))
    gather(z, grads)
    if state.error_feedback:
        take_residuals(state, z, grads, names)
    before = _comm.stats(comm)["bytes_on_wire"]
    _comm.allreduce(comm, z.data_ptr(), z.data_ptr(), z.numel(), "float32", "avg", bits=bits,
                    bucket_size=bucket_size, rounding=state.rounding, seed=state.seed,
                    algo="sra", error_feedback=state.error_feedback, stream=stream_of(z),
                    rotation=state.rotation, rotation_block=state.rotation_block,
                    clip=state.clip)
    state.calls += 1
    state.quantized_bytes_sent += _comm.stats(comm)["bytes_on_wire"] - before
    scatter(z, grads)


def _input(state, names, setting, device, count):
    """The float32 buffer a quantized group is reduced in, the same one at every call. When
    DDP rebuilds its buckets (after the first iteration) the groups change; the residuals then
    move to state.residuals by parameter name, from where the new buffers' first calls take
    them."""
    key = (tuple(names), setting, str(device))
    if key not in state._inputs:
        if state.error_feedback and any(set(names) & set(k[0]) for k in state._inputs):
            _move_residuals(state)  # these parameters had another buffer
        state._inputs[key] = torch.empty(count, dtype=torch.float32, device=device)
    return state._inputs[key]


def _move_residuals(state):
    """The engine's residuals into state.residuals by name; the engine's are freed."""
    if state.error_feedback and state._engine_comm is not None:
        state.residuals.update(_engine_residuals(state))
        _comm.reset_error_feedback(state._engine_comm)
    state._inputs.clear()


def _engine_residuals(state):
    """The residuals the engine holds for the state's input buffers, by name."""
    out = {}
    for (names, _, _), z in state._inputs.items():
        try:
            values = _comm.residual(state._engine_comm, z.data_ptr(), z.numel(), "float32")
        except _lib.QncclError:
            continue  # made, never reduced with error feedback
        offset = 0
        for name in names:
            m = state._sizes[name]
            out[name] = values[offset:offset + m].copy()
            offset += m
    return out


def all_residuals(state):
    """Every residual of the state by parameter name: its own and the engine's."""
    residuals = dict(state.residuals)
    if state.error_feedback and state._engine_comm is not None:
        residuals.update(_engine_residuals(state))
    return residuals


def call_count(state):
    """The engine's call count to save: its communicator's, or the one restored."""
    if state._engine_comm is not None:
        return _comm.call_counts(state._engine_comm)[0]
    return state._engine_calls


def reset(state):
    """Frees the engine's residuals of the state's communicator (QuantizedHookState.reset)."""
    if state._engine_comm is not None and state.error_feedback:
        _comm.reset_error_feedback(state._engine_comm)


def restart(state, calls):
    """After a restore: the engine's residuals are dropped (the restored ones, in
    state.residuals, replace them) and the next call gives the engine `calls`."""
    reset(state)
    state._inputs.clear()
    state._engine_comm = None
    state._engine_calls = calls


def stream_of(tensor):
    """The CUDA stream the engine computes `tensor` on: PyTorch's current stream of its
    device (0 for host memory, which the engine computes before returning)."""
    return torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0


# What ProcessGroupNCCL answers for a communicator it aborted (its watchdog, or abort()).
ABORTED_BY_TORCH = "NCCL communicator was aborted"


def communicator(group=None):
    """The address of `group`'s NCCL communicator (default: the world group), as
    ProcessGroupNCCL._comm_ptr() gives it, for qnccl.comm's per-communicator calls."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    try:
        backend = group._get_backend(torch.device("cuda"))
        address = backend._comm_ptr()
    except (RuntimeError, AttributeError) as exc:
        if ABORTED_BY_TORCH in str(exc):  # NCCLComm::getNcclComm() of an aborted one
            raise CommunicatorEnded(f"QNCCL: the process group's NCCL communicator was aborted "
                                    f"({exc}); the quantized groups cannot run on it",
                                    gone=True) from exc
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
    _comm._flags(collectives)  # the arguments first, whatever the group
    _comm._policy_bits(bits)
    _comm.set_quantization(communicator(group), collectives, bits)
