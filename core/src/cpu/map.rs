//! The CPU `Map` kernel: runs core's plan, evaluating the expression tree a block of output
//! elements at a time and splitting large pieces across threads.

use super::block::{binary, fma, select, unary, with_block, with_dtype, Block, Prim};
use super::strided::View;
use crate::backend::{KernelArgs, Operand};
use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::ir::{Expr, PhiloxWord};
use crate::layout::Layout;
use crate::lower::map_plan::{self, MapPlan, Position};
use crate::lower::operands::MapOperands;
use crate::lower::pieces::BufferInfo;
use crate::lower::program::{Lanes, Op, Program};
use crate::target::Target;

use super::strided::{BLOCK, PARALLEL_MIN};

struct Context<'a> {
    inputs: Vec<View<'a>>,
    scalars: &'a [Scalar],
    /// How element `i` of the piece maps to its row-major position in the whole output.
    position: &'a Position,
    shape: &'a [usize],
}

impl Context<'_> {
    /// The row-major positions of elements `start..start + len` of the piece.
    fn positions(&self, start: usize, len: usize) -> Vec<u64> {
        match self.position {
            Position::Unused | Position::Linear { .. } => {
                let base = match self.position {
                    Position::Linear { base } => *base,
                    _ => 0,
                };
                (start..start + len).map(|i| (base + i) as u64).collect()
            }
            Position::Strided { base, strides } => (start..start + len)
                .map(|i| {
                    let (mut rest, mut p) = (i, *base as isize);
                    for (&n, &st) in self.shape.iter().zip(strides).rev() {
                        p += (rest % n) as isize * st;
                        rest /= n;
                    }
                    p as u64
                })
                .collect(),
        }
    }
}

/// Evaluates `program` for elements `start..start + len` of the piece: each instruction over
/// the block, once, in order; a block is dropped after its last reader. Returns each
/// output's block.
fn eval(
    program: &Program,
    last_uses: &[usize],
    cx: &Context,
    start: usize,
    len: usize,
    scratch: &mut Vec<usize>,
) -> Result<Vec<Block>> {
    let mut blocks: Vec<Option<Block>> = vec![None; program.instrs.len()];
    for (i, instr) in program.instrs.iter().enumerate() {
        let block = match &instr.op {
            Op::Input { input, .. } => {
                let view = cx.inputs.get(*input).ok_or_else(|| {
                    Error::Invalid(format!(
                        "map reads input {input}, but {} were given",
                        cx.inputs.len()
                    ))
                })?;
                // SAFETY: bounds checked when the view was made.
                with_dtype!(instr.dtype, T => T::wrap(unsafe { view.load::<T>(start, len, scratch) }))
            }
            Op::Scalar(k) => {
                let s = cx.scalars.get(*k).ok_or_else(|| {
                    Error::Invalid(format!(
                        "map reads scalar {k}, but {} were given",
                        cx.scalars.len()
                    ))
                })?;
                Block::splat(s.cast(instr.dtype, false), len)
            }
            Op::Literal(bits) => Block::splat(Scalar::from_bits(instr.dtype, *bits), len),
            Op::Position { .. } => Block::I64(
                cx.positions(start, len)
                    .into_iter()
                    .map(|p| p as i64)
                    .collect(),
            ),
            Op::Philox(w) => philox(w, cx, start, len)?,
            Op::Word { .. } | Op::KnownWord { .. } => {
                return Err(Error::Invalid(
                    "internal error: the CPU evaluates each element's own draws".into(),
                ))
            }
            Op::Cast(a, saturate) => arg(&blocks, *a)?.cast(instr.dtype, *saturate),
            Op::Bitcast(a) => arg(&blocks, *a)?.bitcast(instr.dtype)?,
            Op::Unary(op, a) => unary(*op, arg(&blocks, *a)?)?,
            Op::Binary(op, a, b) => binary(*op, arg(&blocks, *a)?, arg(&blocks, *b)?)?,
            Op::Fma(a, b, c) => fma(arg(&blocks, *a)?, arg(&blocks, *b)?, arg(&blocks, *c)?)?,
            Op::Where(c, a, b) => {
                let cond = arg(&blocks, *c)?.clone().into_bool();
                select(&cond, arg(&blocks, *a)?, arg(&blocks, *b)?)?
            }
        };
        for a in instr.op.args() {
            if last_uses[a] == i {
                blocks[a] = None;
            }
        }
        blocks[i] = Some(block);
    }
    // Each output's block moved out (copied where a later output is the same value).
    let outputs = &program.outputs[0];
    (0..outputs.len())
        .map(|k| {
            let v = outputs[k];
            let block = if outputs[k + 1..].contains(&v) {
                blocks[v].clone()
            } else {
                blocks[v].take()
            };
            block.ok_or_else(missing)
        })
        .collect()
}

/// The error of a value read before it is made (instructions follow the values they read).
fn missing() -> Error {
    Error::Invalid("internal error: a map value read before it is made".into())
}

/// The block of value `k`.
fn arg(blocks: &[Option<Block>], k: usize) -> Result<&Block> {
    blocks[k].as_ref().ok_or_else(missing)
}

/// Philox word `w` of each element of the block.
fn philox(w: &PhiloxWord, cx: &Context, start: usize, len: usize) -> Result<Block> {
    let scalar = |k: usize| {
        cx.scalars
            .get(k)
            .map(|s| s.cast(crate::dtype::DType::U64, false).to_i128() as u64)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "philox reads scalar {k}, but {} were given",
                    cx.scalars.len()
                ))
            })
    };
    let (key, base) = (scalar(w.key)?, scalar(w.counter)?);
    let key = [key as u32, (key >> 32) as u32];
    Ok(Block::U32(
        cx.positions(start, len)
            .into_iter()
            .map(|i| {
                let c = base.wrapping_add(w.counter_of(i));
                crate::ir::philox4x32_10([c as u32, (c >> 32) as u32, 0, 0], key)[w.word_of(i)]
            })
            .collect(),
    ))
}

impl Block {
    fn into_bool(self) -> Vec<bool> {
        match self {
            Block::Bool(b) => b,
            other => other.cast(crate::dtype::DType::Bool, false).into_bool(),
        }
    }
}

/// A map's program (its trees, output 0's first) and when each value is last read.
struct Outputs {
    program: Program,
    last_uses: Vec<usize>,
}

/// Runs the map for output elements `range`, a block at a time.
fn run_range(
    outs: &Outputs,
    cx: &Context,
    views: &[View],
    range: std::ops::Range<usize>,
) -> Result<()> {
    let mut scratch = Vec::new();
    let mut start = range.start;
    while start < range.end {
        let len = BLOCK.min(range.end - start);
        let values = eval(&outs.program, &outs.last_uses, cx, start, len, &mut scratch)?;
        for (view, values) in views.iter().zip(&values) {
            debug_assert_eq!(values.len(), len);
            // SAFETY: bounds checked in View::new; ranges of different threads are disjoint.
            // bool is stored as one byte holding 0 or 1, which is Rust's representation of bool.
            with_block!(values, v: T => unsafe { view.store::<T>(start, v, &mut scratch) });
        }
        start += len;
    }
    Ok(())
}

/// Executes a `Map` kernel: core's plan for the CPU (one piece, axes coalesced). Work for one
/// thread runs on the operands' own layouts: a plan only coalesces axes there, and planning
/// costs more than it saves on a small map. `also`: a multi-output map's further outputs.
pub(crate) fn run(expr: &Expr, also: &[Expr], args: &KernelArgs) -> Result<()> {
    let ops = MapOperands::of_outputs(expr, also, args)?;
    let program = Program::build(std::iter::once(expr).chain(also), Lanes::one());
    let outs = Outputs {
        last_uses: program.last_uses(),
        program,
    };
    let numel = ops.out.layout.numel();
    if numel < PARALLEL_MIN {
        let operands: Vec<&Operand> = ops.operands().collect();
        let position = Position::Linear { base: 0 };
        return run_piece(
            &outs,
            &operands,
            ops.scalars,
            &position,
            ops.out.layout.shape(),
        );
    }
    let target = Target::cpu(super::strided::threads());
    let buffers = BufferInfo::of_operands(args);
    let plan = map_plan::plan(&ops, expr.reads_linear_index(), &buffers, &target)?;
    run_plan(&outs, &ops, &plan)
}

/// Executes a planned map of any target's plan, piece by piece (windows included), so the
/// planner's pieces and positions are tested here without a GPU.
fn run_plan(outs: &Outputs, ops: &MapOperands, plan: &MapPlan) -> Result<()> {
    for piece in &plan.pieces {
        let operands = ops
            .operands()
            .zip(&piece.operands)
            .map(|(o, p)| {
                let window_start = p.window.map_or(0, |w| w.byte_offset as usize);
                let offset = window_start / o.dtype.itemsize() + p.offset;
                Ok(Operand {
                    buffer: o.buffer.clone(),
                    layout: Layout::new(piece.shape.to_vec(), p.strides.to_vec(), offset)?,
                    dtype: o.dtype,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let operands: Vec<&Operand> = operands.iter().collect();
        run_piece(outs, &operands, ops.scalars, &piece.position, &piece.shape)?;
    }
    Ok(())
}

/// One piece: the outputs first in `operands`, inputs the rest, threads over blocks when it
/// is large.
fn run_piece(
    outs: &Outputs,
    operands: &[&Operand],
    scalars: &[Scalar],
    position: &Position,
    shape: &[usize],
) -> Result<()> {
    let n_out = outs.program.outputs[0].len();
    let views = operands[..n_out]
        .iter()
        .map(|o| View::new(o))
        .collect::<Result<Vec<_>>>()?;
    let inputs = operands[n_out..]
        .iter()
        .map(|o| View::new(o))
        .collect::<Result<Vec<_>>>()?;
    let cx = Context {
        inputs,
        scalars,
        position,
        shape,
    };
    let n: usize = shape.iter().product();
    let threads = super::strided::threads();
    if n < PARALLEL_MIN || threads == 1 {
        return run_range(outs, &cx, &views, 0..n);
    }
    // Split on block boundaries so each thread's blocks stay aligned.
    let per = n.div_ceil(threads).div_ceil(BLOCK) * BLOCK;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| (t * per).min(n)..((t + 1) * per).min(n))
            .filter(|r| !r.is_empty())
            .map(|r| {
                let (cx, views) = (&cx, &views);
                scope.spawn(move || run_range(outs, cx, views, r))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Backend("a CPU worker thread panicked".into())))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::BinaryOp;
    use crate::{DType, Device, Tensor};

    #[test]
    fn windowed_pieces_give_the_whole_result() {
        let dev = Device::cpu();
        let x = Tensor::arange(0, 40 * 30, 1, DType::F32, &dev)
            .unwrap()
            .reshape([40, 30])
            .unwrap();
        let xt = x.t().unwrap(); // [30, 40], column-wise
                                 // out = x.t() * 2 + position, so pieces must get their positions right too.
        let expr = Expr::binary(
            BinaryOp::Add,
            Expr::binary(
                BinaryOp::Mul,
                Expr::input(0, DType::F32),
                Expr::scalar(0, DType::F32),
            ),
            Expr::linear_index().cast(DType::F32, false),
        );
        let run_with = |target: &Target| {
            let out = Tensor::zeros([30, 40], DType::F32, &dev).unwrap();
            let args = KernelArgs {
                outputs: vec![out.operand().unwrap()],
                inputs: vec![xt.operand().unwrap()],
                scalars: vec![Scalar::F32(2.0)],
            };
            let ops = MapOperands::of(&expr, &args).unwrap();
            let buffers = BufferInfo::of_operands(&args);
            let plan = map_plan::plan(&ops, true, &buffers, target).unwrap();
            let program = Program::build(std::slice::from_ref(&expr), Lanes::one());
            let outs = Outputs {
                last_uses: program.last_uses(),
                program,
            };
            run_plan(&outs, &ops, &plan).unwrap();
            (plan.pieces.len(), out.to_vec::<f32>().unwrap())
        };
        let (one, whole) = run_with(&Target::cpu(1));
        let windowed = Target {
            binding_limit: Some(512),
            offset_align: 16,
            ..Target::cpu(1)
        };
        let (many, split) = run_with(&windowed);
        assert_eq!(one, 1);
        assert!(many > 4, "{many} pieces");
        assert_eq!(split, whole);
        assert_eq!(whole[41], 2.0 * x.to_vec::<f32>().unwrap()[30 + 1] + 41.0);
    }
}
