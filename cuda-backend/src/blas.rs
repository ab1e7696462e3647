//! cuBLAS: one handle per device, and running a planned call ([`GemmCall`], planned by `run::matmul`):
//! `cublasGemmStridedBatchedEx` for f32 (TF32 only when the device opted in), f64, f16 and
//! bf16 with f32 accumulation.

use crate::driver::Raw;
use cudarc::cublas::sys as cb;
use cudarc::driver::sys;
use std::sync::Mutex;
use strata_core::sync::LockUnpoisoned;
use strata_core::{DType, Error, Result};

/// A `cublasGemmStridedBatchedEx` call, planned: `C = α·op(X)·op(Y) + β·C` over column-major
/// operands (a row-major product is computed as its transpose, `Cᵀ = Bᵀ·Aᵀ`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GemmCall {
    /// The operands' dtype (f32, f64, f16 or bf16).
    pub dtype: DType,
    /// f32 products through TF32.
    pub tf32: bool,
    /// The user's `(batch, m, k, n)`.
    pub dims: (usize, usize, usize, usize),
    /// cuBLAS's rows and columns of C.
    pub rows: usize,
    pub cols: usize,
    /// The first and second operand: address, and layout as cuBLAS sees it.
    pub x: (u64, BlasMatrix),
    pub y: (u64, BlasMatrix),
    /// C's address, leading dimension and batch stride.
    pub c: (u64, i64, i64),
    pub alpha: f64,
    pub beta: f64,
}

/// One operand as cuBLAS sees it (column-major): transpose or not, leading dimension,
/// batch stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlasMatrix {
    pub transpose: bool,
    pub ld: i64,
    pub batch_stride: i64,
}

/// One cuBLAS handle per device, pointed at each launch's stream.
pub(crate) struct Blas {
    handle: Mutex<Raw<cb::cublasHandle_t>>,
}

impl Blas {
    /// A handle, or `None` when the cuBLAS library is missing (our kernel then runs).
    pub(crate) fn new() -> Option<Blas> {
        // SAFETY: only asks the loader whether the library can be opened.
        if !unsafe { cb::is_culib_present() } {
            return None;
        }
        let handle = cudarc::cublas::result::create_handle().ok()?;
        Some(Blas {
            handle: Mutex::new(Raw(handle)),
        })
    }

    /// Enqueues `call` on `stream`.
    pub(crate) fn run(&self, call: &GemmCall, stream: sys::CUstream) -> Result<()> {
        let (data, compute) = match call.dtype {
            DType::F32 if call.tf32 => (
                cb::cudaDataType::CUDA_R_32F,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            DType::F32 => (
                cb::cudaDataType::CUDA_R_32F,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::F64 => (
                cb::cudaDataType::CUDA_R_64F,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            ),
            DType::F16 => (
                cb::cudaDataType::CUDA_R_16F,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            DType::BF16 => (
                cb::cudaDataType::CUDA_R_16BF,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            other => {
                return Err(Error::Backend(format!(
                    "internal error: a cuBLAS call planned for {other}"
                )))
            }
        };
        let op = |t: bool| {
            if t {
                cb::cublasOperation_t::CUBLAS_OP_T
            } else {
                cb::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha64, beta64) = (call.alpha, call.beta);
        let (alpha32, beta32) = (alpha64 as f32, beta64 as f32);
        let (pal, pbe) = if call.dtype == DType::F64 {
            (
                &alpha64 as *const f64 as *const std::ffi::c_void,
                &beta64 as *const f64 as *const std::ffi::c_void,
            )
        } else {
            (
                &alpha32 as *const f32 as *const std::ffi::c_void,
                &beta32 as *const f32 as *const std::ffi::c_void,
            )
        };
        let ((px, x), (py, y), (pc, ldc, stride_c)) = (call.x, call.y, call.c);
        let (batch, m, k, n) = call.dims;
        let handle = self.handle.lock_unpoisoned();
        // SAFETY: the handle is live and used under its lock; the planner checked that every
        // size fits 32 bits and that the pointers and leading dimensions describe live device
        // memory of the operands; α and β outlive the (host-pointer-mode) call.
        let status = unsafe {
            let s = cb::cublasSetStream_v2(handle.0, stream as cb::cudaStream_t);
            if s != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Backend(format!("cublasSetStream failed: {s:?}")));
            }
            cb::cublasGemmStridedBatchedEx(
                handle.0,
                op(x.transpose),
                op(y.transpose),
                call.rows as i32,
                call.cols as i32,
                k as i32,
                pal,
                px as *const std::ffi::c_void,
                data,
                x.ld as i32,
                x.batch_stride,
                py as *const std::ffi::c_void,
                data,
                y.ld as i32,
                y.batch_stride,
                pbe,
                pc as *mut std::ffi::c_void,
                data,
                ldc as i32,
                stride_c,
                batch as i32,
                compute,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend(format!(
                "cublasGemmStridedBatchedEx ({}, {batch}×{m}×{k}×{n}) failed: {status:?}",
                call.dtype
            )));
        }
        Ok(())
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let h = self.handle.lock_unpoisoned();
        // SAFETY: created by create_handle, destroyed once.
        unsafe { cb::cublasDestroy_v2(h.0) };
    }
}
