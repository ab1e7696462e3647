//! A map kernel's first launch runs through the interpreter (`codegen/interpret.rs`) when its
//! own kernel would have to be compiled: a new fused kernel's first call waits for a launch,
//! not for NVRTC. The kernel is compiled at its second launch, so a loop pays its compile once
//! as before and a one-off expression (a notebook cell run once) never does.
//! `STRATA_CUDA_INTERPRET=0` compiles every kernel at its first launch.

use crate::codegen::interpret::{self, InterpretSig};
use crate::codegen::map::MapSig;
use crate::compile::Compiler;
use crate::launch::{Function, Launch, Program};
use std::sync::OnceLock;
use strata_core::lower::cache::KernelCache;
use strata_core::Result;

/// The interpreter, and which maps had their first launch.
pub(crate) struct FirstLaunches {
    enabled: bool,
    interpreted: KernelCache<MapSig<'static>, ()>,
    /// The interpreter once compiled or loaded; `None` when that failed (then every map
    /// compiles at its first launch, and the compile is not tried again for each new map).
    interpreter: OnceLock<Option<Function>>,
}

impl FirstLaunches {
    pub(crate) fn new() -> FirstLaunches {
        FirstLaunches {
            enabled: std::env::var("STRATA_CUDA_INTERPRET").map_or(true, |v| v != "0"),
            interpreted: KernelCache::default(),
            interpreter: OnceLock::new(),
        }
    }

    /// The interpreter and its launch for the map `sig` (planned as `plan`), whose kernel is
    /// not loaded: `None` when this is not the map's first launch, the disk cache holds its
    /// kernel, or the interpreter does not run such maps. Marks the first launch as taken.
    pub(crate) fn interpret(
        &self,
        sig: &MapSig,
        plan: &Launch,
        compiler: &Compiler,
    ) -> Result<Option<(Function, Launch)>> {
        if !self.enabled || self.interpreted.peek(sig).is_some() {
            return Ok(None);
        }
        let Some(launch) = interpret::launch(sig, plan) else {
            return Ok(None);
        };
        if compiler.has_cached(&sig.source()?, MapSig::NAME, sig.optimization()) {
            return Ok(None);
        }
        // Should the interpreter fail to compile, the map compiles as it would without it
        // (and says why, if that fails too).
        let interpreter = self.interpreter.get_or_init(|| {
            let source = InterpretSig.source().ok()?;
            let optimization = InterpretSig.optimization();
            compiler
                .function(&source, InterpretSig::NAME, optimization)
                .ok()
        });
        let Some(f) = interpreter.clone() else {
            return Ok(None);
        };
        self.interpreted.get(sig, |_| Ok(()))?;
        Ok(Some((f, launch)))
    }
}
