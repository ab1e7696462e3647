//! Copies between the host and device buffers, in stream order: a small one through a
//! staging buffer of its own, a large one's 4-byte-aligned body through the reused staging
//! rings (`crate::staging`), its ragged ends merged with the bytes already there.

use crate::gpu::Gpu;
use crate::staging::{write_parallel, ReadRing, UploadRing, CHUNK, CHUNKS, STREAMED_MIN};
use std::collections::VecDeque;
use strata_core::backend::parallel_copy;
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

impl Gpu {
    /// Copies `len` bytes at `offset` of `src` to the host: the copy joins the batch, the batch
    /// is submitted, and only that submission is waited for.
    pub(crate) fn read(&self, src: &wgpu::Buffer, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0; len];
        self.read_into(src, offset, &mut out)?;
        Ok(out)
    }

    /// Reads `out.len()` bytes at `offset` of `src` into `out`, after the work submitted so
    /// far (through a mapped staging buffer).
    pub(crate) fn read_into(&self, src: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        if len == 0 {
            return Ok(());
        }
        if len >= STREAMED_MIN {
            // The 4-byte-aligned body through the readback ring, the ragged ends (under 4 bytes
            // each) through a staging buffer of their own.
            let head = ((4 - offset % 4) % 4) as usize;
            let body = (len - head) / 4 * 4;
            let (first, rest) = out.split_at_mut(head);
            let (middle, last) = rest.split_at_mut(body);
            self.read_streamed(src, offset + head as u64, middle)?;
            self.read_into(src, offset, first)?;
            return self.read_into(src, offset + (head + body) as u64, last);
        }
        let start = offset / 4 * 4;
        let end = (offset + len as u64).div_ceil(4) * 4;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata readback"),
            size: end - start,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let index = {
            let mut b = self.batch();
            let enc = b.encoder(&self.device);
            enc.copy_buffer_to_buffer(src, start, &staging, 0, end - start);
            self.flush_locked(&mut b)?;
            b.last_submitted.clone()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait(index)?;
        rx.recv()
            .map_err(|_| Error::Backend("wgpu: a readback was dropped".into()))?
            .map_err(|e| Error::Backend(format!("wgpu ({}): readback: {e}", self.info.name)))?;
        let data = staging
            .get_mapped_range(..)
            .map_err(|e| Error::Backend(format!("wgpu: readback: {e}")))?;
        let skip = (offset - start) as usize;
        parallel_copy(out, &data[skip..skip + len]);
        Ok(())
    }

    /// Writes `data` at `offset` of `dst` in stream order (through a staging buffer copied in
    /// the batch). Unaligned edges are merged with the bytes already there.
    pub(crate) fn write(&self, dst: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if data.len() >= STREAMED_MIN {
            // The 4-byte-aligned body through the reused staging chunks; the ragged ends (under
            // 4 bytes each, their words shared with no body byte) merged below.
            let head = ((4 - offset % 4) % 4) as usize;
            let body = (data.len() - head) / 4 * 4;
            self.write_streamed(dst, offset + head as u64, &data[head..head + body])?;
            self.write(dst, offset, &data[..head])?;
            return self.write(dst, offset + (head + body) as u64, &data[head + body..]);
        }
        let start = offset / 4 * 4;
        let end = (offset + data.len() as u64).div_ceil(4) * 4;
        let skip = (offset - start) as usize;
        // Edge words hold neighbouring elements: they keep their current bytes.
        let edges = if start != offset || end != offset + data.len() as u64 {
            let first = self.read(dst, start, 4)?;
            let last = self.read(dst, end - 4, 4)?;
            Some((first, last))
        } else {
            None
        };
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata upload"),
            size: end - start,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut mapped = staging
                .get_mapped_range_mut(..)
                .map_err(|e| Error::Backend(format!("wgpu: upload: {e}")))?;
            if let Some((first, last)) = edges {
                let n = mapped.len();
                mapped.slice(n - 4..).copy_from_slice(&last);
                mapped.slice(..4).copy_from_slice(&first);
            }
            // Straight from the caller's slice, on several threads (a copy into a second
            // buffer first, then one core's copy into mapped memory, bounded a 1 GiB upload).
            write_parallel(mapped.slice(skip..skip + data.len()), data);
        }
        staging.unmap();
        self.copy(&staging, 0, dst, start, end - start);
        Ok(())
    }
    /// Drops the staging chunks (256 MiB of host-visible memory once both rings exist); the
    /// next large copy makes them again. `Device::empty_cache` calls it.
    pub(crate) fn release_staging(&self) {
        *self.uploads.lock_unpoisoned() = None;
        *self.readbacks.lock_unpoisoned() = None;
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
        let mut guard = self.uploads.lock_unpoisoned();
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
        let mut guard = self.readbacks.lock_unpoisoned();
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
