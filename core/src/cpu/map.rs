//! The CPU `Map` kernel: evaluates the expression tree a block of output elements at a time,
//! splitting large outputs across threads.

use super::strided::View;
use super::values::{binary, fma, select, unary, with_dtype, with_values, Prim, Values};
use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::ir::{Expr, KernelArgs, Node};

use super::strided::{BLOCK, PARALLEL_MIN};

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
        Node::Literal(bits) => Values::splat(Scalar::from_bits(e.dtype, *bits), len),
        Node::LinearIndex => Values::I64((start..start + len).map(|i| i as i64).collect()),
        Node::Philox { key, counter, word } => {
            let scalar = |k: usize| {
                cx.scalars
                    .get(k)
                    .map(|s| s.cast(crate::DType::U64, false).to_i128() as u64)
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "philox reads scalar {k}, but {} were given",
                            cx.scalars.len()
                        ))
                    })
            };
            let (key, base) = (scalar(*key)?, scalar(*counter)?);
            let key = [key as u32, (key >> 32) as u32];
            Values::U32(
                (start..start + len)
                    .map(|i| {
                        let c = base.wrapping_add(i as u64);
                        crate::random::philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], key)
                            [*word as usize]
                    })
                    .collect(),
            )
        }
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
    let out = crate::lower::operands::MapOperands::of(expr, args)?.out;
    let out_view = View::new(out)?;
    let inputs = args
        .inputs
        .iter()
        .map(View::new)
        .collect::<Result<Vec<_>>>()?;
    let cx = Context {
        inputs,
        scalars: &args.scalars,
    };
    let n = out.layout.numel();
    let threads = super::strided::threads();
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
