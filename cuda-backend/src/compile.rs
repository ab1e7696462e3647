//! CUDA C → machine code (CUBIN) with NVRTC, an on-disk cache shared by processes (a new
//! notebook reuses what an earlier one compiled), and loading it into the device's context.
//! NVRTC emits the device's own SASS, so loading a module copies it instead of running the
//! driver's JIT over PTX. A compile can also be left to a background thread
//! ([`Compiler::compile_later`]): a new kernel's first launches run a quickly compiled form
//! while its own one compiles there.

use crate::archive::{self, Entry};
use crate::background::Background;
use crate::driver::{check, Gpu};
use crate::hash::stable_hash;
use crate::render::Optimization;
use cudarc::driver::sys;
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use strata_core::sync::LockUnpoisoned;
use strata_core::{Error, Result};

/// Compiles kernel source for one device and loads it.
pub(crate) struct Compiler {
    gpu: Option<Arc<Gpu>>,
    /// The device's compute capability, e.g. `(9, 0)`.
    arch: (i32, i32),
    cache_dir: Option<PathBuf>,
    /// Loaded modules stay alive as long as the compiler (their functions are cached).
    modules: Mutex<Vec<crate::driver::Raw<sys::CUmodule>>>,
    /// NVRTC's `--Ofast-compile` level for [`Optimization::FastCompile`] kernels (`None`:
    /// they are fully optimized too).
    fast_compile: Option<String>,
    /// Whether kernels compiled [`Optimization::Full`] first compile
    /// [`Optimization::Quick`] (false: every kernel compiles at its own level at once).
    quick: bool,
    /// The thread [`Compiler::compile_later`] leaves compiles to, with its own compiler.
    background: Background<Compiler>,
    /// Whether kernels are loaded from the shipped archive when it holds them
    /// (`crate::shipped`; `STRATA_CUDA_SHIPPED=0`: never).
    shipped: bool,
    /// Whether the local NVRTC built the archive: else maps and the map interpreter are
    /// compiled here (`crate::archive`'s docs say why).
    same_nvrtc: bool,
    /// Where each loaded kernel's source is recorded (`STRATA_CUDA_RECORD`), if anywhere.
    record: Option<PathBuf>,
}

/// What NVRTC is given for one kernel, and the keys its machine code is found by.
struct Program {
    /// The prelude and the kernel's body.
    source: String,
    options: Vec<String>,
    /// Its file in the disk cache (keyed by NVRTC's version too), if there is a cache.
    path: Option<PathBuf>,
    /// Its key in the shipped archive.
    shipped: u64,
}

/// The CUDA version whose NVRTC first takes `--Ofast-compile`.
const FAST_COMPILE_SINCE: (i32, i32) = (12, 8);

/// The `--Ofast-compile` level `STRATA_CUDA_FAST_COMPILE` asks for (`None`: off), given
/// NVRTC's version.
fn fast_compile_level(setting: Option<&str>, version: (i32, i32)) -> Option<String> {
    if version < FAST_COMPILE_SINCE {
        return None;
    }
    match setting {
        Some("0") => None,
        Some(level @ ("mid" | "max")) => Some(level.into()),
        _ => Some("min".into()),
    }
}

/// Whether a fully optimized kernel's first launches run a quick compile of it
/// (`--Ofast-compile=min`) while its own compile runs in the background: on unless
/// `STRATA_CUDA_QUICK_COMPILE=0`, with an NVRTC that has the option.
fn quick_compile(setting: Option<&str>, version: (i32, i32)) -> bool {
    version >= FAST_COMPILE_SINCE && setting != Some("0")
}

/// The NVRTC version, or `Err` saying what to install when the library is missing.
///
/// ```
/// match strata_cuda::nvrtc_version() {
///     Ok((major, minor)) => assert!(major >= 11, "{major}.{minor}"),
///     Err(e) => assert!(e.to_string().contains("NVRTC")),
/// }
/// ```
pub fn nvrtc_version() -> Result<(i32, i32)> {
    // SAFETY: only asks the loader whether the library can be opened.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(Error::DeviceUnavailable(
            "NVRTC (libnvrtc.so) was not found, and strata compiles its CUDA kernels with it: \
             install the CUDA toolkit's NVRTC (Debian/Ubuntu: cuda-nvrtc-13-0; pip: \
             nvidia-cuda-nvrtc) and make sure the loader finds it (LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; both outputs are written.
    let status = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Backend(format!("nvrtcVersion failed: {status:?}")));
    }
    Ok((major, minor))
}

/// Where compiled kernels (CUBIN files) are kept: `$STRATA_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/strata/ptx`, else `~/.cache/strata/ptx` (the name is older than the CUBIN
/// files). `STRATA_CACHE_DIR=off` turns the disk cache off.
///
/// ```
/// if let Some(dir) = strata_cuda::ptx_cache_dir() {
///     assert!(dir.ends_with("ptx"));
/// }
/// ```
pub fn ptx_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("STRATA_CACHE_DIR") {
        if dir == "off" {
            return None;
        }
        return Some(PathBuf::from(dir).join("ptx"));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("strata").join("ptx"))
}

impl Compiler {
    /// A compiler for `gpu`'s architecture (`None`: compile only, for tests without a GPU).
    pub(crate) fn new(gpu: Option<Arc<Gpu>>, arch: (i32, i32)) -> Compiler {
        let setting = std::env::var("STRATA_CUDA_FAST_COMPILE").ok();
        let quick = std::env::var("STRATA_CUDA_QUICK_COMPILE").ok();
        let version = nvrtc_version().ok();
        Compiler {
            gpu,
            arch,
            cache_dir: ptx_cache_dir(),
            modules: Mutex::new(Vec::new()),
            fast_compile: version.and_then(|v| fast_compile_level(setting.as_deref(), v)),
            quick: version.is_some_and(|v| quick_compile(quick.as_deref(), v)),
            background: Background::default(),
            shipped: archive::enabled(),
            same_nvrtc: version.is_some() && version == archive::built_by(),
            record: archive::record_dir(),
        }
    }

    /// NVRTC's options for a program for `arch` (`sm_XY`: CUBIN; `compute_XY`: PTX).
    fn options(&self, arch: &str, optimization: Optimization) -> Result<Vec<String>> {
        let mut options = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
            // Contracting a*b+c into fma would change results against the CPU backend.
            "--fmad=false".to_string(),
        ];
        // Without the runtime API's declarations (textures, device-side launches), which no
        // generated kernel uses: the same machine code, an empty kernel's compile 25% shorter.
        if nvrtc_version()? >= (12, 4) {
            options.push("-minimal".to_string());
        }
        let min = "min".to_string();
        let level = match optimization {
            Optimization::Full => None,
            Optimization::FastCompile => self.fast_compile.as_ref(),
            // `min`, as maps: `max` changed values (an interpreted `relu` of a NaN, H200).
            Optimization::Quick => Some(&min),
        };
        if let Some(level) = level {
            options.push(format!("--Ofast-compile={level}"));
        }
        Ok(options)
    }

    /// Whether a kernel of `body` at `optimization` should first be compiled
    /// [`Optimization::Quick`] (its own level then compiled by [`Compiler::compile_later`]):
    /// there is a device, a quick level that differs from `optimization`'s, and the disk
    /// cache does not hold the kernel at its own level.
    pub(crate) fn quick_first(&self, body: &str, optimization: Optimization) -> bool {
        let arch = format!("sm_{}{}", self.arch.0, self.arch.1);
        let differs = match (
            self.options(&arch, Optimization::Quick),
            self.options(&arch, optimization),
        ) {
            (Ok(quick), Ok(own)) => quick != own,
            _ => false,
        };
        self.gpu.is_some() && self.quick && differs && !self.has_cached(body, optimization)
    }

    /// Compiles and loads the kernel `name` of `body` at `optimization` on the background
    /// thread (one per compiler, started now if it is not running), then calls `then` with the
    /// function there; false (and `then` dropped uncalled) when the thread cannot start.
    pub(crate) fn compile_later(
        &self,
        body: String,
        name: String,
        optimization: Optimization,
        then: Box<dyn FnOnce(Result<sys::CUfunction>) + Send>,
    ) -> bool {
        // The thread's own compiler: the same device, cache and levels; the modules it loads
        // stay loaded until the thread ends, after this compiler is dropped.
        let worker = || Compiler {
            gpu: self.gpu.clone(),
            arch: self.arch,
            cache_dir: self.cache_dir.clone(),
            modules: Mutex::new(Vec::new()),
            fast_compile: self.fast_compile.clone(),
            quick: false,
            background: Background::default(),
            shipped: self.shipped,
            same_nvrtc: self.same_nvrtc,
            record: self.record.clone(),
        };
        if !self.background.started() {
            // A new thread's first job: a tiny kernel at the optimizing level, so that NVRTC
            // sets up (and registers the exit teardown of) its optimizer's state before any
            // compile a process may exit during (see `background`).
            let warm = Box::new(|worker: &Compiler| worker.warm_up());
            self.background.submit(worker, warm);
        }
        let job = Box::new(move |worker: &Compiler| {
            then(worker.load_function(&body, &name, optimization));
        });
        self.background.submit(worker, job)
    }

    /// What NVRTC is given for `body` at `optimization`, and where its machine code is kept.
    fn program(&self, body: &str, optimization: Optimization) -> Result<Program> {
        let version = nvrtc_version()?;
        let source = format!("{}\n{body}", crate::render::PRELUDE);
        let arch = format!("sm_{}{}", self.arch.0, self.arch.1);
        let options = self.options(&arch, optimization)?;
        let joined = options.join(" ");
        let key = stable_hash(&[
            source.as_bytes(),
            arch.as_bytes(),
            format!("{version:?}").as_bytes(),
            joined.as_bytes(),
        ]);
        // Not of NVRTC's version: an image another NVRTC built with the same options is the
        // same kernel (one the driver cannot load is compiled instead, `load_function`).
        let shipped = stable_hash(&[
            b"shipped",
            source.as_bytes(),
            arch.as_bytes(),
            joined.as_bytes(),
        ]);
        let path = self
            .cache_dir
            .as_ref()
            .map(|d| d.join(format!("{key:016x}.cubin")));
        Ok(Program {
            source,
            options,
            path,
            shipped,
        })
    }

    /// True when the shipped archive or the disk cache holds the machine code
    /// [`Compiler::load_function`] would load for `body`'s kernel (so loading it needs no
    /// compile).
    pub(crate) fn has_cached(&self, body: &str, optimization: Optimization) -> bool {
        self.program(body, optimization).is_ok_and(|p| {
            self.shipped_image(&p, optimization).is_some()
                || p.path.is_some_and(|path| path.exists())
        })
    }

    /// The key `body` at `optimization` has in the shipped archive ([`Program::shipped`]).
    #[cfg(test)]
    pub(crate) fn shipped_key(&self, body: &str, optimization: Optimization) -> Result<u64> {
        Ok(self.program(body, optimization)?.shipped)
    }

    /// The shipped image of `program` where the archive is in use for it: not a quick form
    /// (never shipped), and not a map or the interpreter (`FastCompile`) unless the local
    /// NVRTC built the archive.
    fn shipped_image(
        &self,
        program: &Program,
        optimization: Optimization,
    ) -> Option<&'static [u8]> {
        let usable = match optimization {
            Optimization::Quick => false,
            Optimization::FastCompile => self.same_nvrtc,
            Optimization::Full => true,
        };
        (self.shipped && usable)
            .then(|| archive::image(self.arch_number(), program.shipped))
            .flatten()
    }

    /// The architecture as the shipped archive numbers it (`major * 10 + minor`).
    fn arch_number(&self) -> u32 {
        (self.arch.0 * 10 + self.arch.1) as u32
    }

    /// `body` compiled now (no cache) with its shipped key, for the archive's builder.
    pub(crate) fn shipped_compile(
        &self,
        body: &str,
        optimization: Optimization,
    ) -> Result<(u64, Vec<u8>)> {
        let p = self.program(body, optimization)?;
        Ok((p.shipped, compile(&p.source, &p.options, Output::Cubin)?))
    }

    /// The device's machine code for `body` (the prelude is prepended), from the disk cache
    /// when it has it.
    #[cfg(test)]
    pub(crate) fn cubin(&self, body: &str, optimization: Optimization) -> Result<Vec<u8>> {
        self.cubin_of(self.program(body, optimization)?)
    }

    /// The machine code of `program`, from the disk cache when it has it, else compiled now
    /// (and stored there).
    fn cubin_of(&self, program: Program) -> Result<Vec<u8>> {
        let Program {
            source,
            options,
            path,
            ..
        } = program;
        if let Some(image) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            return Ok(image);
        }
        archive::count_compile();
        let image = compile(&source, &options, Output::Cubin)?;
        if let Some(path) = path {
            // Write then rename, so a concurrent process never reads half a file.
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let stored = path
                .parent()
                .map(std::fs::create_dir_all)
                .transpose()
                .and_then(|_| std::fs::write(&tmp, &image))
                .and_then(|_| std::fs::rename(&tmp, &path));
            if stored.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok(image)
    }

    /// Compiles a tiny kernel to machine code at the optimizing level, past the disk cache
    /// (so every process does), and drops it: NVRTC's state for such compiles is set up.
    fn warm_up(&self) {
        let body = "extern \"C\" __global__ void strata_warm_up(float* x) { x[0] = 1.0f; }";
        if let Ok(p) = self.program(body, Optimization::Full) {
            let _ = compile(&p.source, &p.options, Output::Cubin);
        }
    }

    /// PTX for `body`, compiled now for the virtual architecture (tests that check the
    /// generator use it: NVRTC checks the source without running the assembler).
    #[cfg(test)]
    pub(crate) fn ptx_uncached(&self, body: &str) -> Result<String> {
        nvrtc_version()?;
        let source = format!("{}\n{body}", crate::render::PRELUDE);
        let arch = format!("compute_{}{}", self.arch.0, self.arch.1);
        let ptx = compile(
            &source,
            &self.options(&arch, Optimization::Full)?,
            Output::Ptx,
        )?;
        Ok(String::from_utf8_lossy(&ptx).into_owned())
    }

    /// Compiles (or reads from the cache) and loads `body`, returning its kernel `name`; the
    /// module stays loaded as long as the compiler.
    pub(crate) fn load_function(
        &self,
        body: &str,
        name: &str,
        optimization: Optimization,
    ) -> Result<sys::CUfunction> {
        if let Some(dir) = self.record.as_deref() {
            if optimization != Optimization::Quick {
                archive::record(dir, body, name, optimization);
            }
        }
        let program = self.program(body, optimization)?;
        // The shipped image where there is one (copied to 8-byte-aligned memory, as an ELF
        // file read from disk would be); compiled when the driver refuses it, and the archive
        // then left unused.
        if let Some(image) = self.shipped_image(&program, optimization) {
            let mut aligned = vec![0u64; image.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
            match self.load(bytemuck::cast_slice(&aligned), name) {
                Ok((module, f)) => {
                    self.keep(module);
                    return Ok(f);
                }
                Err(_) => archive::refused(),
            }
        }
        let image = self.cubin_of(program)?;
        let (module, f) = self.load(&image, name)?;
        self.keep(module);
        Ok(f)
    }

    /// Loads a CUBIN image and finds its kernel `name` (the module is unloaded on failure).
    fn load(&self, image: &[u8], name: &str) -> Result<(sys::CUmodule, sys::CUfunction)> {
        let gpu = self.gpu.as_ref().ok_or_else(|| {
            Error::DeviceUnavailable("this compiler has no device to load kernels on".into())
        })?;
        gpu.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the image is a whole CUBIN file NVRTC wrote (now, on disk, or into the
        // shipped archive); `module` is written on success.
        check(
            unsafe {
                sys::cuModuleLoadData(&mut module, image.as_ptr() as *const std::ffi::c_void)
            },
            "cuModuleLoadData",
        )?;
        match get_function(module, name) {
            Ok(f) => Ok((module, f)),
            Err(e) => {
                // SAFETY: loaded above; none of its functions was handed out.
                unsafe { sys::cuModuleUnload(module) };
                Err(e)
            }
        }
    }

    /// Keeps a loaded module alive as long as the compiler.
    fn keep(&self, module: sys::CUmodule) {
        self.modules
            .lock_unpoisoned()
            .push(crate::driver::Raw(module));
    }
}

/// Compiles every kernel source recorded in `recorded` (by `STRATA_CUDA_RECORD`) for each
/// architecture of `archs` (`(major, minor)`), and returns the archive's bytes and its listing
/// (a line per entry: architecture, key, name, optimization, bytes). Needs
/// NVRTC, not a GPU.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("strata-ship-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// // No sources recorded: an archive of no entries.
/// let (archive, listing) = strata_cuda::shipped::build_archive(&dir, &[(9, 0)]).unwrap();
/// assert!(strata_cuda::shipped::entries(&archive).unwrap().is_empty());
/// assert!(listing.is_empty());
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn build_archive(
    recorded: &std::path::Path,
    archs: &[(i32, i32)],
) -> Result<(Vec<u8>, String)> {
    let sources = archive::recorded(recorded)?;
    // One thread per architecture (NVRTC compiles programs concurrently).
    let per_arch = std::thread::scope(|scope| {
        let threads: Vec<_> = archs
            .iter()
            .map(|&arch| {
                let sources = &sources;
                scope.spawn(move || -> Result<(String, (u32, Vec<Entry>))> {
                    let compiler = Compiler::new(None, arch);
                    let mut built = Vec::new();
                    for (name, optimization, body) in sources {
                        let (key, image) = compiler.shipped_compile(body, *optimization)?;
                        let line = format!(
                            "sm_{}{} {key:016x} {name} {} {}\n",
                            arch.0,
                            arch.1,
                            optimization.label(),
                            image.len()
                        );
                        let arch = compiler.arch_number();
                        let name = name.clone();
                        built.push((
                            line,
                            Entry {
                                key,
                                arch,
                                name,
                                image,
                            },
                        ));
                    }
                    built.sort_by_key(|(_, e)| e.key);
                    built.dedup_by_key(|(_, e)| e.key);
                    let listing = built.iter().map(|(line, _)| line.as_str()).collect();
                    let entries = built.into_iter().map(|(_, e)| e).collect();
                    Ok((listing, (compiler.arch_number(), entries)))
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
    let (listings, per_arch): (Vec<String>, Vec<_>) = per_arch.into_iter().unzip();
    let listing = listings.concat();
    Ok((archive::encode(nvrtc_version()?, &per_arch), listing))
}

impl Drop for Compiler {
    fn drop(&mut self) {
        let Some(gpu) = &self.gpu else { return };
        if gpu.synchronize().is_err() {
            return;
        }
        for m in self.modules.lock_unpoisoned().drain(..) {
            // SAFETY: loaded by this compiler; no function of it runs after the device syncs.
            unsafe { sys::cuModuleUnload(m.0) };
        }
    }
}

/// What NVRTC hands back.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// PTX text for a `compute_XY` architecture (no NUL).
    #[cfg_attr(not(test), allow(dead_code))]
    Ptx,
    /// The machine code for an `sm_XY` architecture.
    Cubin,
}

/// Compiles `source` with `options` (their architecture `compute_XY` for PTX, `sm_XY` for
/// CUBIN).
fn compile(source: &str, options: &[String], output: Output) -> Result<Vec<u8>> {
    let c_src = CString::new(source)
        .map_err(|_| Error::Backend("kernel source contains a NUL byte".into()))?;
    let prog = nvrtc::create_program(&c_src, None)
        .map_err(|e| Error::Backend(format!("nvrtcCreateProgram failed: {e:?}")))?;
    // SAFETY: `prog` is a live program; it is destroyed below on every path.
    let compiled = unsafe { nvrtc::compile_program(prog, options) };
    let result = match compiled {
        Ok(()) if output == Output::Ptx => unsafe { nvrtc::get_ptx(prog) }
            .map(|chars| {
                chars
                    .iter()
                    .map(|&c| c as u8)
                    .take_while(|&b| b != 0)
                    .collect()
            })
            .map_err(|e| Error::Backend(format!("nvrtcGetPTX failed: {e:?}"))),
        Ok(()) => cubin_of(prog),
        Err(e) => {
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|chars| {
                    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default();
            Err(Error::Backend(format!(
                "NVRTC could not compile a generated kernel ({e:?}); this is a bug in \
                 strata's code generation:\n{log}"
            )))
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    result
}

/// The CUBIN of a compiled program (cudarc wraps PTX only, so through the raw calls).
fn cubin_of(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: a compiled, live program; `size` is written on success.
    let status = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(Error::Backend(format!(
            "nvrtcGetCUBINSize failed ({status:?}, {size} bytes)"
        )));
    }
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds the `size` bytes NVRTC said it writes.
    let status = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) };
    if status != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Backend(format!("nvrtcGetCUBIN failed: {status:?}")));
    }
    Ok(image)
}

/// The kernel `name` of a loaded module.
fn get_function(module: sys::CUmodule, name: &str) -> Result<sys::CUfunction> {
    let c_name = CString::new(name).map_err(|_| Error::Backend("bad kernel name".into()))?;
    let mut f = std::ptr::null_mut();
    // SAFETY: a live module and a NUL-terminated name; `f` is written on success.
    check(
        unsafe { sys::cuModuleGetFunction(&mut f, module, c_name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    Ok(f)
}

/// N of the kernel's `Args<N>` parameter.
pub(crate) fn argument_words(body: &str) -> Result<usize> {
    body.split("Args<")
        .nth(1)
        .and_then(|rest| rest.split('>').next())
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| Error::Backend("internal error: a kernel without Args<N>".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_compile_to_the_devices_machine_code() {
        if let Err(e) = nvrtc_version() {
            assert!(std::env::var_os("STRATA_REQUIRE_NVRTC").is_none(), "{e}");
            return;
        }
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        let body = "extern \"C\" __global__ void strata_probe(float* p) { p[0] = 1.0f; }";
        let image = compiler.cubin(body, Optimization::Full).unwrap();
        // An ELF file for the device (no driver JIT at load), holding the kernel.
        assert_eq!(&image[..4], b"\x7fELF");
        assert!(image.windows(12).any(|w| w == b"strata_probe"));
        let err = compiler.cubin(
            "__global__ void k() { undefined_name; }",
            Optimization::Full,
        );
        assert!(err.unwrap_err().to_string().contains("undefined_name"));
    }

    #[test]
    fn a_map_and_its_batched_form_compile_as_two_programs() {
        use crate::render::map::{render, MapSig};
        use strata_core::ir::Expr;
        use strata_core::lower::map_plan::Path;
        use strata_core::DType;
        let sig = MapSig {
            trees: strata_core::ir::MapTrees::one(Expr::input(0, DType::F32)),
            dtypes: vec![DType::F32; 2],
            paths: vec![Path::Contiguous; 2],
            scalars: vec![],
            rank: 1,
            vector: 4,
            wide: false,
        };
        let rendered = render(&sig).unwrap();
        let batched = rendered.batched.unwrap();
        if nvrtc_version().is_err() {
            return;
        }
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        for (src, kernel, other) in [
            (rendered.source.as_str(), "strata_map", "strata_map_batch"),
            (batched.as_str(), "strata_map_batch", "void strata_map("),
        ] {
            assert!(!src.contains(other), "{src}");
            let image = compiler.cubin(src, Optimization::FastCompile).unwrap();
            assert!(image.windows(kernel.len()).any(|w| w == kernel.as_bytes()));
        }
    }

    #[test]
    fn reductions_over_rows_of_several_reduced_axes_compile() {
        use crate::render::reduce::ReduceSig;
        use crate::render::Generated;
        use strata_core::ir::ReduceOp;
        use strata_core::DType;
        let Ok(_) = nvrtc_version() else { return };
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        for (op, rank, vector) in [(ReduceOp::Sum, 2, 4), (ReduceOp::ArgMax, 3, 1)] {
            let sig = ReduceSig {
                op,
                input: DType::F32,
                acc: DType::F32,
                out: if op == ReduceOp::Sum {
                    DType::F32
                } else {
                    DType::I64
                },
                outer_rank: 1,
                reduced_rank: rank,
                group: 32,
                vector,
                wide: false,
                combine: false,
                map: None,
                prologue: None,
                epilogue: None,
                held: false,
                stores_map: false,
                out_vector: 1,
            };
            let src = sig.render().unwrap().source;
            assert!(src.contains("row < r1 / inner"), "{src}");
            compiler.cubin(&src, Optimization::FastCompile).unwrap();
        }
    }

    #[test]
    fn own_convolution_kernels_compile_for_every_pass_and_float_dtype() {
        use crate::render::conv::{ConvSig, ConvSumSig};
        use crate::render::Generated;
        use strata_core::ir::ConvPass;
        use strata_core::DType;
        let Ok(_) = nvrtc_version() else { return };
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for pass in [
                ConvPass::Forward,
                ConvPass::BackwardData,
                ConvPass::BackwardFilter,
            ] {
                // Every tile in f32 (and both strides where they differ: backward data); the
                // other dtypes change only the loads and stores (NVRTC takes a second a kernel).
                let tiles = match dtype {
                    DType::F32 => &strata_core::lower::conv_plan::TILES[..],
                    _ => &strata_core::lower::conv_plan::TILES[..1],
                };
                // 32-bit indices; the first tile with 64-bit ones too.
                for (&tile, narrow) in tiles
                    .iter()
                    .map(|t| (t, true))
                    .chain(std::iter::once((&tiles[0], false)))
                {
                    let sig = ConvSig {
                        pass,
                        dtype,
                        tile,
                        narrow,
                        // (Backward data's strided phases with 32-bit indices.)
                        strided: pass == ConvPass::BackwardData && narrow,
                    };
                    let src = sig.render().unwrap().source;
                    let image = compiler
                        .cubin(&src, Optimization::Full)
                        .unwrap_or_else(|e| panic!("{pass:?} {dtype} {tile:?}: {e}\n{src}"));
                    assert!(image.windows(11).any(|w| w == b"strata_conv"));
                }
            }
            let src = ConvSumSig { dtype }.render().unwrap().source;
            compiler.cubin(&src, Optimization::Full).unwrap();
        }
    }

    #[test]
    fn maps_compile_fast_where_nvrtc_can() {
        assert_eq!(fast_compile_level(None, (13, 0)).as_deref(), Some("min"));
        assert_eq!(
            fast_compile_level(Some("max"), (13, 0)).as_deref(),
            Some("max")
        );
        assert_eq!(fast_compile_level(Some("0"), (13, 0)), None);
        assert_eq!(fast_compile_level(None, (12, 4)), None);
        let Ok(version) = nvrtc_version() else { return };
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        let full = compiler.options("sm_90", Optimization::Full).unwrap();
        let fast = compiler
            .options("sm_90", Optimization::FastCompile)
            .unwrap();
        assert_eq!(full.iter().any(|o| o == "-minimal"), version >= (12, 4));
        assert!(!full.iter().any(|o| o.starts_with("--Ofast-compile")));
        assert_eq!(
            fast.iter().any(|o| o.starts_with("--Ofast-compile")),
            compiler.fast_compile.is_some()
        );
        // NVRTC takes the options (CI's is 13.x): both make the device's machine code.
        let body = "extern \"C\" __global__ void strata_probe(float* p) { p[0] = expf(p[1]); }";
        for optimization in [Optimization::Full, Optimization::FastCompile] {
            let image = compiler.cubin(body, optimization).unwrap();
            assert_eq!(&image[..4], b"\x7fELF", "{optimization:?}");
            assert!(image.windows(12).any(|w| w == b"strata_probe"));
        }
    }

    #[test]
    fn a_first_compile_is_quick_unless_turned_off() {
        assert!(quick_compile(None, (13, 0)));
        assert!(!quick_compile(Some("0"), (13, 0)));
        assert!(!quick_compile(None, (12, 6)));
        let Ok(version) = nvrtc_version() else { return };
        let mut compiler = Compiler::new(None, (9, 0));
        compiler.cache_dir = None;
        let quick = compiler.options("sm_90", Optimization::Quick).unwrap();
        assert_eq!(
            quick.iter().any(|o| o == "--Ofast-compile=min"),
            version >= FAST_COMPILE_SINCE
        );
        // No device to load on: every kernel compiles at its own level.
        assert!(!compiler.quick_first("", Optimization::Full));
        let body = "extern \"C\" __global__ void strata_probe(float* p) { p[0] = expf(p[1]); }";
        let image = compiler.cubin(body, Optimization::Quick).unwrap();
        assert_eq!(&image[..4], b"\x7fELF");
    }

    #[test]
    fn the_hash_is_stable() {
        assert_eq!(stable_hash(&[b"a"]), stable_hash(&[b"a"]));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
    }
    /// The map interpreter's source is fixed (no signature), so whether the archive holds its
    /// current form can be checked here: regenerate the archive (`ship_kernels`) after
    /// changing it.
    #[test]
    fn the_archive_holds_the_current_map_interpreter() {
        use crate::render::interpreter::InterpretSig;
        use crate::render::Generated;
        if crate::nvrtc_version().is_err() {
            assert!(std::env::var_os("STRATA_REQUIRE_NVRTC").is_none());
            return;
        }
        let rendered = InterpretSig.render().unwrap();
        for arch in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)] {
            let compiler = Compiler::new(None, arch);
            let key = compiler
                .shipped_key(&rendered.source, InterpretSig.optimization())
                .unwrap();
            assert!(
                archive::image((arch.0 * 10 + arch.1) as u32, key).is_some(),
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
        archive::record(&dir, body, "strata_probe", Optimization::Full);
        if crate::nvrtc_version().is_err() {
            assert!(std::env::var_os("STRATA_REQUIRE_NVRTC").is_none());
            return;
        }
        let (archive, listing) = build_archive(&dir, &[(8, 0), (9, 0)]).unwrap();
        let all = archive::entries(&archive).unwrap();
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
        let err = archive::entries(&archive[..archive.len() - 1]).unwrap_err();
        assert!(err.to_string().contains("ends inside an entry"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
