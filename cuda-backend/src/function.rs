//! Loaded kernels: a kernel's function with its argument count, the per-device cache from
//! kernel structure to function (core's `KernelCache`), and the batched form a small launch
//! compiles when it first needs it. `compile` makes machine code; this file keeps what it
//! loaded.

use crate::compile::{argument_words, Compiler};
use crate::driver::Raw;
use crate::render::{Generated, Optimization, Rendered};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use strata_core::kernel_cache::KernelCache;
use strata_core::sync::LockUnpoisoned;
use strata_core::Result;

/// A loaded kernel and the number of argument words it takes.
#[derive(Clone, Debug)]
pub(crate) struct Function {
    pub f: sys::CUfunction,
    pub words: usize,
    /// Its batched form (`<name>_batch`, see [`BatchedForm`]) when the source has one,
    /// compiled when first needed.
    pub batch: Option<Arc<BatchedForm>>,
}

// SAFETY: a CUfunction is a handle the driver lets any thread use with its context current.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// Compiles (or reads from the cache) and loads the kernel `name` of `rendered`; its
    /// batched form, where it has one, is compiled when a launch first needs it
    /// ([`BatchedForm`]): one NVRTC program took about as long as two, and two at once longer
    /// than one (NVRTC 13 on an H100 host).
    pub(crate) fn load(
        compiler: &Compiler,
        rendered: Rendered,
        name: &str,
        optimization: Optimization,
    ) -> Result<Function> {
        Ok(Function {
            f: compiler.load_function(&rendered.source, name, optimization)?,
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

/// A kernel's batched form (`<name>_batch`): its program's source, compiled and loaded at the
/// kernel's second launch small enough for a batch. The first such launch runs alone, so a new
/// kernel's first call waits for one NVRTC program; a kernel launched small again (a loop over
/// tiny tensors, where batching pays) compiles its batched form then, once.
pub(crate) struct BatchedForm {
    /// The program: the helpers before the kernel, then `<name>_batch` (no prelude).
    source: String,
    name: String,
    optimization: Optimization,
    /// A small launch has run (alone): the next one compiles the form.
    used: AtomicBool,
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
            loaded: OnceLock::new(),
            compiling: Mutex::new(()),
        }
    }

    /// Whether the next small launch runs in a batch (the form is loaded, or compiled then).
    pub(crate) fn is_due(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// For a small launch: the batched function, compiled at the kernel's second small
    /// launch; `None` at its first, which runs alone.
    pub(crate) fn for_launch(&self, compiler: &Compiler) -> Result<Option<sys::CUfunction>> {
        if let Some(f) = self.loaded.get() {
            return Ok(Some(f.0));
        }
        if !self.used.swap(true, Ordering::Relaxed) {
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
