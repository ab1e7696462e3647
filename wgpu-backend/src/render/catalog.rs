//! Every generator variant validated by naga, without a device: each unary and binary op on
//! every dtype it is defined for (strided, contiguous and vectorized paths), casts between all
//! dtype pairs, random bits, every reduction on every dtype (per path, partial and combine),
//! matmul and the index ops on every dtype. A shader wgpu would reject fails here.
//!
//! Metal and DX12 are never compiled by CI's lavapipe, so every variant is also generated for
//! them (no f64 on either as wgpu exposes them: the f32 math library, f16 stored natively) and
//! translated by naga's MSL and HLSL back ends under each platform's capabilities. f64 variants
//! are left out there: the backend refuses f64 on such adapters before generating anything
//! (`check_dtype`), with the same `Err` as on a Vulkan adapter without SHADER_F64.

use super::matmul::Staged;
use super::{
    conv, coop_matmul, index, layer_norm, map, matmul, moments, reduce, softmax, staged, Caps,
};
use strata_core::ir::ConvPass;
use strata_core::ir::MapTrees;
use strata_core::ir::{BinaryOp, Expr, IndexKind, Node, ReduceOp, UnaryOp};
use strata_core::lower::legal::{binary_rule, fma_defined, unary_rule};
use strata_core::lower::map_plan::PositionKind;
use strata_core::DType;

const CAPS: Caps = Caps {
    f64: true,
    int64: true,
    f16: false,
    fused_fma: false,
    coop_f16: false,
    subgroups: false,
};

/// Metal and DX12 adapters as wgpu exposes them: 64-bit integers and f16, no f64; a fused `fma`
/// (Apple's GPUs), so the portable targets also compile the fused square root.
const PORTABLE: Caps = Caps {
    f64: false,
    int64: true,
    f16: true,
    fused_fma: true,
    coop_f16: false,
    subgroups: false,
};

/// Where a generated module must compile.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    /// Vulkan (SPIR-V): naga's validation with every capability the generator may use.
    Vulkan,
    /// Metal: validated under naga's MSL capabilities, then written as MSL 2.4.
    Metal,
    /// DX12: validated under naga's HLSL capabilities, then written as HLSL for shader model 6.2
    /// (16-bit types).
    Dx12,
}

/// The adapters a variant over `dtypes` is generated for, with the targets each must pass: f16
/// packed and, where it matters, native on Vulkan; Metal and DX12 unless it needs f64.
fn caps_for(dtypes: &[DType]) -> Vec<(Caps, &'static [Target])> {
    let mut all: Vec<(Caps, &'static [Target])> = vec![(CAPS, &[Target::Vulkan])];
    if dtypes.contains(&DType::F16) {
        all.push((Caps { f16: true, ..CAPS }, &[Target::Vulkan]));
    }
    if dtypes.iter().any(|d| d.is_float()) {
        // The square root an adapter with a fused `fma` and subgroups (NVIDIA's Vulkan
        // driver) compiles, and its softmax's subgroup combines.
        all.push((
            Caps {
                fused_fma: true,
                subgroups: true,
                ..CAPS
            },
            &[Target::Vulkan],
        ));
    }
    if !dtypes.contains(&DType::F64) {
        all.push((PORTABLE, &[Target::Metal, Target::Dx12]));
    }
    all
}

/// Checks `src` for each target: parse, validate, and for Metal and DX12 translate.
/// Every `(a, b, c)` of the three lists.
fn every_combination<A: Copy, B: Copy, C: Copy>(a: &[A], b: &[B], c: &[C]) -> Vec<(A, B, C)> {
    let pairs = a.iter().flat_map(|&x| b.iter().map(move |&y| (x, y)));
    pairs
        .flat_map(|(x, y)| c.iter().map(move |&z| (x, y, z)))
        .collect()
}

fn check(src: &str, targets: &[Target]) {
    use naga::valid::Capabilities as C;
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(src)));
    for &target in targets {
        let caps = match target {
            Target::Vulkan => C::FLOAT64 | C::SHADER_INT64 | C::SHADER_FLOAT16 | C::SUBGROUP,
            Target::Metal => naga::back::msl::supported_capabilities(),
            Target::Dx12 => naga::back::hlsl::supported_capabilities() & !C::FLOAT64,
        };
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{target:?}: {}\n{src}", e.emit_to_string(src)));
        let written = match target {
            Target::Vulkan => Ok(()),
            Target::Metal => {
                let options = naga::back::msl::Options {
                    lang_version: (2, 4),
                    ..Default::default()
                };
                naga::back::msl::write_string(&module, &info, &options, &Default::default())
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Target::Dx12 => {
                let options = naga::back::hlsl::Options {
                    shader_model: naga::back::hlsl::ShaderModel::V6_2,
                    ..Default::default()
                };
                let mut out = String::new();
                let pipeline = naga::back::hlsl::PipelineOptions::default();
                naga::back::hlsl::Writer::new(&mut out, &options, &pipeline)
                    .write(&module, &info, None)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        };
        if let Err(e) = written {
            panic!("{target:?}: {e}\n{src}");
        }
    }
}

/// Checks `src` on Vulkan only (variants whose caps are fixed by the test).
fn validate(src: &str) {
    check(src, &[Target::Vulkan]);
}

fn map_sig(
    expr: Expr,
    dtypes: Vec<DType>,
    contiguous: bool,
    vector: usize,
) -> map::MapSig<'static> {
    let position = if expr.reads_linear_index() {
        PositionKind::Strided
    } else {
        PositionKind::Unused
    };
    map::MapSig {
        contiguous: vec![contiguous; dtypes.len()],
        rows: vec![false; dtypes.len()],
        tiled: vec![false; dtypes.len().saturating_sub(1)],
        dtypes,
        position,
        scalars: vec![DType::U64, DType::U64],
        rank: 2,
        vector,
        trees: MapTrees::one(expr),
    }
}

#[test]
fn multi_output_maps_validate() {
    // An f16 input widened and a product stored beside an f32 result, and a product beside
    // an f16 result (narrow outputs: packed words on the vector path, atomics per element
    // elsewhere); contiguous, vector, strided and tiled.
    // (The tiled path takes 32-bit dtypes only: a product of two f32 inputs stored beside
    // the result.)
    let y = Expr::input(1, DType::F32);
    let product = |x: &Expr| Expr::binary(BinaryOp::Mul, x.clone(), y.clone());
    let top = |x: &Expr| Expr::binary(BinaryOp::Max, product(x), y.clone());
    let x16 = Expr::input(0, DType::F16);
    let wide = x16.cast(DType::F32, false);
    let x32 = Expr::input(0, DType::F32);
    for (expr, also, x) in [
        (top(&wide), vec![wide.clone(), product(&wide)], DType::F16),
        (
            top(&wide).cast(DType::F16, false),
            vec![product(&wide)],
            DType::F16,
        ),
        (top(&x32), vec![product(&x32)], DType::F32),
    ] {
        let outputs = 1 + also.len();
        let dtypes: Vec<DType> = std::iter::once(expr.dtype)
            .chain(also.iter().map(|e| e.dtype))
            .chain([x, DType::F32])
            .collect();
        let paths = [
            (true, 1, false),
            (true, 4, false),
            (false, 1, false),
            (false, 1, true),
        ];
        for (contiguous, vector, tiled) in paths {
            if tiled && dtypes.iter().any(|d| d.itemsize() != 4) {
                continue;
            }
            let mut sig = map_sig(expr.clone(), dtypes.clone(), contiguous, vector);
            sig.trees.also = std::borrow::Cow::Owned(also.clone());
            sig.tiled = vec![tiled, false];
            for (caps, targets) in caps_for(&dtypes) {
                let src = map::source(&sig, caps).unwrap();
                check(&src, targets);
                let body = &src[src.find("@compute").unwrap()..];
                // The product is computed once per element (per lane on the vector path).
                let lanes = if vector == 4 { 4 } else { 1 };
                assert_eq!(body.matches(" * v").count(), lanes, "{src}");
                if vector == 4 {
                    assert!(
                        body.contains(&format!("b{}[q{}] = ", outputs - 1, outputs - 1)),
                        "{src}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_map_variant_validates() {
    use BinaryOp::*;
    use UnaryOp::*;
    let unary = [
        Neg, NegSat, Abs, Sign, Square, Sqrt, Rsqrt, Reciprocal, Exp, Exp2, Expm1, Log, Log2,
        Log10, Log1p, Sin, Cos, Tan, Tanh, Sigmoid, Relu, Gelu, Erf, Floor, Ceil, Round, Trunc,
        IsNan, IsInf, IsFinite, LogicalNot, BitNot,
    ];
    let binary = [
        Add, Sub, Mul, Div, FloorDiv, Rem, Pow, Max, Min, Atan2, BitAnd, BitOr, BitXor, Shl, Shr,
        AddSat, SubSat, MulSat, DivSat, LogicalAnd, LogicalOr, LogicalXor, Eq, Ne, Lt, Le, Gt, Ge,
    ];
    let mut n = 0;
    for d in DType::ALL {
        let x = || Expr::input(0, d);
        // The pairs the legality table defines (canonical forms included: literals too).
        let mut exprs: Vec<Expr> = unary
            .iter()
            .filter(|&&op| unary_rule(op, d).defined())
            .map(|&op| Expr::unary(op, x()))
            .collect();
        exprs.extend(
            binary
                .iter()
                .filter(|&&op| binary_rule(op, d).defined())
                .map(|&op| Expr::binary(op, x(), Expr::input(1, d))),
        );
        if fma_defined(d) {
            exprs.push(Expr::fma(x(), Expr::input(1, d), x()));
        }
        exprs.push(Expr::select(Expr::input(1, DType::Bool), x(), x()));
        for to in DType::ALL {
            exprs.push(x().cast(to, false));
            exprs.push(x().cast(to, true));
            if to.itemsize() == d.itemsize() && to != DType::Bool && d != DType::Bool {
                exprs.push(x().bitcast(to));
            }
            if let Ok(e) = strata_core::stochastic_round::stochastic_round_expr(d, to) {
                exprs.push(e);
            }
        }
        for e in exprs {
            let mut dtypes = vec![e.dtype, d, d];
            if let Node::Where(..) = e.node {
                dtypes[2] = DType::Bool;
            }
            // (Four lanes of 64-bit dtypes, each element moved whole, where a draw takes them.)
            for (contiguous, vector) in [(false, 1), (true, 1), (true, 4)] {
                for (caps, targets) in caps_for(&dtypes) {
                    let sig = map_sig(e.clone(), dtypes.clone(), contiguous, vector);
                    let src = map::source(&sig, caps)
                        .unwrap_or_else(|err| panic!("{err}: {:?} on {d}", e.node));
                    check(&src, targets);
                    n += 1;
                }
            }
            if dtypes.iter().all(|t| t.itemsize() <= 4) {
                // Vector launches whose second input is a splat (constant along the rows).
                // Input 1 too, whose name must not meet scalar 1's.
                let mut sig = map_sig(e.clone(), dtypes.clone(), true, 4);
                sig.contiguous[2] = false;
                sig.contiguous[1] = n % 2 == 0;
                for (caps, targets) in caps_for(&dtypes) {
                    let src = map::source(&sig, caps)
                        .unwrap_or_else(|err| panic!("{err}: {:?} on {d}", e.node));
                    check(&src, targets);
                    n += 1;
                }
                // And with operands strided between rows (a part of a `cat`): the output and
                // the first input in whole words at decoded offsets.
                let mut sig = map_sig(e.clone(), dtypes.clone(), true, 4);
                sig.contiguous[..2].fill(false);
                sig.rows[..2].fill(true);
                for (caps, targets) in caps_for(&dtypes) {
                    let src = map::source(&sig, caps)
                        .unwrap_or_else(|err| panic!("{err}: {:?} on {d}", e.node));
                    check(&src, targets);
                    n += 1;
                }
            }
            if dtypes.iter().all(|t| t.itemsize() == 4) {
                for tiled in [[true, false], [false, true], [true, true]] {
                    let mut sig = map_sig(e.clone(), dtypes.clone(), false, 1);
                    sig.tiled = tiled.to_vec();
                    for (caps, targets) in caps_for(&dtypes) {
                        let src = map::source(&sig, caps)
                            .unwrap_or_else(|err| panic!("{err}: {:?} on {d}", e.node));
                        check(&src, targets);
                        n += 1;
                    }
                }
            }
        }
    }
    let philox = Expr {
        dtype: DType::U32,
        node: Node::Philox(strata_core::ir::PhiloxWord {
            key: 0,
            counter: 1,
            word: 1,
            per_counter: 4,
            shared: 2,
        }),
    };
    validate(&map::source(&map_sig(philox.clone(), vec![DType::U32], false, 1), CAPS).unwrap());
    // Vectors of draws: Philox calls made before the lanes (four and two elements a counter),
    // and a Box–Muller-like parity test on the position, which aligned lanes fold.
    for per_counter in [4, 2] {
        let word = Expr {
            dtype: DType::U32,
            node: Node::Philox(strata_core::ir::PhiloxWord {
                key: 0,
                counter: 1,
                word: 0,
                per_counter,
                shared: 2,
            }),
        };
        let parity = Expr::binary(
            strata_core::ir::BinaryOp::BitAnd,
            Expr::linear_index(),
            Expr::literal(strata_core::Scalar::I64(1)),
        );
        let even = Expr::binary(
            strata_core::ir::BinaryOp::Eq,
            parity,
            Expr::literal(strata_core::Scalar::I64(0)),
        );
        let e = Expr::select(even, word.clone(), word.cast(DType::U32, false));
        let mut sig = map_sig(e, vec![DType::U32], true, 4);
        // Aligned vectors take their words by constant; a vector launch at any other position
        // (none is planned today) takes the general lanes.
        for (position, aligned) in [(PositionKind::Aligned, true), (PositionKind::Linear, false)] {
            sig.position = position;
            let src = map::source(&sig, CAPS).unwrap();
            assert!(src.contains("philox4("), "{src}");
            // General lanes pick their counter's call at run time.
            assert_eq!(src.contains("select(ph0_1_0"), !aligned, "{src}");
            validate(&src);
        }
    }
    let arange = Expr::linear_index().cast(DType::F32, false);
    validate(&map::source(&map_sig(arange, vec![DType::F32], true, 1), CAPS).unwrap());
    assert!(n > 1000, "{n} variants");
}

#[test]
fn every_reduce_variant_validates() {
    use ReduceOp::*;
    for d in DType::ALL {
        for op in [Sum, Prod, Min, Max, ArgMin, ArgMax, Any, All] {
            let acc = match op {
                Any | All => DType::Bool,
                Sum | Prod if !d.is_float() => DType::I64,
                _ => d,
            };
            let out = if op.returns_index() { DType::I64 } else { acc };
            let paths = [(false, false), (false, true), (true, false)];
            for (group, (combine, partial), vector) in every_combination(&[1, 256], &paths, &[1, 4])
            {
                if vector == 4 && (combine || d.itemsize() != 4) {
                    continue;
                }
                {
                    let sig = reduce::ReduceSig {
                        op,
                        acc,
                        input: if combine { acc } else { d },
                        out: if partial { acc } else { out },
                        outer_rank: 2,
                        reduced_rank: if combine { 1 } else { 2 },
                        group,
                        combine,
                        partial,
                        map: None,
                        vector,
                    };
                    for (caps, targets) in caps_for(&[d, acc]) {
                        check(&reduce::source(&sig, caps).unwrap(), targets);
                    }
                }
            }
        }
    }
}

/// Layer norm's backward: with and without γ and the column sums, one element an invocation
/// and the most, by subgroups and by a tree.
#[test]
fn every_layer_norm_variant_validates() {
    for (weight, columns) in [(true, true), (false, false), (true, false), (false, true)] {
        for per_invocation in [1, 3, layer_norm::PER_INVOCATION] {
            let sig = layer_norm::LayerNormSig {
                weight,
                columns,
                per_invocation,
            };
            for (caps, targets) in caps_for(&[DType::F32]) {
                check(&layer_norm::source(&sig, caps), targets);
            }
        }
    }
}

/// Layer norm's forward: with and without γ and β, one element an invocation and the most, by
/// subgroups and by a tree.
#[test]
fn every_layer_norm_forward_variant_validates() {
    for (weight, bias) in [(true, true), (false, false), (true, false), (false, true)] {
        for per_invocation in [1, 3, layer_norm::PER_INVOCATION] {
            let sig = layer_norm::LayerNormForwardSig {
                weight,
                bias,
                per_invocation,
            };
            for (caps, targets) in caps_for(&[DType::F32]) {
                check(&layer_norm::forward_source(&sig, caps), targets);
            }
        }
    }
}

/// Channel moments and batch norm's backward sums: each stage (one slice a channel, slices
/// into scratch, their merge).
#[test]
fn every_channel_moments_variant_validates() {
    for stage in [
        moments::Stage::Whole,
        moments::Stage::Slices,
        moments::Stage::Merge,
    ] {
        for (caps, targets) in caps_for(&[DType::F32]) {
            check(
                &moments::source(&moments::MomentsSig { stage }, caps),
                targets,
            );
            check(
                &moments::grad_source(&moments::GradSumsSig { stage }, caps),
                targets,
            );
        }
    }
}

/// Softmax and log-softmax on every float dtype: a row per invocation and per workgroup, kept
/// in registers (whole or not; f32 in 16-byte vectors too) or read in each pass.
#[test]
fn every_softmax_variant_validates() {
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for log in [false, true] {
            for (group, cached) in [(1, 1), (1, 16), (256, 1), (256, 64), (256, 0)] {
                for (vector, full) in [(false, false), (false, true), (true, false), (true, true)] {
                    if (vector && (d != DType::F32 || cached < 4)) || (full && cached == 0) {
                        continue;
                    }
                    let sig = softmax::SoftmaxSig {
                        dtype: d,
                        log,
                        outer_rank: 2,
                        group,
                        cached,
                        vector,
                        full,
                    };
                    for (caps, targets) in caps_for(&[d, d.accumulator()]) {
                        check(&softmax::source(&sig, caps).unwrap(), targets);
                    }
                }
            }
        }
    }
}

/// Staged reductions (a row prologue, and an epilogue, in one dispatch) on every float dtype:
/// softmax from its primitives (`exp(x0 - x1)` summed, then `/ x2`), and a minimum prologue
/// with a product, an input laid out like the rows (`x3`) and a scalar in the epilogue
/// (`(x0 - x1) * x3 * s0 + x2`); rows of one element an invocation and of 64, whole or not,
/// f32 ones in 16-byte vectors too.
#[test]
fn staged_reduction_variants_validate() {
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let x = |k| Box::new(Expr::input(k, d));
        let node = |node| Expr { dtype: d, node };
        let sub = node(Node::Binary(BinaryOp::Sub, x(0), x(1)));
        let exp = node(Node::Unary(UnaryOp::Exp, Box::new(sub.clone())));
        let div = node(Node::Binary(BinaryOp::Div, Box::new(exp.clone()), x(2)));
        let weighted = node(Node::Binary(
            BinaryOp::Mul,
            Box::new(node(Node::Binary(
                BinaryOp::Mul,
                Box::new(sub.clone()),
                x(3),
            ))),
            Box::new(Expr::scalar(0, d)),
        ));
        let plus = node(Node::Binary(BinaryOp::Add, Box::new(weighted), x(2)));
        // Softmax times a weight that holds one value per position in the row (input 3).
        let times = node(Node::Binary(BinaryOp::Mul, Box::new(div.clone()), x(3)));
        let cases = [
            (
                ReduceOp::Sum,
                ReduceOp::Max,
                exp.clone(),
                Some(div),
                vec![d, d, d],
                vec![],
            ),
            (
                ReduceOp::Sum,
                ReduceOp::Max,
                exp,
                Some(times),
                vec![d, d, d, d],
                vec![],
            ),
            (
                ReduceOp::Sum,
                ReduceOp::Max,
                node(Node::Unary(UnaryOp::Exp, Box::new(sub.clone()))),
                None,
                vec![d, d],
                vec![],
            ),
            (
                ReduceOp::Prod,
                ReduceOp::Min,
                sub.clone(),
                Some(plus),
                vec![d, d, d, d],
                vec![d],
            ),
            // A layer norm: the row's sum (input 1) first, the sum of squares of the centred
            // elements, then the centred elements over the result (input 2) times a weight.
            (
                ReduceOp::Sum,
                ReduceOp::Sum,
                node(Node::Binary(
                    BinaryOp::Mul,
                    Box::new(sub.clone()),
                    Box::new(sub.clone()),
                )),
                Some(node(Node::Binary(
                    BinaryOp::Mul,
                    Box::new(node(Node::Binary(BinaryOp::Div, Box::new(sub), x(2)))),
                    x(3),
                ))),
                vec![d, d, d, d],
                vec![],
            ),
        ];
        for (op, prologue, expr, epilogue, inputs, scalars) in cases {
            let layouts = [(1, false, false), (64, false, false), (64, false, true)];
            let vectors = [(64, true, false), (64, true, true), (4, true, true)];
            let f32_only = if d == DType::F32 { &vectors[..] } else { &[] };
            for &(cached, vector, full) in layouts.iter().chain(f32_only) {
                let per_output = (0..inputs.len()).map(|k| k == 1 || k == 2).collect();
                let per_position = (0..inputs.len())
                    .map(|k| k == 3 && op == ReduceOp::Sum)
                    .collect();
                let sig = staged::StagedSig {
                    op,
                    acc: d.accumulator(),
                    out: d,
                    outer_rank: 2,
                    map: strata_core::lower::operands::ReduceMap {
                        expr: expr.clone(),
                        inputs: inputs.clone(),
                        per_output,
                        per_position,
                        scalars: scalars.clone(),
                    },
                    prologue: staged::StagedPrologue {
                        op: prologue,
                        result: 1,
                    },
                    epilogue: epilogue.clone().map(|expr| staged::StagedEpilogue {
                        expr,
                        result: 2,
                        out: d,
                    }),
                    cached,
                    vector,
                    full,
                };
                for (caps, targets) in caps_for(&[d, d.accumulator()]) {
                    check(&staged::source(&sig, caps).unwrap(), targets);
                }
            }
        }
    }
}

/// Map→reduce: `exp(x0 - x1)` with `x1` one value per output, summed (softmax's denominator),
/// `x0 * x1 * s0` over inputs laid out alike, arg-maxed, and the same summed with `x1` one
/// value per position along the reduced axes (a layer norm's weight), each unsplit and split.
#[test]
fn map_reduce_variants_validate() {
    use ReduceOp::*;
    for d in [DType::F32, DType::F16, DType::BF16] {
        let x = |k| Box::new(Expr::input(k, d));
        let node = |node| Expr { dtype: d, node };
        let sub = node(Node::Binary(BinaryOp::Sub, x(0), x(1)));
        let exp = node(Node::Unary(UnaryOp::Exp, Box::new(sub)));
        let mul = node(Node::Binary(BinaryOp::Mul, x(0), x(1)));
        let scaled = node(Node::Binary(
            BinaryOp::Mul,
            Box::new(mul),
            Box::new(Expr::scalar(0, d)),
        ));
        let cases = [
            (
                Sum,
                DType::F32,
                exp,
                vec![false, true],
                vec![false; 2],
                vec![],
            ),
            (
                ArgMax,
                d,
                scaled.clone(),
                vec![false; 2],
                vec![false; 2],
                vec![d],
            ),
            (
                Sum,
                DType::F32,
                scaled,
                vec![false; 2],
                vec![false, true],
                vec![d],
            ),
        ];
        for (op, acc, expr, per_output, per_position, scalars) in cases {
            for (group, partial, vector) in every_combination(&[1, 256], &[false, true], &[1, 4]) {
                if vector == 4 && d.itemsize() != 4 {
                    continue;
                }
                {
                    let out = match op {
                        _ if partial => acc,
                        ArgMax => DType::I64,
                        _ => d,
                    };
                    let sig = reduce::ReduceSig {
                        op,
                        acc,
                        input: d,
                        out,
                        outer_rank: 2,
                        reduced_rank: 2,
                        group,
                        combine: false,
                        partial,
                        map: Some(strata_core::lower::operands::ReduceMap {
                            expr: expr.clone(),
                            inputs: vec![d, d],
                            per_output: per_output.clone(),
                            per_position: per_position.clone(),
                            scalars: scalars.clone(),
                        }),
                        vector,
                    };
                    for (caps, targets) in caps_for(&[d, acc]) {
                        check(&reduce::source(&sig, caps).unwrap(), targets);
                    }
                }
            }
        }
    }
}

/// The f16 matmul on cooperative matrices (Vulkan only: wgpu offers them there and on Metal
/// in 8×8 f32 only), validated with the capabilities it needs and written as SPIR-V: the
/// cooperative types and the Vulkan memory model they bring are emitted only by that writer.
#[test]
fn cooperative_matmul_validates_and_writes_spirv() {
    use naga::valid::Capabilities as C;
    let caps = Caps {
        f16: true,
        coop_f16: true,
        ..CAPS
    };
    for vectors in [false, true] {
        let src = coop_matmul::source(caps, vectors);
        assert!(src.contains("coopMultiplyAdd"), "{src}");
        let module = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
        let needs = C::FLOAT64 | C::SHADER_INT64 | C::SHADER_FLOAT16 | C::COOPERATIVE_MATRIX | C::SUBGROUP
            // (`unpack2x16float`: the 16-byte staging.)
            | C::SHADER_FLOAT16_IN_FLOAT32;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), needs)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}\n{src}", e.emit_to_string(&src)));
        let words = naga::back::spv::write_vec(&module, &info, &Default::default(), None)
            .unwrap_or_else(|e| panic!("SPIR-V: {e}\n{src}"));
        assert!(words.len() > 100);
        // Without the capability the module is refused: the tiled kernel is what such adapters get.
        assert!(naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            needs - C::COOPERATIVE_MATRIX
        )
        .validate(&module)
        .is_err());
    }
}

#[test]
fn matmul_and_index_variants_validate() {
    for d in DType::ALL {
        let acc = match d {
            DType::F16 | DType::BF16 => DType::F32,
            _ => d,
        };
        for (caps, targets) in caps_for(&[d]) {
            let sig = matmul::MatmulSig {
                dtype: d,
                acc,
                coop: false,
                staged: [Staged::Elements; 2],
            };
            check(&matmul::source(&sig, caps), targets);
            if d == DType::F32 {
                let all = [Staged::Elements, Staged::AlongDepth, Staged::AlongTile];
                for staged in all.into_iter().flat_map(|a| all.map(|b| [a, b])) {
                    let sig = matmul::MatmulSig {
                        staged,
                        ..sig.clone()
                    };
                    check(&matmul::source(&sig, caps), targets);
                }
            }
        }
        for (kind, flagged, rows) in [
            (IndexKind::Gather, false, false),
            (IndexKind::Gather, true, false),
            (IndexKind::Gather, false, true),
            (IndexKind::Gather, true, true),
            (IndexKind::Scatter, false, false),
            (IndexKind::ScatterAdd, false, false),
        ] {
            // The row path moves word groups of four elements of at most 32 bits.
            if rows && d.itemsize() > 4 {
                continue;
            }
            let sig = index::IndexSig {
                dtype: d,
                rank: 3,
                axis: 1,
                kind,
                flagged,
                rows,
            };
            for (caps, targets) in caps_for(&[d]) {
                check(&index::source(&sig, caps), targets);
            }
        }
    }
}

#[test]
fn the_f32_math_library_validates_without_f64() {
    let caps = Caps::default();
    let e = Expr::unary(UnaryOp::Gelu, Expr::input(0, DType::F32));
    validate(&map::source(&map_sig(e, vec![DType::F32, DType::F32], true, 1), caps).unwrap());
    // Each square root (fused residual, WGSL's own) where an adapter has no f64, on the
    // portable targets too.
    let root = Expr::unary(UnaryOp::Sqrt, Expr::input(0, DType::F32));
    for fused_fma in [true, false] {
        let caps = Caps {
            fused_fma,
            ..PORTABLE
        };
        let sig = map_sig(root.clone(), vec![DType::F32, DType::F32], true, 1);
        let src = map::source(&sig, caps).unwrap();
        assert_eq!(src.contains("fn sqrt_fused_f32"), fused_fma, "{src}");
        check(&src, &[Target::Vulkan, Target::Metal, Target::Dx12]);
    }
}

#[test]
fn histogram_variants_validate() {
    use super::histogram::{source, HistogramSig};
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
        // Counts with private copies, weight sums with one copy, and bins past workgroup memory.
        for (acc, weighted, bins, copies) in [
            (DType::U32, false, 64, 8),
            (DType::F32, true, 4096, 1),
            (DType::U32, false, 10_000, 0),
        ] {
            let sig = HistogramSig {
                bin: bin.clone(),
                values,
                acc,
                weighted,
                scalars: scalars.clone(),
                bins,
                copies,
            };
            for (caps, targets) in caps_for(&[values, acc]) {
                let src = source(&sig, caps).unwrap_or_else(|e| panic!("{e}: {sig:?}"));
                check(&src, targets);
            }
        }
    }
}

#[test]
fn convolution_variants_validate() {
    for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let acc = if d == DType::F64 { d } else { DType::F32 };
        for pass in [
            ConvPass::Forward,
            ConvPass::BackwardData,
            ConvPass::BackwardFilter,
        ] {
            for tile in strata_core::lower::conv_plan::TILES {
                for (sum_partials, fast_division) in [(false, false), (false, true), (true, false)]
                {
                    let sig = conv::ConvSig {
                        pass,
                        dtype: d,
                        acc,
                        tile,
                        sum_partials,
                        fast_division,
                        strided: pass == ConvPass::BackwardData && fast_division,
                    };
                    for (caps, targets) in caps_for(&[d]) {
                        check(&conv::source(&sig, caps), targets);
                    }
                }
            }
        }
    }
}
