//! cuDNN for convolutions: the library loaded at run time (like cuBLAS), one handle per device
//! made at the first convolution, and one plan per convolution shape, kept for the device's
//! life: the convolution as a cuDNN graph with its execution plan built once ([`graph`]), run
//! where the operands are 16-byte aligned, and the legacy API's descriptors and algorithm
//! (chosen by the rules below) for the calls whose operands are not, or where no graph plan
//! qualifies (`STRATA_CUDNN_GRAPH=0`: always). `STRATA_CUDNN=0` turns cuDNN off: strata's own
//! implicit-GEMM kernels run the convolutions.
//!
//! f32 runs without TF32 unless the device opted in (`set_allow_tf32`), 16-bit floats
//! accumulate in f32 on tensor cores, f64 in f64; the legacy algorithm is the fastest of
//! cuDNN's candidates, timed at the shape's first call (see [`benchmarks`]), whose workspace is
//! at most [`MAX_WORKSPACE`] bytes.

mod graph;

use crate::driver::Raw;
use cudarc::cudnn::sys as dn;
use cudarc::driver::sys::CUstream;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use strata_core::ir::{ConvGeometry, ConvPass};
use strata_core::sync::LockUnpoisoned;
use strata_core::{DType, Error, Result};

/// The largest workspace a convolution's algorithm may take (its scratch buffer).
pub(crate) const MAX_WORKSPACE: usize = 1 << 30;

/// One convolution shape: what its plan depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConvKey {
    pub pass: ConvPass,
    pub geometry: ConvGeometry,
    pub dtype: DType,
    pub tf32: bool,
    /// `[N, C, H, W]` of the input `x`, `[O, C/g, kH, kW]` of the weight, `[N, O, OH, OW]`
    /// of `y`, whichever pass reads or writes them.
    pub x: [usize; 4],
    pub w: [usize; 4],
    pub y: [usize; 4],
}

/// The algorithm a plan runs, of its pass's kind.
#[derive(Debug, Clone, Copy)]
enum Algo {
    Forward(dn::cudnnConvolutionFwdAlgo_t),
    BackwardData(dn::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(dn::cudnnConvolutionBwdFilterAlgo_t),
}

/// A convolution shape's descriptors and chosen algorithm.
#[derive(Debug)]
pub(crate) struct ConvPlan {
    x: dn::cudnnTensorDescriptor_t,
    w: dn::cudnnFilterDescriptor_t,
    y: dn::cudnnTensorDescriptor_t,
    conv: dn::cudnnConvolutionDescriptor_t,
    algo: Algo,
    /// Bytes of scratch memory the algorithm needs.
    pub workspace: usize,
    /// The algorithm and math type, for the profiler.
    pub algo_name: String,
    /// The same convolution as a cuDNN graph, run where the operands are aligned for it.
    graph: Option<graph::GraphPlan>,
    /// The shape it was made for.
    pub key: ConvKey,
}

// SAFETY: descriptors are host objects that cuDNN only reads during a call; every call runs
// under the handle's lock.
unsafe impl Send for ConvPlan {}
unsafe impl Sync for ConvPlan {}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by this plan and are destroyed once.
        unsafe {
            dn::cudnnDestroyTensorDescriptor(self.x);
            dn::cudnnDestroyTensorDescriptor(self.y);
            dn::cudnnDestroyFilterDescriptor(self.w);
            dn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

/// A planned cuDNN call: the plan, the three operands' addresses (`x`, `w`, `y` whichever is
/// read or written) and the scratch buffer holding the workspace.
#[derive(Debug)]
pub(crate) struct ConvCall {
    pub plan: Arc<ConvPlan>,
    pub x: u64,
    pub w: u64,
    pub y: u64,
    /// Index of the launch's scratch buffer with the workspace (none when it needs none).
    pub workspace: Option<usize>,
}

/// cuDNN on one device.
pub(crate) struct Dnn {
    handle: OnceLock<std::result::Result<Mutex<Raw<dn::cudnnHandle_t>>, String>>,
    plans: Mutex<HashMap<ConvKey, Arc<ConvPlan>>>,
}

/// `Err` for a cuDNN status other than success, naming the call.
fn check(status: dn::cudnnStatus_t, what: &str) -> Result<()> {
    match status {
        dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(()),
        s => Err(Error::Backend(format!("cuDNN {what} failed: {s:?}"))),
    }
}

/// A size as cuDNN's `int`, or `Err`.
fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::Unsupported(format!(
            "a convolution's {what} of {v} (cuDNN takes sizes below 2^31)"
        ))
    })
}

impl Dnn {
    /// True when cuDNN can be loaded and `STRATA_CUDNN` does not turn it off.
    pub(crate) fn available() -> bool {
        if std::env::var("STRATA_CUDNN").is_ok_and(|v| v == "0") {
            return false;
        }
        // SAFETY: only asks the loader whether the library can be opened.
        unsafe { dn::is_culib_present() }
    }

    /// cuDNN for a device, its handle made at the first convolution.
    pub(crate) fn new() -> Dnn {
        Dnn {
            handle: OnceLock::new(),
            plans: Mutex::new(HashMap::new()),
        }
    }

    /// The handle (made now the first time, with the device's context current).
    fn handle(&self) -> Result<&Mutex<Raw<dn::cudnnHandle_t>>> {
        let made = self.handle.get_or_init(|| {
            let mut h: dn::cudnnHandle_t = std::ptr::null_mut();
            // SAFETY: writes a new handle into `h`.
            match unsafe { dn::cudnnCreate(&mut h) } {
                dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS => Ok(Mutex::new(Raw(h))),
                s => Err(format!("cudnnCreate failed: {s:?}")),
            }
        });
        made.as_ref().map_err(|e| Error::Backend(e.clone()))
    }

    /// The plan of `key`, made on its first use.
    pub(crate) fn plan(&self, key: &ConvKey) -> Result<Arc<ConvPlan>> {
        if let Some(p) = self.plans.lock_unpoisoned().get(key) {
            return Ok(p.clone());
        }
        let plan = Arc::new(self.make_plan(key)?);
        self.plans.lock_unpoisoned().insert(*key, plan.clone());
        Ok(plan)
    }

    fn make_plan(&self, key: &ConvKey) -> Result<ConvPlan> {
        let handle = self.handle()?.lock_unpoisoned();
        let (data, compute) = match key.dtype {
            DType::F32 => (
                dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ),
            DType::F64 => (
                dn::cudnnDataType_t::CUDNN_DATA_DOUBLE,
                dn::cudnnDataType_t::CUDNN_DATA_DOUBLE,
            ),
            DType::F16 => (
                dn::cudnnDataType_t::CUDNN_DATA_HALF,
                dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ),
            DType::BF16 => (
                dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
                dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ),
            other => {
                return Err(Error::DType(format!(
                    "internal error: a cuDNN convolution of {other}"
                )))
            }
        };
        // f32 without TF32: kernels of plain FMAs only.
        let fma_only = key.dtype == DType::F32 && !key.tf32;
        let g = &key.geometry;
        let mut plan = ConvPlan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: Algo::Forward(dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
            workspace: 0,
            algo_name: String::new(),
            graph: None,
            key: *key,
        };
        let h = handle.0;
        // SAFETY: each descriptor is created before it is set, and destroyed by the plan's
        // drop (a null one is ignored by cuDNN); the handle is live and used under its lock.
        unsafe {
            check(
                dn::cudnnCreateTensorDescriptor(&mut plan.x),
                "tensor descriptor",
            )?;
            check(
                dn::cudnnCreateTensorDescriptor(&mut plan.y),
                "tensor descriptor",
            )?;
            check(
                dn::cudnnCreateFilterDescriptor(&mut plan.w),
                "filter descriptor",
            )?;
            check(
                dn::cudnnCreateConvolutionDescriptor(&mut plan.conv),
                "convolution descriptor",
            )?;
            let nchw = dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
            let four = |s: [usize; 4], what| -> Result<[i32; 4]> {
                Ok([
                    int(s[0], what)?,
                    int(s[1], what)?,
                    int(s[2], what)?,
                    int(s[3], what)?,
                ])
            };
            let [n, c, hh, ww] = four(key.x, "input size")?;
            check(
                dn::cudnnSetTensor4dDescriptor(plan.x, nchw, data, n, c, hh, ww),
                "cudnnSetTensor4dDescriptor (input)",
            )?;
            let [n, o, oh, ow] = four(key.y, "output size")?;
            check(
                dn::cudnnSetTensor4dDescriptor(plan.y, nchw, data, n, o, oh, ow),
                "cudnnSetTensor4dDescriptor (output)",
            )?;
            let [k, cg, kh, kw] = four(key.w, "weight size")?;
            check(
                dn::cudnnSetFilter4dDescriptor(plan.w, data, nchw, k, cg, kh, kw),
                "cudnnSetFilter4dDescriptor",
            )?;
            check(
                dn::cudnnSetConvolution2dDescriptor(
                    plan.conv,
                    int(g.padding[0], "padding")?,
                    int(g.padding[1], "padding")?,
                    int(g.stride[0], "stride")?,
                    int(g.stride[1], "stride")?,
                    int(g.dilation[0], "dilation")?,
                    int(g.dilation[1], "dilation")?,
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
                "cudnnSetConvolution2dDescriptor",
            )?;
            check(
                dn::cudnnSetConvolutionGroupCount(plan.conv, int(g.groups, "group count")?),
                "cudnnSetConvolutionGroupCount",
            )?;
            // The legacy API's default math leaves tensor cores out for 16-bit floats and TF32
            // (measured: bf16 and TF32 ran at f32's rate, 0.3-0.7x PyTorch's, on an H200).
            let math = match key.dtype {
                DType::F64 => dn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
                _ if fma_only => dn::cudnnMathType_t::CUDNN_FMA_MATH,
                _ => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            };
            check(
                dn::cudnnSetConvolutionMathType(plan.conv, math),
                "cudnnSetConvolutionMathType",
            )?;
            // Timing needs memory of cuDNN's own: where it fails, the heuristics choose.
            let chosen = match benchmarks() {
                true => choose(h, &plan, key.pass, fma_only, true)
                    .or_else(|_| choose(h, &plan, key.pass, fma_only, false)),
                false => choose(h, &plan, key.pass, fma_only, false),
            };
            let (algo, math, workspace) = chosen?;
            plan.algo_name = format!("{algo:?}, {math:?}");
            plan.algo = algo;
            plan.workspace = workspace;
            // Where the graph cannot be built the legacy calls run the shape (the profiler
            // says why).
            if graphs() {
                match graph::build(h, key, data, compute) {
                    Ok(g) => {
                        plan.workspace = plan.workspace.max(g.workspace);
                        plan.algo_name = format!(
                            "engine {} (cuDNN graph; unaligned operands: {})",
                            g.engine, plan.algo_name
                        );
                        plan.graph = Some(g);
                    }
                    Err(e) => plan.algo_name = format!("{} (no cuDNN graph: {e})", plan.algo_name),
                }
            }
        }
        Ok(plan)
    }

    /// Enqueues `call` on `stream`, its workspace at `workspace` (0 for none).
    pub(crate) fn run(&self, call: &ConvCall, workspace: u64, stream: CUstream) -> Result<()> {
        let handle = self.handle()?.lock_unpoisoned();
        let p = &call.plan;
        if let Some(g) = &p.graph {
            if graph::aligned(&[call.x, call.w, call.y, workspace]) {
                // SAFETY: the handle is live and used under its lock; the operands are the
                // contiguous ones core allocated, the workspace a scratch buffer of the plan's
                // size alive until the call is enqueued; the plan was built for this shape on
                // this handle.
                return unsafe {
                    graph::execute(handle.0, g, [call.x, call.w, call.y], workspace, stream)
                };
            }
        }
        let (one64, zero64, one32, zero32) = (1.0f64, 0.0f64, 1.0f32, 0.0f32);
        let (alpha, beta) = if p.key.dtype == DType::F64 {
            (
                &one64 as *const f64 as *const std::ffi::c_void,
                &zero64 as *const f64 as *const std::ffi::c_void,
            )
        } else {
            (
                &one32 as *const f32 as *const std::ffi::c_void,
                &zero32 as *const f32 as *const std::ffi::c_void,
            )
        };
        let ptr = |a: u64| a as *mut std::ffi::c_void;
        let ws = ptr(workspace);
        // SAFETY: the handle is live and used under its lock; the plan's descriptors describe
        // the contiguous operands core allocated (checked when the step was planned) and the
        // workspace is a scratch buffer of the plan's size alive until the call is enqueued
        // (its free is stream-ordered); α and β outlive the call.
        unsafe {
            check(
                dn::cudnnSetStream(handle.0, stream as dn::cudaStream_t),
                "cudnnSetStream",
            )?;
            let status = match p.algo {
                Algo::Forward(a) => dn::cudnnConvolutionForward(
                    handle.0,
                    alpha,
                    p.x,
                    ptr(call.x),
                    p.w,
                    ptr(call.w),
                    p.conv,
                    a,
                    ws,
                    p.workspace,
                    beta,
                    p.y,
                    ptr(call.y),
                ),
                Algo::BackwardData(a) => dn::cudnnConvolutionBackwardData(
                    handle.0,
                    alpha,
                    p.w,
                    ptr(call.w),
                    p.y,
                    ptr(call.y),
                    p.conv,
                    a,
                    ws,
                    p.workspace,
                    beta,
                    p.x,
                    ptr(call.x),
                ),
                Algo::BackwardFilter(a) => dn::cudnnConvolutionBackwardFilter(
                    handle.0,
                    alpha,
                    p.x,
                    ptr(call.x),
                    p.y,
                    ptr(call.y),
                    p.conv,
                    a,
                    ws,
                    p.workspace,
                    beta,
                    p.w,
                    ptr(call.w),
                ),
            };
            check(status, "convolution")
        }
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.plans.lock_unpoisoned().clear();
        if let Some(Ok(h)) = self.handle.get() {
            // SAFETY: the handle was made by this `Dnn` and is destroyed once, after its plans.
            unsafe { dn::cudnnDestroy(h.lock_unpoisoned().0) };
        }
    }
}

/// True when a new shape's algorithm is chosen by timing cuDNN's candidates
/// (`cudnnFindConvolution…Algorithm`, as PyTorch's `cudnn.benchmark = True`), the default;
/// `STRATA_CUDNN_BENCHMARK=0` takes the heuristics' ranking instead (PyTorch's default),
/// which costs nothing at a shape's first call but ran up to 1.8× slower on an H200.
fn benchmarks() -> bool {
    std::env::var("STRATA_CUDNN_BENCHMARK").map_or(true, |v| v != "0")
}

/// True when a shape's convolution runs as a cuDNN graph with its plan built once (the
/// default); `STRATA_CUDNN_GRAPH=0` runs the legacy calls, which rebuild it at every call.
fn graphs() -> bool {
    std::env::var("STRATA_CUDNN_GRAPH").map_or(true, |v| v != "0")
}

/// How many ranked algorithms to ask cuDNN for.
const RANKED: usize = 16;

/// The first algorithm cuDNN ranks for `pass` (by timing them when `timed`, else by its
/// heuristics) whose status is success and whose
/// workspace fits [`MAX_WORKSPACE`]: `(algo, its math type, workspace bytes)`, with the
/// convolution descriptor left at that math type (FMAs only when `fma_only`).
///
/// # Safety
/// `h` is a live handle used under its lock; the plan's descriptors are set.
unsafe fn choose(
    h: dn::cudnnHandle_t,
    p: &ConvPlan,
    pass: ConvPass,
    fma_only: bool,
    timed: bool,
) -> Result<(Algo, dn::cudnnMathType_t, usize)> {
    let mut count = 0i32;
    let ok = dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS;
    let ranking = match timed {
        true => "timing (cudnnFindConvolution…Algorithm)",
        false => "ranking (cudnnGetConvolution…Algorithm_v7)",
    };
    // One pass's ranking call over its descriptors in cuDNN's order: the successful entries.
    macro_rules! rank {
        ($algo:ident, $perf:ty, $find:path, $get:path, $d0:expr, $d1:expr, $d2:expr) => {{
            let mut perf = [std::mem::zeroed::<$perf>(); RANKED];
            let call = if timed { $find } else { $get };
            let (n, out) = (RANKED as i32, perf.as_mut_ptr());
            check(call(h, $d0, $d1, p.conv, $d2, n, &mut count, out), ranking)?;
            let found = perf.iter().take(count.max(0) as usize);
            found
                .filter(|r| r.status == ok)
                .map(|r| (Algo::$algo(r.algo), r.mathType))
                .collect::<Vec<_>>()
        }};
    }
    let ranked = match pass {
        ConvPass::Forward => rank!(
            Forward,
            dn::cudnnConvolutionFwdAlgoPerf_t,
            dn::cudnnFindConvolutionForwardAlgorithm,
            dn::cudnnGetConvolutionForwardAlgorithm_v7,
            p.x,
            p.w,
            p.y
        ),
        ConvPass::BackwardData => rank!(
            BackwardData,
            dn::cudnnConvolutionBwdDataAlgoPerf_t,
            dn::cudnnFindConvolutionBackwardDataAlgorithm,
            dn::cudnnGetConvolutionBackwardDataAlgorithm_v7,
            p.w,
            p.y,
            p.x
        ),
        ConvPass::BackwardFilter => rank!(
            BackwardFilter,
            dn::cudnnConvolutionBwdFilterAlgoPerf_t,
            dn::cudnnFindConvolutionBackwardFilterAlgorithm,
            dn::cudnnGetConvolutionBackwardFilterAlgorithm_v7,
            p.x,
            p.y,
            p.w
        ),
    };
    for (algo, math) in ranked {
        let math = match fma_only {
            true => dn::cudnnMathType_t::CUDNN_FMA_MATH,
            false => math,
        };
        check(
            dn::cudnnSetConvolutionMathType(p.conv, math),
            "cudnnSetConvolutionMathType",
        )?;
        let mut bytes = 0usize;
        let status = match algo {
            Algo::Forward(a) => {
                dn::cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, a, &mut bytes)
            }
            Algo::BackwardData(a) => dn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                h, p.w, p.y, p.conv, p.x, a, &mut bytes,
            ),
            Algo::BackwardFilter(a) => dn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                h, p.x, p.y, p.conv, p.w, a, &mut bytes,
            ),
        };
        if status == ok && bytes <= MAX_WORKSPACE {
            return Ok((algo, math, bytes));
        }
    }
    Err(Error::Unsupported(format!(
        "cuDNN has no {} algorithm for this shape within a {} MiB workspace",
        pass.name(),
        MAX_WORKSPACE >> 20
    )))
}
