//! Every kernel variant the generator can produce for the IR's ops × dtypes, compiled with
//! NVRTC in one translation unit. The test needs only NVRTC, not a GPU: CI installs it from
//! PyPI, so a generator change that emits invalid CUDA C fails there, before the GPU machine.

use super::index::IndexSig;
use super::layer_norm::{LayerNormForwardSig, LayerNormSig};
use super::map::MapSig;
use super::matmul::MatmulSig;
use super::moments::{GradSumsSig, MomentsSig, Stage};
use super::reduce::ReduceSig;
use super::softmax::SoftmaxSig;
use strata_core::ir::MapTrees;
use strata_core::ir::{BinaryOp, Expr, IndexKind, ReduceOp, UnaryOp};
use strata_core::lower::legal::{binary_rule, unary_rule, Rule};
use strata_core::lower::map_plan::Path;
use strata_core::DType;

const UNARY: [UnaryOp; 32] = {
    use UnaryOp::*;
    [
        Neg, NegSat, Abs, Sign, Square, Sqrt, Rsqrt, Reciprocal, Exp, Exp2, Expm1, Log, Log2,
        Log10, Log1p, Sin, Cos, Tan, Tanh, Sigmoid, Relu, Gelu, Erf, Floor, Ceil, Round, Trunc,
        IsNan, IsInf, IsFinite, LogicalNot, BitNot,
    ]
};

const BINARY: [BinaryOp; 28] = {
    use BinaryOp::*;
    [
        Add, Sub, Mul, Div, FloorDiv, Rem, Pow, Max, Min, Atan2, BitAnd, BitOr, BitXor, Shl, Shr,
        AddSat, SubSat, MulSat, DivSat, LogicalAnd, LogicalOr, LogicalXor, Eq, Ne, Lt, Le, Gt, Ge,
    ]
};

fn map(expr: Expr, inputs: &[DType], contiguous: bool, vector: usize) -> MapSig<'static> {
    MapSig {
        dtypes: std::iter::once(expr.dtype)
            .chain(inputs.iter().copied())
            .collect(),
        // Not contiguous: the first input through a tile, the other operands strided.
        paths: (0..=inputs.len())
            .map(|k| match (contiguous, k) {
                (true, _) => Path::Contiguous,
                (false, 1) => Path::Tiled,
                _ => Path::Strided,
            })
            .collect(),
        scalars: vec![DType::U64, DType::U64],
        rank: 2,
        vector,
        wide: !contiguous,
        trees: MapTrees::one(expr),
    }
}

/// Map signatures: every unary and binary op the dtype defines, every cast, fma, where,
/// and the random-number and index nodes.
pub(crate) fn maps() -> Vec<MapSig<'static>> {
    let mut out = Vec::new();
    for d in DType::ALL {
        let x = Expr::input(0, d);
        let y = Expr::input(1, d);
        // The pairs the backends implement (the legality table's `Kernel` rules), and the
        // canonical rewrites of the others (literals included: integer relu is max(x, 0)).
        for op in UNARY {
            match unary_rule(op, d) {
                Rule::Undefined => {}
                Rule::Kernel => out.push(map(Expr::unary(op, x.clone()), &[d], true, 4)),
                _ => out.push(map(Expr::unary(op, x.clone()), &[d], false, 1)),
            }
        }
        for op in BINARY {
            if binary_rule(op, d).defined() {
                out.push(map(
                    Expr::binary(op, x.clone(), y.clone()),
                    &[d, d],
                    false,
                    1,
                ));
            }
        }
        for to in DType::ALL {
            for saturate in [false, true] {
                out.push(map(x.clone().cast(to, saturate), &[d], true, 1));
            }
        }
        for to in DType::ALL {
            if to.itemsize() == d.itemsize() && to != DType::Bool && d != DType::Bool {
                out.push(map(x.clone().bitcast(to), &[d], true, 1));
            }
            if let Ok(e) = strata_core::stochastic_round::stochastic_round_expr(d, to) {
                // Vectors as wide as the draws (eight elements a Philox call: two loads of
                // f32), and a plain vector.
                let lanes = e.draw_lanes().max(4);
                out.push(map(e.clone(), &[d], true, lanes));
                out.push(map(e, &[d], true, 4));
            }
        }
        if d != DType::Bool {
            let e = Expr::fma(x.clone(), y.clone(), Expr::input(2, d));
            out.push(map(e, &[d, d, d], true, 2));
        }
        let c = Expr::input(2, DType::Bool);
        out.push(map(
            Expr::select(c, x.clone(), y.clone()),
            &[d, d, DType::Bool],
            false,
            1,
        ));
        // Vector loads with a row-broadcast input read once per vector (x - row_max).
        if binary_rule(BinaryOp::Sub, d).defined() && d != DType::Bool {
            let mut sig = map(
                Expr::binary(BinaryOp::Sub, x.clone(), y.clone()),
                &[d, d],
                true,
                2,
            );
            sig.paths[2] = Path::Strided;
            out.push(sig);
            // Vector accesses of strided rows: a part of a cat written, a slice read.
            let mut sig = map(x.clone(), &[d], true, 2);
            sig.paths = vec![Path::Rows, Path::Rows];
            out.push(sig);
        }
    }
    let philox = Expr {
        dtype: DType::U32,
        node: strata_core::ir::Node::Philox(strata_core::ir::PhiloxWord {
            key: 0,
            counter: 1,
            word: 1,
            per_counter: 4,
            shared: 2,
        }),
    };
    out.push(map(philox.clone(), &[], true, 4));
    // Lanes over two counters (f16 out), inside one counter (i64 out), and unvectorized.
    out.push(map(philox.clone().cast(DType::F16, false), &[], true, 8));
    out.push(map(philox.clone().cast(DType::I64, false), &[], true, 2));
    out.push(map(philox, &[], false, 1));
    out.push(map(
        Expr::linear_index().cast(DType::F32, false),
        &[],
        false,
        1,
    ));
    out.extend(multi_output());
    out
}

/// Multi-output maps (fused kernels that store held intermediates): an f16 input widened and
/// a product stored beside an f32 result, and a product beside an f16 result; on the vector,
/// strided and tiled paths.
fn multi_output() -> Vec<MapSig<'static>> {
    let (x, y) = (Expr::input(0, DType::F16), Expr::input(1, DType::F32));
    let wide = x.cast(DType::F32, false);
    let product = Expr::binary(BinaryOp::Mul, wide.clone(), y.clone());
    let top = Expr::binary(BinaryOp::Max, product.clone(), y);
    let cases = [
        (top.clone(), vec![wide, product.clone()]),
        (top.cast(DType::F16, false), vec![product]),
    ];
    let mut out = Vec::new();
    for (expr, also) in cases {
        let outputs = 1 + also.len();
        let dtypes: Vec<DType> = std::iter::once(expr.dtype)
            .chain(also.iter().map(|e| e.dtype))
            .chain([DType::F16, DType::F32])
            .collect();
        for (paths, vector) in [
            (vec![Path::Contiguous; outputs + 2], 4),
            (vec![Path::Strided; outputs + 2], 1),
            (
                (0..outputs + 2)
                    .map(|k| {
                        if k == outputs {
                            Path::Tiled
                        } else {
                            Path::Strided
                        }
                    })
                    .collect(),
                1,
            ),
        ] {
            out.push(MapSig {
                trees: MapTrees {
                    expr: std::borrow::Cow::Owned(expr.clone()),
                    also: std::borrow::Cow::Owned(also.clone()),
                },
                dtypes: dtypes.clone(),
                paths,
                scalars: vec![],
                rank: 2,
                vector,
                wide: false,
            });
        }
    }
    out
}

/// Reduce signatures: every op × input dtype, each group size, vector loads, combine launches.
pub(crate) fn reductions() -> Vec<ReduceSig> {
    use ReduceOp::*;
    let mut out = Vec::new();
    for d in DType::ALL {
        for op in [Sum, Prod, Min, Max, ArgMin, ArgMax, Any, All] {
            let acc = match op {
                Sum | Prod => d.accumulator(),
                Any | All => DType::Bool,
                _ => d,
            };
            let result = match op {
                ArgMin | ArgMax => DType::I64,
                Any | All => DType::Bool,
                _ => acc,
            };
            for (group, vector, combine) in [(1, 1, false), (32, 4, false), (256, 2, true)] {
                out.push(ReduceSig {
                    op,
                    input: if combine {
                        super::reduce::repr(op, acc)
                    } else {
                        d
                    },
                    acc,
                    out: result,
                    outer_rank: 2,
                    reduced_rank: 1 + group / 256,
                    group,
                    vector: if d.itemsize() * vector > 16 {
                        1
                    } else {
                        vector
                    },
                    wide: group == 32,
                    combine,
                    map: None,
                    prologue: None,
                    epilogue: None,
                    held: false,
                    stores_map: false,
                    out_vector: 1,
                });
            }
        }
    }
    // Map→reduce fusion: the element is a map over several inputs and a scalar.
    use strata_core::ir::{BinaryOp, Expr, UnaryOp};
    let x = |k: usize, d: DType| Expr::input(k, d);
    let fused = [
        // sum(a * b + s0) in f32
        (Sum, DType::F32, DType::F32, vec![DType::F32, DType::F32], {
            let ab = Expr::binary(BinaryOp::Mul, x(0, DType::F32), x(1, DType::F32));
            Expr::binary(BinaryOp::Add, ab, Expr::scalar(0, DType::F32))
        }),
        // softmax's sum(exp(x - max)), the max one value per output
        (Sum, DType::F32, DType::F32, vec![DType::F32, DType::F32], {
            let d = Expr::binary(BinaryOp::Sub, x(0, DType::F32), x(1, DType::F32));
            Expr::binary(
                BinaryOp::Add,
                Expr::unary(UnaryOp::Exp, d),
                Expr::scalar(0, DType::F32),
            )
        }),
        // argmax(exp(f16 a - f16 b)), computed per node in f16
        (
            ArgMax,
            DType::F16,
            DType::F16,
            vec![DType::F16, DType::F16],
            {
                let d = Expr::binary(BinaryOp::Sub, x(0, DType::F16), x(1, DType::F16));
                Expr::unary(UnaryOp::Exp, d)
            },
        ),
        // any(a > b) over i32
        (
            Any,
            DType::Bool,
            DType::I32,
            vec![DType::I32, DType::I32],
            {
                let gt = Expr::binary(BinaryOp::Gt, x(0, DType::I32), x(1, DType::I32));
                Expr::binary(BinaryOp::BitOr, gt, Expr::scalar(0, DType::Bool))
            },
        ),
    ];
    for (k, (op, acc, d, inputs, expr)) in fused.into_iter().enumerate() {
        let result = match op {
            ArgMax => DType::I64,
            Any => DType::Bool,
            _ => acc,
        };
        let scalars: Vec<DType> = match op {
            Any => vec![DType::Bool],
            Sum => vec![DType::F32],
            _ => vec![],
        };
        for (group, vector) in [(1, 1), (32, 4), (256, 2)] {
            let sig = ReduceSig {
                op,
                input: d,
                acc,
                out: result,
                outer_rank: 2,
                reduced_rank: 1 + group / 256,
                group,
                vector,
                wide: group == 32,
                combine: false,
                map: Some(strata_core::lower::operands::ReduceMap {
                    expr: expr.clone(),
                    per_output: (0..inputs.len()).map(|i| k == 1 && i == 1).collect(),
                    per_position: vec![false; inputs.len()],
                    inputs: inputs.clone(),
                    scalars: scalars.clone(),
                }),
                prologue: None,
                epilogue: None,
                held: false,
                stores_map: false,
                out_vector: 1,
            };
            // Each path also storing the map (a tree read after its reduction), but arg ops.
            if !op.returns_index() {
                out.push(ReduceSig {
                    stores_map: true,
                    out_vector: 1,
                    ..sig.clone()
                });
                // A thread walking neighbouring columns (`columns`).
                if group == 1 {
                    out.push(ReduceSig {
                        stores_map: true,
                        out_vector: (16 / d.itemsize()).min(4),
                        ..sig.clone()
                    });
                }
            }
            // `b` one value per position along the reduced axes (γ in a row sum, a row's
            // statistics in a column sum), on each path, stored and walked by columns too.
            if k == 0 {
                let mut at_position = sig.clone();
                if let Some(m) = &mut at_position.map {
                    m.per_position[1] = true;
                }
                for (stores_map, out_vector) in [(false, 1), (true, 1), (true, 4)] {
                    if out_vector == 1 || group == 1 {
                        out.push(ReduceSig {
                            stores_map,
                            out_vector,
                            ..at_position.clone()
                        });
                    }
                }
            }
            out.push(sig);
        }
    }
    // A row prologue with the row staged (`reduce_prologue`): `exp(x - max) * w` summed,
    // in a warp's and a block's eager order, f32 and f64, after a maximum or a minimum.
    for (d, vector) in [(DType::F32, 4), (DType::F64, 2)] {
        for (group, prologue) in [(32, Max), (256, Min)] {
            let shifted = Expr::binary(BinaryOp::Sub, x(0, d), x(1, d));
            let expr = Expr::binary(BinaryOp::Mul, Expr::unary(UnaryOp::Exp, shifted), x(2, d));
            out.push(ReduceSig {
                op: Sum,
                input: d,
                acc: d,
                out: d,
                outer_rank: 2,
                reduced_rank: 1,
                group,
                vector,
                wide: group == 32,
                combine: false,
                map: Some(strata_core::lower::operands::ReduceMap {
                    expr,
                    per_output: vec![false, true, false],
                    per_position: vec![false; 3],
                    inputs: vec![d; 3],
                    scalars: vec![],
                }),
                prologue: Some(super::reduce::StagedPrologue {
                    op: prologue,
                    result: 1,
                    out: d,
                }),
                epilogue: None,
                held: false,
                stores_map: false,
                out_vector: 1,
            });
        }
        // Softmax from its primitives held in registers (`held`): a block's lanes, the
        // quotient over the terms as the epilogue (the sum read through input 2).
        let term = Expr::unary(UnaryOp::Exp, Expr::binary(BinaryOp::Sub, x(0, d), x(1, d)));
        let held = ReduceSig {
            op: Sum,
            input: d,
            acc: d,
            out: d,
            outer_rank: 2,
            reduced_rank: 1,
            group: 256,
            vector,
            wide: false,
            combine: false,
            map: Some(strata_core::lower::operands::ReduceMap {
                expr: term.clone(),
                per_output: vec![false, true, true],
                per_position: vec![false; 3],
                inputs: vec![d; 3],
                scalars: vec![],
            }),
            prologue: Some(super::reduce::StagedPrologue {
                op: Max,
                result: 1,
                out: d,
            }),
            epilogue: Some(super::reduce::StagedEpilogue {
                expr: Expr::binary(BinaryOp::Div, term.clone(), x(2, d)),
                result: 2,
                out: d,
            }),
            held: true,
            stores_map: false,
            out_vector: 1,
        };
        out.push(held.clone());
        // Softmax's backward staged in the eager sum's lanes (`staged::stages_in_lanes`):
        // `Σ y·g`, then `y·(g − Σ y·g)`.
        let product = Expr::binary(BinaryOp::Mul, x(0, d), x(1, d));
        let gradient = Expr::binary(
            BinaryOp::Mul,
            x(0, d),
            Expr::binary(BinaryOp::Sub, x(1, d), x(2, d)),
        );
        let lanes = ReduceSig {
            map: Some(strata_core::lower::operands::ReduceMap {
                expr: product,
                per_output: vec![false, false, true],
                per_position: vec![false; 3],
                inputs: vec![d; 3],
                scalars: vec![],
            }),
            prologue: None,
            epilogue: Some(super::reduce::StagedEpilogue {
                expr: gradient.clone(),
                result: 2,
                out: d,
            }),
            held: false,
            ..held
        };
        out.push(lanes.clone());
        if d == DType::F32 {
            // The gradient written as f64: 32-byte output vectors, stored evicted first.
            out.push(ReduceSig {
                epilogue: Some(super::reduce::StagedEpilogue {
                    expr: gradient.cast(DType::F64, false),
                    result: 2,
                    out: DType::F64,
                }),
                ..lanes.clone()
            });
        }
        // A layer norm's variance and its normalized rows, scaled by a weight and shifted by
        // a bias that hold one value per position in the row (inputs 3 and 4).
        let centred = Expr::binary(BinaryOp::Sub, x(0, d), x(1, d));
        let scale = Expr::unary(UnaryOp::Rsqrt, x(2, d));
        let normalized = Expr::binary(BinaryOp::Mul, centred.clone(), scale);
        let affine = Expr::binary(BinaryOp::Mul, normalized, x(3, d));
        out.push(ReduceSig {
            map: Some(strata_core::lower::operands::ReduceMap {
                expr: Expr::binary(BinaryOp::Mul, centred.clone(), centred),
                per_output: vec![false, true, true, false, false],
                per_position: vec![false, false, false, true, true],
                inputs: vec![d; 5],
                scalars: vec![],
            }),
            epilogue: Some(super::reduce::StagedEpilogue {
                expr: Expr::binary(BinaryOp::Add, affine, x(4, d)),
                result: 2,
                out: d,
            }),
            ..lanes
        });
        // The same with the mean's sum as the prologue (added in the eager lanes' order) and
        // the row kept staged for the epilogue, for a warp's and a block's lanes.
        if let Some(ln) = out.last().cloned() {
            for group in [32, 256] {
                out.push(ReduceSig {
                    group,
                    wide: group == 32,
                    prologue: Some(super::reduce::StagedPrologue {
                        op: Sum,
                        result: 1,
                        out: d,
                    }),
                    ..ln.clone()
                });
            }
        }
        // Softmax from its primitives times a weight a position, held in registers.
        let softmax = Expr::binary(BinaryOp::Div, term.clone(), x(2, d));
        out.push(ReduceSig {
            map: Some(strata_core::lower::operands::ReduceMap {
                expr: term,
                per_output: vec![false, true, true, false],
                per_position: vec![false, false, false, true],
                inputs: vec![d; 4],
                scalars: vec![],
            }),
            epilogue: Some(super::reduce::StagedEpilogue {
                expr: Expr::binary(BinaryOp::Mul, softmax, x(3, d)),
                result: 2,
                out: d,
            }),
            ..held
        });
    }
    out
}

/// Gather, scatter and scatter-add signatures for every dtype.
pub(crate) fn indexing() -> Vec<IndexSig> {
    let mut out = Vec::new();
    for d in DType::ALL {
        for kind in [IndexKind::Gather, IndexKind::Scatter, IndexKind::ScatterAdd] {
            for flagged in [false, true] {
                if flagged && kind != IndexKind::Gather {
                    continue;
                }
                out.push(IndexSig {
                    kind,
                    axis: 1,
                    rank: 3,
                    dtype: d,
                    wide: kind == IndexKind::ScatterAdd || flagged,
                    row_bytes: 0,
                    run_blocks: false,
                    flagged,
                });
            }
        }
    }
    // The row path of gathers: one kernel per access width, 32- and 64-bit indexing, with
    // and without the range flag.
    for row_bytes in [1, 2, 4, 8, 16] {
        for wide in [false, true] {
            for flagged in [false, true] {
                for run_blocks in [false, true] {
                    out.push(IndexSig {
                        kind: IndexKind::Gather,
                        axis: 0,
                        rank: 0,
                        dtype: DType::U8,
                        wide,
                        row_bytes,
                        run_blocks,
                        flagged,
                    });
                }
            }
        }
    }
    out
}

/// Our matmul kernel for every dtype with its accumulator.
pub(crate) fn matmuls() -> Vec<MatmulSig> {
    DType::ALL
        .into_iter()
        .filter(|&d| d != DType::Bool)
        .map(|d| MatmulSig {
            dtype: d,
            out: d,
            acc: if d.is_float() {
                d.accumulator()
            } else {
                DType::I64
            },
        })
        .collect()
}

/// Softmax signatures: each float dtype, both outputs, every group size and vector width.
/// Histogram signatures: counts in u32 and u64 from a float bin expression with scalars
/// (histc's), weighted f32 and f64 sums of integer bins (bincount's), with and without
/// private copies.
pub(crate) fn histograms() -> Vec<super::histogram::HistogramSig> {
    use super::histogram::HistogramSig;
    let mut out = Vec::new();
    for values in DType::ALL {
        if values == DType::Bool {
            continue;
        }
        let x = Expr::input(0, values);
        let (bin, scalars) = if values.is_float() {
            let pos = Expr::binary(
                BinaryOp::Mul,
                x.cast(DType::F32, false),
                Expr::scalar(0, DType::F32),
            );
            (
                Expr::unary(UnaryOp::Floor, pos).cast(DType::I32, true),
                vec![DType::F32],
            )
        } else {
            (x.cast(DType::I32, true), vec![])
        };
        for (acc, weighted, copies) in [
            (DType::U32, false, 8),
            (DType::U64, false, 0),
            (DType::F32, true, 2),
            (DType::F64, true, 0),
        ] {
            out.push(HistogramSig {
                bin: bin.clone(),
                values,
                acc,
                weighted,
                scalars: scalars.clone(),
                copies,
                wide: copies == 0,
            });
        }
    }
    out
}

pub(crate) fn softmaxes() -> Vec<SoftmaxSig> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for log in [false, true] {
            let v = 16 / dtype.itemsize();
            for (group, vector, cached, staged) in [
                (1, 1, 0, false),
                (32, v, 0, false),
                (256, 1, 0, false),
                (256, v, 16, false),
                (1024, v, 0, false),
                (512, v, 0, true),
                (1, 1, 2, false),
            ] {
                out.push(SoftmaxSig {
                    dtype,
                    log,
                    outer_rank: 2,
                    group,
                    vector,
                    wide: group == 1,
                    cached,
                    staged,
                });
            }
        }
    }
    out
}

/// Layer norm backward signatures: each float dtype, with and without γ and the column sums,
/// the smallest and largest blocks, vectors and elements a thread.
pub(crate) fn layer_norms() -> Vec<LayerNormSig> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for (weight, columns) in [(true, true), (false, false), (true, false), (false, true)] {
            for (threads, per_thread, vector) in
                [(32, 1, 1), (512, 8, 4), (1024, 8, 2), (128, 6, 2)]
            {
                let vector = vector.min(16 / dtype.itemsize());
                out.push(LayerNormSig {
                    dtype,
                    weight,
                    columns,
                    threads,
                    per_thread,
                    vector,
                });
            }
        }
    }
    out
}

/// Layer norm forward signatures: each float dtype, with and without γ and β, the smallest
/// and largest blocks, vectors and elements a thread.
pub(crate) fn layer_norm_forwards() -> Vec<LayerNormForwardSig> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for (weight, bias) in [(true, true), (false, false), (true, false), (false, true)] {
            for (threads, per_thread, vector) in
                [(32, 1, 1), (512, 8, 4), (1024, 8, 2), (128, 6, 2)]
            {
                let vector = vector.min(16 / dtype.itemsize());
                out.push(LayerNormForwardSig {
                    dtype,
                    weight,
                    bias,
                    threads,
                    per_thread,
                    vector,
                });
            }
        }
    }
    out
}

/// Batch norm's backward sums signatures: each float dtype, each vector width, each stage.
pub(crate) fn channel_grad_sums() -> Vec<GradSumsSig> {
    channel_moments()
        .into_iter()
        .map(|m| GradSumsSig {
            dtype: m.dtype,
            vector: m.vector,
            stage: m.stage,
        })
        .collect()
}

/// Channel moments signatures: each float dtype, each vector width it takes, each stage.
pub(crate) fn channel_moments() -> Vec<MomentsSig> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        out.push(MomentsSig {
            dtype,
            vector: 1,
            stage: Stage::Merge,
        });
        for vector in [1, 2, 4] {
            for stage in [Stage::Whole, Stage::Slices] {
                if vector * dtype.itemsize() <= 16 {
                    out.push(MomentsSig {
                        dtype,
                        vector,
                        stage,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{nvrtc_version, Compiler};

    /// All sources, each kernel (and its helpers and batched form, which share its name as a
    /// prefix) renamed so they can share one translation unit.
    fn all_sources() -> Vec<String> {
        let mut out = Vec::new();
        let mut add = |src: String, name: &str| {
            let n = out.len();
            out.push(src.replace(name, &format!("{name}_{n}")));
        };
        for s in maps() {
            let rendered = super::super::map::render(&s).expect("map source");
            add(rendered.source, "strata_map");
            if let Some(batched) = rendered.batched {
                add(batched, "strata_map");
            }
        }
        add(
            super::super::interpreter::source().expect("interpreter source"),
            "strata_interpret",
        );
        for s in reductions() {
            add(
                super::super::Generated::render(&s)
                    .expect("reduce source")
                    .source,
                "strata_reduce",
            );
        }
        for s in indexing() {
            add(
                super::super::index::source(&s).expect("index source"),
                "strata_index",
            );
        }
        for s in softmaxes() {
            add(
                super::super::softmax::source(&s).expect("softmax source"),
                "strata_softmax",
            );
        }
        for s in layer_norm_forwards() {
            add(
                super::super::layer_norm::forward_source(&s),
                "strata_layer_norm",
            );
        }
        for s in layer_norms() {
            add(
                super::super::layer_norm::source(&s),
                "strata_layer_norm_backward",
            );
        }
        for s in channel_grad_sums() {
            add(
                super::super::Generated::render(&s)
                    .expect("channel gradient sums source")
                    .source,
                "strata_channel_grad_sums",
            );
        }
        for s in channel_moments() {
            add(
                super::super::Generated::render(&s)
                    .expect("channel moments source")
                    .source,
                "strata_channel_moments",
            );
        }
        for s in matmuls() {
            add(
                super::super::matmul::source(&s).expect("matmul source"),
                "strata_matmul",
            );
        }
        for s in histograms() {
            add(
                super::super::histogram::source(&s).expect("histogram source"),
                "strata_histogram",
            );
        }
        out
    }

    #[test]
    fn the_catalog_covers_every_dtype() {
        let sources = all_sources();
        assert!(sources.len() > 1000, "{} kernels", sources.len());
        for d in DType::ALL {
            assert!(maps().iter().any(|m| m.dtypes[0] == d));
        }
    }

    #[test]
    fn every_generated_kernel_compiles_with_nvrtc() {
        if let Err(e) = nvrtc_version() {
            eprintln!("skipped: {e}");
            assert!(
                std::env::var_os("STRATA_REQUIRE_NVRTC").is_none(),
                "STRATA_REQUIRE_NVRTC is set but NVRTC is missing: {e}"
            );
            return;
        }
        let compiler = Compiler::new(None, (9, 0));
        let broken = compiler.ptx_uncached("extern \"C\" __global__ void k() { undefined_name; }");
        assert!(broken.is_err(), "NVRTC accepted an undefined name");
        let sources = all_sources();
        // A few large translation units keep NVRTC's fixed cost low.
        for part in sources.chunks(400) {
            let body = part.join("\n");
            if let Err(e) = compiler.ptx_uncached(&body) {
                // The errors first: warnings about unused locals would fill the message.
                let msg = e.to_string();
                let lines: Vec<&str> = msg.lines().collect();
                let errors: Vec<String> = (0..lines.len())
                    .filter(|&k| lines[k].contains("error"))
                    .map(|k| lines[k..(k + 3).min(lines.len())].join("\n"))
                    .collect();
                let shown = format!("{}\n{msg}", errors.join("\n"));
                panic!("{}", &shown[..shown.len().min(6000)]);
            }
        }
    }
}
