//! Kernels shipped compiled: an archive of the machine code (CUBIN) of the kernels common
//! notebook work launches first (reductions, softmax, index, casts, random draws, the map
//! interpreter), built into the library for the common GPU architectures. A new process's first
//! call of such a kernel loads it (about a millisecond) instead of waiting for NVRTC (40–200 ms
//! with empty caches, BENCHMARKS.md "First calls"); every other kernel compiles as before.
//!
//! An archive entry is found by the hash of what NVRTC would be given (the full source, the
//! architecture, the options), so a kernel whose generator changed since the archive was built
//! simply misses it and compiles: a stale entry is never run. An image the driver refuses (a
//! driver older than the NVRTC that built it) is compiled instead, and the archive is left
//! unused for the rest of the process. Where the local NVRTC is not the one that built the
//! archive, elementwise maps and the map interpreter are not taken from it: an interpreted
//! first launch must give the bits of the map's own kernel, which the local NVRTC compiles
//! (its math library may differ); other kernels run from the archive at every launch.
//!
//! The archive is made in two steps (`examples/ship_kernels.rs`): on a GPU, `record` runs the
//! common work with `STRATA_CUDA_RECORD=<dir>`, which writes each kernel's source there;
//! `build` compiles those sources for each architecture (`compile::build_archive`).
//! `STRATA_CUDA_SHIPPED=0` leaves the archive unused.

use crate::hash::stable_hash;
use crate::render::Optimization;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

/// The archive (`cuda-backend/shipped/kernels.bin`; `kernels.txt` beside it lists it).
static ARCHIVE: &[u8] = include_bytes!("../shipped/kernels.bin");

/// The archive's first bytes; then the version of the NVRTC that built it (major and minor,
/// u32 each), the number of architectures (u32), then for each: the
/// architecture (u32, e.g. 90), its entry count (u32) and its entries as one deflate stream
/// (u32 length, bytes; one stream compresses the kernels' common structure, 40% smaller than
/// an entry each). The stream inflates to each entry's key (u64), kernel name (u16 length,
/// bytes) and image (u32 length, bytes). Little-endian.
const MAGIC: &[u8; 8] = b"STRATAK3";

/// Set when the driver refused a shipped image: the archive is not used again.
static REFUSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// NVRTC programs compiled on this thread.
    static COMPILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many programs NVRTC has compiled on the calling thread: a call that waited for NVRTC
/// shows here (kernels loaded from the shipped archive or the disk cache are not counted, nor
/// compiles left to the background thread, which no call waits for).
///
/// ```
/// // No CUDA work on this thread yet: nothing compiled.
/// assert_eq!(strata_cuda::shipped::nvrtc_compiles(), 0);
/// ```
pub fn nvrtc_compiles() -> usize {
    COMPILES.with(|c| c.get())
}

/// Counts one NVRTC compile on this thread.
pub(crate) fn count_compile() {
    COMPILES.with(|c| c.set(c.get() + 1));
}

/// Whether CUDA device `ordinal`'s first calls of the shipped kernels load them all: the
/// archive is in use (`STRATA_CUDA_SHIPPED` is not `0`, no image refused), holds the device's
/// architecture, and was built by the NVRTC this process loads (whose options its keys
/// assume). Opens the device's primary context to read its architecture.
///
/// ```
/// // No such device: false.
/// assert!(!strata_cuda::shipped::serves(usize::MAX));
/// ```
pub fn serves(ordinal: usize) -> bool {
    if !enabled()
        || REFUSED.load(Ordering::Relaxed)
        || ordinal >= crate::device_count()
        || crate::nvrtc_version().ok() != built_by()
    {
        return false;
    }
    let Ok(ctx) = cudarc::driver::CudaContext::new(ordinal) else {
        return false;
    };
    ctx.compute_capability()
        .is_ok_and(|(major, minor)| images((major * 10 + minor) as u32).is_some())
}

/// One archive entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The hash of the full source, architecture and options (what NVRTC would be given).
    pub key: u64,
    /// The architecture, as `major * 10 + minor` (90 for `sm_90`).
    pub arch: u32,
    /// The kernel's entry point.
    pub name: String,
    /// The machine code (CUBIN).
    pub image: Vec<u8>,
}

/// Reads an archive's bytes front to back.
struct Reader<'a> {
    at: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.at.len() < n {
            return Err(malformed("it ends inside an entry"));
        }
        let (head, rest) = self.at.split_at(n);
        self.at = rest;
        Ok(head)
    }

    fn word(&mut self, n: usize) -> Result<u64> {
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(self.take(n)?);
        Ok(u64::from_le_bytes(w))
    }
}

fn malformed(what: &str) -> Error {
    Error::Backend(format!("the shipped kernel archive is malformed: {what}"))
}

/// The architectures of an archive: each one's number, entry count and deflated stream.
fn streams(bytes: &[u8]) -> Result<Vec<(u32, usize, &[u8])>> {
    let at = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| malformed("no STRATAK3 header"))?;
    let mut r = Reader { at };
    r.take(8)?;
    let mut out = Vec::new();
    for _ in 0..r.word(4)? {
        let arch = r.word(4)? as u32;
        let count = r.word(4)? as usize;
        let len = r.word(4)? as usize;
        out.push((arch, count, r.take(len)?));
    }
    if !r.at.is_empty() {
        return Err(malformed("bytes after the last architecture"));
    }
    Ok(out)
}

/// An entry of an inflated stream: its key, its kernel's name and its image's place.
type Listed = (u64, String, std::ops::Range<usize>);

/// The entries of one architecture's stream, inflated, and the inflated bytes.
fn stream_entries(deflated: &[u8], count: usize) -> Result<(Vec<u8>, Vec<Listed>)> {
    let inflated = miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, 1 << 28)
        .map_err(|e| malformed(&format!("a stream does not inflate ({e:?})")))?;
    let mut r = Reader { at: &inflated };
    let mut out = Vec::new();
    for _ in 0..count {
        let key = r.word(8)?;
        let name_len = r.word(2)? as usize;
        let name =
            String::from_utf8(r.take(name_len)?.to_vec()).map_err(|_| malformed("a name"))?;
        let len = r.word(4)? as usize;
        let start = inflated.len() - r.at.len();
        r.take(len)?;
        out.push((key, name, start..start + len));
    }
    if !r.at.is_empty() {
        return Err(malformed("bytes after a stream's last entry"));
    }
    Ok((inflated, out))
}

/// The entries of an archive, or `Err` naming what is malformed.
///
/// ```
/// let entries = strata_cuda::shipped::entries(&strata_cuda::shipped::archive()).unwrap();
/// assert!(entries.iter().all(|e| e.arch >= 50 && e.image.starts_with(b"\x7fELF")));
/// ```
pub fn entries(bytes: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for (arch, count, deflated) in streams(bytes)? {
        let (inflated, list) = stream_entries(deflated, count)?;
        for (key, name, range) in list {
            let image = inflated[range].to_vec();
            out.push(Entry {
                key,
                arch,
                name,
                image,
            });
        }
    }
    Ok(out)
}

/// The archive built into this library.
///
/// ```
/// assert!(strata_cuda::shipped::archive().starts_with(b"STRATAK3"));
/// ```
pub fn archive() -> &'static [u8] {
    ARCHIVE
}

/// The version of the NVRTC that built an archive, `(major, minor)`.
fn nvrtc_of(bytes: &[u8]) -> Option<(i32, i32)> {
    let mut r = Reader {
        at: bytes.strip_prefix(MAGIC)?,
    };
    Some((r.word(4).ok()? as i32, r.word(4).ok()? as i32))
}

/// The version of the NVRTC that built the archive in this library.
///
/// ```
/// if let Some((major, _)) = strata_cuda::shipped::built_by() {
///     assert!(major >= 12);
/// }
/// ```
pub fn built_by() -> Option<(i32, i32)> {
    nvrtc_of(ARCHIVE)
}

/// Leaves the archive unused for the rest of the process (the driver refused an image of it).
pub(crate) fn refused() {
    REFUSED.store(true, Ordering::Relaxed);
}

/// One architecture's images, inflated, by key.
struct Images {
    inflated: Vec<u8>,
    index: HashMap<u64, std::ops::Range<usize>>,
}

/// The built-in archive's images for `arch`, inflated at the first ask (a few milliseconds,
/// once a process) and kept; `None` when it has none (or is malformed: then nothing is used).
fn images(arch: u32) -> Option<&'static Images> {
    type Inflated = HashMap<u32, Option<&'static Images>>;
    static INFLATED: OnceLock<Mutex<Inflated>> = OnceLock::new();
    let mut inflated = INFLATED.get_or_init(Default::default).lock_unpoisoned();
    *inflated.entry(arch).or_insert_with(|| {
        let (_, count, deflated) = streams(ARCHIVE).ok()?.into_iter().find(|s| s.0 == arch)?;
        let (bytes, list) = stream_entries(deflated, count).ok()?;
        let index = list
            .into_iter()
            .map(|(key, _, range)| (key, range))
            .collect();
        // Kept for the process: each architecture's images inflate once.
        Some(&*Box::leak(Box::new(Images {
            inflated: bytes,
            index,
        })))
    })
}

/// The shipped machine code of `key` for `arch` (`major * 10 + minor`), if the archive holds
/// it.
pub(crate) fn image(arch: u32, key: u64) -> Option<&'static [u8]> {
    if REFUSED.load(Ordering::Relaxed) {
        return None;
    }
    let images = images(arch)?;
    Some(&images.inflated[images.index.get(&key)?.clone()])
}

/// Writes the source of a kernel just loaded to the record directory (`STRATA_CUDA_RECORD`),
/// once per program: `<hash>.cu`, its first line `// strata-shipped <name> <optimization>`.
pub(crate) fn record(dir: &Path, body: &str, name: &str, optimization: Optimization) {
    let label = optimization.label();
    let key = stable_hash(&[body.as_bytes(), label.as_bytes()]);
    let path = dir.join(format!("{key:016x}.cu"));
    if path.exists() {
        return;
    }
    let _ = std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::write(&path, format!("// strata-shipped {name} {label}\n{body}")));
}

/// The record directory, `STRATA_CUDA_RECORD`, if set.
pub(crate) fn record_dir() -> Option<PathBuf> {
    std::env::var_os("STRATA_CUDA_RECORD").map(PathBuf::from)
}

/// Whether the archive is used: unless `STRATA_CUDA_SHIPPED=0`.
pub(crate) fn enabled() -> bool {
    std::env::var("STRATA_CUDA_SHIPPED").map_or(true, |v| v != "0")
}

/// The kernel sources recorded in `dir` (by [`record`]): each one's kernel name,
/// optimization and body.
pub(crate) fn recorded(dir: &Path) -> Result<Vec<(String, Optimization, String)>> {
    let io = |e: std::io::Error| Error::Backend(format!("{}: {e}", dir.display()));
    let mut sources = Vec::new();
    for file in std::fs::read_dir(dir).map_err(io)? {
        let path = file.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "cu") {
            let text = std::fs::read_to_string(&path).map_err(io)?;
            let (head, body) = text.split_once('\n').unwrap_or((&text, ""));
            let mut words = head.split_whitespace().skip(2);
            let (Some(name), Some(label)) = (words.next(), words.next()) else {
                return Err(Error::Backend(format!(
                    "{} does not start with `// strata-shipped <name> <optimization>`",
                    path.display()
                )));
            };
            let optimization = Optimization::from_label(label).ok_or_else(|| {
                Error::Backend(format!("{}: unknown optimization {label}", path.display()))
            })?;
            sources.push((name.to_string(), optimization, body.to_string()));
        }
    }
    Ok(sources)
}

/// An archive of `per_arch` (each architecture's entries, sorted by key and without
/// duplicates), built by NVRTC `nvrtc`.
pub(crate) fn encode(nvrtc: (i32, i32), per_arch: &[(u32, Vec<Entry>)]) -> Vec<u8> {
    let mut archive = MAGIC.to_vec();
    archive.extend((nvrtc.0 as u32).to_le_bytes());
    archive.extend((nvrtc.1 as u32).to_le_bytes());
    archive.extend((per_arch.len() as u32).to_le_bytes());
    for (arch, entries) in per_arch {
        let mut stream = Vec::new();
        for e in entries {
            stream.extend(e.key.to_le_bytes());
            stream.extend((e.name.len() as u16).to_le_bytes());
            stream.extend(e.name.as_bytes());
            stream.extend((e.image.len() as u32).to_le_bytes());
            stream.extend(&e.image);
        }
        let deflated = miniz_oxide::deflate::compress_to_vec(&stream, 9);
        archive.extend(arch.to_le_bytes());
        archive.extend((entries.len() as u32).to_le_bytes());
        archive.extend((deflated.len() as u32).to_le_bytes());
        archive.extend(deflated);
    }
    archive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_well_formed_and_each_image_is_machine_code() {
        let all = entries(ARCHIVE).unwrap();
        assert!(!all.is_empty(), "no kernels shipped");
        for e in &all {
            assert_eq!(&e.image[..4], b"\x7fELF", "{}", e.name);
            assert!(
                e.image
                    .windows(e.name.len())
                    .any(|w| w == e.name.as_bytes()),
                "{} in its image",
                e.name
            );
            assert_eq!(image(e.arch, e.key), Some(&e.image[..]), "{}", e.name);
        }
        assert!(image(90, 0x1234).is_none(), "an unknown key");
        assert!(
            image(11, all[0].key).is_none(),
            "an architecture the archive lacks"
        );
        assert!(built_by().is_some_and(|(major, _)| major >= 12));
    }

    #[test]
    fn a_truncated_or_foreign_archive_is_an_error() {
        for cut in [4, 12, 30, ARCHIVE.len() - 1] {
            assert!(entries(&ARCHIVE[..cut]).is_err(), "cut at {cut}");
        }
        let err = entries(b"STRATAK2\0\0\0\0").unwrap_err();
        assert!(err.to_string().contains("no STRATAK3 header"), "{err}");
    }
}
