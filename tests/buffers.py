"""Where a test program's buffers live: numpy arrays in host memory (the default), or with
QNCCL_TEST_MEMORY=device in device memory of the process's CUDA device, through the CUDA
runtime the process finds as libcudart.so.12 (the simulated GPU's, build/simdev, in CI:
docs/simulated-gpu.md; NVIDIA's on a GPU machine).

A program keeps working on numpy arrays and asks this module for the pointers it passes:

    mem = Memory()
    send_p, recv_p = mem.ptr(send, ffi), mem.ptr(recv, ffi)   # uploaded now
    lib.qncclAllReduce(send_p, recv_p, ..., comm, mem.cuda_stream(ffi))
    mem.sync(send, recv)               # the stream done, the results in the arrays

On the device each array's whole numpy buffer (its base) has a device twin, made on first use
and kept, so views keep their offsets (in place calls stay in place) and a buffer keeps its
device address from call to call (error feedback's residuals belong to an address). Host
mode passes the arrays themselves and the NULL stream: the programs read the same either way.
"""
import contextlib
import os

import numpy as np
from cffi import FFI

MEMORY = os.environ.get("QNCCL_TEST_MEMORY", "host")
if MEMORY not in ("host", "device"):
    raise SystemExit(f"QNCCL_TEST_MEMORY={MEMORY!r}: allowed: host or device")

_CDEF = """
typedef int cudaError_t;
typedef struct CUstream_st* cudaStream_t;
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, int kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind,
                            cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
const char* cudaGetErrorString(cudaError_t error);
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
"""
_SIMDEV_CDEF = """
typedef struct { uint64_t kernels, graphLaunches, allocationsInCapture, hostFunctions,
                 modulesLoaded, kernelsResolved; } simdevCounters;
int simdevGetCounters(simdevCounters* out);
"""
_H2D, _D2H = 1, 2
_NON_BLOCKING = 1


def _root(array):
    """The array that owns `array`'s memory."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class Memory:
    """This process's buffers (module docstring). `device`: the CUDA device (default:
    QNCCL_TEST_DEVICE, else 0)."""

    def __init__(self, device=None):
        self.device_mode = MEMORY == "device"
        self._twins = {}  # (host address, bytes) of a root -> device address
        if not self.device_mode:
            self.ffi = None
            return
        self.ffi = FFI()
        self.ffi.cdef(_CDEF)
        try:
            self.cuda = self.ffi.dlopen("libcudart.so.12")
        except OSError as err:
            raise SystemExit(f"QNCCL_TEST_MEMORY=device needs a CUDA runtime (libcudart.so.12 on "
                             f"LD_LIBRARY_PATH; the simulated GPU's is build/simdev): {err}")
        self.device = int(os.environ.get("QNCCL_TEST_DEVICE", "0") if device is None else device)
        self._check(self.cuda.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
        stream = self.ffi.new("cudaStream_t*")
        self._check(self.cuda.cudaStreamCreateWithFlags(stream, _NON_BLOCKING),
                    "cudaStreamCreateWithFlags")
        self._stream = stream[0]

    def _check(self, code, what):
        if code != 0:
            raise RuntimeError(f"{what}: CUDA error {code}: "
                               f"{self.ffi.string(self.cuda.cudaGetErrorString(code)).decode()}")

    @contextlib.contextmanager
    def _current(self):
        """This memory's device current (the program's own current device restored
        after: twins live on self.device whichever device the program made current)."""
        previous = self.ffi.new("int*")
        self._check(self.cuda.cudaGetDevice(previous), "cudaGetDevice")
        if previous[0] != self.device:
            self._check(self.cuda.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
        try:
            yield
        finally:
            if previous[0] != self.device:
                self._check(self.cuda.cudaSetDevice(previous[0]), "cudaSetDevice")

    def _twin(self, root):
        host = root.__array_interface__["data"][0]
        key = (host, root.nbytes)
        if key not in self._twins:
            p = self.ffi.new("void**")
            with self._current():
                self._check(self.cuda.cudaMalloc(p, max(root.nbytes, 1)), "cudaMalloc")
            self._twins[key] = int(self.ffi.cast("uintptr_t", p[0]))
        return host, self._twins[key]

    def ptr(self, array, ffi):
        """The pointer to pass for `array` (cffi `ffi` of the library called): the array
        itself, or its device twin after uploading its whole buffer on the stream."""
        if not self.device_mode:
            return ffi.from_buffer(array)
        root = _root(array)
        host, device = self._twin(root)
        if root.nbytes:
            with self._current():
                self._check(self.cuda.cudaMemcpyAsync(self.ffi.cast("void*", device),
                                                      self.ffi.cast("void*", host), root.nbytes,
                                                      _H2D, self._stream), "cudaMemcpyAsync")
        offset = array.__array_interface__["data"][0] - host
        return ffi.cast("void*", device + offset)

    def address(self, array):
        """Where `array` is for the library (an int): its twin on the device."""
        if not self.device_mode:
            return array.__array_interface__["data"][0]
        root = _root(array)
        host, device = self._twin(root)
        return device + array.__array_interface__["data"][0] - host

    def cuda_stream(self, ffi):
        """The stream to pass (cffi `ffi` of the library called): NULL on the host."""
        if not self.device_mode:
            return ffi.NULL
        return ffi.cast("cudaStream_t", int(self.ffi.cast("uintptr_t", self._stream)))

    def capture(self, issue):
        """A CUDA graph of what issue() queues on the stream, captured in global mode (the
        strictest: any allocation during it fails), instantiated; run it with replay()."""
        self._check(self.cuda.cudaStreamBeginCapture(self._stream, 0), "cudaStreamBeginCapture")
        try:
            issue()
        finally:
            graph = self.ffi.new("cudaGraph_t*")
            ended = self.cuda.cudaStreamEndCapture(self._stream, graph)
        self._check(ended, "cudaStreamEndCapture")
        exec_ = self.ffi.new("cudaGraphExec_t*")
        self._check(self.cuda.cudaGraphInstantiate(exec_, graph[0], 0), "cudaGraphInstantiate")
        self._check(self.cuda.cudaGraphDestroy(graph[0]), "cudaGraphDestroy")
        return exec_[0]

    def replay(self, graph):
        """Launches an instantiated graph on the stream."""
        self._check(self.cuda.cudaGraphLaunch(graph, self._stream), "cudaGraphLaunch")

    def simulator_counters(self):
        """The simulated GPU's counters (simdevCounters as a dict), or None on a real GPU."""
        sim = FFI()
        sim.cdef(_SIMDEV_CDEF)
        try:
            lib = sim.dlopen("libcuda.so.1")
            counters = sim.new("simdevCounters*")
            if lib.simdevGetCounters(counters) != 0:
                return None
        except (OSError, AttributeError):
            return None
        return {name: getattr(counters, name) for name, _ in sim.typeof("simdevCounters").fields}

    def sync(self, *arrays):
        """Waits for the stream and copies each array's buffer back from its twin."""
        if not self.device_mode:
            return
        with self._current():
            self._check(self.cuda.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
            for root in {id(_root(a)): _root(a) for a in arrays}.values():
                host, device = self._twin(root)
                if root.nbytes:
                    self._check(self.cuda.cudaMemcpy(self.ffi.cast("void*", host),
                                                     self.ffi.cast("void*", device),
                                                     root.nbytes, _D2H), "cudaMemcpy")
