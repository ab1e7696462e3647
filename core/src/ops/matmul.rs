//! Matrix products: PyTorch's `matmul` shape rules, `dot`, and augpy's `gemm`, all lowered to
//! the batched, strided `Matmul` kernel.

use super::promote::promote_types;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::Kernel;
use crate::layout::broadcast_shapes;
use crate::tensor::{launch, Tensor};

/// The dtype a product of `a` and `b` computes in; bool is an `Err`.
fn product_dtype(a: &Tensor, b: &Tensor, what: &str) -> Result<DType> {
    a.same_device(b, what)?;
    let d = promote_types(a.dtype(), b.dtype());
    if d == DType::Bool {
        return Err(Error::DType(format!(
            "{what} is not defined for bool tensors; convert them with to_dtype"
        )));
    }
    Ok(d)
}

/// Runs `c = α·a·b + β·c` on 3-D views (batch already broadcast), converting `a` and `b` to
/// `c`'s dtype first.
fn launch_matmul(a: &Tensor, b: &Tensor, c: &Tensor, alpha: f64, beta: f64) -> Result<()> {
    let acc = c.dtype().accumulator();
    let acc = if c.dtype().is_float() {
        acc
    } else {
        DType::I64
    };
    let a = if a.dtype() == c.dtype() {
        a.clone()
    } else {
        a.to_dtype(c.dtype())?
    };
    let b = if b.dtype() == c.dtype() {
        b.clone()
    } else {
        b.to_dtype(c.dtype())?
    };
    let scalars = vec![
        Scalar::F64(alpha).cast(acc, false),
        Scalar::F64(beta).cast(acc, false),
    ];
    if matches!(c.dtype(), DType::F16 | DType::BF16)
        && c.device()
            .backend()
            .target()
            .widens_half_matmul
            .contains(&c.dtype())
    {
        // The f32 product of exact f32 copies, rounded once into C: the half kernel's numbers.
        let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
        a.realize()?;
        b.realize()?;
        let wide = if beta != 0.0 {
            c.to_dtype(DType::F32)?
        } else {
            Tensor::alloc(c.shape(), DType::F32, c.device())?
        };
        let kernel = Kernel::Matmul {
            acc: DType::F32,
            tf32: false,
        };
        launch(kernel, &wide, &[&a, &b], scalars)?;
        return c.assign(&wide);
    }
    let tf32 = acc == DType::F32 && c.device().allow_tf32();
    let (a, b) = match c.device().backend().target().k_major_tf32_from {
        Some(from) if tf32 => k_major_operand(a, b, from)?,
        _ => (a, b),
    };
    launch(Kernel::Matmul { acc, tf32 }, c, &[&a, &b], scalars)
}

/// `a` `[batch, m, k]` and `b` `[batch, k, n]` with the smaller one copied contiguous along
/// `k` when A is column-major, B row-major and the product has at least `from` multiply-adds
/// (see [`Target::k_major_tf32_from`](crate::target::Target::k_major_tf32_from)); as they are
/// otherwise. An operand broadcast along the batch is not copied (the copy would repeat it):
/// the other one is, where it is not broadcast too.
fn k_major_operand(a: Tensor, b: Tensor, from: u64) -> Result<(Tensor, Tensor)> {
    let (batch, m, k, n) = (a.shape()[0], a.shape()[1], a.shape()[2], b.shape()[2]);
    let (sa, sb) = (a.strides(), b.strides());
    // A column-major (along m) and B row-major (along n), as cuBLAS takes them: no other
    // layout, and no matrix of one row or column, whose layout cuBLAS reads either way.
    let a_along_m = sa[1] == 1 && sa[2] > 0;
    let b_along_n = sb[2] == 1 && sb[1] > 0;
    let work = [batch, m, k, n].iter().map(|&d| d as u64).product::<u64>();
    if !(a_along_m && b_along_n) || m < 2 || n < 2 || k < 2 || work < from {
        return Ok((a, b));
    }
    let copies = |t: &Tensor| batch == 1 || t.strides()[0] != 0;
    let (copy_a, copy_b) = (copies(&a), copies(&b));
    if copy_a && (m <= n || !copy_b) {
        Ok((a.contiguous()?, b))
    } else if copy_b {
        // Bᵀ contiguous: B column-major, each column's k values in a row.
        Ok((a, b.transpose(1, 2)?.contiguous()?.transpose(1, 2)?))
    } else {
        Ok((a, b))
    }
}

/// The inner-dimension check shared by every product.
fn check_inner(a: &[usize], b: &[usize], what: &str) -> Result<()> {
    let (ka, kb) = (a[a.len() - 1], b[b.len() - 2]);
    if ka != kb {
        return Err(Error::Shape(format!(
            "{what}: shapes {a:?} and {b:?} do not fit: inner dimensions {ka} and {kb} differ"
        )));
    }
    Ok(())
}

impl Tensor {
    /// The matrix product with PyTorch's rules: 1-D @ 1-D is a dot product (0-d), a 1-D
    /// operand gains a size-1 axis that is removed again, and axes before the last two are
    /// batch axes that broadcast. Any strides; the result dtype is the promoted one.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev).unwrap().reshape([2, 3]).unwrap();
    /// let b = Tensor::ones([3], DType::F32, &dev).unwrap();
    /// assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 12.0]);
    /// assert_eq!(a.matmul(&a.t().unwrap()).unwrap().shape(), &[2, 2]);
    /// assert!(a.matmul(&a).is_err());
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        if crate::autograd::needed([self, other]) {
            let out = crate::autograd::no_grad(|| self.matmul(other))?;
            return Ok(record_matmul(self, other, out));
        }
        let what = "matmul";
        let dtype = product_dtype(self, other, what)?;
        if self.ndim() == 0 || other.ndim() == 0 {
            return Err(Error::Shape(format!(
                "{what} needs operands of rank 1 or more, got shapes {:?} and {:?}",
                self.shape(),
                other.shape()
            )));
        }
        // 1-D operands become matrices, and the added axis is dropped from the result.
        let a = if self.ndim() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let b = if other.ndim() == 1 {
            other.unsqueeze(1)?
        } else {
            other.clone()
        };
        check_inner(a.shape(), b.shape(), what).map_err(|_| {
            Error::Shape(format!(
                "{what}: shapes {:?} and {:?} do not fit: inner dimensions {} and {} differ",
                self.shape(),
                other.shape(),
                a.shape()[a.ndim() - 1],
                b.shape()[b.ndim() - 2]
            ))
        })?;
        let (m, n) = (a.shape()[a.ndim() - 2], b.shape()[b.ndim() - 1]);
        let batch = broadcast_shapes(&a.shape()[..a.ndim() - 2], &b.shape()[..b.ndim() - 2])
            .map_err(|e| Error::Shape(format!("{what}: batch axes: {e}")))?;
        let full = |t: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
            let shape: Vec<usize> = batch.iter().copied().chain([rows, cols]).collect();
            let nb: usize = batch.iter().product();
            t.broadcast_to(shape)?.reshape_batch(nb)
        };
        let k = a.shape()[a.ndim() - 1];
        // Operands in the result's dtype, run before the result is allocated: what their
        // pending trees hold (a backward pass's saved activation and incoming gradient) is
        // freed first, so the peak holds the operand or those, not both (128 MiB less at the
        // MLP's peak).
        let to = |t: Tensor| {
            if t.dtype() == dtype {
                Ok(t)
            } else {
                t.to_dtype(dtype)
            }
        };
        let (a3, b3) = (to(full(&a, m, k)?)?, to(full(&b, k, n)?)?);
        a3.realize()?;
        b3.realize()?;
        let nb: usize = batch.iter().product();
        let out = Tensor::alloc(&[nb, m, n], dtype, self.device())?;
        launch_matmul(&a3, &b3, &out, 1.0, 0.0)?;
        let mut shape = batch;
        if self.ndim() > 1 {
            shape.push(m);
        }
        if other.ndim() > 1 {
            shape.push(n);
        }
        out.view(shape)
    }

    /// Collapses all axes before the last two into one batch axis of size `nb` (a view
    /// whenever the batch axes allow, else a copy).
    fn reshape_batch(&self, nb: usize) -> Result<Tensor> {
        let (r, c) = (self.shape()[self.ndim() - 2], self.shape()[self.ndim() - 1]);
        self.reshape([nb, r, c])
    }

    /// The dot product of two 1-D tensors of the same length, as a 0-d tensor.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let v = Tensor::from_slice(&[1i32, 2, 3], [3], &Device::cpu()).unwrap();
    /// assert_eq!(v.dot(&v).unwrap().item::<i32>().unwrap(), 14);
    /// ```
    pub fn dot(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 1 || other.ndim() != 1 || self.numel() != other.numel() {
            return Err(Error::Shape(format!(
                "dot needs two 1-D tensors of one length, got shapes {:?} and {:?}",
                self.shape(),
                other.shape()
            )));
        }
        self.matmul(other)
    }

    /// augpy's `gemm`: `c = α·op(a)·op(b) + β·c` in place, where `op` transposes the last two
    /// axes when asked. `c` has rank 2 or more; batch axes of `a` and `b` broadcast to `c`'s.
    /// With β = 0, `c`'s old values are not read.
    ///
    /// ```
    /// use strata_core::{Device, DType, Tensor};
    /// let dev = Device::cpu();
    /// let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [2, 2], &dev).unwrap();
    /// let c = Tensor::ones([2, 2], DType::F32, &dev).unwrap();
    /// Tensor::gemm(2.0, &a, &a, 1.0, &c, true, false).unwrap(); // 2·aᵀa + c
    /// assert_eq!(c.to_vec::<f32>().unwrap(), vec![21.0, 29.0, 29.0, 41.0]);
    /// ```
    pub fn gemm(
        alpha: f64,
        a: &Tensor,
        b: &Tensor,
        beta: f64,
        c: &Tensor,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<()> {
        let what = "gemm";
        if crate::autograd::needed([a, b]) {
            return Err(Error::Invalid(
                "gemm writes into c in place, which records no gradient: use matmul (and add \
                 or mul) for tensors that require one"
                    .into(),
            ));
        }
        product_dtype(a, b, what)?;
        c.same_device(a, what)?;
        crate::autograd::refuse_write_into(c)?;
        if a.ndim() < 2 || b.ndim() < 2 || c.ndim() < 2 {
            return Err(Error::Shape(format!(
                "{what} needs operands of rank 2 or more, got {:?}, {:?} and {:?}",
                a.shape(),
                b.shape(),
                c.shape()
            )));
        }
        let a = if trans_a {
            a.transpose(-1, -2)?
        } else {
            a.clone()
        };
        let b = if trans_b {
            b.transpose(-1, -2)?
        } else {
            b.clone()
        };
        check_inner(a.shape(), b.shape(), what)?;
        let (m, n, k) = (
            a.shape()[a.ndim() - 2],
            b.shape()[b.ndim() - 1],
            a.shape()[a.ndim() - 1],
        );
        let (cm, cn) = (c.shape()[c.ndim() - 2], c.shape()[c.ndim() - 1]);
        if (cm, cn) != (m, n) {
            return Err(Error::Shape(format!(
                "{what}: op(a) @ op(b) has {m}×{n} matrices, c has shape {:?}",
                c.shape()
            )));
        }
        let batch = &c.shape()[..c.ndim() - 2];
        let nb: usize = batch.iter().product();
        let expand = |t: &Tensor, r: usize, cols: usize| -> Result<Tensor> {
            let shape: Vec<usize> = batch.iter().copied().chain([r, cols]).collect();
            t.broadcast_to(shape)
                .map_err(|e| Error::Shape(format!("{what}: {e}")))?
                .reshape_batch(nb)
        };
        let (a3, b3) = (expand(&a, m, k)?, expand(&b, k, n)?);
        // C is written in place: its batch axes must collapse into one as a view.
        let c3 = c.view([nb, m, n]).map_err(|_| {
            Error::Shape(format!(
                "{what}: the batch axes of c (shape {:?}, strides {:?}) cannot be viewed as one",
                c.shape(),
                c.strides()
            ))
        })?;
        launch_matmul(&a3, &b3, &c3, alpha, beta)
    }
}

/// `out = a.matmul(b)` with its backward node: `g @ bᵀ` and `aᵀ @ g` on the operands as
/// matrices (1-D ones given the axis `matmul` gave them), summed over broadcast batch axes.
fn record_matmul(a: &Tensor, b: &Tensor, out: Tensor) -> Tensor {
    use crate::autograd::graph::Saved;
    let (sa, sb) = (Saved::new(a, "matmul"), Saved::new(b, "matmul"));
    let described = vec![sa.describe(), sb.describe()];
    let (need_a, need_b) = (a.requires_grad(), b.requires_grad());
    crate::autograd::record("MatmulBackward", &[a, b], out, described, move |g| {
        let (a, b) = (sa.get()?, sb.get()?);
        let a2 = if a.ndim() == 1 {
            a.unsqueeze(0)?
        } else {
            a.clone()
        };
        let b2 = if b.ndim() == 1 {
            b.unsqueeze(1)?
        } else {
            b.clone()
        };
        // The gradient with the axes matmul dropped for 1-D operands put back.
        let mut g2 = g.clone();
        if b.ndim() == 1 {
            g2 = g2.unsqueeze(-1)?;
        }
        if a.ndim() == 1 {
            g2 = g2.unsqueeze(-2)?;
        }
        // B's gradient first: its product may copy `aᵀ` along k (`k_major_operand`), and that
        // copy is freed before A's gradient, usually as large, is allocated.
        let gb = if need_b {
            let full = a2.transpose(-1, -2)?.matmul(&g2)?;
            let gb =
                crate::autograd::sum_to_shape(&full, b2.shape())?.reshape(b.shape().to_vec())?;
            Some(cast_to(gb, b.dtype())?)
        } else {
            None
        };
        let ga = if need_a {
            let full = g2.matmul(&b2.transpose(-1, -2)?)?;
            let ga =
                crate::autograd::sum_to_shape(&full, a2.shape())?.reshape(a.shape().to_vec())?;
            Some(cast_to(ga, a.dtype())?)
        } else {
            None
        };
        Ok(vec![ga, gb])
    })
}

/// `t` in `dtype` (itself when it has it).
fn cast_to(t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        t.to_dtype(dtype)
    }
}
