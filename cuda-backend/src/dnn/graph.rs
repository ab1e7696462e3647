//! A convolution as a cuDNN graph (the backend API): the operation, the heuristics' engine
//! configurations and an execution plan built once per shape, so a call only binds its
//! pointers (a variant pack) and executes. The legacy calls (`cudnnConvolutionForward`, …)
//! rebuild that plan inside cuDNN 9 at every call: 90–160 µs of host time each in the small
//! CNN's step on an H200 host, about 40% of the step's host time.
//!
//! The plan is the first configuration of cuDNN's heuristics (mode A) that finalizes, keeps
//! the dtype's numerics (f32 without TF32: no tensor-core engine; no reduced-precision
//! reductions, no inputs converted down) and needs at most [`MAX_WORKSPACE`] bytes. Its
//! tensors are declared 16-byte aligned: a call whose operands are not runs the legacy path.

use super::{check, ConvKey, MAX_WORKSPACE};
use cudarc::cudnn::sys as dn;
use cudarc::driver::sys::CUstream;
use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as T;
use dn::cudnnBackendDescriptorType_t as D;
use std::ffi::c_void;
use strata_core::ir::ConvPass;
use strata_core::{DType, Result};

/// The byte alignment the plan's tensors are declared with.
pub(crate) const ALIGNMENT: u64 = 16;

/// The ids of the tensors x, w, y in a plan's variant pack.
const IDS: [i64; 3] = [1, 2, 3];

/// A backend descriptor, destroyed on drop.
#[derive(Debug)]
struct Desc(dn::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by `Desc::new`, destroyed once.
            unsafe { dn::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

impl Desc {
    fn new(kind: D) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: writes a new descriptor into `d`.
        check(
            unsafe { dn::cudnnBackendCreateDescriptor(kind, &mut d) },
            "cudnnBackendCreateDescriptor",
        )?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `values` of type `ty`.
    fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<()> {
        // SAFETY: `values` holds `len` elements of the type `ty` names.
        let status = unsafe {
            dn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        };
        check(status, &format!("cudnnBackendSetAttribute({name:?})"))
    }

    fn finalize(self) -> Result<Desc> {
        // SAFETY: a live descriptor.
        check(
            unsafe { dn::cudnnBackendFinalize(self.0) },
            "cudnnBackendFinalize",
        )?;
        Ok(self)
    }

    /// Reads up to `n` elements of attribute `name` (of type `ty`) into `out`: how many it
    /// holds (at most `n` were written).
    ///
    /// # Safety
    /// `out` has room for `n` elements of `ty` (null where `n` is 0).
    unsafe fn get(&self, name: A, ty: T, n: usize, out: *mut c_void) -> Result<usize> {
        let mut got = 0i64;
        check(
            dn::cudnnBackendGetAttribute(self.0, name, ty, n as i64, &mut got, out),
            &format!("cudnnBackendGetAttribute({name:?})"),
        )?;
        Ok(got.max(0) as usize)
    }

    /// Attribute `name`'s descriptors (up to `n`), each made of kind `kind`.
    fn descriptors(&self, name: A, kind: D, n: usize) -> Result<Vec<Desc>> {
        let mut made = (0..n)
            .map(|_| Desc::new(kind))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<dn::cudnnBackendDescriptor_t> = made.iter().map(|d| d.0).collect();
        let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
        // SAFETY: `raw` holds `n` live descriptors of the attribute's kind to fill.
        let got = unsafe { self.get(name, desc, n, raw.as_mut_ptr() as *mut c_void)? };
        made.truncate(got.min(n));
        Ok(made)
    }

    /// How many elements attribute `name` (of type `ty`) holds.
    fn count(&self, name: A, ty: T) -> Result<usize> {
        // SAFETY: a count query writes nothing.
        unsafe { self.get(name, ty, 0, std::ptr::null_mut()) }
    }

    /// The plain values of attribute `name` (as `W`, the size of its type `ty`): all of
    /// them (at most 16) where `n` is `None`, else the first `n`.
    fn values<W: Copy + Default>(&self, name: A, ty: T, n: Option<usize>) -> Result<Vec<W>> {
        let n = match n {
            Some(n) => n,
            None => self.count(name, ty)?,
        }
        .min(16);
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut out = [W::default(); 16];
        // SAFETY: `out` has room for `n` elements of the attribute's type (`W` of its size).
        let got = unsafe { self.get(name, ty, n, out.as_mut_ptr() as *mut c_void)? };
        Ok(out[..got.min(n)].to_vec())
    }
}

/// A shape's execution plan and what a call needs of it.
#[derive(Debug)]
pub(crate) struct GraphPlan {
    plan: Desc,
    /// The descriptors it was built from, kept as long as it is.
    _from: Vec<Desc>,
    /// Bytes of scratch memory the plan needs.
    pub workspace: usize,
    /// The engine's global index, for the profiler.
    pub engine: i64,
}

// SAFETY: the plan is a host object cuDNN only reads while executing, under the handle's lock.
unsafe impl Send for GraphPlan {}
unsafe impl Sync for GraphPlan {}

/// A 4-D contiguous tensor descriptor of `dims`, `id`, `data`.
fn tensor(dims: [usize; 4], id: i64, data: dn::cudnnDataType_t) -> Result<Desc> {
    let dims = dims.map(|d| d as i64);
    let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[data],
    )?;
    t.set(A::CUDNN_ATTR_TENSOR_DIMENSIONS, T::CUDNN_TYPE_INT64, &dims)?;
    t.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?;
    t.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[id])?;
    let align = [ALIGNMENT as i64];
    t.set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &align,
    )?;
    t.finalize()
}

/// Whether an engine's numerical notes keep `key`'s numerics: f32 without TF32 runs no
/// tensor-core engine; no dtype takes reduced-precision reductions or inputs converted down.
fn keeps_numerics(notes: &[u32], key: &ConvKey) -> bool {
    use dn::cudnnBackendNumericalNote_t as N;
    let has = |n: N| notes.contains(&(n as u32));
    let fma_only = key.dtype == DType::F32 && !key.tf32;
    !(has(N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
        || has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
        || (fma_only && has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE)))
}

/// Builds the plan of `key` on `handle` (data type `data`, accumulating in `compute`); `Err`
/// naming why each configuration of cuDNN's heuristics was passed over where none qualifies.
///
/// # Safety
/// `handle` is live and used under its lock.
pub(crate) unsafe fn build(
    handle: dn::cudnnHandle_t,
    key: &ConvKey,
    data: dn::cudnnDataType_t,
    compute: dn::cudnnDataType_t,
) -> Result<GraphPlan> {
    let [x, w, y] = [
        tensor(key.x, IDS[0], data)?,
        tensor(key.w, IDS[1], data)?,
        tensor(key.y, IDS[2], data)?,
    ];
    let g = &key.geometry;
    let pair = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[compute],
    )?;
    let mode = dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        T::CUDNN_TYPE_CONVOLUTION_MODE,
        &[mode],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        T::CUDNN_TYPE_INT64,
        &[2i64],
    )?;
    let int64 = T::CUDNN_TYPE_INT64;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        int64,
        &pair(g.dilation),
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        int64,
        &pair(g.stride),
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        int64,
        &pair(g.padding),
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        int64,
        &pair(g.padding),
    )?;
    let conv = conv.finalize()?;
    let (kind, [ax, aw, ay, aconv, aalpha, abeta]) = operation(key.pass);
    let op = Desc::new(kind)?;
    let desc = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    op.set(ax, desc, &[x.0])?;
    op.set(aw, desc, &[w.0])?;
    op.set(ay, desc, &[y.0])?;
    op.set(aconv, desc, &[conv.0])?;
    match key.dtype {
        DType::F64 => {
            op.set(aalpha, T::CUDNN_TYPE_DOUBLE, &[1.0f64])?;
            op.set(abeta, T::CUDNN_TYPE_DOUBLE, &[0.0f64])?;
        }
        _ => {
            op.set(aalpha, T::CUDNN_TYPE_FLOAT, &[1.0f32])?;
            op.set(abeta, T::CUDNN_TYPE_FLOAT, &[0.0f32])?;
        }
    }
    let op = op.finalize()?;
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, desc, &[op.0])?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    let graph = graph.finalize()?;
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, desc, &[graph.0])?;
    let heur_mode = dn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        T::CUDNN_TYPE_HEUR_MODE,
        &[heur_mode],
    )?;
    let heur = heur.finalize()?;
    let n = heur.count(A::CUDNN_ATTR_ENGINEHEUR_RESULTS, desc)?;
    let configs = heur.descriptors(
        A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
        D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        n,
    )?;
    let mut why = Vec::new();
    for cfg in configs {
        let mut engines = match cfg.descriptors(
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            D::CUDNN_BACKEND_ENGINE_DESCRIPTOR,
            1,
        ) {
            Ok(e) => e,
            Err(e) => {
                why.push(format!("engine: {e}"));
                continue;
            }
        };
        let Some(engine) = engines.pop() else {
            continue;
        };
        let notes: Vec<u32> = engine.values(
            A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            T::CUDNN_TYPE_NUMERICAL_NOTE,
            None,
        )?;
        if !keeps_numerics(&notes, key) {
            why.push(format!("notes {notes:?}"));
            continue;
        }
        let index: i64 = engine
            .values(
                A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                T::CUDNN_TYPE_INT64,
                Some(1),
            )
            .ok()
            .and_then(|v| v.first().copied())
            .unwrap_or(-1);
        let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        plan.set(
            A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
            T::CUDNN_TYPE_HANDLE,
            &[handle],
        )?;
        plan.set(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, desc, &[cfg.0])?;
        // A configuration that does not finalize does not run this shape: the next.
        let plan = match plan.finalize() {
            Ok(p) => p,
            Err(e) => {
                why.push(format!("engine {index}: {e}"));
                continue;
            }
        };
        let bytes: i64 = plan
            .values(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, int64, Some(1))?
            .first()
            .copied()
            .unwrap_or(0);
        if bytes < 0 || bytes as usize > MAX_WORKSPACE {
            why.push(format!("engine {index}: workspace {bytes}"));
            continue;
        }
        return Ok(GraphPlan {
            plan,
            _from: vec![x, w, y, conv, op, graph, cfg],
            workspace: bytes as usize,
            engine: index,
        });
    }
    Err(strata_core::Error::Unsupported(format!(
        "none of cuDNN's {n} engine configurations: {}",
        why.join("; ")
    )))
}

/// Whether `addresses` (the operands and the workspace) meet the plan's alignment.
pub(crate) fn aligned(addresses: &[u64]) -> bool {
    addresses.iter().all(|a| a % ALIGNMENT == 0)
}

/// Executes `plan` on `stream` over x, w, y at `ptrs` with its workspace at `workspace`.
///
/// # Safety
/// `handle` is live and used under its lock; the pointers are the plan's shape's operands
/// and a workspace of its size, alive until the work is enqueued (frees are stream-ordered).
pub(crate) unsafe fn execute(
    handle: dn::cudnnHandle_t,
    plan: &GraphPlan,
    ptrs: [u64; 3],
    workspace: u64,
    stream: CUstream,
) -> Result<()> {
    let pointers = ptrs.map(|p| p as *mut c_void);
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    let void = T::CUDNN_TYPE_VOID_PTR;
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        T::CUDNN_TYPE_INT64,
        &IDS,
    )?;
    pack.set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, void, &pointers)?;
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        void,
        &[workspace as *mut c_void],
    )?;
    let pack = pack.finalize()?;
    check(
        dn::cudnnSetStream(handle, stream as dn::cudaStream_t),
        "cudnnSetStream",
    )?;
    check(
        dn::cudnnBackendExecute(handle, plan.plan.0, pack.0),
        "cudnnBackendExecute",
    )
}

/// The pass's operation descriptor kind and its attributes for x, w, y, the convolution,
/// alpha and beta.
fn operation(pass: ConvPass) -> (D, [A; 6]) {
    match pass {
        ConvPass::Forward => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            ],
        ),
        ConvPass::BackwardData => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            ],
        ),
        ConvPass::BackwardFilter => (
            D::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            [
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                A::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            ],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dn::cudnnBackendNumericalNote_t as N;
    use strata_core::ir::ConvGeometry;

    #[test]
    fn engines_keep_the_dtypes_numerics() {
        let key = |dtype, tf32| ConvKey {
            pass: ConvPass::Forward,
            geometry: ConvGeometry {
                stride: [1, 1],
                padding: [1, 1],
                dilation: [1, 1],
                groups: 1,
            },
            dtype,
            tf32,
            x: [1, 1, 4, 4],
            w: [1, 1, 3, 3],
            y: [1, 1, 4, 4],
        };
        let core = [N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32];
        // Tensor cores: f32 only where TF32 is allowed; the 16-bit floats always.
        assert!(!keeps_numerics(&core, &key(DType::F32, false)));
        assert!(keeps_numerics(&core, &key(DType::F32, true)));
        assert!(keeps_numerics(&core, &key(DType::BF16, false)));
        assert!(keeps_numerics(&[], &key(DType::F32, false)));
        // Never a reduced-precision sum, nor inputs converted down.
        for note in [
            N::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
            N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
        ] {
            assert!(!keeps_numerics(&[note as u32], &key(DType::F16, false)));
        }
        assert!(aligned(&[0, 16, 4096]) && !aligned(&[16, 8]));
    }
}
