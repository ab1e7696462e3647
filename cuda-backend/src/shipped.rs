//! Kernels shipped compiled: an archive of the machine code (CUBIN) of the kernels common
//! notebook work launches first (reductions, softmax, index, casts, random draws, the map
//! interpreter), built into the library for the common GPU architectures. A new process's first
//! call of such a kernel loads it (about a millisecond) instead of waiting for NVRTC (40–200 ms
//! with empty caches, BENCHMARKS.md "First calls"); every other kernel compiles as before.
//!
//! An archive entry is found by the hash of what NVRTC would be given (the full source, the
//! architecture, the options), so a kernel whose generator changed since the archive was built
//! simply misses it and compiles: a stale entry is never run. An image the driver refuses (a
//! driver older than the NVRTC that built it) is compiled instead too.
//!
//! The archive is made in two steps (`examples/ship_kernels.rs`): on a GPU, `record` runs the
//! common work with `STRATA_CUDA_RECORD=<dir>`, which writes each kernel's source there;
//! `build` compiles those sources for each architecture ([`build_archive`]).
//! `STRATA_CUDA_SHIPPED=0` leaves the archive unused.

use crate::compile::{stable_hash, Compiler};
use crate::render::Optimization;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

/// The archive (`cuda-backend/shipped/kernels.bin`; `kernels.txt` beside it lists it).
static ARCHIVE: &[u8] = include_bytes!("../shipped/kernels.bin");

/// The archive's first bytes; then the number of architectures (u32), then for each: the
/// architecture (u32, e.g. 90), its entry count (u32) and its entries as one deflate stream
/// (u32 length, bytes; one stream compresses the kernels' common structure, 40% smaller than
/// an entry each). The stream inflates to each entry's key (u64), kernel name (u16 length,
/// bytes) and image (u32 length, bytes). Little-endian.
const MAGIC: &[u8; 8] = b"STRATAK2";

thread_local! {
    /// NVRTC programs compiled on this thread.
    static COMPILES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many programs NVRTC has compiled on the calling thread: a call that waited for NVRTC
/// shows here (kernels loaded from the shipped archive or the disk cache are not counted, nor
/// compiles left to the background thread, which no call waits for).
///
/// ```
/// let before = strata_cuda::shipped::nvrtc_compiles();
/// assert!(strata_cuda::shipped::nvrtc_compiles() >= before);
/// ```
pub fn nvrtc_compiles() -> usize {
    COMPILES.with(|c| c.get())
}

/// Counts one NVRTC compile on this thread.
pub(crate) fn count_compile() {
    COMPILES.with(|c| c.set(c.get() + 1));
}

/// Whether CUDA device `ordinal`'s first calls of the shipped kernels load them: the archive
/// is in use (`STRATA_CUDA_SHIPPED` is not `0`) and holds the device's architecture.
///
/// ```
/// // No such device: false.
/// assert!(!strata_cuda::shipped::serves(usize::MAX));
/// ```
pub fn serves(ordinal: usize) -> bool {
    if !enabled() || ordinal >= crate::device_count() {
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
        .ok_or_else(|| malformed("no STRATAK2 header"))?;
    let mut r = Reader { at };
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
/// assert!(strata_cuda::shipped::archive().starts_with(b"STRATAK2"));
/// ```
pub fn archive() -> Vec<u8> {
    ARCHIVE.to_vec()
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
    let images = images(arch)?;
    Some(&images.inflated[images.index.get(&key)?.clone()])
}

/// Whether the archive holds `key` for `arch`.
pub(crate) fn holds(arch: u32, key: u64) -> bool {
    image(arch, key).is_some()
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

/// Compiles every kernel source recorded in `recorded` (by `STRATA_CUDA_RECORD`) for each
/// architecture of `archs` (`(major, minor)`), and returns the archive's bytes and its listing
/// (a line per entry: architecture, key, name, optimization, bytes, bytes deflated). Needs
/// NVRTC, not a GPU.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("strata-ship-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// // No sources recorded: an archive of no entries.
/// let (archive, listing) = strata_cuda::shipped::build_archive(&dir, &[(9, 0)]).unwrap();
/// assert!(strata_cuda::shipped::entries(&archive).unwrap().is_empty());
/// assert!(listing.is_empty());
/// ```
pub fn build_archive(recorded: &Path, archs: &[(i32, i32)]) -> Result<(Vec<u8>, String)> {
    let io = |e: std::io::Error| Error::Backend(format!("{}: {e}", recorded.display()));
    let mut sources = Vec::new();
    for file in std::fs::read_dir(recorded).map_err(io)? {
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
    // One thread per architecture (NVRTC compiles programs concurrently).
    let per_arch = std::thread::scope(|scope| {
        let threads: Vec<_> = archs
            .iter()
            .map(|&arch| {
                let sources = &sources;
                scope.spawn(move || -> Result<Vec<(String, Entry)>> {
                    let compiler = Compiler::new(None, arch);
                    let mut built = Vec::new();
                    for (name, optimization, body) in sources {
                        let (key, image) = compiler.shipped_compile(body, *optimization)?;
                        let listing = format!(
                            "sm_{}{} {key:016x} {name} {} {}\n",
                            arch.0,
                            arch.1,
                            optimization.label(),
                            image.len(),
                        );
                        let arch = (arch.0 * 10 + arch.1) as u32;
                        let name = name.clone();
                        built.push((
                            listing,
                            Entry {
                                key,
                                arch,
                                name,
                                image,
                            },
                        ));
                    }
                    Ok(built)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(Error::Backend("a compile thread panicked".into())))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut archive = MAGIC.to_vec();
    archive.extend((per_arch.len() as u32).to_le_bytes());
    let mut listing = String::new();
    for (mut built, &(major, minor)) in per_arch.into_iter().zip(archs) {
        built.sort_by_key(|b| b.1.key);
        built.dedup_by_key(|b| b.1.key);
        let mut stream = Vec::new();
        for (line, e) in &built {
            listing.push_str(line);
            stream.extend(e.key.to_le_bytes());
            stream.extend((e.name.len() as u16).to_le_bytes());
            stream.extend(e.name.as_bytes());
            stream.extend((e.image.len() as u32).to_le_bytes());
            stream.extend(&e.image);
        }
        let deflated = miniz_oxide::deflate::compress_to_vec(&stream, 9);
        archive.extend(((major * 10 + minor) as u32).to_le_bytes());
        archive.extend((built.len() as u32).to_le_bytes());
        archive.extend((deflated.len() as u32).to_le_bytes());
        archive.extend(deflated);
    }
    Ok((archive, listing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::interpreter::InterpretSig;
    use crate::render::Generated;

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
        assert!(!holds(90, 0x1234), "an unknown key");
        assert!(!holds(11, all[0].key), "an architecture the archive lacks");
    }

    /// The map interpreter's source is fixed (no signature), so whether the archive holds its
    /// current form can be checked here: regenerate the archive (`ship_kernels`) after
    /// changing it.
    #[test]
    fn the_archive_holds_the_current_map_interpreter() {
        if crate::nvrtc_version().is_err() {
            assert!(std::env::var_os("STRATA_REQUIRE_NVRTC").is_none());
            return;
        }
        let rendered = InterpretSig.render().unwrap();
        for arch in [(8, 0), (8, 6), (8, 9), (9, 0), (12, 0)] {
            let compiler = Compiler::new(None, arch);
            let key = compiler
                .shipped_key(&rendered.source, InterpretSig.optimization())
                .unwrap();
            assert!(
                holds((arch.0 * 10 + arch.1) as u32, key),
                "the shipped archive lacks the map interpreter for sm_{}{}: run `bash \
                 scripts/gpu-run.sh ship` on the GPU machine and copy its `shipped/kernels.bin` \
                 and `kernels.txt` into cuda-backend/shipped/ (examples/ship_kernels.rs)",
                arch.0,
                arch.1
            );
        }
    }

    #[test]
    fn an_archive_round_trips_and_a_truncated_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("strata-ship-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let body = "extern \"C\" __global__ void strata_probe(float* p) { p[0] = 2.0f; }";
        record(&dir, body, "strata_probe", Optimization::Full);
        if crate::nvrtc_version().is_err() {
            assert!(std::env::var_os("STRATA_REQUIRE_NVRTC").is_none());
            return;
        }
        let (archive, listing) = build_archive(&dir, &[(8, 0), (9, 0)]).unwrap();
        let all = entries(&archive).unwrap();
        assert_eq!(all.len(), 2, "{listing}");
        assert!(
            listing.starts_with("sm_80 ") && listing.contains("\nsm_90 "),
            "{listing}"
        );
        assert!(all.iter().all(|e| e.name == "strata_probe"));
        assert_eq!((all[0].arch, all[1].arch), (80, 90));
        let compiler = Compiler::new(None, (9, 0));
        assert_eq!(
            all[1].key,
            compiler.shipped_key(body, Optimization::Full).unwrap()
        );
        let err = entries(&archive[..archive.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("ends inside an entry"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
