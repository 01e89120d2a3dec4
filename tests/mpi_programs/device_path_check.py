"""The device path against CUDA's, NCCL's and PyTorch's documented behaviour, on real ranks
with device buffers (QNCCL_TEST_MEMORY=device: the simulated GPU in CI, tests/buffers.py),
through libqnccl's exported NCCL entry points over QNCCL's host backend. One section per
run:

    QNCCL_TEST_MEMORY=device mpirun -np 2 python device_path_check.py SECTION

codec      (1 rank, 2 devices) qncclQuantize and qncclDequantize on buffers of device 1
           while device 0 is current, on a stream of device 1: they run in device 1's
           context (the host codec's bytes), and device 0 stays current; buffers on two
           devices are refused with a message naming both.
context    a quantized allreduce issued from a thread that has no CUDA context leaves it
           with none: QNCCL restores the context, not a device number, so no primary
           context is made on the way (the case of PyTorch's watchdog thread).
legacy     (>= 2 ranks) rank 0 issues its allreduce on the legacy default stream while
           another stream of its device is being captured: the call is refused
           (ncclInvalidUsage, nothing issued), the capture is not invalidated, and the
           retry once it ended completes the call its peers issued, the emulator's bytes.
histories  (>= 2 ranks, error feedback) each rank captures its second call into a graph,
           rank 0 on the buffer of its first, eager call (it holds that buffer's residual
           and a workspace), every other rank on a new buffer at another address (no
           residual): every rank runs it quantized, and the replay is the emulator's call 1
           with rank 0's residual and zeros for the others.
streams    (error feedback) call 0 on one stream, call 1 on another stream on a new buffer
           (its residual made first, on the workspace's private stream): call 1 still waits
           for call 0 (they share the workspace and the call counter), so both are the
           emulator's calls 0 and 1, whatever order the simulated GPU's lazy schedule prefers.
retired    (error feedback) a call captured on a new buffer makes its residual during the
           capture; qncclCommResetErrorFeedback then drops it, and the graph still replays
           correctly (the emulator's call 0 from a zero residual): the residual's memory is
           retired with the workspace, not freed under the graph.
layout     (4 ranks, 2 emulated nodes, auto's rule) the communicator's first call is
           captured: the node layout is not looked for inside a capture (a split is an
           NCCL init), so the replay is the flat rule's (SRA) bytes; the next, eager call
           finds the layout and runs the hierarchical algorithm's.
kernels    (1 process, 2 devices) two ranks made by ncclCommInitAll: every kernel is
           loaded and resolved on both devices when the communicators are made, before any
           call; then a group of quantized allreduces on both loads nothing (the simulated
           GPU counts loads, and makes a first resolve wait for the device as CUDA's lazy
           loading may).
threads    (host or device buffers) calls of two pipeline lanes run their lanes on threads
           kept across calls: the threads named qnccl-lane after call 3 are the same ones
           after call 12 (a call used to start and join two threads).
launches   (device buffers, simulated GPU) one call of ring, tree and SRA, sum and avg,
           launches one kernel per compute step it counts (qncclCommGetStats'
           computeSteps, pinned per algorithm by allreduce_check.py's counts) and one that
           takes the call's number from the device counter (so a graph replay takes the
           next), nothing else.
ops        (host or device buffers) a quantized op passed to ncclReduceScatter and
           ncclReduce on bfloat16 runs as the exact ncclAvg it stands for: the real
           library's own result (its PreMulSum is float32 only).

Prints one line per failure and a summary; exits non-zero on any failure.
"""
import argparse
import os
import sys
import threading

import numpy as np
from cffi import FFI

from allreduce_check import (COMM, MEMORY, NRANKS, RANK, STREAM, Case, check_nccl,
                             emulate_allreduce, ffi, first_difference, lib, nccl, ptr,
                             rank_input, synced)
from buffers import Memory
from interposer_check import expect, failures, init_comm, require

SETTINGS = dict(bits=4, bucket_size=128, rounding="stochastic", seed=31, min_bytes=0)

_CUDA = FFI()
_CUDA.cdef("""
typedef int cudaError_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUgraph_st* cudaGraph_t;
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
int cuCtxGetCurrent(void** context);
""")


def cuda():
    return _CUDA.dlopen("libcudart.so.12")


def driver():
    return _CUDA.dlopen("libcuda.so.1")


def last_error():
    return ffi.string(lib.qncclGetLastError()).decode()


def gathered_check(label, case, got, inputs, call, **emulate):
    """Rank 0: every rank's `got` (gathered) against the emulator's output of `call`."""
    outputs = COMM.gather(got, root=0)
    everyone = COMM.gather(inputs, root=0)
    if RANK != 0:
        return
    want = emulate_allreduce(everyone, algo=case.algo, bits=case.bits, bucket_size=case.bucket,
                             rounding=case.rounding, seed=case.seed, call=call, **emulate)[0]
    for r, out in enumerate(outputs):
        diff = first_difference(case, out, want, case.dtype,
                                f"rank {r} differs from the emulator's call {call}")
        expect(diff is None, label, diff)


def new_call(count, algo="ring", error_feedback=0):
    """A communicator made under SETTINGS (QNCCL_ALGO=`algo`), the float32 Case of `count`
    values of its algorithm (auto's rule: SRA), this rank's input, an output, and their
    pointers (uploaded now)."""
    settings = dict(SETTINGS, error_feedback=1) if error_feedback else SETTINGS
    result, comm = init_comm(algo=algo, **settings)
    require(result, "ncclCommInitRank")
    case = Case("sra" if algo == "rule" else algo, "float32", count, seed=SETTINGS["seed"])
    x = rank_input(case, RANK)
    out = np.zeros_like(x)
    return comm, case, x, out, (ptr(x), ptr(out))


def codec(_):
    """Section codec (module docstring)."""
    if NRANKS != 1:
        return expect(False, "codec", "run with one rank")
    other = Memory(device=1)  # device 1's buffers and stream
    rt = cuda()
    check_nccl(lib.ncclSuccess if rt.cudaSetDevice(0) == 0 else lib.ncclInternalError,
               "cudaSetDevice(0)")
    config = ffi.new("qncclCodecConfig_t*")
    config.bits, config.bucketSize, config.rounding, config.seed = 4, 128, 1, 5
    count = 10007
    x = rank_input(Case("ring", "float32", count, seed=5), 0)
    size = ffi.new("size_t*")
    check_nccl(lib.qncclCompressedSize(count, config, size), "qncclCompressedSize")
    wire_host = np.zeros(size[0], np.uint8)
    check_nccl(lib.qncclQuantize(ffi.from_buffer(x), count, lib.ncclFloat32, config, 3,
                                 ffi.from_buffer(wire_host), size[0], ffi.NULL), "host quantize")
    wire = np.zeros(size[0], np.uint8)
    stream = other.cuda_stream(ffi)
    result = lib.qncclQuantize(other.ptr(x, ffi), count, lib.ncclFloat32, config, 3,
                               other.ptr(wire, ffi), size[0], stream)
    expect(result == lib.ncclSuccess, "codec", f"qncclQuantize on device 1: {last_error()}")
    other.sync(wire)  # (ptr() uploads the host array again)
    back = np.zeros_like(x)
    result = lib.qncclDequantize(other.ptr(wire, ffi), size[0], count, config,
                                 other.ptr(back, ffi), lib.ncclFloat32, stream)
    expect(result == lib.ncclSuccess, "codec", f"qncclDequantize on device 1: {last_error()}")
    other.sync(back)
    expect(np.array_equal(wire, wire_host), "codec", "device 1's wire bytes differ from the host "
           "codec's")
    host_back = np.zeros_like(x)
    check_nccl(lib.qncclDequantize(ffi.from_buffer(wire_host), size[0], count, config,
                                   ffi.from_buffer(host_back), lib.ncclFloat32, ffi.NULL),
               "host dequantize")
    expect(np.array_equal(back.view(np.uint32), host_back.view(np.uint32)), "codec",
           "device 1's decoded values differ from the host codec's")
    current = _CUDA.new("int*")
    rt.cudaGetDevice(current)
    expect(current[0] == 0, "codec", f"device {current[0]} is current after the calls, not 0")
    # Source on device 0, destination on device 1.
    result = lib.qncclQuantize(MEMORY.ptr(x, ffi), count, lib.ncclFloat32, config, 3,
                               other.ptr(wire, ffi), size[0], stream)
    expect(result == lib.ncclInvalidArgument and "src is on device 0 and dst on device 1"
           in last_error(), "codec", f"buffers on two devices: {result}: {last_error()}")
    return 6


def context(_):
    """Section context (module docstring)."""
    comm, case, x, out, pointers = new_call(30011)
    synced()
    seen = {}

    def call():
        seen["result"] = lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum,
                                           comm, STREAM)
        seen["error"] = last_error()
        context_now = _CUDA.new("void**")
        seen["driver"] = driver().cuCtxGetCurrent(context_now)
        seen["context"] = int(_CUDA.cast("uintptr_t", context_now[0]))

    before = _CUDA.new("void**")
    worker = threading.Thread(target=lambda: (driver().cuCtxGetCurrent(before), call()))
    worker.start()
    worker.join()
    expect(int(_CUDA.cast("uintptr_t", before[0])) == 0, "context",
           "a new thread already had a context")
    expect(seen["result"] == lib.ncclSuccess, "context", f"ncclAllReduce: {seen['error']}")
    expect(seen["driver"] == 0 and seen["context"] == 0, "context",
           f"the thread has context {seen['context']:#x} after the call, not none")
    synced(out)
    gathered_check("context", case, out, x, 0)
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 3


def legacy(_):
    """Section legacy (module docstring)."""
    comm, case, x, out, pointers = new_call(20000)
    synced()  # the uploads done: the legacy stream does not wait for a non-blocking one
    rt = cuda()

    def allreduce():
        return lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum, comm,
                                 ffi.NULL)

    if RANK == 0:
        captured = _CUDA.new("cudaStream_t*")
        assert rt.cudaStreamCreateWithFlags(captured, 0) == 0  # blocking
        assert rt.cudaStreamBeginCapture(captured[0], 0) == 0  # global mode
        refused = allreduce()
        message = last_error()
        filler = _CUDA.cast("void*", MEMORY.address(out))
        node = rt.cudaMemsetAsync(filler, 0, 4, captured[0])
        graph = _CUDA.new("cudaGraph_t*")
        ended = rt.cudaStreamEndCapture(captured[0], graph)
        expect(refused == lib.ncclInvalidUsage and "legacy default stream" in message, "legacy",
               f"the call during the capture answered {refused}: {message}")
        expect(node == 0 and ended == 0, "legacy", f"the capture was broken: memset {node}, "
               f"end {ended}")
        if ended == 0:
            rt.cudaGraphDestroy(graph[0])
    result = allreduce()  # rank 0's retry: the call its peers issued
    expect(result == lib.ncclSuccess, "legacy", f"ncclAllReduce: {result}: {last_error()}")
    assert rt.cudaDeviceSynchronize() == 0
    synced(out)
    gathered_check("legacy", case, out, x, 0)
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 3


def histories(_):
    """Section histories (module docstring)."""
    result, comm = init_comm(algo="ring", error_feedback=1, **SETTINGS)
    require(result, "ncclCommInitRank")
    case = Case("ring", "float32", 24007, seed=SETTINGS["seed"])
    first = rank_input(case, RANK)
    out = np.zeros_like(first)
    check_nccl(lib.ncclAllReduce(ptr(first), ptr(out), case.count, lib.ncclFloat32, lib.ncclSum,
                                 comm, STREAM), "eager ncclAllReduce")
    synced(out)
    gathered_check("histories, call 0", case, out, first, 0)  # zero residuals: plain bytes
    # The second call: rank 0 on its first buffer, the others on a new one.
    second = rank_input(Case("ring", "float32", case.count, seed=SETTINGS["seed"] + 1), RANK)
    buffer = first if RANK == 0 else np.empty_like(first)
    buffer[:] = second
    pointers = (ptr(buffer), ptr(out))  # uploaded now: nothing pageable during the capture
    graph = MEMORY.capture(lambda: check_nccl(
        lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum, comm, STREAM),
        "captured ncclAllReduce"))
    MEMORY.replay(graph)
    synced(out)
    outputs = COMM.gather(out, root=0)
    firsts = COMM.gather(rank_input(case, RANK), root=0)
    seconds = COMM.gather(second, root=0)
    if RANK == 0:
        kw = dict(algo="ring", bits=case.bits, bucket_size=case.bucket, rounding=case.rounding,
                  seed=case.seed)
        residuals = [np.zeros(case.count, np.float32) for _ in range(NRANKS)]
        emulate_allreduce(firsts, call=0, residuals=residuals, **kw)
        # Only rank 0 captured on the buffer of call 0: the others start from zero.
        residuals = [residuals[0]] + [np.zeros(case.count, np.float32)] * (NRANKS - 1)
        want = emulate_allreduce(seconds, call=1, residuals=residuals, **kw)[0]
        for r, got in enumerate(outputs):
            diff = first_difference(case, got, want, "float32",
                                    f"rank {r}'s replay differs from the emulator's call 1")
            expect(diff is None, "histories", diff)
    counted = ffi.new("qncclStats_t*")
    check_nccl(lib.qncclCommGetStats(comm, counted), "qncclCommGetStats")
    expect(counted.callsPassedThrough == 0 and counted.callsCompressed == 2, "histories",
           f"compressed {counted.callsCompressed}, passed through {counted.callsPassedThrough}: "
           f"want 2 and 0")
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 2


def streams(_):
    """Section streams (module docstring)."""
    result, comm = init_comm(algo="ring", error_feedback=1, **SETTINGS)
    require(result, "ncclCommInitRank")
    case = Case("ring", "float32", 24007, seed=SETTINGS["seed"])
    first = rank_input(case, RANK)
    second = rank_input(Case("ring", "float32", case.count, seed=case.seed + 1), RANK)
    outs = [np.zeros_like(first), np.zeros_like(first)]
    pointers = [(ptr(first), ptr(outs[0])), (ptr(second), ptr(outs[1]))]
    synced()  # the uploads done: the other stream does not wait for them
    other = _CUDA.new("cudaStream_t*")
    assert cuda().cudaStreamCreateWithFlags(other, 1) == 0  # non-blocking
    streams_used = [STREAM, ffi.cast("cudaStream_t", int(_CUDA.cast("uintptr_t", other[0])))]
    for call in range(2):
        check_nccl(lib.ncclAllReduce(*pointers[call], case.count, lib.ncclFloat32, lib.ncclSum,
                                     comm, streams_used[call]), f"ncclAllReduce {call}")
    assert cuda().cudaDeviceSynchronize() == 0
    synced(*outs)
    outputs = COMM.gather(outs, root=0)
    inputs = [COMM.gather(first, root=0), COMM.gather(second, root=0)]
    if RANK == 0:
        kw = dict(algo="ring", bits=case.bits, bucket_size=case.bucket, rounding=case.rounding,
                  seed=case.seed)
        for call in range(2):  # each buffer's first call: zero residuals
            residuals = [np.zeros(case.count, np.float32) for _ in range(NRANKS)]
            want = emulate_allreduce(inputs[call], call=call, residuals=residuals, **kw)[0]
            for r, got in enumerate(outputs):
                diff = first_difference(case, got[call], want, "float32",
                                        f"rank {r}'s call {call} differs from the emulator's")
                expect(diff is None, "streams", diff)
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 2


def retired(_):
    """Section retired (module docstring)."""
    comm, case, x, out, pointers = new_call(24007, error_feedback=1)
    graph = MEMORY.capture(lambda: check_nccl(
        lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum, comm, STREAM),
        "captured ncclAllReduce"))
    check_nccl(lib.qncclCommResetErrorFeedback(comm), "qncclCommResetErrorFeedback")
    assert cuda().cudaDeviceSynchronize() == 0  # whatever the reset queued has run
    MEMORY.replay(graph)
    synced(out)
    gathered_check("retired", case, out, x, 0)
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 1


def layout(_):
    """Section layout (module docstring): 4 ranks, NCCL_HOSTID node<rank // 2>."""
    if NRANKS != 4:
        return expect(False, "layout", "run with 4 ranks")
    os.environ["NCCL_HOSTID"] = f"node{RANK // 2}"
    comm, case, x, out, pointers = new_call(40000, algo="rule")
    graph = MEMORY.capture(lambda: check_nccl(
        lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum, comm, STREAM),
        "captured ncclAllReduce"))
    MEMORY.replay(graph)
    synced(out)
    gathered_check("layout: the captured first call (flat: SRA)", case, out, x, 0)
    check_nccl(lib.ncclAllReduce(*pointers, case.count, lib.ncclFloat32, lib.ncclSum, comm,
                                 STREAM), "eager ncclAllReduce")
    synced(out)
    gathered_check("layout: the next, eager call (hierarchical)",
                   Case("auto", "float32", case.count, seed=case.seed), out, x, 1,
                   nodes=[r // 2 for r in range(NRANKS)])
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 2


def kernels(_):
    """Section kernels (module docstring)."""
    if NRANKS != 1:
        return expect(False, "kernels", "run with one process")
    devices = [MEMORY, Memory(device=1)]
    before = MEMORY.simulator_counters()
    comms = ffi.new("ncclComm_t[2]")
    os.environ.update(QNCCL_ALGO="ring", QNCCL_BITS="4", QNCCL_MIN_BYTES="0",
                      QNCCL_BUCKET_SIZE="128", QNCCL_ROUNDING="nearest",
                      QNCCL_SEED=str(SETTINGS["seed"]))
    require(lib.ncclCommInitAll(comms, 2, ffi.new("int[2]", [0, 1])), "ncclCommInitAll")
    made = MEMORY.simulator_counters()
    loaded = made["modulesLoaded"] - before["modulesLoaded"]
    resolved = made["kernelsResolved"] - before["kernelsResolved"]
    expect(loaded == 4 and resolved > 0 and resolved % 2 == 0, "kernels",
           f"ncclCommInitAll loaded {loaded} modules and resolved {resolved} kernels; want both "
           f"modules on both devices and all their kernels")
    case = Case("ring", "float32", 30011, rounding="nearest", seed=SETTINGS["seed"])
    inputs = [rank_input(case, r) for r in range(2)]
    outs = [np.zeros_like(x) for x in inputs]
    pointers = [(m.ptr(x, ffi), m.ptr(o, ffi)) for m, x, o in zip(devices, inputs, outs)]
    check_nccl(lib.ncclGroupStart(), "ncclGroupStart")
    for r in range(2):
        check_nccl(lib.ncclAllReduce(*pointers[r], case.count, lib.ncclFloat32, lib.ncclSum,
                                     comms[r], devices[r].cuda_stream(ffi)), "ncclAllReduce")
    check_nccl(lib.ncclGroupEnd(), "ncclGroupEnd")
    for m, o in zip(devices, outs):
        m.sync(o)
    after = MEMORY.simulator_counters()
    expect(after["modulesLoaded"] == made["modulesLoaded"] and
           after["kernelsResolved"] == made["kernelsResolved"], "kernels",
           f"the calls loaded {after['modulesLoaded'] - made['modulesLoaded']} modules and "
           f"resolved {after['kernelsResolved'] - made['kernelsResolved']} kernels")
    want = emulate_allreduce(inputs, algo="ring", bits=4, bucket_size=128, rounding="nearest",
                             seed=case.seed, call=0)[0]
    for r, o in enumerate(outs):
        diff = first_difference(case, o, want, "float32", f"rank {r} differs from the emulator")
        expect(diff is None, "kernels", diff)
    for r in range(2):
        check_nccl(lib.ncclCommDestroy(comms[r]), "ncclCommDestroy")
    return 4


def lane_threads():
    """The ids of this process's threads named qnccl-lane."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as name:
                if name.read().strip() == "qnccl-lane":
                    found.add(int(tid))
        except OSError:
            continue  # ended meanwhile
    return found


def threads(_):
    """Section threads (module docstring)."""
    result, comm = init_comm(**SETTINGS)
    require(result, "ncclCommInitRank")
    case = Case("ring", "float32", 20000, segment_values=4096, lanes=2, seed=SETTINGS["seed"])
    config = ffi.new("qncclAllReduceConfig_t*")
    config.codec.bits, config.codec.bucketSize, config.codec.seed = 4, 128, case.seed
    config.algo, config.segmentValues, config.lanes = lib.qncclAlgoRing, 4096, 2
    x = rank_input(case, RANK)
    out = np.zeros_like(x)
    seen = {}
    for call in range(12):
        check_nccl(lib.qncclAllReduce(ptr(x), ptr(out), case.count, lib.ncclFloat32, lib.ncclSum,
                                      config, comm, STREAM), "qncclAllReduce")
        synced(out)
        if call + 1 in (3, 12):
            seen[call + 1] = lane_threads()
    expect(len(seen[3]) >= 2 and seen[12] == seen[3], "threads",
           f"lane threads after call 3: {sorted(seen[3])}, after call 12: {sorted(seen[12])}; "
           f"want the same two or more")
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return 1


def launches(_):
    """Section launches (module docstring)."""
    import qnccl.comm
    if MEMORY.simulator_counters() is None:
        return expect(False, "launches", "run on the simulated GPU (it counts launches)")
    checked = 0
    for algo in ("ring", "tree", "sra"):
        for op in ("sum", "avg"):
            comm, case, x, out, (px, pout) = new_call(128 * 8 * NRANKS, algo=algo)
            config = ffi.new("qncclAllReduceConfig_t*")
            config.codec.bits, config.codec.bucketSize, config.codec.seed = 4, 128, case.seed
            config.algo = {"ring": lib.qncclAlgoRing, "tree": lib.qncclAlgoTree,
                           "sra": lib.qncclAlgoSra}[algo]
            reduction = lib.ncclSum if op == "sum" else lib.ncclAvg
            for call in range(2):  # the first makes the workspace; the second is counted
                synced(out)
                before, stats = MEMORY.simulator_counters(), qnccl.comm.stats(comm)
                check_nccl(lib.qncclAllReduce(px, pout, case.count, lib.ncclFloat32, reduction,
                                              config, comm, STREAM), "qncclAllReduce")
                synced(out)
            after, stats_after = MEMORY.simulator_counters(), qnccl.comm.stats(comm)
            kernels = after["kernels"] - before["kernels"]
            steps = stats_after["compute_steps"] - stats["compute_steps"]
            expect(steps > 0 and kernels == steps + 1, f"launches {algo} {op}",
                   f"one call launched {kernels} kernels for its {steps} compute steps; want "
                   f"one per step and one for the call number")
            checked += 1
            check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return checked


def ops(_):
    """Section ops (module docstring)."""
    result, comm = init_comm(**SETTINGS)
    require(result, "ncclCommInitRank")
    op = ffi.new("ncclRedOp_t*")
    config = ffi.new("qncclQuantizedOpConfig_t*")
    config.allreduce.codec.bits, config.allreduce.codec.bucketSize = 4, 128
    config.reduction = lib.ncclAvg
    require(lib.qncclRedOpCreateQuantized(op, config, comm), "qncclRedOpCreateQuantized")
    rng = np.random.default_rng([7, RANK])
    x = (rng.standard_normal(NRANKS * 4096).astype(np.float32).view(np.uint32) >> 16) \
        .astype(np.uint16)  # bfloat16 bits
    checked = 0
    for name in ("ncclReduceScatter", "ncclReduce"):
        outs = []
        for api, reduction in ((lib, op[0]), (nccl, lib.ncclAvg)):
            out = np.zeros(4096 if name == "ncclReduceScatter" else x.size, np.uint16)
            if name == "ncclReduceScatter":
                res = api.ncclReduceScatter(ptr(x), ptr(out), out.size, lib.ncclBfloat16,
                                            reduction, comm, STREAM)
            else:
                res = api.ncclReduce(ptr(x), ptr(out), x.size, lib.ncclBfloat16, reduction, 0,
                                     comm, STREAM)
            expect(res == lib.ncclSuccess, "ops",
                   f"{name} with {'the quantized op' if api is lib else 'ncclAvg'}: {res}: "
                   f"{last_error()}")
            synced(out)
            outs.append(out)
        if name == "ncclReduce" and RANK != 0:
            continue  # only the root's output is defined
        expect(np.array_equal(outs[0], outs[1]), "ops",
               f"{name} with the quantized op differs from the real library's ncclAvg")
        checked += 1
    check_nccl(lib.ncclRedOpDestroy(op[0], comm), "ncclRedOpDestroy")
    check_nccl(lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return checked


SECTIONS = {f.__name__: f for f in (codec, context, legacy, histories, streams, retired,
                                     layout, kernels, threads, launches, ops)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("section", choices=SECTIONS)
    args = parser.parse_args()
    cases = SECTIONS[args.section](args)
    failed = COMM.allreduce(len(failures.lines))
    if RANK == 0:
        print(f"SUMMARY {args.section}: {NRANKS} ranks, {cases} cases, {failed} failures",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
