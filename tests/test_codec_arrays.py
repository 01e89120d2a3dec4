"""qnccl.codec on every kind of array it takes (qnccl/_arrays.py): torch tensors on the CPU
(float32, float16, bfloat16) give the bytes and values numpy arrays give, results come back
as torch tensors of the input's type and device, in-place outputs are written in place;
CPU objects speaking DLPack are taken as host memory; what the codec cannot take fails
naming what it takes. The device side's decisions (the stream a CUDA array's work is ordered
on, its element type) are checked on __cuda_array_interface__ descriptions: no GPU here."""
import numpy as np
import pytest

import qnccl.codec as codec
from conftest import assert_python_message
from qnccl import _arrays

torch = pytest.importorskip("torch")

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tensor_and_numpy(dtype, n=3000, seed=0):
    """A torch tensor of `dtype` and the numpy array holding the same bits (uint16 for
    bfloat16) with the dtype argument numpy needs."""
    values = torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32))
    t = values.to(TORCH[dtype])
    if dtype == "bfloat16":
        return t, t.view(torch.int16).numpy().view(np.uint16).copy(), "bfloat16"
    return t, t.numpy().copy(), None


@pytest.mark.parametrize("dtype", list(TORCH))
def test_torch_tensors_give_the_numpy_bytes_and_come_back_as_tensors(dtype):
    t, array, np_dtype = tensor_and_numpy(dtype)
    q = codec.quantize(t.reshape(60, 50), bits=3, bucket_size=64, seed=9, stream=2)
    want = codec.quantize(array, bits=3, bucket_size=64, seed=9, stream=2, dtype=np_dtype)
    assert isinstance(q.data, torch.Tensor) and q.data.dtype == torch.uint8
    assert np.array_equal(q.data.numpy(), want.data) and q.dtype == dtype
    assert q.nbytes == want.nbytes and q.shape == (60, 50)
    y = codec.dequantize(q)
    assert isinstance(y, torch.Tensor) and y.dtype == TORCH[dtype] and y.shape == (60, 50)
    assert np.array_equal(_arrays.to_numpy(y).reshape(-1).view(np.uint8),
                          codec.dequantize(want).reshape(-1).view(np.uint8))
    acc = torch.ones(60, 50, dtype=TORCH[dtype])
    same = acc
    codec.dequantize_accumulate(q, acc)
    reference = np.ones(3000, array.dtype) if np_dtype is None else \
        torch.ones(3000, dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
    codec.dequantize_accumulate(want, reference)
    assert acc is same and np.array_equal(_arrays.to_numpy(acc).reshape(-1), reference)


def test_tensor_inputs_are_read_as_they_are():
    """Non-contiguous tensors are copied; tensors that require grad are read detached."""
    t, _, _ = tensor_and_numpy("float32", 4000)
    strided = t.reshape(40, 100).t()  # non-contiguous view
    q = codec.quantize(strided, seed=1)
    assert np.array_equal(q.data.numpy(), codec.quantize(strided.contiguous(), seed=1).data)
    grad = t.clone().requires_grad_(True)
    assert np.array_equal(codec.quantize(grad, seed=4).data.numpy(),
                          codec.quantize(t, seed=4).data.numpy())


def test_outputs_must_be_writable_in_place():
    q = codec.quantize(torch.ones(100))
    with pytest.raises(ValueError, match="out must be a contiguous tensor"):
        codec.dequantize(q, out=torch.zeros(10, 10).t())
    with pytest.raises(ValueError, match="out holds 50 values"):
        codec.dequantize(q, out=torch.zeros(50))


TENSOR_TYPES = "a torch.Tensor of dtype torch.float32, torch.float16 or torch.bfloat16"
VALUES = "a float32, float16 or bfloat16 array (bfloat16 as ml_dtypes.bfloat16, or uint16 bits"


@pytest.mark.parametrize("call, error, name, allowed, given", [
    (lambda: codec.quantize(torch.zeros(10, dtype=torch.float64)), TypeError, "array",
     TENSOR_TYPES, "a torch.Tensor of dtype torch.float64"),
    (lambda: codec.quantize(torch.zeros(10, dtype=torch.int32)), TypeError, "array",
     TENSOR_TYPES, "a torch.Tensor of dtype torch.int32"),
    (lambda: codec.quantize(torch.zeros(10, dtype=torch.uint8)), TypeError, "array",
     VALUES, "a torch.Tensor of dtype torch.uint8"),
    (lambda: codec.quantize(torch.zeros(10), bucket_size=torch.tensor(0)), ValueError,
     "bucket_size", "an integer in 1..2**64-1", "0"),
    (lambda: codec.quantize(torch.zeros(10), bits=torch.tensor(4.0)), TypeError, "bits",
     "an integer in 1..8", "a torch.Tensor of dtype torch.float32"),
    (lambda: codec.dequantize(codec.quantize(torch.zeros(10)),
                              out=torch.zeros(10, dtype=torch.int32)), TypeError, "out",
     TENSOR_TYPES, "a torch.Tensor of dtype torch.int32"),
    (lambda: codec.dequantize_accumulate(codec.quantize(torch.zeros(10)),
                                         torch.zeros(10, dtype=torch.float16)), ValueError,
     "acc", "a float32 array", "a torch.Tensor of dtype torch.float16"),
    (lambda: codec.dequantize(torch.zeros(10)), TypeError, "q",
     "a QuantizedArray (from quantize)", "a torch.Tensor of dtype torch.float32"),
    (lambda: codec.unrotate(torch.zeros(8, dtype=torch.float16)), ValueError, "values",
     "a float32 array (rotate's output)", "a torch.Tensor of dtype torch.float16"),
])
def test_other_tensor_types_are_refused(call, error, name, allowed, given):
    """A tensor of a type the codec cannot take, or where an integer belongs, is named as
    what it is: "a torch.Tensor of dtype torch.int32"."""
    with pytest.raises(error) as caught:
        call()
    assert_python_message(caught.value, name, allowed, given)


class DLPackOnly:
    """A host array that offers nothing but the DLPack protocol (as other frameworks do)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_host_arrays_are_taken():
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    q = codec.quantize(DLPackOnly(x), seed=3)
    assert isinstance(q.data, np.ndarray)
    assert np.array_equal(q.data, codec.quantize(x, seed=3).data)


def test_device_interfaces_name_their_stream_and_type():
    """What a CUDA array's work is ordered on: the interface's stream (0 when it names
    none, the legacy default stream); 16-bit float bits arrive as uint16."""
    class Described:
        def __init__(self, **interface):
            self.__cuda_array_interface__ = dict(
                {"shape": (4, 8), "typestr": "<f4", "data": (0x7000, False), "version": 3},
                **interface)

    m = _arrays.adopt(Described(stream=0x1234), "x", writable=False)
    assert (m.device, m.stream, m.shape, m.kind, m.address) == (True, 0x1234, (4, 8), "cupy",
                                                                 0x7000)
    assert _arrays.adopt(Described(stream=None), "x", False).stream == 0
    bits = _arrays.adopt(Described(typestr="<u2"), "x", False)
    assert _arrays.codec_type(bits, "bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="C-contiguous writable device array"):
        _arrays.adopt(Described(data=(0x7000, True)), "out", writable=True)
    with pytest.raises(ValueError, match="C-contiguous device array"):
        _arrays.adopt(Described(strides=(4, 16)), "x", writable=False)


class CupyLike:
    """A device array as CuPy's are described (its class's module is cupy's)."""
    __module__ = "cupy._core.core"

    def __init__(self, typestr="<f4", data=(0x7000, False), **interface):
        self.__cuda_array_interface__ = dict(
            {"shape": (4, 8), "typestr": typestr, "data": data, "version": 3}, **interface)


@pytest.mark.parametrize("array, writable, error, name, allowed, given", [
    (CupyLike("<i4"), False, TypeError, "array", VALUES, "an int32 CuPy array"),
    (CupyLike("<f8"), False, TypeError, "array", VALUES, "a float64 CuPy array"),
    (CupyLike("<u1"), False, TypeError, "array", VALUES, "a uint8 CuPy array"),
    (CupyLike(data=(0x7000, True)), True, ValueError, "out", "a C-contiguous writable device "
     "array", "a read-only float32 CuPy array"),
    (CupyLike(strides=(4, 16)), False, ValueError, "array", "a C-contiguous device array",
     "a non-contiguous float32 CuPy array"),
])
def test_device_arrays_are_named_as_what_they_are(array, writable, error, name, allowed, given):
    """What the codec refuses of a device array names its element type and kind ("an int32
    CuPy array"), as it would for a numpy array. The checks run on the interface's
    description: no GPU here."""
    with pytest.raises(error) as caught:
        _arrays.codec_type(_arrays.adopt(array, name, writable), None, name)
    assert_python_message(caught.value, name, allowed, given)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(TORCH))
def test_cuda_tensors_match_cpu_tensors(dtype):
    """On a GPU: CUDA tensors are processed on PyTorch's current stream (here a side
    stream) and come back as CUDA tensors with the CPU path's bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    t, _, _ = tensor_and_numpy(dtype)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        device = t.cuda()
        q = codec.quantize(device, seed=3)
        y = codec.dequantize(q)
    side.synchronize()
    want = codec.quantize(t, seed=3)
    assert q.data.is_cuda and y.is_cuda and y.dtype == t.dtype
    assert np.array_equal(q.data.cpu().numpy(), want.data.numpy())
    assert torch.equal(y.cpu(), codec.dequantize(want))
