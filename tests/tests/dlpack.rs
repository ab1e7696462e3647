//! DLPack exchange on every backend: every dtype and layout round trips without a copy (the
//! same address, writes seen both ways), exports keep their storage alive until the deleter
//! runs, imports call the producer's deleter once, read-only imports refuse writes, bad input
//! is an `Err`, wgpu exchanges only through a host copy, and on CUDA a consumer's stream waits
//! for the producer's work without the host waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use strata::dlpack::{
    ConsumerStream, DLDataType, DLDataTypeCode, DLDevice, Dlpack, DlpackFlags, ExportOptions,
    LegacyDlpack,
};
use strata::prelude::*;
use strata::BackendKind;
use strata_tests::test_device;

/// The message of an `Err` (a DLPack tensor has no `Debug` for `unwrap_err`).
fn err<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an Err"),
        Err(e) => e.to_string(),
    }
}

/// The views an exchange must carry: offsets, negative and zero strides, transposes, a 0-d
/// element and an empty slice.
fn views(base: &Tensor) -> Result<Vec<(&'static str, Tensor)>> {
    Ok(vec![
        ("contiguous", base.clone()),
        ("slice with an offset", base.slice(s![1.., ..;2, 1..3])?),
        ("negative step", base.slice(s![.., ..;-1, ..])?),
        ("transpose", base.permute([2, 0, 1])?),
        ("broadcast", base.slice(s![0, 0..1, ..])?.expand([3, 4])?),
        ("0-d element", base.slice(s![1, 2, 3])?),
        ("empty", base.slice(s![.., 1..1, ..])?),
    ])
}

/// `0..24` as `dtype` in shape [2, 3, 4] (bools alternate).
fn base(dtype: DType, dev: &Device) -> Result<Tensor> {
    let t = Tensor::arange(0, 24, 1, DType::I64, dev)?;
    let t = if dtype == DType::Bool {
        (&t % 2i64)?.to_dtype(dtype)?
    } else {
        t.to_dtype(dtype)?
    };
    t.reshape([2, 3, 4])
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

/// The address of a view's first element, from the backend's buffer address.
fn address(t: &Tensor) -> Result<u64> {
    let op = t.operand()?;
    let base = t.device().backend().buffer_address(op.buffer.as_ref())?;
    let at = base + (t.offset() * t.itemsize()) as u64;
    assert_eq!(t.data_ptr()?, at);
    Ok(at)
}

fn every_dtype_and_layout_round_trips(dev: &Device) -> Result<()> {
    if dev.kind() == BackendKind::Wgpu {
        return Ok(()); // wgpu_exchanges_through_a_host_copy
    }
    for dtype in DType::ALL {
        for (what, v) in views(&base(dtype, dev)?)? {
            let d: Dlpack = v.to_dlpack()?;
            let desc = d.validate().map_err(|e| Error::Invalid(e.to_string()))?;
            let want_shape: Vec<i64> = v.shape().iter().map(|&n| n as i64).collect();
            let want_strides: Vec<i64> = v.strides().iter().map(|&s| s as i64).collect();
            assert_eq!(desc.shape(), &want_shape[..], "{what} {dtype}");
            assert_eq!(
                desc.strides().unwrap_or(&[]),
                &want_strides[..],
                "{what} {dtype}"
            );
            assert_eq!(
                desc.dtype().bits as usize,
                8 * dtype.itemsize(),
                "{what} {dtype}"
            );
            assert_eq!(Some(desc.device()), v.dlpack_device(), "{what} {dtype}");
            if v.numel() > 0 {
                assert_eq!(
                    desc.data_ptr() as usize as u64,
                    address(&v)?,
                    "{what} {dtype}"
                );
            }
            let u = Tensor::from_dlpack(d, dev)?;
            assert_eq!(u.shape(), v.shape(), "{what} {dtype}");
            assert_eq!(u.strides(), v.strides(), "{what} {dtype}");
            assert_eq!(u.dtype(), dtype);
            assert_eq!(values(&u)?, values(&v)?, "{what} {dtype}");
            if v.numel() > 0 {
                assert_eq!(address(&u)?, address(&v)?, "{what} {dtype}: not zero-copy");
            }
            // Writes are shared both ways (where the view may be written at all).
            if what != "broadcast" && v.numel() > 0 {
                u.fill(1)?;
                assert!(values(&v)?.iter().all(|&x| x == 1.0), "{what} {dtype}");
                v.fill(0)?;
                assert!(values(&u)?.iter().all(|&x| x == 0.0), "{what} {dtype}");
            }
        }
    }
    // The legacy ABI carries the same tensor.
    let t = base(DType::F32, dev)?.slice(s![.., ..;-1, ..])?;
    let legacy: LegacyDlpack = t.to_legacy_dlpack_with(&ExportOptions::default())?;
    assert_eq!(values(&Tensor::from_dlpack(legacy, dev)?)?, values(&t)?);
    Ok(())
}
test_device!(
    every_dtype_and_layout_round_trips_without_a_copy,
    every_dtype_and_layout_round_trips
);

fn storage_outlives(dev: &Device) -> Result<()> {
    if dev.kind() == BackendKind::Wgpu {
        return Ok(());
    }
    dev.synchronize()?;
    let before = dev.memory_stats().allocated;
    let t = Tensor::full([1 << 16], 3.0, DType::F32, dev)?;
    let d = t.to_dlpack()?;
    let lent_at = d.validate().unwrap().data_ptr() as usize as u64;
    drop(t);
    // The allocator neither frees nor hands out the block while the consumer holds it.
    let other = Tensor::zeros([1 << 16], DType::F32, dev)?;
    assert_ne!(address(&other)?, lent_at);
    assert!(dev.memory_stats().allocated >= before + (2 << 18));
    drop(other);
    let back = Tensor::from_dlpack(d, dev)?;
    assert_eq!(
        back.sum(strata::ops::Axes::All, false)?.item::<f32>()?,
        3.0 * 65536.0
    );
    drop(back);
    dev.synchronize()?;
    assert_eq!(dev.memory_stats().allocated, before);
    Ok(())
}
test_device!(
    an_export_keeps_its_storage_until_the_deleter_runs,
    storage_outlives
);

/// Host memory with a drop counter: a producer whose deleter the test can see.
struct Lent {
    _data: Vec<f32>,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A CPU DLPack tensor over `values`, with `flags`, dtype and device as given.
fn lent(
    values: Vec<f32>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    flags: DlpackFlags,
    dtype: DLDataType,
    device: DLDevice,
    dropped: &Arc<AtomicUsize>,
) -> Dlpack {
    let mut values = values;
    let data = values.as_mut_ptr().cast();
    let owner = Box::new(Lent {
        _data: values,
        dropped: dropped.clone(),
    });
    let mut init = dlpark::metadata::Dynamic::new(shape, strides)
        .initialize(owner)
        .unwrap();
    init.set_data(data).set_dtype(dtype).set_device(device);
    init.set_flags(flags).unwrap();
    // SAFETY: the data lives in the owner, shape and strides describe it.
    unsafe { init.finish() }
}

const F32: DLDataType = DLDataType::new(DLDataTypeCode::FLOAT, 32, 1);

#[test]
fn the_producers_deleter_runs_once_when_the_last_view_drops() {
    let dev = Device::cpu();
    let dropped = Arc::new(AtomicUsize::new(0));
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let d = lent(
        data,
        vec![3, 4],
        vec![4, 1],
        DlpackFlags::empty(),
        F32,
        DLDevice::CPU,
        &dropped,
    );
    let t = Tensor::from_dlpack(d, &dev).unwrap();
    let col = t.slice(s![.., -1]).unwrap();
    drop(t);
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    assert_eq!(col.to_vec::<f32>().unwrap(), vec![3.0, 7.0, 11.0]);
    col.add_(1.0).unwrap();
    drop(col);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    // Foreign memory is not the allocator's: nothing counted, nothing leaked.
    assert_eq!(dev.memory_stats().allocated, 0);
}

#[test]
fn a_read_only_import_refuses_writes() {
    let dev = Device::cpu();
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = lent(
        vec![1.0, 2.0, 3.0],
        vec![3],
        vec![1],
        DlpackFlags::READ_ONLY,
        F32,
        DLDevice::CPU,
        &dropped,
    );
    let t = Tensor::from_dlpack(d, &dev).unwrap();
    assert!(t.is_read_only());
    for e in [
        t.fill(0.0).unwrap_err(),
        t.add_(1.0).unwrap_err(),
        t.slice(s![1..]).unwrap().fill(5.0).unwrap_err(),
    ] {
        assert!(e.to_string().contains("read-only"), "{e}");
    }
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    let copy = t.copy().unwrap();
    copy.fill(0.0).unwrap();
    // Re-exported, it stays read-only.
    let again = t.to_dlpack().unwrap();
    assert!(again.flags().contains(DlpackFlags::READ_ONLY));
    drop((t, again));
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn bad_input_is_an_error_that_says_what_is_wrong() {
    let dev = Device::cpu();
    let dropped = Arc::new(AtomicUsize::new(0));
    let case = |dtype: DLDataType, device: DLDevice, strides: Vec<i64>| {
        let d = lent(
            vec![0.0; 4],
            vec![4],
            strides,
            DlpackFlags::empty(),
            dtype,
            device,
            &dropped,
        );
        Tensor::from_dlpack(d, &dev).unwrap_err().to_string()
    };
    let lanes = case(
        DLDataType::new(DLDataTypeCode::FLOAT, 32, 2),
        DLDevice::CPU,
        vec![1],
    );
    assert!(lanes.contains("2 lanes"), "{lanes}");
    let fp8 = case(
        DLDataType::new(DLDataTypeCode::FLOAT8_E4M3FN, 8, 1),
        DLDevice::CPU,
        vec![1],
    );
    assert!(fp8.contains("no strata dtype"), "{fp8}");
    let cuda = case(F32, DLDevice::cuda(1), vec![1]);
    assert!(cuda.contains("cuda:1") && cuda.contains("cpu"), "{cuda}");
    // Every rejected import still released the producer's memory.
    assert_eq!(dropped.load(Ordering::SeqCst), 3);
    // A stream on a CPU export, and a device no copy reaches.
    let t = Tensor::ones([2], DType::F32, &dev).unwrap();
    let on_stream = ExportOptions {
        stream: ConsumerStream::Native(5),
        ..Default::default()
    };
    let e = t.to_dlpack_with(&on_stream);
    assert!(err(e).contains("takes no stream"));
    let to_gpu = ExportOptions {
        device: Some(DLDevice::cuda(0)),
        ..Default::default()
    };
    let e = t.to_dlpack_with(&to_gpu);
    assert!(err(e).contains("asked for cuda:0"));
}

#[test]
fn a_misaligned_pointer_is_an_error() {
    let dev = Device::cpu();
    let t = Tensor::zeros([8], DType::U8, &dev).unwrap();
    // Bytes 1..5 seen as one f32 by hand: the address is odd.
    let d = t.slice(s![1..5]).unwrap().to_dlpack().unwrap();
    let address = d.validate().unwrap().data_ptr();
    let keep = Box::new(d);
    let mut init = dlpark::metadata::Dynamic::new(vec![1i64], vec![1i64])
        .initialize(keep)
        .unwrap();
    init.set_data(address.cast_mut())
        .set_dtype(F32)
        .set_device(DLDevice::CPU);
    // SAFETY: the bytes live in the boxed export.
    let bad: Dlpack = unsafe { init.finish() };
    let e = Tensor::from_dlpack(bad, &dev).unwrap_err().to_string();
    assert!(e.contains("not aligned"), "{e}");
}

fn wgpu_exchange(dev: &Device) -> Result<()> {
    if dev.kind() != BackendKind::Wgpu {
        return Ok(());
    }
    let t = Tensor::arange(0, 6, 1, DType::F32, dev)?.reshape([2, 3])?;
    let e = err(t.to_dlpack());
    assert!(e.contains("copy=true"), "{e}");
    let copy = ExportOptions {
        copy: Some(true),
        ..Default::default()
    };
    let d: Dlpack = t.to_dlpack_with(&copy)?;
    assert_eq!(d.validate().unwrap().device(), DLDevice::CPU);
    assert!(d.flags().contains(DlpackFlags::IS_COPIED));
    let no_copy = ExportOptions {
        copy: Some(false),
        device: Some(DLDevice::CPU),
        ..Default::default()
    };
    assert!(t.to_dlpack_with(&no_copy).is_err());
    let e = Tensor::from_dlpack(t.to_legacy_dlpack_with(&copy)?, dev).unwrap_err();
    assert!(e.to_string().contains("from_dlpack_copy"), "{e}");
    let back = Tensor::from_dlpack_copy(d, dev)?;
    assert_eq!(back.device().kind(), BackendKind::Wgpu);
    assert_eq!(back.to_vec::<f32>()?, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    Ok(())
}
test_device!(wgpu_exchanges_through_a_host_copy, wgpu_exchange);

/// CUDA: the consumer's stream waits for the producer's pending work through an event (no
/// host wait), so a read on that stream sees the final values; a second CUDA ordinal is
/// refused.
fn consumer_stream(dev: &Device) -> Result<()> {
    if dev.kind() != BackendKind::Cuda {
        return Ok(());
    }
    let (producer, consumer) = (dev.new_stream()?, dev.new_stream()?);
    let n = 1 << 24;
    let x = dev.with_stream(&producer, || -> Result<Tensor> {
        let mut x = Tensor::zeros([n], DType::F32, dev)?;
        for _ in 0..40 {
            x = (&x + 1.0)?;
            x.realize()?;
        }
        Ok(x)
    })??;
    let handle = dev.backend().native_stream(consumer.id())?;
    let options = ExportOptions {
        stream: ConsumerStream::Native(handle),
        ..Default::default()
    };
    let d: Dlpack = x.to_dlpack_with(&options)?;
    // A new storage: strata's own ordering knows nothing of `x`, only the event orders it.
    let total = dev.with_stream(&consumer, || -> Result<f32> {
        let seen = Tensor::from_dlpack(d, dev)?.copy()?;
        seen.max(strata::ops::Axes::All, false)?.item::<f32>()
    })??;
    assert_eq!(total, 40.0);
    let dropped = Arc::new(AtomicUsize::new(0));
    let other = lent(
        vec![0.0; 4],
        vec![4],
        vec![1],
        DlpackFlags::empty(),
        F32,
        DLDevice::cuda(1),
        &dropped,
    );
    let e = Tensor::from_dlpack(other, dev).unwrap_err().to_string();
    assert!(e.contains("cuda:1") && e.contains("cuda:0"), "{e}");
    Ok(())
}
test_device!(
    a_cuda_consumer_stream_waits_for_the_producer,
    consumer_stream
);
