"""qnccl.codec on every kind of array it takes (qnccl/_arrays.py): torch tensors on the CPU
(float32, float16, bfloat16) give the bytes and values numpy arrays give, results come back
as torch tensors of the input's type and device, in-place outputs are written in place;
CPU objects speaking DLPack are taken as host memory; what the codec cannot take fails
naming what it takes. The device side's decisions (the stream a CUDA array's work is ordered
on, its element type) are checked on __cuda_array_interface__ descriptions: no GPU here."""
import numpy as np
import pytest

import qnccl.codec as codec
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


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_other_tensor_types_are_refused(dtype):
    with pytest.raises(TypeError, match="torch.float32, torch.float16 and torch.bfloat16"):
        codec.quantize(torch.zeros(10, dtype=dtype))


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
