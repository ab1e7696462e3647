//! The CPU `Reduce` kernel: for each output element, folds the reduced axes a block at a time;
//! many outputs are split across threads, and so is one long reduction.

use super::block::{with_block, with_dtype, Block, Prim};
use super::strided::{threads, View, BLOCK, PARALLEL_MIN};
use crate::backend::KernelArgs;
use crate::dtype::{DType, Scalar};
use crate::error::{Error, Result};
use crate::ir::ReduceOp;
use crate::layout::Layout;
use crate::lower::operands::ReduceOperands;
use crate::lower::pieces::BufferInfo;
use crate::lower::reduce_plan::{self, ReducePlan};
use crate::target::Target;

/// A partial result over part of one reduction, held in the IR's accumulator dtype: sums and
/// products of f16, bf16 and f32 round in f32 at every step, as on the GPUs (blocks combine
/// pairwise, so the rounding error grows with the logarithm of the extent).
#[derive(Debug, Clone, Copy)]
enum Partial {
    /// Float sums and products accumulated in f32.
    F32(f32),
    /// Float sums and products accumulated in f64.
    Float(f64),
    /// Integer sums and products wrap in 64 bits (the same bits for signed and unsigned).
    Int(i64),
    Bool(bool),
    /// The best element so far and its position; `None` before any element.
    Best(Option<(Scalar, usize)>),
}

fn is_nan(s: Scalar) -> bool {
    s.dtype().is_float() && s.to_f64().is_nan()
}

/// True when `a` should replace `b` as the running best (NaN wins, then the extreme value;
/// ties keep the earlier one, which the caller guarantees comes first).
fn better(op: ReduceOp, a: Scalar, b: Scalar) -> bool {
    if is_nan(b) {
        return false;
    }
    if is_nan(a) {
        return true;
    }
    let less = if a.dtype().is_float() {
        a.to_f64() < b.to_f64()
    } else {
        a.to_i128() < b.to_i128()
    };
    let greater = if a.dtype().is_float() {
        a.to_f64() > b.to_f64()
    } else {
        a.to_i128() > b.to_i128()
    };
    match op {
        ReduceOp::Min | ReduceOp::ArgMin => less,
        _ => greater,
    }
}

/// For `Min` and `Max` of zeros: -0 is below +0 (IEEE 754-2019's minimum and maximum), so the
/// result does not depend on the order elements are combined in. Positions (`ArgMin`,
/// `ArgMax`) treat the two zeros as equal and keep the first.
fn signed_zero_wins(op: ReduceOp, candidate: f64, best: f64) -> bool {
    candidate == 0.0
        && best == 0.0
        && candidate.is_sign_negative() != best.is_sign_negative()
        && match op {
            ReduceOp::Min => candidate.is_sign_negative(),
            ReduceOp::Max => best.is_sign_negative(),
            _ => false,
        }
}

impl Partial {
    fn identity(op: ReduceOp, acc: DType) -> Partial {
        match op {
            ReduceOp::Sum if acc == DType::F32 => Partial::F32(0.0),
            ReduceOp::Prod if acc == DType::F32 => Partial::F32(1.0),
            ReduceOp::Sum if acc.is_float() => Partial::Float(0.0),
            ReduceOp::Prod if acc.is_float() => Partial::Float(1.0),
            ReduceOp::Sum => Partial::Int(0),
            ReduceOp::Prod => Partial::Int(1),
            ReduceOp::Any => Partial::Bool(false),
            ReduceOp::All => Partial::Bool(true),
            _ => Partial::Best(None),
        }
    }

    /// Combines with the partial of a later range.
    fn combine(self, later: Partial, op: ReduceOp) -> Partial {
        match (self, later) {
            (Partial::F32(a), Partial::F32(b)) if op == ReduceOp::Sum => Partial::F32(a + b),
            (Partial::F32(a), Partial::F32(b)) => Partial::F32(a * b),
            (Partial::Float(a), Partial::Float(b)) if op == ReduceOp::Sum => Partial::Float(a + b),
            (Partial::Float(a), Partial::Float(b)) => Partial::Float(a * b),
            (Partial::Int(a), Partial::Int(b)) if op == ReduceOp::Sum => {
                Partial::Int(a.wrapping_add(b))
            }
            (Partial::Int(a), Partial::Int(b)) => Partial::Int(a.wrapping_mul(b)),
            (Partial::Bool(a), Partial::Bool(b)) if op == ReduceOp::Any => Partial::Bool(a || b),
            (Partial::Bool(a), Partial::Bool(b)) => Partial::Bool(a && b),
            (Partial::Best(Some(a)), Partial::Best(Some(b))) => {
                let zero =
                    a.0.dtype().is_float() && signed_zero_wins(op, b.0.to_f64(), a.0.to_f64());
                Partial::Best(Some(if better(op, b.0, a.0) || zero { b } else { a }))
            }
            (Partial::Best(a), Partial::Best(b)) => Partial::Best(a.or(b)),
            (a, _) => a,
        }
    }

    fn result(self, op: ReduceOp, out: DType) -> Result<Scalar> {
        Ok(match self {
            Partial::F32(v) => Scalar::F32(v).cast(out, false),
            Partial::Float(v) => Scalar::F64(v).cast(out, false),
            Partial::Int(v) => Scalar::I64(v).cast(out, false),
            Partial::Bool(b) => Scalar::Bool(b).cast(out, false),
            Partial::Best(Some((_, i))) if op.returns_index() => {
                Scalar::I64(i as i64).cast(out, false)
            }
            Partial::Best(Some((v, _))) => v.cast(out, false),
            Partial::Best(None) => {
                return Err(Error::Invalid(format!("{op:?} over an empty extent")))
            }
        })
    }
}

/// Sums with eight independent accumulators, so the loop vectorizes.
fn sum_lanes<T: Copy + std::ops::Add<Output = T> + Default>(x: &[T]) -> T {
    let mut acc = [T::default(); 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..8 {
            acc[k] = acc[k] + c[k];
        }
    }
    let mut total = rest.iter().fold(T::default(), |a, &b| a + b);
    for a in acc {
        total = total + a;
    }
    total
}

/// The best element of a block and its index within the block.
fn best_of<T: Prim + PartialOrd>(x: &[T], op: ReduceOp) -> Option<(T, usize)> {
    let mut best: Option<(T, usize)> = None;
    for (i, &v) in x.iter().enumerate() {
        #[allow(clippy::eq_op)]
        let nan = v != v;
        match best {
            None => best = Some((v, i)),
            Some((b, _)) => {
                #[allow(clippy::eq_op)]
                let b_nan = b != b;
                if b_nan {
                    break;
                }
                let wins =
                    nan || match op {
                        ReduceOp::Min | ReduceOp::ArgMin => v < b,
                        _ => v > b,
                    } || (T::DTYPE.is_float() && signed_zero_wins(op, v.to_f64(), b.to_f64()));
                if wins {
                    best = Some((v, i));
                }
            }
        }
    }
    best
}

trait ToScalar {
    fn scalar(self) -> Scalar;
}
impl<T: crate::dtype::Element> ToScalar for T {
    fn scalar(self) -> Scalar {
        self.to_scalar()
    }
}

/// Folds one block of values (positions `first..`) into a partial.
fn fold_block(op: ReduceOp, acc: DType, block: &Block, first: usize) -> Partial {
    match (op, block) {
        // Float sums straight from the block, lane by lane (vectorizes).
        (ReduceOp::Sum, Block::F32(x)) if acc == DType::F32 => return Partial::F32(sum_lanes(x)),
        (ReduceOp::Sum, Block::F64(x)) if acc == DType::F64 => return Partial::Float(sum_lanes(x)),
        _ => {}
    }
    match op {
        ReduceOp::Sum | ReduceOp::Prod if acc == DType::F32 => {
            let Block::F32(v) = block.cast(DType::F32, false) else {
                unreachable!()
            };
            Partial::F32(if op == ReduceOp::Sum {
                sum_lanes(&v)
            } else {
                v.iter().product()
            })
        }
        ReduceOp::Sum | ReduceOp::Prod if acc.is_float() => {
            let Block::F64(v) = block.cast(DType::F64, false) else {
                unreachable!()
            };
            Partial::Float(if op == ReduceOp::Sum {
                sum_lanes(&v)
            } else {
                v.iter().product()
            })
        }
        ReduceOp::Sum | ReduceOp::Prod => {
            let Block::I64(v) = block.cast(DType::I64, false) else {
                unreachable!()
            };
            Partial::Int(if op == ReduceOp::Sum {
                v.iter().fold(0i64, |a, &b| a.wrapping_add(b))
            } else {
                v.iter().fold(1i64, |a, &b| a.wrapping_mul(b))
            })
        }
        ReduceOp::Any | ReduceOp::All => {
            let Block::Bool(v) = block.cast(DType::Bool, false) else {
                unreachable!()
            };
            Partial::Bool(if op == ReduceOp::Any {
                v.iter().any(|&b| b)
            } else {
                v.iter().all(|&b| b)
            })
        }
        _ => with_block!(block, x: T => Partial::Best(
            best_of(x, op).map(|(v, i)| (v.scalar(), first + i))
        )),
    }
}

/// Reduces elements `range` of the inner view.
fn reduce_range(
    op: ReduceOp,
    acc: DType,
    dtype: DType,
    inner: &View,
    range: std::ops::Range<usize>,
) -> Partial {
    // Block partials combine pairwise (a binary counter of levels), in order: earlier blocks
    // are always the left operand, so arg reductions keep the first best position.
    let mut levels: Vec<(u32, Partial)> = Vec::new();
    let mut scratch = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let len = BLOCK.min(range.end - start);
        // SAFETY: the inner view lies inside the input, whose bounds View::new checked.
        let block =
            with_dtype!(dtype, T => T::wrap(unsafe { inner.load::<T>(start, len, &mut scratch) }));
        let (mut level, mut partial) = (0, fold_block(op, acc, &block, start));
        while let Some(&(l, earlier)) = levels.last() {
            if l != level {
                break;
            }
            levels.pop();
            partial = earlier.combine(partial, op);
            level += 1;
        }
        levels.push((level, partial));
        start += len;
    }
    levels
        .into_iter()
        .fold(Partial::identity(op, acc), |a, (_, b)| a.combine(b, op))
}

/// Executes a `Reduce` kernel: core's plan for the CPU (ranges when there are fewer outputs
/// than threads), each range folded by one thread.
pub(crate) fn run(op: ReduceOp, reduced: usize, acc: DType, args: &KernelArgs) -> Result<()> {
    let ops = ReduceOperands::of(reduced, args)?;
    if ops.outputs == 0 {
        return Ok(());
    }
    let buffers = BufferInfo::of_operands(args);
    let plan = reduce_plan::plan(&ops, &buffers, &Target::cpu(threads()))?;
    run_plan(op, acc, &ops, &plan)
}

/// Executes a planned reduction of any target's plan: every range's partial, then each output
/// combines its ranges in order (as a combine launch does), so split plans and their windows
/// are tested here without a GPU.
pub(crate) fn run_plan(
    op: ReduceOp,
    acc: DType,
    ops: &ReduceOperands,
    plan: &ReducePlan,
) -> Result<()> {
    let (input, out) = (ops.input, ops.out);
    let ro = plan.outer_shape.len();
    // The reduced range of each split, in split order (the reduced windows of the first outer
    // window; every outer window repeats them).
    let mut ranges = Vec::with_capacity(plan.splits);
    for l in plan.launches.iter().filter(|l| l.piece.start[0] == 0) {
        let count: usize = l.piece.len[ro..].iter().product();
        for k in 0..l.splits {
            let lo = l.first_position + (k * l.chunk).min(count);
            ranges.push(lo..l.first_position + ((k + 1) * l.chunk).min(count));
        }
    }
    if ranges.len() != plan.splits {
        return Err(Error::Invalid(format!(
            "a reduce plan of {} splits lists {} ranges",
            plan.splits,
            ranges.len()
        )));
    }
    let outer = Layout::new(
        plan.outer_shape.clone(),
        plan.in_outer.clone(),
        input.layout.offset(),
    )?;
    let in_view = View::new(input)?;
    let out_view = View::new(out)?;
    let partial = |task: usize, scratch: &mut Vec<usize>| -> Result<Partial> {
        let (o, j) = (task / plan.splits, task % plan.splits);
        outer.positions_into(o, scratch);
        let inner_layout = Layout::new(
            plan.reduced_shape.clone(),
            plan.in_reduced.clone(),
            scratch[0],
        )?;
        let inner = in_view.with_layout(&inner_layout);
        Ok(reduce_range(
            op,
            acc,
            input.dtype,
            &inner,
            ranges[j].clone(),
        ))
    };
    let tasks = plan.outputs * plan.splits;
    let per_task = plan.extent.div_ceil(plan.splits).max(1);
    let workers = if tasks.saturating_mul(per_task) < PARALLEL_MIN {
        1
    } else {
        threads().min(tasks)
    };
    let per = tasks.div_ceil(workers);
    let parts: Vec<Partial> = if workers == 1 {
        // Small work on the calling thread: starting one costs more than a small reduction
        // (`batch_norm`'s forward over a [2, 8, 4, 4] batch: 749 µs with its two, 87 without).
        let mut scratch = Vec::new();
        (0..tasks)
            .map(|t| partial(t, &mut scratch))
            .collect::<Result<Vec<_>>>()?
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| (w * per).min(tasks)..((w + 1) * per).min(tasks))
                .map(|r| {
                    let partial = &partial;
                    s.spawn(move || -> Result<Vec<Partial>> {
                        let mut scratch = Vec::new();
                        r.map(|t| partial(t, &mut scratch)).collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Backend("a CPU worker thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<_>>>()
        })?
        .concat()
    };
    let mut scratch = Vec::new();
    for (o, splits) in parts.chunks(plan.splits).enumerate() {
        let folded = splits
            .iter()
            .fold(Partial::identity(op, acc), |a, &b| a.combine(b, op));
        let v = folded.result(op, out.dtype)?;
        // SAFETY: out bounds checked by View::new; each output index is written once.
        with_dtype!(out.dtype, T => unsafe {
            out_view.store::<T>(o, &[<T as crate::dtype::Element>::from_scalar(v)], &mut scratch)
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    /// A GPU-like target: groups, many slots, windows of `limit` bytes.
    fn gpu(limit: u64) -> Target {
        Target {
            parallel_slots: 1 << 12,
            items_per_thread: 8,
            group_sizes: &[1, 32, 256],
            row_groups: &[1],
            row_stage_bytes: 0,
            row_stage_group: 1,
            binding_limit: Some(limit),
            offset_align: 16,
            ..Target::cpu(1)
        }
    }

    #[test]
    fn split_and_windowed_plans_give_the_unsplit_result() {
        let dev = Device::cpu();
        let x = Tensor::arange(0, 6000, 1, DType::I64, &dev)
            .unwrap()
            .remainder(97)
            .unwrap()
            .reshape([6, 1000])
            .unwrap();
        for (view, kept) in [
            (x.clone(), vec![6]),
            (x.t().unwrap(), vec![1000]),
            (x.reshape([6000]).unwrap(), vec![]),
        ] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::ArgMin] {
                // Sums of i64 and positions are both i64.
                let want = Tensor::zeros(&kept, DType::I64, &dev).unwrap();
                let got = Tensor::zeros(&kept, DType::I64, &dev).unwrap();
                let args = |o: &Tensor| crate::backend::KernelArgs {
                    outputs: vec![o.operand().unwrap()],
                    inputs: vec![view.operand().unwrap()],
                    scalars: vec![],
                };
                let reduced = view.ndim() - kept.len();
                let (wa, ga) = (args(&want), args(&got));
                let acc = DType::I64;
                run(op, reduced, acc, &wa).unwrap();
                let ops = ReduceOperands::of(reduced, &ga).unwrap();
                let plan =
                    reduce_plan::plan(&ops, &BufferInfo::of_operands(&ga), &gpu(2048)).unwrap();
                assert!(
                    plan.splits > 1 || plan.launches.len() > 1,
                    "{op:?} {kept:?}"
                );
                run_plan(op, acc, &ops, &plan).unwrap();
                assert_eq!(
                    got.to_vec::<i64>().unwrap(),
                    want.to_vec::<i64>().unwrap(),
                    "{op:?} over {kept:?}"
                );
            }
        }
    }
}
