"""strata <-> PyTorch and CuPy through DLPack on CUDA (runs where torch sees a GPU: the GPU
machine, `bash scripts/gpu-run.sh python`): zero-copy by device pointer, writes seen both ways,
a producer's pending work seen by the consumer without an explicit synchronize (both ways),
deleters exactly once over 10,000 exchanges, and bad input as exceptions."""

import gc

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import strata  # noqa: E402

TORCH_DTYPES = {
    "bool": torch.bool, "u8": torch.uint8, "u16": torch.uint16, "u32": torch.uint32,
    "u64": torch.uint64, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32,
    "i64": torch.int64, "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
    "f64": torch.float64,
}


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
def test_torch_and_strata_share_memory_for_every_dtype(name):
    values = [float(i % 2 if name == "bool" else i) for i in range(12)]
    t = strata.tensor(values, shape=[3, 4], dtype=name, device="cuda")
    x = torch.from_dlpack(t)
    assert x.dtype == TORCH_DTYPES[name] and x.device.type == "cuda"
    assert x.data_ptr() == t.data_ptr()
    assert x.double().flatten().tolist() == values
    x.fill_(1)  # PyTorch writes, strata sees (after the exchange, ordering is the user's)
    torch.cuda.synchronize()
    assert t.tolist() == [1.0] * 12
    back = strata.from_dlpack(x)
    assert back.data_ptr() == x.data_ptr()
    back.fill_(0)  # strata writes, PyTorch sees
    torch.cuda.synchronize()
    strata.synchronize("cuda")
    assert x.double().abs().sum().item() == 0  # (PyTorch has no any() for u16..u64)


def test_views_cross_with_their_strides():
    x = torch.arange(20, device="cuda", dtype=torch.float32).reshape(4, 5)
    for v in [x[1:, ::2], x.t(), x[:, 1:4]]:
        t = strata.from_dlpack(v)
        assert t.shape == list(v.shape) and t.strides == list(v.stride())
        assert t.data_ptr() == v.data_ptr()
        assert t.tolist() == v.flatten().tolist()
    s = strata.arange(12, dtype="f32", device="cuda").copy()
    y = torch.from_dlpack(s.T)
    assert y.data_ptr() == s.data_ptr()


def test_cupy_and_strata_share_memory():
    cp = pytest.importorskip("cupy")
    a = cp.arange(8, dtype=cp.float32)
    t = strata.from_dlpack(a)
    assert t.data_ptr() == a.data.ptr
    t.add_(1)
    strata.synchronize("cuda")
    assert a.tolist() == [float(i + 1) for i in range(8)]
    b = cp.from_dlpack(strata.arange(8, dtype="i64", device="cuda"))
    assert b.tolist() == list(range(8))


def test_a_producers_pending_work_is_seen_without_a_synchronize():
    n = 1 << 26
    # torch -> strata: 60 adds queued on torch's stream; strata reads on its own
    # (non-blocking) stream, which __dlpack__(stream=...) made wait for torch's.
    for _ in range(3):
        x = torch.zeros(n, device="cuda")
        for _ in range(60):
            x.add_(1)
        t = strata.from_dlpack(x)
        assert t.sum() == 60.0 * n
    # strata -> torch: 60 adds queued on strata's stream; torch reads on its current stream.
    for _ in range(3):
        t = strata.zeros([n], device="cuda")
        for _ in range(60):
            t.add_(1)
        x = torch.from_dlpack(t)
        assert x.sum().item() == 60.0 * n
    # cupy -> strata the same way, where CuPy is installed.
    cp = pytest.importorskip("cupy")
    a = cp.zeros(n, dtype=cp.float32)
    for _ in range(60):
        a += 1
    assert strata.from_dlpack(a).sum() == 60.0 * n


def test_ten_thousand_exchanges_leak_nothing():
    torch.cuda.synchronize()
    strata.synchronize("cuda")
    gc.collect()
    torch_before = torch.cuda.memory_allocated()
    strata_before = strata.memory_stats("cuda")["allocated"]
    x = torch.ones(1024, device="cuda")
    for _ in range(10_000):
        t = strata.from_dlpack(torch.ones(256, device="cuda"))  # torch's deleter frees it
        y = torch.from_dlpack(strata.zeros([256], device="cuda"))  # strata's frees its buffer
        del t, y
        strata.from_dlpack(x)
    del x
    gc.collect()
    torch.cuda.synchronize()
    strata.synchronize("cuda")
    assert torch.cuda.memory_allocated() == torch_before
    assert strata.memory_stats("cuda")["allocated"] == strata_before


def test_bad_input_is_an_exception_never_a_crash():
    x = torch.ones(4, device="cuda")
    capsule = x.__dlpack__()
    strata.from_dlpack(capsule)
    with pytest.raises((ValueError, BufferError, TypeError)):
        strata.from_dlpack(capsule)  # used twice
    with pytest.raises(TypeError):
        strata.from_dlpack(torch.ones(2, device="cuda", dtype=torch.complex64))
    with pytest.raises(BufferError, match="cuda:0"):
        strata.from_dlpack(x, device="cpu", copy=False)
    if torch.cuda.device_count() > 1:
        with pytest.raises(BufferError, match="cuda:1"):
            strata.from_dlpack(torch.ones(2, device="cuda:1"), device="cuda:0")
