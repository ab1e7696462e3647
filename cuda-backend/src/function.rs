//! Loaded kernels: a kernel's function with its argument count, the per-device cache from
//! kernel structure to function (core's `KernelCache`), and the batched form a small launch
//! compiles when it first needs it. `compile` makes machine code; this file keeps what it
//! loaded.
//!
//! A fully optimized kernel the disk cache does not hold is compiled twice: quickly at once
//! ([`Optimization::Quick`]), so its first launch waits for `--Ofast-compile=min` rather than
//! NVRTC's full optimization (a staged softmax's 0.3–0.5 s), and at its own level on the
//! compiler's background thread, whose function replaces the quick one when it is loaded.
//! Both give the same bits (`--fmad=false` decides rounding; `first_launch.rs` checks it).

use crate::compile::{argument_words, Compiler};
use crate::driver::Raw;
use crate::render::{Generated, Optimization, Rendered};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use strata_core::kernel_cache::KernelCache;
use strata_core::sync::LockUnpoisoned;
use strata_core::Result;

/// A loaded kernel and the number of argument words it takes.
#[derive(Clone, Debug)]
pub(crate) struct Function {
    /// The function launches use: the quick form until the kernel's own one replaces it.
    handle: Arc<Handle>,
    pub words: usize,
    /// Its batched form (`<name>_batch`, see [`BatchedForm`]) when the source has one,
    /// compiled when first needed.
    pub batch: Option<Arc<BatchedForm>>,
}

/// A kernel's loaded function, which its background compile replaces once.
#[derive(Debug)]
struct Handle {
    f: AtomicPtr<sys::CUfunc_st>,
    /// True while the kernel's own compile is queued or running.
    compiling: Mutex<bool>,
    compiled: Condvar,
}

impl Handle {
    fn new(f: sys::CUfunction, compiling: bool) -> Arc<Handle> {
        Arc::new(Handle {
            f: AtomicPtr::new(f),
            compiling: Mutex::new(compiling),
            compiled: Condvar::new(),
        })
    }
}

impl Function {
    /// The function to launch now.
    pub(crate) fn f(&self) -> sys::CUfunction {
        self.handle.f.load(Ordering::Acquire)
    }

    /// Waits until the kernel's own compile, if one is running in the background, has
    /// replaced its quick form (the profiler times the kernel users will run); true when it
    /// waited.
    pub(crate) fn settle(&self) -> bool {
        let mut compiling = self.handle.compiling.lock_unpoisoned();
        let waited = *compiling;
        while *compiling {
            compiling = self
                .handle
                .compiled
                .wait(compiling)
                .unwrap_or_else(|e| e.into_inner());
        }
        waited
    }

    /// Compiles (or reads from the cache) and loads the kernel `name` of `rendered`: quickly
    /// now and at `optimization` in the background when the disk cache does not hold it
    /// (`Compiler::quick_first`), else at `optimization` now. Its batched form, where it has
    /// one, is compiled when a launch first needs it ([`BatchedForm`]): one NVRTC program took
    /// about as long as two, and two at once longer than one (NVRTC 13 on an H100 host).
    pub(crate) fn load(
        compiler: &Compiler,
        rendered: Rendered,
        name: &str,
        optimization: Optimization,
    ) -> Result<Function> {
        let quick = compiler.quick_first(&rendered.source, optimization);
        let first = if quick {
            Optimization::Quick
        } else {
            optimization
        };
        let f = compiler.load_function(&rendered.source, name, first)?;
        let handle = Handle::new(f, quick);
        if quick {
            let done = handle.clone();
            let queued = compiler.compile_later(
                rendered.source.clone(),
                name.to_string(),
                optimization,
                Box::new(move |f| {
                    // Should the full compile fail, the quick form stays (same values).
                    if let Ok(f) = f {
                        done.f.store(f, Ordering::Release);
                    }
                    *done.compiling.lock_unpoisoned() = false;
                    done.compiled.notify_all();
                }),
            );
            if !queued {
                // No background thread: the kernel's own level now.
                let own = compiler.load_function(&rendered.source, name, optimization)?;
                handle.f.store(own, Ordering::Release);
                *handle.compiling.lock_unpoisoned() = false;
            }
        }
        Function::with_handle(handle, rendered, name, optimization)
    }

    /// The function of `rendered`'s kernel `name`, `f`, loaded at `optimization` (on the
    /// background thread: `run::first_launch`).
    pub(crate) fn loaded(
        f: sys::CUfunction,
        rendered: Rendered,
        name: &str,
        optimization: Optimization,
    ) -> Result<Function> {
        Function::with_handle(Handle::new(f, false), rendered, name, optimization)
    }

    fn with_handle(
        handle: Arc<Handle>,
        rendered: Rendered,
        name: &str,
        optimization: Optimization,
    ) -> Result<Function> {
        Ok(Function {
            handle,
            words: argument_words(&rendered.source)?,
            batch: rendered.batched.map(|source| {
                Arc::new(BatchedForm::new(
                    source,
                    format!("{name}_batch"),
                    optimization,
                ))
            }),
        })
    }
}

/// Loaded functions by kernel structure, per device.
pub(crate) type FunctionCache<S> = KernelCache<S, Function>;

/// The function for `key` in `cache`, rendering and compiling its program on a miss.
pub(crate) fn function<K: Generated>(
    cache: &FunctionCache<K::Stored>,
    key: &K,
    compiler: &Compiler,
) -> Result<Function> {
    cache.get(key, |k| {
        Function::load(compiler, k.render()?, K::NAME, k.optimization())
    })
}

/// A kernel's batched form (`<name>_batch`): its program's source, compiled and loaded on the
/// compiler's background thread from the kernel's second launch small enough for a batch.
/// Small launches run alone until it is loaded, so a new kernel's first calls wait for one
/// NVRTC program at most; a kernel launched small again (a loop over tiny tensors, where
/// batching pays) is batched once its form is loaded.
pub(crate) struct BatchedForm {
    /// The program: the helpers before the kernel, then `<name>_batch` (no prelude).
    source: String,
    name: String,
    optimization: Optimization,
    /// A small launch has run (alone): the next one has the form compiled.
    used: AtomicBool,
    /// The form's compile has been left to the background thread.
    queued: AtomicBool,
    /// The loaded form: read without a lock by every later small launch.
    loaded: OnceLock<Raw<sys::CUfunction>>,
    /// Held while compiling, so two threads do not compile it twice.
    compiling: Mutex<()>,
}

impl BatchedForm {
    pub(crate) fn new(source: String, name: String, optimization: Optimization) -> BatchedForm {
        BatchedForm {
            source,
            name,
            optimization,
            used: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            loaded: OnceLock::new(),
            compiling: Mutex::new(()),
        }
    }

    /// Whether the form is compiled or being compiled for the next small launches (the
    /// profiler's `prepare` compiles it before a launch it times).
    pub(crate) fn is_due(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// For a small launch: the batched function once loaded; `None` (the launch runs alone)
    /// before. The kernel's second small launch leaves the form's compile to the background
    /// thread (or compiles it now when the thread cannot start).
    pub(crate) fn for_launch(
        self: &Arc<Self>,
        compiler: &Compiler,
    ) -> Result<Option<sys::CUfunction>> {
        if let Some(f) = self.loaded.get() {
            return Ok(Some(f.0));
        }
        if !self.used.swap(true, Ordering::Relaxed) || self.queued.swap(true, Ordering::Relaxed) {
            return Ok(None);
        }
        let form = self.clone();
        let then = Box::new(move |f: Result<sys::CUfunction>| {
            // A failed compile leaves the launches alone; `prepare` would say why.
            if let Ok(f) = f {
                form.loaded.get_or_init(|| Raw(f));
            }
        });
        let (source, name) = (self.source.clone(), self.name.clone());
        if compiler.compile_later(source, name, self.optimization, then) {
            return Ok(None);
        }
        self.load(compiler).map(Some)
    }

    /// Compiles the form now when the next small launch will use it (the profiler's
    /// `prepare`, so that the compile is not timed as the launch); true when it compiled.
    pub(crate) fn prepare(&self, compiler: &Compiler) -> Result<bool> {
        if !self.is_due() || self.loaded.get().is_some() {
            return Ok(false);
        }
        self.load(compiler).map(|_| true)
    }

    /// The loaded form, compiled now unless another thread did.
    fn load(&self, compiler: &Compiler) -> Result<sys::CUfunction> {
        let _compiling = self.compiling.lock_unpoisoned();
        if let Some(f) = self.loaded.get() {
            return Ok(f.0);
        }
        let f = compiler.load_function(&self.source, &self.name, self.optimization)?;
        Ok(self.loaded.get_or_init(|| Raw(f)).0)
    }
}

impl std::fmt::Debug for BatchedForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedForm")
            .field("name", &self.name)
            .field("due", &self.is_due())
            .finish()
    }
}
