//! A map's launch: core's plan (one piece: CUDA binds no windows) as a signature and its
//! argument words, and the launch shape the kernel wants.

use super::step::{MapLaunch, Step};
use crate::launch::{Args, Launch};
use crate::render::map::{applies_float_function, counter_pairs, two_vectors_a_thread, MapSig};
use strata_core::backend::{KernelArgs, Operand};
use strata_core::ir::Expr;
use strata_core::ir::MapTrees;
use strata_core::layout::Strides;
use strata_core::lower::map_plan::{self, Path};
use strata_core::lower::operands::MapOperands;
use strata_core::lower::pieces::BufferInfo;
use strata_core::target::Target;
use strata_core::Result;

/// The step of the map `expr` (and the further outputs `also`) over `args`; none for an empty
/// output.
pub(crate) fn steps<'k>(
    expr: &'k Expr,
    also: &'k [Expr],
    args: &KernelArgs,
    target: &Target,
) -> Result<Vec<Step<'k>>> {
    let ops = MapOperands::of_outputs(expr, also, args)?;
    let operands: Vec<&Operand> = ops.operands().collect();
    let buffers: Vec<BufferInfo> = operands
        .iter()
        .map(|o| crate::memory::buffer_info(o))
        .collect::<Result<_>>()?;
    let positional = expr.reads_linear_index();
    let planned = map_plan::plan(&ops, positional, &buffers, target)?;
    let Some(piece) = planned.pieces.into_iter().next() else {
        return Ok(Vec::new());
    };
    let addresses: Vec<(u64, Strides)> = operands
        .iter()
        .zip(&piece.operands)
        .zip(&buffers)
        .map(|((o, p), b)| {
            let address = b.address + (p.offset * o.dtype.itemsize()) as u64;
            (address, p.strides.clone())
        })
        .collect();
    let mut words = Args::new();
    words.push(piece.numel as u64);
    for &n in &piece.shape {
        words.push(n as u64);
    }
    for ((address, strides), planned) in addresses.iter().zip(&piece.operands) {
        words.push(*address);
        if planned.path != Path::Contiguous {
            for &s in strides {
                words.push(s as i64 as u64);
            }
        }
    }
    let scalars: Vec<u64> = ops.scalars.iter().map(|s| s.bits()).collect();
    words.0.extend_from_slice(&scalars);
    let sig = MapSig {
        trees: MapTrees::borrowed(expr, also),
        dtypes: operands.iter().map(|o| o.dtype).collect(),
        paths: piece.operands.iter().map(|o| o.path).collect(),
        scalars: ops.scalars.iter().map(|s| s.dtype()).collect(),
        rank: piece.shape.len(),
        vector: piece.vector,
        wide: piece.wide,
    };
    // Random draws read the position: other maps skip these tree walks. (Further outputs
    // are subtrees of output 0's tree, so its walk covers them.)
    let draws = positional && expr.draws_random();
    // Where a warp shares each counter between two vectors, a thread draws for two vectors;
    // maps bound by arithmetic take two vectors a thread too.
    let work = if (draws && counter_pairs(&sig)) || two_vectors_a_thread(&sig, draws) {
        piece.work.div_ceil(2)
    } else {
        piece.work
    };
    // A thread that draws computes Philox's round keys before its first item; where the
    // draws then go through float functions (randn's log, square root and sine) the kernel is
    // bound by arithmetic, and threads looping over many items spare that set-up (randn of
    // 2^28 on an H100: 0.66 -> 0.56 ms). Draws stored as they are (rand, randint) run at
    // bandwidth, where the full grid is as fast or faster (randint 3% faster).
    let launch = if draws && applies_float_function(expr) {
        Launch::looping(words, work)
    } else {
        Launch::linear(words, work)
    };
    let launch = MapLaunch {
        launch,
        numel: piece.numel,
        shape: piece.shape,
        operands: addresses,
        scalars,
    };
    Ok(vec![Step::Map { sig, launch }])
}

#[cfg(test)]
mod tests {
    #[test]
    fn threads_loop_where_random_draws_go_through_float_functions() {
        assert!(super::applies_float_function(
            &strata_core::random::randn_f32_expr()
        ));
        // rand's shape of tree: a Philox word's top bits, scaled (no float function).
        use strata_core::ir::{BinaryOp, Expr, Node, PhiloxWord};
        use strata_core::DType;
        let word = PhiloxWord {
            key: 0,
            counter: 1,
            word: 0,
            per_counter: 4,
            shared: 1,
        };
        let bits = Expr {
            dtype: DType::U32,
            node: Node::Philox(word),
        };
        let rand = Expr::binary(
            BinaryOp::Mul,
            bits.cast(DType::F32, false),
            Expr::scalar(2, DType::F32),
        );
        assert!(!super::applies_float_function(&rand));
    }
}
