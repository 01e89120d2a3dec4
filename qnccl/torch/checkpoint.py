"""A QuantizedHookState's checkpoints: state_dict / load_state_dict, and what pickling keeps.

A restored job continues bit for bit: the checkpoint carries the per-parameter settings decided
so far, the call counters of the random streams (the hook's and, where the engine ran, the
engine's), the error-feedback residuals by parameter name (where the engine ran, read back from
it) and the byte counts. What belongs to this process (the process group, the model's tensors,
the communicators, the worker thread) is left out.
"""
from __future__ import annotations

import numpy as np
import torch

from ..emulate.rotation import DEFAULT_BLOCK
from . import engine

CONFIG = ("bits", "bucket_size", "rounding", "min_numel", "error_feedback", "warmup_steps",
          "seed", "adaptive", "rotation", "rotation_block", "clip")
# what a checkpoint made before a setting existed means by its absence
CONFIG_BEFORE = {"adaptive": None, "rotation": "none", "rotation_block": DEFAULT_BLOCK,
                 "clip": "none"}
COUNTERS = ("input_bytes", "quantized_input_bytes", "quantized_bytes_sent", "exact_bytes")


def state_dict(state):
    """QuantizedHookState.state_dict: a dict of plain values and float32 tensors."""
    per_layer = state.per_layer
    return {"config": {k: getattr(state, k) for k in CONFIG},
            "per_layer": "callable" if callable(per_layer) else
            (None if per_layer is None else {k: v for k, v in per_layer.items()}),
            "settings": dict(state._settings),
            "calls": state.calls, "bucket_calls": dict(state.bucket_calls),
            "engine_calls": engine.call_count(state),
            "residuals": {n: torch.from_numpy(r.copy())
                          for n, r in engine.all_residuals(state).items()},
            "counters": {k: getattr(state, k) for k in COUNTERS},
            "world_size": state.world_size,
            "adaptive": None if state._policy is None else state._policy.state_dict()}


def load_state_dict(state, saved):
    """QuantizedHookState.load_state_dict: `saved` into `state`, which must have been made
    with the same arguments for the same model (ValueError names what differs)."""
    config = saved["config"]
    for key in CONFIG:
        saved_value = config.get(key, CONFIG_BEFORE.get(key))
        if key == "rotation_block" and state.rotation == "none":
            continue  # unused unrotated (the rotations already matched)
        if saved_value != getattr(state, key):
            raise ValueError(f"the checkpoint's hook state has {key}={saved_value!r}, this "
                             f"one {getattr(state, key)!r}: make it with the checkpoint's "
                             "arguments")
    names = set(state._names.values()) if state._names is not None else None
    for name in list(saved["settings"]) + list(saved["residuals"]):
        if names is not None and name not in names:
            raise ValueError(f"the checkpoint's hook state has parameter {name!r}, which "
                             "the model does not")
    state._settings = {n: (None if s is None else tuple(s))
                       for n, s in saved["settings"].items()}
    state.calls = int(saved["calls"])
    state.bucket_calls = {int(k): int(v) for k, v in saved["bucket_calls"].items()}
    state.residuals = {n: r.detach().cpu().numpy().astype(np.float32, copy=True)
                       for n, r in saved["residuals"].items()}
    engine.restart(state, saved.get("engine_calls"))
    for key in COUNTERS:
        setattr(state, key, saved["counters"][key])
    state.world_size = saved["world_size"]
    if state._policy is not None:
        state._policy.load_state_dict(saved["adaptive"])


def pickled(state):
    """QuantizedHookState.__getstate__: its attributes, less what belongs to this process
    (a loaded state needs attach(model), and its comm if it had one)."""
    out = dict(state.__dict__)
    out["process_group"] = None  # not picklable: the default group after loading
    out["_names"] = None  # ids of this process's tensors: attach(model) after loading
    out["_thread"] = None  # a thread: a new one after loading
    out["residuals"] = engine.all_residuals(state)  # the engine's, by name
    out["_engine_calls"] = engine.call_count(state)
    out["comm"] = out["_engine_comm"] = None  # this process's communicators
    out["_inputs"] = {}
    return out
