"""The argument checks of the Python API, one per concept, and the words of their messages.

Every message names the argument as the Python API spells it (bucket_size, rotation_block),
says what is allowed (a range, a set of names) and what was given, in words: "a list",
"a float64 numpy array", "an int32 CuPy array", "a torch.Tensor of dtype torch.int32". A
value of the wrong type raises TypeError, a value out of range ValueError. The limits are
qnccl.h's, so that an argument the library would refuse is refused here first, in Python's
terms. No torch, CuPy or cffi import: `import qnccl.emulate` needs none of them.
"""
from __future__ import annotations

import operator
import sys

import numpy as np

# ---- qnccl.h's limits ---------------------------------------------------------------------

MIN_BITS, MAX_BITS = 1, 8  # QNCCL_MIN_BITS, QNCCL_MAX_BITS
MIN_ROTATION_BLOCK, MAX_ROTATION_BLOCK = 2, 1 << 14  # QNCCL_MIN/MAX_ROTATION_BLOCK
DEFAULT_ROTATION_BLOCK = 256  # QNCCL_DEFAULT_ROTATION_BLOCK
MAX_LANES = 8  # QNCCL_MAX_LANES
DEFAULT_SEGMENT_VALUES = 1 << 22  # QNCCL_DEFAULT_SEGMENT_VALUES
UINT64_MAX = 2**64 - 1  # seeds, random streams, call counters (uint64_t)
SIZE_MAX = 2**64 - 1  # size_t of the 64-bit platforms QNCCL builds for
MAX_COUNT = SIZE_MAX // 16  # codec_api.cc's kMaxCount: larger counts overflow the wire format

ROUNDINGS = ("nearest", "stochastic")
ROTATIONS = ("none", "hadamard", "prerotated")
CLIPS = ("none", "gaussian")


# ---- words ----------------------------------------------------------------------------------

def with_article(word):
    """"an int32", "a uint8", "a float64", "an object": the article English reads it with."""
    return ("an " if word[:1].lower() in "aeio" else "a ") + word


def number(n):
    """n as a message writes it: 2**k and 2**k-1 for the large limits, else decimal."""
    for k in range(16, 65):
        if n == 1 << k:
            return f"2**{k}"
        if n == (1 << k) - 1:
            return f"2**{k}-1"
    return str(n)


def span(low, high=None):
    """"in 1..8", ">= 0": the integers from low to high (no upper limit when None)."""
    return f">= {number(low)}" if high is None else f"in {number(low)}..{number(high)}"


def alternatives(names):
    """"a, b or c"."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def describe(value):
    """What `value` is, in words, for "got ...": "a list", "a float64 numpy array", "an int32
    CuPy array", "a torch.Tensor of dtype torch.int32", "a str ('4')", "None"."""
    if value is None:
        return "None"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"a torch.Tensor of dtype {value.dtype}{where}"
    if isinstance(value, np.ndarray):
        return f"{with_article(value.dtype.name)} numpy array"
    interface = getattr(value, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        try:
            dtype = np.dtype(interface["typestr"]).name
        except (KeyError, TypeError):
            dtype = "untyped"
        kind = ("CuPy array" if type(value).__module__.split(".")[0] == "cupy"
                else f"device array ({type(value).__name__})")
        return f"{with_article(dtype)} {kind}"
    if isinstance(value, np.generic):
        return f"a numpy.{type(value).__name__} scalar"
    if isinstance(value, type):
        return f"the type {value.__module__}.{value.__qualname__}"
    text = with_article(type(value).__name__)
    if isinstance(value, (bool, int, float, complex, str, bytes)) and len(repr(value)) <= 40:
        text += f" ({value!r})"
    return text


def describe_layout(value):
    """describe(value), with what keeps a numpy array from being written in place: "a
    non-contiguous float32 numpy array", "a read-only float32 numpy array"."""
    if isinstance(value, np.ndarray):
        flaws = [word for word, flawed in (("read-only", not value.flags.writeable),
                                           ("non-contiguous", not value.flags.c_contiguous))
                 if flawed]
        if flaws:
            return f"{with_article(' '.join([*flaws, value.dtype.name]))} numpy array"
    return describe(value)


# ---- the checks -----------------------------------------------------------------------------

def integer(name, value, low=0, high=None, allowed=None):
    """`value` as an int in [low, high] (no upper limit when None): TypeError for anything
    but an integer (bool included), ValueError out of range. `allowed`: the words that say
    what is allowed, when "an integer in low..high" does not."""
    allowed = allowed or f"an integer {span(low, high)}"
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {allowed}, got {describe(value)}") from None
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def power_of_two(name, value, low, high, allowed=None):
    """`value` as an int, a power of two in [low, high]."""
    allowed = allowed or f"a power of two in {number(low)}..{number(high)}"
    value = integer(name, value, low, high, allowed)
    if value & (value - 1):
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def one_of(name, value, names):
    """`value`, one of the strings `names`: TypeError for a value that is no string,
    ValueError for another string."""
    if isinstance(value, str) and value in names:
        return value
    message = f"{name} must be one of {', '.join(names)}, got "
    if not isinstance(value, str):
        raise TypeError(message + describe(value))
    raise ValueError(message + repr(value))


def dtype(value, names, name="dtype"):
    """A type name out of `names`: a string, or a numpy dtype or type (np.float16,
    ml_dtypes.bfloat16) taken by its name."""
    if isinstance(value, str):
        return one_of(name, value, names)
    try:
        converted = None if value is None else np.dtype(value).name
    except TypeError:
        converted = None
    message = f"{name} must be one of {', '.join(names)}, got "
    if converted is None:
        raise TypeError(message + describe(value))
    if converted not in names:
        raise ValueError(f"{message}the numpy dtype {converted}")
    return converted


def boolean(name, value):
    """`value`, True or False (TypeError for anything else, 0 and 1 included)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {describe(value)}")


# ---- the codec's and the collectives' arguments ---------------------------------------------

def bits(value, name="bits"):
    """Bits per value, 1..8."""
    return integer(name, value, MIN_BITS, MAX_BITS)


def bucket_size(value, name="bucket_size"):
    """Values per bucket: 1 up to size_t's largest."""
    return integer(name, value, 1, SIZE_MAX)


def uint64(name, value):
    """A seed, a random stream, a call counter: 0..2**64-1."""
    return integer(name, value, 0, UINT64_MAX)


def count(value, name="count"):
    """A number of values the codec handles: 0..2**60-1 (codec_api.cc's kMaxCount)."""
    return integer(name, value, 0, MAX_COUNT)


def rounding(value):
    return one_of("rounding", value, ROUNDINGS)


def rotation(value, names=ROTATIONS):
    return one_of("rotation", value, names)


def rotation_block(value, zero_is_default=False, name="rotation_block"):
    """Values per rotation block: a power of two in 2..16384; with zero_is_default (the C
    API's convention) 0 stands for 256 too, and the block it stands for is returned."""
    low, high = MIN_ROTATION_BLOCK, MAX_ROTATION_BLOCK
    if not zero_is_default:
        return power_of_two(name, value, low, high)
    allowed = (f"0 (the default, {DEFAULT_ROTATION_BLOCK}) or a power of two in "
               f"{number(low)}..{number(high)}")
    if integer(name, value, 0, high, allowed) == 0:
        return DEFAULT_ROTATION_BLOCK
    return power_of_two(name, value, low, high, allowed)


def clip(value, rotation_value, rotations=ROTATIONS):
    """The clip setting, allowed with `rotation_value` (a clip needs rotated buckets: one of
    `rotations` other than "none")."""
    one_of("clip", value, CLIPS)
    if value != "none" and rotation_value == "none":
        needs = " or ".join(repr(r) for r in rotations if r != "none")
        raise ValueError(f"clip={value!r} clips rotated buckets' ranges; it needs "
                         f"rotation={needs} (or clip='none')")
    return value


def lanes(value):
    return integer("lanes", value, 0, MAX_LANES,
                   f"0 (auto: 2 on device buffers, 1 on host buffers) or an integer in "
                   f"1..{MAX_LANES}")


def segment_values(value):
    return integer("segment_values", value, 0, SIZE_MAX,
                   f"0 (the default, {number(DEFAULT_SEGMENT_VALUES)}) or an integer in "
                   f"1..{number(SIZE_MAX)}")
