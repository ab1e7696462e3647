//! Pinned host memory and asynchronous copies (`Device::pinned_host`, `Tensor::pin_memory`):
//! on a CUDA device the real thing; on every machine, a stand-in GPU whose copies run late on
//! a thread of their own, so the tests see that a copy does not make the host wait and that
//! every host use of a pinned tensor waits for the copy in flight on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use strata::prelude::*;
use strata::{Backend, DeviceBuffer, EventId, StreamId};
use strata_tests::test_device;

/// How long a stand-in copy takes.
const LATE: Duration = Duration::from_millis(200);

/// A CPU backend posing as a GPU with page-locked memory: each pinned copy runs on a thread
/// that first sleeps [`LATE`]; its event completes when the thread has copied.
#[derive(Debug, Default)]
struct LateCopies {
    cpu: strata::cpu::CpuBackend,
    copies: Mutex<HashMap<u64, JoinHandle<()>>>,
    next: AtomicUsize,
    /// Copies that have finished.
    done: Arc<AtomicUsize>,
    /// Page-locked blocks handed out.
    blocks: AtomicUsize,
}

/// A pinned block of the stand-in: a heap allocation the owner frees.
struct Block(#[allow(dead_code)] Vec<u64>);

impl LateCopies {
    fn copy_late(&self, from: usize, to: usize, len: usize) -> EventId {
        let done = self.done.clone();
        let copy = std::thread::spawn(move || {
            std::thread::sleep(LATE);
            // SAFETY: core keeps both blocks alive and untouched until this event completes
            // (what these tests check).
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, len) };
            done.fetch_add(1, Ordering::SeqCst);
        });
        let id = (1u64 << 40) + self.next.fetch_add(1, Ordering::Relaxed) as u64;
        self.copies.lock().unwrap().insert(id, copy);
        EventId(id)
    }

    fn address(&self, b: &dyn DeviceBuffer, offset: usize) -> usize {
        self.cpu.buffer_address(b).unwrap() as usize + offset
    }
}

impl Backend for LateCopies {
    fn kind(&self) -> strata::BackendKind {
        strata::BackendKind::Cpu
    }
    fn name(&self) -> String {
        "late-copies".into()
    }
    fn check_dtype(&self, d: DType) -> Result<()> {
        self.cpu.check_dtype(d)
    }
    fn target(&self) -> &strata::target::Target {
        self.cpu.target()
    }
    fn allocate(&self, n: usize, s: StreamId) -> Result<Arc<dyn DeviceBuffer>> {
        self.cpu.allocate(n, s)
    }
    fn upload(&self, b: &dyn DeviceBuffer, o: usize, d: &[u8], s: StreamId) -> Result<()> {
        self.cpu.upload(b, o, d, s)
    }
    fn download(&self, b: &dyn DeviceBuffer, o: usize, d: &mut [u8], s: StreamId) -> Result<()> {
        self.cpu.download(b, o, d, s)
    }
    fn run(
        &self,
        k: &strata::ir::Kernel,
        a: &strata::backend::KernelArgs,
        s: StreamId,
    ) -> Result<()> {
        self.cpu.run(k, a, s)
    }
    fn buffer_address(&self, b: &dyn DeviceBuffer) -> Result<u64> {
        self.cpu.buffer_address(b)
    }
    fn pins_host_memory(&self) -> bool {
        true
    }
    fn allocate_pinned(&self, bytes: usize) -> Result<(u64, strata::backend::ForeignOwner)> {
        self.blocks.fetch_add(1, Ordering::SeqCst);
        let block = vec![0u64; bytes.div_ceil(8).max(1)];
        let address = block.as_ptr() as usize as u64;
        Ok((address, Box::new(Block(block))))
    }
    fn upload_pinned(
        &self,
        dst: &dyn DeviceBuffer,
        at: usize,
        src: u64,
        len: usize,
        _: StreamId,
    ) -> Result<EventId> {
        Ok(self.copy_late(src as usize, self.address(dst, at), len))
    }
    fn download_pinned(
        &self,
        src: &dyn DeviceBuffer,
        at: usize,
        dst: u64,
        len: usize,
        _: StreamId,
    ) -> Result<EventId> {
        Ok(self.copy_late(self.address(src, at), dst as usize, len))
    }
    fn memory_stats(&self) -> strata::MemoryStats {
        self.cpu.memory_stats()
    }
    fn empty_cache(&self) {
        self.cpu.empty_cache()
    }
    fn new_stream(&self) -> Result<StreamId> {
        self.cpu.new_stream()
    }
    fn destroy_stream(&self, s: StreamId) {
        self.cpu.destroy_stream(s)
    }
    fn record_event(&self, s: StreamId) -> Result<EventId> {
        self.cpu.record_event(s)
    }
    fn wait_event(&self, s: StreamId, e: EventId) -> Result<()> {
        self.cpu.wait_event(s, e)
    }
    fn synchronize_event(&self, e: EventId) -> Result<()> {
        match self.copies.lock().unwrap().remove(&e.0) {
            Some(copy) => copy
                .join()
                .map_err(|_| Error::Backend("copy thread".into())),
            None => self.cpu.synchronize_event(e),
        }
    }
    fn elapsed_ms(&self, a: EventId, b: EventId) -> Result<f64> {
        self.cpu.elapsed_ms(a, b)
    }
    fn destroy_event(&self, e: EventId) {
        if self.copies.lock().unwrap().remove(&e.0).is_none() {
            self.cpu.destroy_event(e)
        }
    }
    fn synchronize_stream(&self, s: StreamId) -> Result<()> {
        self.cpu.synchronize_stream(s)
    }
    fn synchronize(&self) -> Result<()> {
        self.cpu.synchronize()
    }
}

fn late_gpu() -> (Device, Arc<LateCopies>) {
    let backend = Arc::new(LateCopies::default());
    (Device::from_backend(backend.clone()), backend)
}

#[test]
fn a_pinned_host_device_is_one_device_that_says_what_it_is() {
    let (gpu, backend) = late_gpu();
    let host = gpu.pinned_host().unwrap();
    assert_eq!(host, gpu.pinned_host().unwrap());
    assert_eq!(host.pinned_host().unwrap(), host);
    assert_eq!(host.pinned_for(), Some(&gpu));
    assert_eq!(host.name(), "cpu (pinned for late-copies)");
    let t = Tensor::arange(0, 8, 1, DType::F32, &Device::cpu()).unwrap();
    let p = t.pin_memory(&gpu).unwrap();
    assert!(p.is_pinned() && !t.is_pinned());
    assert_eq!(p.device(), &host);
    assert_eq!(backend.blocks.load(Ordering::SeqCst), 1);
    assert!(host.memory_stats().allocated >= 32);
    // Pinned tensors are host tensors: every op runs on them.
    let q = (&p * 2.0).unwrap().sum(Axes::All, false).unwrap();
    assert_eq!(q.item::<f32>().unwrap(), 56.0);
    // A freed block is kept for the next tensor of its size class.
    drop((p, q));
    let blocks = backend.blocks.load(Ordering::SeqCst);
    let again = t.pin_memory(&gpu).unwrap();
    assert_eq!(backend.blocks.load(Ordering::SeqCst), blocks);
    assert_eq!(again.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
}

#[test]
fn an_upload_from_pinned_memory_does_not_wait_and_a_later_write_waits_for_it() {
    let (gpu, backend) = late_gpu();
    let p = Tensor::arange(0, 1000, 1, DType::I32, &gpu.pinned_host().unwrap()).unwrap();
    let on_gpu = p.to_device(&gpu).unwrap();
    // The copy is still in flight: `to_device` returned without waiting for it.
    assert_eq!(backend.done.load(Ordering::SeqCst), 0);
    // A write into the source waits for the copy, which reads the old values.
    p.fill(7i32).unwrap();
    assert_eq!(backend.done.load(Ordering::SeqCst), 1);
    let want: Vec<i32> = (0..1000).collect();
    assert_eq!(on_gpu.to_vec::<i32>().unwrap(), want);
    assert_eq!(p.to_vec::<i32>().unwrap(), vec![7; 1000]);
}

#[test]
fn a_download_into_pinned_memory_does_not_wait_and_a_read_waits_for_it() {
    let (gpu, backend) = late_gpu();
    let host = gpu.pinned_host().unwrap();
    let x = Tensor::arange(0, 4096, 1, DType::F32, &gpu).unwrap();
    let y = (&x * 2.0).unwrap().to_device(&host).unwrap();
    assert_eq!(backend.done.load(Ordering::SeqCst), 0);
    assert!(y.is_pinned());
    let want: Vec<f32> = (0..4096).map(|i| 2.0 * i as f32).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    // An op on the host waits too, and so does a view's.
    let z = (&x + 1.0).unwrap().to_device(&host).unwrap();
    let tail = z.slice(s![4000..]).unwrap().sum(Axes::All, false).unwrap();
    assert_eq!(
        tail.item::<f32>().unwrap(),
        (4001..=4096).sum::<i32>() as f32
    );
    // A strided source is made contiguous on the device first.
    let t = x
        .reshape([64, 64])
        .unwrap()
        .t()
        .unwrap()
        .to_device(&host)
        .unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap()[1], 64.0);
}

#[test]
fn dropping_a_pinned_tensor_waits_for_its_copy_before_the_memory_is_reused() {
    let (gpu, backend) = late_gpu();
    let x = Tensor::ones([1 << 16], DType::F32, &gpu).unwrap();
    let y = x.to_device(&gpu.pinned_host().unwrap()).unwrap();
    assert_eq!(backend.done.load(Ordering::SeqCst), 0);
    drop(y);
    assert_eq!(backend.done.load(Ordering::SeqCst), 1);
    // A zero-size copy has nothing in flight.
    let e = Tensor::zeros([0, 3], DType::F32, &gpu).unwrap();
    let pe = e.to_device(&gpu.pinned_host().unwrap()).unwrap();
    assert_eq!(pe.shape(), &[0, 3]);
    assert_eq!(pe.to_device(&gpu).unwrap().shape(), &[0, 3]);
}

/// Every backend: CUDA pins host memory and copies through it both ways; the others say
/// they have none.
fn pinned_copies(dev: &Device) -> Result<()> {
    if dev.kind() != strata::BackendKind::Cuda {
        let err = dev.pinned_host().unwrap_err().to_string();
        assert!(err.contains("pinned") && err.contains(&dev.name()), "{err}");
        let t = Tensor::ones([2], DType::F32, dev)?;
        assert!(t.pin_memory(dev).is_err());
        return Ok(());
    }
    let host = dev.pinned_host()?;
    let n = 3 << 20; // 12 MiB of f32
    let values: Vec<f32> = (0..n).map(|i| (i % 1013) as f32).collect();
    let p = Tensor::from_slice(&values, [n], &Device::cpu())?.pin_memory(dev)?;
    let side = dev.new_stream()?;
    let doubled = dev.with_stream(&side, || -> Result<Tensor> {
        let g = p.to_device(dev)?;
        (&g * 2.0)?.to_device(&host)
    })??;
    p.fill(0.0f32)?; // waits for the upload, which read the values
    let got = doubled.to_vec::<f32>()?;
    assert!(got.iter().zip(&values).all(|(g, v)| *g == 2.0 * v));
    // Half-precision and byte dtypes, views and offsets.
    let h = Tensor::arange(0, 1000, 1, DType::F16, dev)?;
    let back = h.slice(s![3..;2])?.to_device(&host)?;
    assert_eq!(back.to_vec::<half::f16>()?[0], half::f16::from_f32(3.0));
    let b = Tensor::from_slice(&[1u8, 2, 3], [3], &host)?.to_device(dev)?;
    assert_eq!(b.to_vec::<u8>()?, vec![1, 2, 3]);
    Ok(())
}
test_device!(pinned_memory_copies_both_ways_on_cuda, pinned_copies);
