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

The package: `state` (QuantizedHookState: the configuration and the per-parameter
decisions), `checkpoint` (its state_dict and pickling), `hook` (sra_hook: a bucket's plan and
the path it takes), `host` (the SRA over torch.distributed's point-to-point messages, on a
worker thread), `engine` (libqnccl's engine on an NCCL communicator) and `grads` (copies
between a bucket's gradients and flat vectors).
"""
from __future__ import annotations

try:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
except ImportError as exc:  # torch stays optional for the rest of qnccl
    raise ImportError("qnccl.torch needs PyTorch with torch.distributed: "
                      "pip install torch (CPU wheels: --index-url "
                      "https://download.pytorch.org/whl/cpu)") from exc

from .engine import communicator, set_quantization  # noqa: E402
from .hook import sra_hook  # noqa: E402
from .state import ROUNDINGS, QuantizedHookState  # noqa: E402

__all__ = ["ROUNDINGS", "QuantizedHookState", "communicator", "set_quantization", "sra_hook"]
