"""strata <-> NumPy through DLPack on the CPU (and wgpu through a host copy where it runs):
zero-copy (the same address, writes seen on both sides), views with offsets, negative and
zero strides, read-only arrays, deleters that run exactly once, and bad input as exceptions."""

import gc
import os
import sys

import numpy as np
import pytest

import strata

NUMPY_DTYPES = {
    "bool": np.bool_, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
}


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_numpy_takes_a_strata_tensor_without_a_copy(name):
    t = strata.tensor([float(i % 2 if name == "bool" else i) for i in range(12)], dtype=name)
    a = np.from_dlpack(t)
    assert a.dtype == NUMPY_DTYPES[name]
    assert a.ctypes.data == t.data_ptr()
    assert a.astype(np.float64).tolist() == t.tolist()
    t.fill_(1)  # strata writes, NumPy sees
    assert a.astype(np.float64).tolist() == [1.0] * 12


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_strata_takes_a_numpy_array_without_a_copy(name):
    a = (np.arange(12) % 2 if name == "bool" else np.arange(12)).astype(NUMPY_DTYPES[name])
    a = a.reshape(3, 4)
    t = strata.from_dlpack(a)
    assert (t.dtype, t.shape, t.strides, t.device) == (name, [3, 4], [4, 1], "cpu")
    assert t.data_ptr() == a.ctypes.data
    a[0, 0] = 1  # NumPy writes, strata sees
    assert t.tolist()[0] == 1.0
    t.fill_(0)  # strata writes, NumPy sees
    assert not a.any()


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[1:, ::2],
        lambda a: a[:, ::-1],
        lambda a: a.T,
        lambda a: a[::-2, 1:3],
    ],
    ids=["offset-and-step", "negative-stride", "transpose", "negative-step-offset"],
)
def test_views_keep_their_strides_both_ways(view):
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    v = view(a)
    t = strata.from_dlpack(v)
    assert t.shape == list(v.shape)
    assert t.strides == [s // 4 for s in v.strides]
    assert t.tolist() == v.ravel().tolist()
    assert t.data_ptr() == v.ctypes.data
    back = np.from_dlpack(t)  # strata's view, exported again: the same memory and strides
    assert back.ctypes.data == v.ctypes.data and back.strides == v.strides
    # strata's own views too: a negative stride and a transpose exported to NumPy.
    s = strata.arange(12, dtype="i32").copy()
    r = np.from_dlpack(s.reversed())
    assert r.tolist() == list(range(11, -1, -1)) and r.strides == (-4,)


def test_a_read_only_array_stays_read_only():
    a = np.arange(6, dtype=np.float64)
    b = np.broadcast_to(a, (3, 6))  # read-only, stride 0
    t = strata.from_dlpack(b)
    assert t.is_read_only and t.strides == [0, 1]
    assert t.tolist() == b.ravel().tolist()
    with pytest.raises(ValueError, match="read-only"):
        t.fill_(1)
    with pytest.raises(ValueError, match="read-only"):
        t.add_(1)
    assert t.copy().sum() == b.sum()


def test_a_capsule_can_be_used_once():
    a = np.ones(4, dtype=np.float32)
    capsule = a.__dlpack__()
    t = strata.from_dlpack(capsule)
    assert t.tolist() == [1.0] * 4
    with pytest.raises((ValueError, BufferError, TypeError)):
        strata.from_dlpack(capsule)


def test_bad_input_is_an_exception_never_a_crash():
    with pytest.raises(TypeError, match="no strata dtype"):
        strata.from_dlpack(np.ones(3, dtype=np.complex64))

    class OnAnotherDevice:
        def __dlpack_device__(self):
            return (7, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("never asked for")

    with pytest.raises(BufferError, match="device type 7"):
        strata.from_dlpack(OnAnotherDevice())
    with pytest.raises((TypeError, AttributeError)):
        strata.from_dlpack(42)
    with pytest.raises(BufferError):
        strata.arange(3).__dlpack__(dl_device=(2, 0))
    with pytest.raises(ValueError, match="takes no stream"):
        strata.arange(3).__dlpack__(stream=5)


def test_ten_thousand_exchanges_leak_nothing():
    a = np.arange(256, dtype=np.float32)
    refs = sys.getrefcount(a)
    gc.collect()
    before = strata.memory_stats("cpu")["allocated"]
    for _ in range(10_000):
        t = strata.from_dlpack(a)  # NumPy's deleter drops its reference when t goes
        b = np.from_dlpack(strata.arange(64))  # strata's deleter frees its buffer with b
        del t, b
    gc.collect()
    assert sys.getrefcount(a) == refs
    assert strata.memory_stats("cpu")["allocated"] == before


def wgpu_or_skip():
    if not os.environ.get("VK_DRIVER_FILES") and not os.path.exists("/dev/dri"):
        pytest.skip("no Vulkan driver here")
    try:
        return strata.arange(6, device="wgpu")
    except RuntimeError as e:
        pytest.skip(f"no wgpu adapter: {e}")


def test_wgpu_exchanges_only_through_a_host_copy():
    t = wgpu_or_skip()
    assert t.__dlpack_device__() == (7, 0)
    with pytest.raises(BufferError, match="copy=true"):
        t.__dlpack__()
    with pytest.raises(BufferError, match="copy=false"):
        t.__dlpack__(dl_device=(1, 0), copy=False)
    a = np.from_dlpack(t, copy=True)
    assert a.tolist() == [0, 1, 2, 3, 4, 5]
    a[0] = 9  # a copy: strata's tensor is unchanged
    assert t.tolist()[0] == 0
    u = strata.from_dlpack(a, device="wgpu")
    assert u.device.startswith("wgpu") and u.tolist()[0] == 9
    with pytest.raises(BufferError, match="allow a copy"):
        strata.from_dlpack(a, device="wgpu", copy=False)
