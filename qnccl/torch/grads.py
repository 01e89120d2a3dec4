"""Copies between a bucket's gradients and the flat vectors the hook reduces."""
from __future__ import annotations

import numpy as np
import torch


def gather(z, grads):
    """Copies the gradients into z, one after another (converted to z's float32)."""
    offset = 0
    for grad in grads:
        m = grad.numel()
        z[offset:offset + m].copy_(grad.reshape(-1))
        offset += m


def scatter(flat, grads):
    """Copies the concatenation `flat` back into the gradients it was made of."""
    offset = 0
    for grad in grads:
        m = grad.numel()
        grad.copy_(flat[offset:offset + m].view_as(grad))
        offset += m


def take_residuals(state, z, grads, names):
    """Adds to the float32 vector z (a numpy array or a tensor) the residuals
    state.residuals holds for these parameters, and drops them from there."""
    offset = 0
    for grad, name in zip(grads, names):
        m = grad.numel()
        old = state.residuals.pop(name, None)
        if old is not None and old.size == m:
            z[offset:offset + m] += old if isinstance(z, np.ndarray) else \
                torch.from_numpy(old).to(z.device)
        offset += m
