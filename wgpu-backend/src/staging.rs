//! Large uploads and readbacks stream through a few reused staging chunks: an upload fills a
//! chunk (on several host threads) while the GPU copies the one before it out; a readback keeps
//! the GPU's copies into chunks in flight while the host drains the oldest. A fresh mapped
//! buffer per copy cost an allocation of the copy's whole size (and, for uploads, wgpu's zero
//! fill of it, one core's pass over the memory) on every `from_slice` and `to_vec`.

use strata_core::backend::copy_threads;

/// Bytes per staging chunk.
pub(crate) const CHUNK: u64 = 32 << 20;
/// Chunks in the ring: one being filled, the others' copies in flight.
pub(crate) const CHUNKS: usize = 4;
/// Copies of at least this many bytes use the rings (their 4-byte-aligned body); smaller ones a
/// staging buffer of their own size.
pub(crate) const STREAMED_MIN: usize = 4 << 20;

/// The reused staging chunks, made at the first large upload.
pub(crate) struct UploadRing {
    pub chunks: Vec<Chunk>,
    pub next: usize,
}

pub(crate) struct Chunk {
    pub buffer: wgpu::Buffer,
    /// The submission copying out of it; `None` while it is mapped and free to fill.
    pub in_flight: Option<wgpu::SubmissionIndex>,
}

/// The reused readback chunks, made at the first large readback.
pub(crate) struct ReadRing {
    pub chunks: Vec<wgpu::Buffer>,
}

impl ReadRing {
    pub(crate) fn new(device: &wgpu::Device) -> ReadRing {
        let chunks = (0..CHUNKS)
            .map(|_| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("strata readback ring"),
                    size: CHUNK,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .collect();
        ReadRing { chunks }
    }
}

impl UploadRing {
    pub(crate) fn new(device: &wgpu::Device) -> UploadRing {
        let chunks = (0..CHUNKS)
            .map(|_| Chunk {
                buffer: device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("strata upload ring"),
                    size: CHUNK,
                    usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                }),
                in_flight: None,
            })
            .collect();
        UploadRing { chunks, next: 0 }
    }
}

/// `dst.copy_from_slice(src)` into write-only mapped memory, split across host threads like
/// [`parallel_copy`] (through the raw pointer `WriteOnly` offers for writes from several
/// threads; nothing is read from it).
pub(crate) fn write_parallel(mut dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a staging write of the wrong length");
    let base = dst.as_raw_element_ptr().as_ptr() as usize;
    let part = src.len().div_ceil(copy_threads(src.len())).max(1);
    std::thread::scope(|scope| {
        for (k, piece) in src.chunks(part).enumerate() {
            scope.spawn(move || {
                // SAFETY: `dst` holds `src.len()` writable bytes at `base` (checked above) and
                // stays borrowed until the scope ends; the pieces are disjoint.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        piece.as_ptr(),
                        (base as *mut u8).add(k * part),
                        piece.len(),
                    )
                }
            });
        }
    });
}
