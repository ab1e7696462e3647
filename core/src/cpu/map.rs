//! The CPU `Map` kernel: evaluates the expression tree a block of output elements at a time,
//! splitting large outputs across threads.

use super::buffer::CpuBuffer;
use super::values::{binary, fma, select, unary, with_dtype, with_values, Prim, Values};
use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::ir::{Expr, KernelArgs, Node, Operand};
use crate::layout::Layout;

/// Elements per block: large enough to amortize dispatch, small enough to stay in L1/L2.
const BLOCK: usize = 2048;
/// Outputs at least this large are split across threads.
const PARALLEL_MIN: usize = 1 << 16;

/// A strided operand resolved to a raw base pointer.
struct View<'a> {
    base: *mut u8,
    layout: &'a Layout,
    contiguous: bool,
    itemsize: usize,
}

// SAFETY: threads write disjoint output elements (core rejects self-overlapping outputs) and
// only read inputs; the buffers outlive the scoped threads.
unsafe impl Send for View<'_> {}
unsafe impl Sync for View<'_> {}

impl<'a> View<'a> {
    fn new(op: &'a Operand) -> Result<View<'a>> {
        let buf = CpuBuffer::of(op.buffer.as_ref())?;
        if op.layout.numel() > 0 {
            let (lo, hi) = op.layout.span();
            let end = hi as usize * op.dtype.itemsize();
            if lo < 0 || end > buf.len() {
                return Err(Error::Index(format!(
                    "view {:?} of {} reaches outside its buffer of {} bytes",
                    op.layout,
                    op.dtype,
                    buf.len()
                )));
            }
        }
        Ok(View {
            base: buf.ptr(),
            layout: &op.layout,
            contiguous: op.layout.is_contiguous(),
            itemsize: op.dtype.itemsize(),
        })
    }

    /// Storage positions of row-major elements `start..start + len`.
    fn positions(&self, start: usize, len: usize, out: &mut Vec<usize>) {
        out.clear();
        let shape = self.layout.shape();
        let strides = self.layout.strides();
        let mut index = vec![0usize; shape.len()];
        let mut rest = start;
        for k in (0..shape.len()).rev() {
            index[k] = rest % shape[k];
            rest /= shape[k];
        }
        let mut pos = self.layout.position(&index) as isize;
        for _ in 0..len {
            out.push(pos as usize);
            // Odometer step: bump the innermost axis, carrying outwards.
            for k in (0..shape.len()).rev() {
                index[k] += 1;
                pos += strides[k];
                if index[k] < shape[k] {
                    break;
                }
                pos -= strides[k] * shape[k] as isize;
                index[k] = 0;
            }
        }
    }

    /// # Safety
    /// The view must lie inside its buffer (checked in `new`).
    unsafe fn load<T: Prim>(&self, start: usize, len: usize, scratch: &mut Vec<usize>) -> Vec<T> {
        let base = self.base as *const u8;
        if self.contiguous {
            let first = self.layout.offset() + start;
            (0..len)
                .map(|i| T::load(base.add((first + i) * self.itemsize)))
                .collect()
        } else {
            self.positions(start, len, scratch);
            scratch
                .iter()
                .map(|&p| T::load(base.add(p * self.itemsize)))
                .collect()
        }
    }

    /// # Safety
    /// As `load`; no other thread writes the same elements.
    unsafe fn store<T: Copy>(&self, start: usize, values: &[T], scratch: &mut Vec<usize>) {
        let base = self.base as *mut T;
        if self.contiguous {
            let dst = base.add(self.layout.offset() + start);
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst, values.len());
        } else {
            self.positions(start, values.len(), scratch);
            for (&p, &v) in scratch.iter().zip(values) {
                *base.add(p) = v;
            }
        }
    }
}

struct Context<'a> {
    inputs: Vec<View<'a>>,
    scalars: &'a [Scalar],
}

fn eval(
    e: &Expr,
    cx: &Context,
    start: usize,
    len: usize,
    scratch: &mut Vec<usize>,
) -> Result<Values> {
    Ok(match &e.node {
        Node::Input(k) => {
            let view = cx.inputs.get(*k).ok_or_else(|| {
                Error::Invalid(format!(
                    "map reads input {k}, but {} were given",
                    cx.inputs.len()
                ))
            })?;
            // SAFETY: bounds checked when the view was made.
            with_dtype!(e.dtype, T => T::wrap(unsafe { view.load::<T>(start, len, scratch) }))
        }
        Node::Scalar(k) => {
            let s = cx.scalars.get(*k).ok_or_else(|| {
                Error::Invalid(format!(
                    "map reads scalar {k}, but {} were given",
                    cx.scalars.len()
                ))
            })?;
            Values::splat(s.cast(e.dtype, false), len)
        }
        Node::LinearIndex => Values::I64((start..start + len).map(|i| i as i64).collect()),
        Node::Cast { arg, saturate } => {
            eval(arg, cx, start, len, scratch)?.cast(e.dtype, *saturate)
        }
        Node::Unary(op, a) => unary(*op, &eval(a, cx, start, len, scratch)?)?,
        Node::Fma(a, b, c) => fma(
            &eval(a, cx, start, len, scratch)?,
            &eval(b, cx, start, len, scratch)?,
            &eval(c, cx, start, len, scratch)?,
        )?,
        Node::Binary(op, a, b) => {
            let a = eval(a, cx, start, len, scratch)?;
            let b = eval(b, cx, start, len, scratch)?;
            binary(*op, &a, &b)?
        }
        Node::Where(c, a, b) => {
            let c = eval(c, cx, start, len, scratch)?.into_bool();
            select(
                &c,
                &eval(a, cx, start, len, scratch)?,
                &eval(b, cx, start, len, scratch)?,
            )?
        }
    })
}

impl Values {
    fn into_bool(self) -> Vec<bool> {
        match self {
            Values::Bool(b) => b,
            other => other.cast(crate::DType::Bool, false).into_bool(),
        }
    }
}

/// Runs `expr` for output elements `range`.
fn run_range(expr: &Expr, cx: &Context, out: &View, range: std::ops::Range<usize>) -> Result<()> {
    let mut scratch = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let len = BLOCK.min(range.end - start);
        let values = eval(expr, cx, start, len, &mut scratch)?;
        debug_assert_eq!(values.len(), len);
        // SAFETY: bounds checked in View::new; ranges of different threads are disjoint.
        // bool is stored as one byte holding 0 or 1, which is Rust's representation of bool.
        with_values!(&values, v: T => unsafe { out.store::<T>(start, v, &mut scratch) });
        start += len;
    }
    Ok(())
}

/// Executes a `Map` kernel.
pub(crate) fn run(expr: &Expr, args: &KernelArgs) -> Result<()> {
    let [out] = args.outputs.as_slice() else {
        return Err(Error::Invalid(format!(
            "a map writes one output, {} were given",
            args.outputs.len()
        )));
    };
    if out.dtype != expr.dtype {
        return Err(Error::Invalid(format!(
            "map expression of {} written to an output of {}",
            expr.dtype, out.dtype
        )));
    }
    let out_view = View::new(out)?;
    let inputs = args
        .inputs
        .iter()
        .map(|op| {
            if op.layout.shape() != out.layout.shape() {
                return Err(Error::Shape(format!(
                    "map input of shape {:?} for an output of shape {:?}",
                    op.layout.shape(),
                    out.layout.shape()
                )));
            }
            View::new(op)
        })
        .collect::<Result<Vec<_>>>()?;
    let cx = Context {
        inputs,
        scalars: &args.scalars,
    };
    let n = out.layout.numel();
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if n < PARALLEL_MIN || threads == 1 {
        return run_range(expr, &cx, &out_view, 0..n);
    }
    // Split on block boundaries so each thread's blocks stay aligned.
    let per = n.div_ceil(threads).div_ceil(BLOCK) * BLOCK;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| (t * per).min(n)..((t + 1) * per).min(n))
            .filter(|r| !r.is_empty())
            .map(|r| {
                let (cx, out_view) = (&cx, &out_view);
                scope.spawn(move || run_range(expr, cx, out_view, r))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Backend("a CPU worker thread panicked".into())))
        })
    })
}
