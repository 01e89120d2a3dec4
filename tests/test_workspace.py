"""qncclAllReduceWorkspaceSize against docs/allreduce.md, "Workspace".

The engine sizes a call's workspace with one pure function on the host, for
host and device buffers alike (the CUDA path keeps the largest per
communicator and must know, during CUDA graph capture, whether a call fits
without allocating). Here its answer is recomputed from the table of the
spec with the emulator's segment, chunk and wire-size rules. That the
algorithms never ask for more is checked on every call: the engine aborts
when one does, so every run of tests/test_allreduce.py exercises it."""
import itertools

import pytest

from qnccl.emulate.allreduce import auto_algo, segment_length
from qnccl.emulate.codec import compressed_size

ALIGN = 256  # the wire buffers start 256-byte aligned after the accumulator
ALGOS = ("auto", "ring", "tree", "sra")
TYPES = {"float32": 7, "float16": 6, "bfloat16": 9}  # ncclDataType_t values


def expected_bytes(count, dtype, nranks, algo, bits, bucket, segment_values, lanes=0,
                   rotation_block=0):
    if count == 0:
        return 0
    if algo == "auto":
        algo = auto_algo(count, dtype, nranks)
    width = segment_length(segment_values, bucket)
    # One workspace per lane of the pipeline, each 256-aligned; lanes 0 means 2
    # (the API answers for device buffers), never more than there are segments.
    lanes = max(1, min(-(-count // width), lanes or 2))
    w = min(count, width)                                      # the largest segment
    c = min(w, bucket * (-(-w // bucket) // nranks + 1))       # the largest chunk
    p = min(w, max(bucket, (1 << 18) // bucket * bucket))     # the largest tree piece
    acc, wire = {"ring": (c, 2 * compressed_size(c, bits, bucket)),
                 "tree": (p, 5 * compressed_size(p, bits, bucket)),
                 "sra": (c, 2 * nranks * compressed_size(c, bits, bucket))}[algo]
    # a rotated call (docs/rotation.md): the segment rotated, and the signs of one block
    rotated = (w + min(w, rotation_block)) if rotation_block else 0
    one = -(-4 * (acc + rotated) // ALIGN) * ALIGN + wire
    return (lanes - 1) * (-(-one // ALIGN) * ALIGN) + one


def workspace_size(capi, count, dtype, nranks, algo, bits, bucket, segment_values, lanes=0,
                   rotation_block=0):
    ffi, lib = capi
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec.bits = bits
    config.codec.bucketSize = bucket
    config.codec.rounding = lib.qncclRoundNearest
    config.algo = ALGOS.index(algo)
    config.segmentValues = segment_values
    config.lanes = lanes
    if rotation_block:
        config.codec.rotation = lib.qncclRotationHadamard
        config.codec.rotationBlock = rotation_block
    out = ffi.new("size_t*")
    result = lib.qncclAllReduceWorkspaceSize(count, TYPES[dtype], config, nranks, out)
    assert result == lib.ncclSuccess, ffi.string(lib.qncclGetLastError()).decode()
    return out[0]


@pytest.mark.parametrize("algo", ALGOS)
def test_workspace_size_follows_the_spec(capi, algo):
    counts = (0, 1, 127, 128, 129, 5003, 16383, 300007, (1 << 22) + 5)
    configs = ((4, 128, 0, 0), (1, 1, 0, 1), (8, 7, 1000, 0), (3, 1000, 100, 3),
               (2, 64, 1 << 20, 8), (4, 128, 1000, 1))
    for count, dtype, nranks, config in itertools.product(counts, TYPES, (1, 2, 3, 8, 17),
                                                          configs):
        want = expected_bytes(count, dtype, nranks, algo, *config)
        got = workspace_size(capi, count, dtype, nranks, algo, *config)
        assert got == want, (count, dtype, nranks, algo, config)


@pytest.mark.parametrize("algo", ALGOS)
def test_rotated_workspace_adds_a_segment_and_a_block_of_signs(capi, algo):
    counts = (1, 127, 5003, 300007, (1 << 22) + 5)
    configs = ((4, 128, 0, 0, 256), (3, 1000, 100, 3, 2), (2, 64, 1 << 20, 8, 16384),
               (4, 128, 1000, 1, 4096))
    for count, nranks, config in itertools.product(counts, (1, 3, 8), configs):
        want = expected_bytes(count, "bfloat16", nranks, algo, *config)
        got = workspace_size(capi, count, "bfloat16", nranks, algo, *config)
        assert got == want, (count, nranks, algo, config)


def test_default_workspace_matches_the_docs_example(capi):
    """docs/allreduce.md: with the defaults (W = 2^22, 4 bits, buckets of 128)
    tree takes, per lane, 1 MiB of accumulator (a piece of 2^18 values) plus
    5 x 144 KiB of wire buffers; a call of several segments runs 2 lanes on
    device buffers."""
    one = (1 << 20) + 5 * compressed_size(1 << 18, 4, 128)
    assert workspace_size(capi, 1 << 24, "float32", 8, "tree", 4, 128, 0, lanes=1) == one
    assert workspace_size(capi, 1 << 24, "float32", 8, "tree", 4, 128, 0) == 2 * one
    assert compressed_size(1 << 18, 4, 128) == 144 << 10


@pytest.mark.parametrize("argument, value, words", [
    ("nranks", 0, ["nranks = 0", ">= 1"]),
    ("algo", 7, ["algo = 7", "qncclAlgoSra"]),
    ("bits", 9, ["bits", "1..8"]),
    ("bytes", None, ["bytes is NULL"]),
    ("datatype", 2, ["datatype"]),
    ("lanes", 9, ["lanes = 9", "1..8"]),
    ("lanes", -1, ["lanes = -1", "0 (auto"]),
])
def test_bad_arguments_name_the_argument(capi, argument, value, words):
    ffi, lib = capi
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec.bits = 9 if argument == "bits" else 4
    config.codec.bucketSize = 128
    config.algo = value if argument == "algo" else 0
    config.lanes = value if argument == "lanes" else 0
    out = ffi.NULL if argument == "bytes" else ffi.new("size_t*")
    datatype = value if argument == "datatype" else TYPES["float32"]
    nranks = value if argument == "nranks" else 2
    assert lib.qncclAllReduceWorkspaceSize(1000, datatype, config, nranks, out) == \
        lib.ncclInvalidArgument
    message = ffi.string(lib.qncclGetLastError()).decode()
    assert all(word in message for word in words), message
