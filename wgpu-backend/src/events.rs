//! Events: markers recorded after the work before them (a timestamp where the adapter has
//! them), waited for and timed against each other.

use crate::gpu::{EventState, Gpu, TIMESTAMP_SLOTS};
use strata_core::{Error, EventId, Result};

impl Gpu {
    /// Records an event after the work recorded so far (a timestamp where the adapter has
    /// them).
    pub(crate) fn record_event(&self) -> EventId {
        let mut b = self.batch();
        let slot = self.timestamps.as_ref().map(|qs| {
            let slot = b.next_slot;
            b.next_slot = (b.next_slot + 1) % TIMESTAMP_SLOTS;
            let enc = b.encoder(&self.device);
            let pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: Some(slot),
                    end_of_pass_write_index: None,
                }),
            });
            drop(pass);
            slot
        });
        let id = b.next_event;
        b.next_event += 1;
        let state = if b.encoder.is_some() {
            EventState {
                seq: b.seq,
                index: None,
                slot,
            }
        } else {
            EventState {
                seq: u64::MAX,
                index: b.last_submitted.clone(),
                slot,
            }
        };
        b.events.insert(id, state);
        EventId(id)
    }

    /// Waits for the work before `event`.
    pub(crate) fn synchronize_event(&self, event: EventId) -> Result<()> {
        let index = {
            let mut b = self.batch();
            let seq = match b.events.get(&event.0) {
                Some(e) => e.seq,
                None => return Err(Error::Invalid(format!("unknown event {}", event.0))),
            };
            if seq == b.seq {
                self.flush_locked(&mut b)?;
            }
            b.events.get(&event.0).and_then(|e| e.index.clone())
        };
        if index.is_some() {
            self.wait(index)?;
        }
        Ok(())
    }

    /// Milliseconds from `base` to each of `events`: every timestamp resolved in one
    /// command and read back at once (the profiler reads thousands).
    pub(crate) fn event_times_ms(&self, base: EventId, events: &[EventId]) -> Result<Vec<f64>> {
        let Some(qs) = &self.timestamps else {
            return Err(Error::Unsupported(format!(
                "wgpu ({}): this adapter has no TIMESTAMP_QUERY, so events cannot be timed",
                self.info.name
            )));
        };
        for &e in events.iter().chain([&base]) {
            self.synchronize_event(e)?;
        }
        let slots = {
            let b = self.batch();
            let slot = |e: &EventId| b.events.get(&e.0).and_then(|s| s.slot);
            std::iter::once(&base)
                .chain(events)
                .map(slot)
                .collect::<Option<Vec<u32>>>()
        };
        let Some(slots) = slots else {
            return Err(Error::Invalid("unknown event".into()));
        };
        // Resolve destinations are 256-byte aligned: one 256-byte row per timestamp.
        const ROW: u64 = 256;
        let resolve = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("strata timestamps"),
            size: ROW * slots.len() as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        {
            let mut b = self.batch();
            let enc = b.encoder(&self.device);
            for (k, &slot) in slots.iter().enumerate() {
                enc.resolve_query_set(qs, slot..slot + 1, &resolve, ROW * k as u64);
            }
        }
        let bytes = self.read(&resolve, 0, (ROW as usize) * slots.len())?;
        let tick = |k: usize| {
            let at = k * ROW as usize;
            u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) as f64
        };
        let period = self.queue.get_timestamp_period() as f64;
        let t0 = tick(0);
        Ok((1..slots.len())
            .map(|k| (tick(k) - t0) * period / 1e6)
            .collect())
    }

    pub(crate) fn destroy_event(&self, event: EventId) {
        self.batch().events.remove(&event.0);
    }
}
