//! Float matmul through cuBLAS (`cublasGemmStridedBatchedEx`): f32 (TF32 only when the device
//! opted in), f64, f16 and bf16 with f32 accumulation. Strided operands are passed as they
//! are whenever cuBLAS can express their layout; `None` sends the caller to our kernel.

use crate::codegen::matmul::{as_blas, BlasMatrix};
use crate::driver::Raw;
use cudarc::cublas::sys as cb;
use cudarc::driver::sys;
use std::sync::Mutex;
use strata_core::lower::operands::MatmulOperands as Operands;
use strata_core::{DType, Error, Result};

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

    /// Runs `C = α·A·B + β·C` with cuBLAS, or returns `Ok(false)` when it cannot (dtype,
    /// layout, sizes past 32 bits).
    pub(crate) fn gemm(&self, ops: &Operands, tf32: bool, stream: sys::CUstream) -> Result<bool> {
        let (batch, m, k, n) = ops.dims;
        let dtype = ops.a.dtype;
        if ops.b.dtype != dtype || ops.c.dtype != dtype || k == 0 {
            return Ok(false);
        }
        let (data, compute) = match dtype {
            DType::F32 if tf32 => (
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
            _ => return Ok(false),
        };
        let fits = |v: usize| i32::try_from(v).is_ok();
        if ![batch, m, n, k].into_iter().all(fits) {
            return Ok(false);
        }
        let strides = |o: &strata_core::ir::Operand| {
            let s = o.layout.strides();
            (s[0], s[1], s[2])
        };
        let (a0, a1, a2) = strides(ops.a);
        let (b0, b1, b2) = strides(ops.b);
        let (c0, c1, c2) = strides(ops.c);
        // Row-major C [m, n] is column-major Cᵀ [n, m]: compute Cᵀ = Bᵀ·Aᵀ. A column-major C
        // (a transposed view) is computed directly as C = A·B.
        let c_rows = |cs: isize| if batch > 1 { cs } else { 0 };
        let plan: Option<(usize, usize, BlasMatrix, BlasMatrix, i64, i64, bool)> =
            if (c2 == 1 || n <= 1) && (m <= 1 || c1 as usize >= n.max(1)) && c1 >= 0 {
                let ldc = if m <= 1 { n.max(1) as i64 } else { c1 as i64 };
                let x = as_blas(k, n, (b1, b2), true, b0);
                let y = as_blas(m, k, (a1, a2), true, a0);
                x.zip(y)
                    .map(|(x, y)| (n, m, x, y, ldc, c_rows(c0) as i64, true))
            } else if (c1 == 1 || m <= 1) && (n <= 1 || c2 as usize >= m.max(1)) && c2 >= 0 {
                let ldc = if n <= 1 { m.max(1) as i64 } else { c2 as i64 };
                let x = as_blas(m, k, (a1, a2), false, a0);
                let y = as_blas(k, n, (b1, b2), false, b0);
                x.zip(y)
                    .map(|(x, y)| (m, n, x, y, ldc, c_rows(c0) as i64, false))
            } else {
                None
            };
        let Some((rows, cols, x, y, ldc, stride_c, swapped)) = plan else {
            return Ok(false);
        };
        if c0 < 0 || !fits(ldc as usize) {
            return Ok(false);
        }
        let (pa, pb, pc) = (
            crate::memory::element_ptr(ops.a)?,
            crate::memory::element_ptr(ops.b)?,
            crate::memory::element_ptr(ops.c)?,
        );
        let (px, py) = if swapped { (pb, pa) } else { (pa, pb) };
        let op = |t: bool| {
            if t {
                cb::cublasOperation_t::CUBLAS_OP_T
            } else {
                cb::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (alpha64, beta64) = (ops.alpha.to_f64(), ops.beta.to_f64());
        let (alpha32, beta32) = (alpha64 as f32, beta64 as f32);
        let (pal, pbe) = if dtype == DType::F64 {
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
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the handle is live and used under its lock; pointers are live device memory
        // of the sizes the layouts describe; α and β outlive the (host-pointer-mode) call.
        let status = unsafe {
            let s = cb::cublasSetStream_v2(handle.0, stream as cb::cudaStream_t);
            if s != cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Backend(format!("cublasSetStream failed: {s:?}")));
            }
            cb::cublasGemmStridedBatchedEx(
                handle.0,
                op(x.transpose),
                op(y.transpose),
                rows as i32,
                cols as i32,
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
                "cublasGemmStridedBatchedEx ({dtype}, {batch}×{m}×{k}×{n}) failed: {status:?}"
            )));
        }
        Ok(true)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let h = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: created by create_handle, destroyed once.
        unsafe { cb::cublasDestroy_v2(h.0) };
    }
}
