//! Large uploads and readbacks stream through a few reused staging chunks: an upload fills a
//! chunk (on several host threads) while the GPU copies the one before it out; a readback keeps
//! the GPU's copies into chunks in flight while the host drains the oldest. A fresh mapped
//! buffer per copy cost an allocation of the copy's whole size (and, for uploads, wgpu's zero
//! fill of it, one core's pass over the memory) on every `from_slice` and `to_vec`.

use crate::gpu::{write_parallel, Gpu};
use std::collections::VecDeque;
use strata_core::backend::parallel_copy;
use strata_core::{Error, Result};

/// Bytes per staging chunk.
const CHUNK: u64 = 32 << 20;
/// Chunks in the ring: one being filled, the others' copies in flight.
const CHUNKS: usize = 4;
/// Copies of at least this many bytes use the rings (their 4-byte-aligned body); smaller ones a
/// staging buffer of their own size.
pub(crate) const STREAMED_MIN: usize = 4 << 20;

/// The reused staging chunks, made at the first large upload.
pub(crate) struct UploadRing {
    chunks: Vec<Chunk>,
    next: usize,
}

struct Chunk {
    buffer: wgpu::Buffer,
    /// The submission copying out of it; `None` while it is mapped and free to fill.
    in_flight: Option<wgpu::SubmissionIndex>,
}

/// The reused readback chunks, made at the first large readback.
pub(crate) struct ReadRing {
    chunks: Vec<wgpu::Buffer>,
}

impl ReadRing {
    fn new(device: &wgpu::Device) -> ReadRing {
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
    fn new(device: &wgpu::Device) -> UploadRing {
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

impl Gpu {
    /// Drops the staging chunks (256 MiB of host-visible memory once both rings exist); the
    /// next large copy makes them again. `Device::empty_cache` calls it.
    pub(crate) fn release_staging(&self) {
        *self.uploads.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.readbacks.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Writes `data` at `offset` of `dst` (both 4-byte aligned) in stream order through the
    /// upload ring. Each chunk's copy is submitted at once, so the GPU copies while the host
    /// fills the next chunk; a chunk is filled again once its copy has finished.
    pub(crate) fn write_streamed(
        &self,
        dst: &wgpu::Buffer,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        debug_assert!(offset.is_multiple_of(4) && data.len().is_multiple_of(4));
        let mut guard = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        let ring = guard.get_or_insert_with(|| UploadRing::new(&self.device));
        let streamed = self.stream_through(ring, dst, offset, data);
        if streamed.is_err() {
            // A chunk may be left neither mapped nor in flight: start over with a new ring.
            *guard = None;
        }
        streamed
    }

    fn stream_through(
        &self,
        ring: &mut UploadRing,
        dst: &wgpu::Buffer,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        for (k, piece) in data.chunks(CHUNK as usize).enumerate() {
            let slot = ring.next;
            ring.next = (ring.next + 1) % CHUNKS;
            let chunk = &mut ring.chunks[slot];
            if let Some(index) = chunk.in_flight.take() {
                let (tx, rx) = std::sync::mpsc::channel();
                chunk.buffer.map_async(wgpu::MapMode::Write, .., move |r| {
                    let _ = tx.send(r);
                });
                self.wait(Some(index))?;
                rx.recv()
                    .map_err(|_| {
                        Error::Backend("wgpu: an upload chunk's mapping was dropped".into())
                    })?
                    .map_err(|e| {
                        Error::Backend(format!("wgpu ({}): upload: {e}", self.info.name))
                    })?;
            }
            let len = piece.len() as u64;
            {
                let mut mapped = chunk
                    .buffer
                    .get_mapped_range_mut(..len)
                    .map_err(|e| Error::Backend(format!("wgpu: upload: {e}")))?;
                write_parallel(mapped.slice(0..piece.len()), piece);
            }
            chunk.buffer.unmap();
            let at = offset + k as u64 * CHUNK;
            chunk.in_flight = Some(self.copy_and_submit((&chunk.buffer, 0), (dst, at), len)?);
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset` of `src` (both 4-byte aligned) into `out`, after the
    /// work submitted so far, through the readback ring: up to four chunk copies in flight,
    /// the oldest drained (on several host threads) while the others run.
    pub(crate) fn read_streamed(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        debug_assert!(offset.is_multiple_of(4) && out.len().is_multiple_of(4));
        let mut guard = self.readbacks.lock().unwrap_or_else(|p| p.into_inner());
        let ring = guard.get_or_insert_with(|| ReadRing::new(&self.device));
        let read = self.drain_through(ring, src, offset, out);
        if read.is_err() {
            // A chunk may be left mapped: start over with a new ring.
            *guard = None;
        }
        read
    }

    fn drain_through(
        &self,
        ring: &ReadRing,
        src: &wgpu::Buffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let chunk = CHUNK as usize;
        let pieces = out.len().div_ceil(chunk);
        // (piece, the submission copying it into chunk `piece % CHUNKS`)
        let mut in_flight: VecDeque<(usize, wgpu::SubmissionIndex)> = VecDeque::new();
        for k in 0..pieces {
            if in_flight.len() == CHUNKS {
                if let Some((done, index)) = in_flight.pop_front() {
                    self.drain(ring, done, index, out)?;
                }
            }
            let len = chunk.min(out.len() - k * chunk) as u64;
            let at = offset + (k * chunk) as u64;
            let index = self.copy_and_submit((src, at), (&ring.chunks[k % CHUNKS], 0), len)?;
            in_flight.push_back((k, index));
        }
        while let Some((done, index)) = in_flight.pop_front() {
            self.drain(ring, done, index, out)?;
        }
        Ok(())
    }

    /// Copies piece `k` of `out` out of its chunk once the submission `index` has run.
    fn drain(
        &self,
        ring: &ReadRing,
        k: usize,
        index: wgpu::SubmissionIndex,
        out: &mut [u8],
    ) -> Result<()> {
        let chunk = CHUNK as usize;
        let end = ((k + 1) * chunk).min(out.len());
        let piece = &mut out[k * chunk..end];
        let buffer = &ring.chunks[k % CHUNKS];
        let (tx, rx) = std::sync::mpsc::channel();
        buffer.map_async(wgpu::MapMode::Read, ..piece.len() as u64, move |r| {
            let _ = tx.send(r);
        });
        self.wait(Some(index))?;
        rx.recv()
            .map_err(|_| Error::Backend("wgpu: a readback chunk's mapping was dropped".into()))?
            .map_err(|e| Error::Backend(format!("wgpu ({}): readback: {e}", self.info.name)))?;
        {
            let data = buffer
                .get_mapped_range(..piece.len() as u64)
                .map_err(|e| Error::Backend(format!("wgpu: readback: {e}")))?;
            parallel_copy(piece, &data);
        }
        buffer.unmap();
        Ok(())
    }
}
