//! Device memory: a size-class pool of `wgpu::Buffer`s. A freed buffer goes back to its class
//! and is handed out again without a driver call; every use is ordered on the one queue, so a
//! reused buffer never races with work that used it before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::{DeviceBuffer, Error, MemoryStats, Result};

/// The usages every tensor buffer has.
const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The pool of one device.
#[derive(Debug)]
pub(crate) struct Pool {
    device: wgpu::Device,
    max_buffer: u64,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    allocated: usize,
    reserved: usize,
    peak: usize,
}

/// The size a request of `bytes` is rounded up to: powers of two up to 64 MiB, then multiples
/// of 16 MiB (bindings need multiples of 4; small classes keep reuse likely).
fn size_class(bytes: usize) -> u64 {
    let b = (bytes.max(16)) as u64;
    if b <= 64 << 20 {
        b.next_power_of_two()
    } else {
        b.div_ceil(16 << 20) * (16 << 20)
    }
}

impl Pool {
    pub(crate) fn new(device: wgpu::Device, max_buffer: u64) -> Pool {
        Pool {
            device,
            max_buffer,
            state: Mutex::new(PoolState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock_unpoisoned()
    }

    /// A buffer of at least `bytes` bytes, from the pool or new; `Err(OutOfMemory)` when the
    /// device refuses even after the cache is emptied.
    pub(crate) fn allocate(self: &Arc<Self>, bytes: usize) -> Result<WgpuBuffer> {
        let class = size_class(bytes);
        if class > self.max_buffer {
            return Err(Error::out_of_memory(bytes, self.max_buffer as usize));
        }
        let reused = self.lock().free.get_mut(&class).and_then(Vec::pop);
        let buffer = match reused {
            Some(b) => b,
            None => match self.create(class) {
                Some(b) => b,
                None => {
                    self.empty_cache();
                    self.create(class).ok_or(Error::out_of_memory(bytes, 0))?
                }
            },
        };
        let mut st = self.lock();
        st.allocated += class as usize;
        st.peak = st.peak.max(st.allocated);
        drop(st);
        Ok(WgpuBuffer {
            buffer: Some(buffer),
            len: bytes,
            class,
            pool: self.clone(),
        })
    }

    /// A new buffer of `size` bytes, or `None` when the device reports an error.
    fn create(&self, size: u64) -> Option<wgpu::Buffer> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata tensor"),
            size,
            usage: USAGE,
            mapped_at_creation: false,
        });
        let bad = pollster::block_on(invalid.pop()).is_some();
        let out = pollster::block_on(oom.pop()).is_some();
        if bad || out {
            return None;
        }
        self.lock().reserved += size as usize;
        Some(buffer)
    }

    fn release(&self, buffer: wgpu::Buffer, class: u64) {
        let mut st = self.lock();
        st.allocated -= class as usize;
        st.free.entry(class).or_default().push(buffer);
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        let st = self.lock();
        MemoryStats {
            allocated: st.allocated,
            reserved: st.reserved,
            peak: st.peak,
        }
    }

    pub(crate) fn empty_cache(&self) {
        let mut st = self.lock();
        let freed: usize = st
            .free
            .drain()
            .flat_map(|(class, bufs)| bufs.into_iter().map(move |b| (class, b)))
            // Dropped, not destroyed: a recorded, unsubmitted batch may still use the buffer;
            // wgpu frees it once no command refers to it.
            .map(|(class, _buffer)| class as usize)
            .sum();
        st.reserved -= freed;
    }
}

/// A tensor's storage on a wgpu device; returns to its pool when dropped.
///
/// ```
/// if let Ok(dev) = strata_wgpu::open() {
///     let buf = dev.backend().allocate(10, strata_core::StreamId::DEFAULT).unwrap();
///     assert!(strata_wgpu::WgpuBuffer::of(buf.as_ref()).is_ok());
/// }
/// ```
#[derive(Debug)]
pub struct WgpuBuffer {
    buffer: Option<wgpu::Buffer>,
    len: usize,
    class: u64,
    pool: Arc<Pool>,
}

impl WgpuBuffer {
    /// The wgpu buffer behind a strata buffer, or `Err` when it belongs to another backend.
    ///
    /// ```
    /// let cpu = strata_core::Device::cpu();
    /// let buf = cpu.backend().allocate(4, strata_core::StreamId::DEFAULT).unwrap();
    /// assert!(strata_wgpu::WgpuBuffer::of(buf.as_ref()).is_err());
    /// ```
    pub fn of(b: &dyn DeviceBuffer) -> Result<&WgpuBuffer> {
        b.as_any().downcast_ref::<WgpuBuffer>().ok_or_else(|| {
            Error::DeviceMismatch("a buffer of another backend was passed to wgpu".into())
        })
    }

    /// The underlying buffer (its size is the pool's size class, at least `len_bytes`).
    ///
    /// ```
    /// if let Ok(dev) = strata_wgpu::open() {
    ///     let buf = dev.backend().allocate(10, strata_core::StreamId::DEFAULT).unwrap();
    ///     assert!(strata_wgpu::WgpuBuffer::of(buf.as_ref()).unwrap().raw().size() >= 10);
    /// }
    /// ```
    pub fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("present until drop")
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.pool.release(b, self.class);
        }
    }
}

impl DeviceBuffer for WgpuBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes_are_powers_of_two_then_16_mib_steps() {
        assert_eq!(size_class(1), 16);
        assert_eq!(size_class(1000), 1024);
        assert_eq!(size_class((64 << 20) + 1), 80 << 20);
    }
}
