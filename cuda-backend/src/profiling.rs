//! What the profiler asks of the CUDA backend: the kernel function and grid `run` would
//! launch (planned as `run` plans it), and compiling it ahead, so that the events around a
//! launch time the kernel, not NVRTC.

use crate::codegen::reduce_prologue::{self, PrologueRun};
use crate::codegen::{index, map, matmul, reduce, softmax};
use crate::launch::{dims, Function, FunctionCache, Launch, Program};
use crate::CudaBackend;
use strata_core::backend::LaunchDescription;
use strata_core::ir::{Kernel, KernelArgs};
use strata_core::lower::operands::{IndexOperands, MatmulOperands};
use strata_core::lower::softmax_plan::SoftmaxOperands;
use strata_core::DType;

impl CudaBackend {
    pub(crate) fn describe(&self, kernel: &Kernel, args: &KernelArgs) -> Option<LaunchDescription> {
        let grid =
            |l: &Launch| dims(&self.gpu, &l.grid).map(|(g, b)| format!("grid {g:?} × block {b:?}"));
        let (name, shape) = match kernel {
            Kernel::Map { expr, also } => {
                let (sig, plan) = map::plan(expr, also, args, &self.target).ok()??;
                // A launch small enough is appended to its stream's batch once the kernel's
                // batched form is due (crate::batch): from its second small launch on.
                let batched = self.maps.peek(&sig).is_some_and(|f| {
                    self.batches
                        .form(&f, &plan)
                        .is_some_and(|form| form.is_due())
                });
                let name = if batched {
                    "strata_map_batch"
                } else {
                    "strata_map"
                };
                (name.to_string(), grid(&plan)?)
            }
            Kernel::Reduce {
                prologue: Some(_), ..
            } => match reduce_prologue::plan_prologue(kernel, args, &self.target).ok()?? {
                PrologueRun::Staged(_, l) => (
                    "strata_reduce".into(),
                    format!("{}, a row staged", grid(&l)?),
                ),
                PrologueRun::Split([(k1, a1), (k2, a2)]) => {
                    let (d1, d2) = (self.describe(&k1, &a1)?, self.describe(&k2, &a2)?);
                    (
                        format!("{} then {}", d1.name, d2.name),
                        format!("{}; then {}", d1.shape, d2.shape),
                    )
                }
            },
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map,
                ..
            } => {
                let red = reduce::plan(*op, *reduced_axes, *acc, map.as_ref(), args, &self.target)
                    .ok()??;
                let first = grid(&red.first(0, 0))?;
                if red.plan.splits == 1 {
                    ("strata_reduce".into(), first)
                } else {
                    let (_, combine) = red.combine(0, 0);
                    (
                        "strata_reduce ×2".into(),
                        format!(
                            "{first} in {} splits, then {} to combine",
                            red.plan.splits,
                            grid(&combine)?
                        ),
                    )
                }
            }
            Kernel::Matmul { acc, .. } => {
                let ops = MatmulOperands::of(args).ok()?;
                let (batch, m, k, n) = ops.dims;
                let blas = self.blas.is_some()
                    && matches!(
                        ops.a.dtype,
                        DType::F32 | DType::F64 | DType::F16 | DType::BF16
                    );
                if blas {
                    (
                        "cublasGemmStridedBatchedEx".into(),
                        format!("batch {batch}, m {m}, n {n}, k {k}"),
                    )
                } else {
                    let (_, plan) = matmul::plan(*acc, &ops).ok()??;
                    ("strata_matmul".into(), grid(&plan)?)
                }
            }
            Kernel::Index { kind, axis } => {
                let ops = IndexOperands::of(*kind, *axis, args).ok()?;
                let (_, plan) = index::plan(&ops).ok()??;
                ("strata_index".into(), grid(&plan)?)
            }
            Kernel::Softmax { log } => {
                let ops = SoftmaxOperands::of(args).ok()?;
                let (sig, plan) = softmax::plan(*log, &ops, &self.target).ok()??;
                let shape = format!("{}, {} threads per row", grid(&plan)?, sig.group);
                ("strata_softmax".into(), shape)
            }
        };
        Some(LaunchDescription { name, shape })
    }

    /// Compiles the kernels `run` will launch for `kernel` (a no-op when cached); true when
    /// something was compiled.
    pub(crate) fn prepare(&self, kernel: &Kernel, args: &KernelArgs) -> strata_core::Result<bool> {
        let mut compiled = false;
        match kernel {
            Kernel::Map { expr, also } => {
                if let Some((sig, plan)) = map::plan(expr, also, args, &self.target)? {
                    let f = compile(&self.maps, &sig, self, &mut compiled)?;
                    if let Some(form) = self.batches.form(&f, &plan) {
                        compiled |= form.prepare(&self.compiler)?;
                    }
                }
            }
            Kernel::Reduce {
                prologue: Some(_), ..
            } => match reduce_prologue::plan_prologue(kernel, args, &self.target)? {
                Some(PrologueRun::Staged(sig, _)) => {
                    compile(&self.reductions, &sig, self, &mut compiled)?;
                }
                Some(PrologueRun::Split(launches)) => {
                    for (k, a) in launches {
                        compiled |= self.prepare(&k, &a)?;
                    }
                }
                None => {}
            },
            Kernel::Reduce {
                op,
                reduced_axes,
                acc,
                map,
                ..
            } => {
                if let Some(red) =
                    reduce::plan(*op, *reduced_axes, *acc, map.as_ref(), args, &self.target)?
                {
                    compile(&self.reductions, &red.sig, self, &mut compiled)?;
                    if red.plan.splits > 1 {
                        let (sig, _) = red.combine(0, 0);
                        compile(&self.reductions, &sig, self, &mut compiled)?;
                    }
                }
            }
            Kernel::Matmul { acc, .. } => {
                let ops = MatmulOperands::of(args)?;
                let blas = self.blas.is_some()
                    && matches!(
                        ops.a.dtype,
                        DType::F32 | DType::F64 | DType::F16 | DType::BF16
                    );
                if !blas {
                    if let Some((sig, _)) = matmul::plan(*acc, &ops)? {
                        compile(&self.matmuls, &sig, self, &mut compiled)?;
                    }
                }
            }
            Kernel::Index { kind, axis } => {
                let ops = IndexOperands::of(*kind, *axis, args)?;
                if let Some((sig, _)) = index::plan(&ops)? {
                    compile(&self.indexing, &sig, self, &mut compiled)?;
                }
            }
            Kernel::Softmax { log } => {
                let ops = SoftmaxOperands::of(args)?;
                if let Some((sig, _)) = softmax::plan(*log, &ops, &self.target)? {
                    compile(&self.softmaxes, &sig, self, &mut compiled)?;
                }
            }
        }
        Ok(compiled)
    }
}

/// [`function`], noting in `compiled` whether it missed the cache.
fn compile<K: Program>(
    cache: &FunctionCache<K::Stored>,
    key: &K,
    backend: &CudaBackend,
    compiled: &mut bool,
) -> strata_core::Result<Function> {
    cache.get(key, |k| {
        *compiled = true;
        backend
            .compiler
            .function(&k.source()?, K::NAME, k.optimization())
    })
}
