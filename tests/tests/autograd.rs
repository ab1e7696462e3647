//! Autograd on every backend. Gradcheck: every differentiable op (elementwise, casts,
//! reductions, matmul, views, index ops, joins) with its inputs in several layouts
//! (contiguous, transposed, negative steps, broadcast), its analytic gradient against central
//! finite differences in f64 on the CPU; then every device and float dtype against the CPU's
//! f64 gradients. Then the semantics peers got wrong: repeated indices, `cat` pieces,
//! broadcast operands, views of leaves, accumulation, `retain_graph`, `no_grad`, `detach`,
//! in-place writes, memory over a long training loop, long chains, and the fused backward.

use strata::autograd;
use strata::ops::Axes;
use strata::prelude::*;
use strata::RecordKind;
use strata_tests::{test_device, Rng};

type OpFn = fn(&[Tensor]) -> Result<Tensor>;

/// What values an input takes: any sign, or positive (for log, sqrt, a divisor, ...).
#[derive(Clone, Copy)]
enum Range {
    Signed,
    Positive,
}

/// One op to check: its inputs' shapes and ranges, and the op over them.
struct Case {
    name: &'static str,
    inputs: Vec<(Vec<usize>, Range)>,
    f: OpFn,
}

fn case(name: &'static str, inputs: &[(&[usize], Range)], f: OpFn) -> Case {
    Case {
        name,
        inputs: inputs.iter().map(|(s, r)| (s.to_vec(), *r)).collect(),
        f,
    }
}

use Range::{Positive as P, Signed as S};

fn cases() -> Vec<Case> {
    vec![
        // Elementwise: every differentiable unary op (rounding ops give zeros).
        case("neg", &[(&[2, 3], S)], |x| x[0].neg()),
        case("abs", &[(&[2, 3], S)], |x| x[0].abs()),
        case("square", &[(&[2, 3], S)], |x| x[0].square()),
        case("sqrt", &[(&[2, 3], P)], |x| x[0].sqrt()),
        case("rsqrt", &[(&[2, 3], P)], |x| x[0].rsqrt()),
        case("reciprocal", &[(&[2, 3], P)], |x| x[0].reciprocal()),
        case("exp", &[(&[2, 3], S)], |x| x[0].exp()),
        case("exp2", &[(&[2, 3], S)], |x| x[0].exp2()),
        case("expm1", &[(&[2, 3], S)], |x| x[0].expm1()),
        case("log", &[(&[2, 3], P)], |x| x[0].log()),
        case("log2", &[(&[2, 3], P)], |x| x[0].log2()),
        case("log10", &[(&[2, 3], P)], |x| x[0].log10()),
        case("log1p", &[(&[2, 3], P)], |x| x[0].log1p()),
        case("sin", &[(&[2, 3], S)], |x| x[0].sin()),
        case("cos", &[(&[2, 3], S)], |x| x[0].cos()),
        case("tan", &[(&[2, 3], S)], |x| x[0].mul(0.5)?.tan()),
        case("tanh", &[(&[2, 3], S)], |x| x[0].tanh()),
        case("sigmoid", &[(&[2, 3], S)], |x| x[0].sigmoid()),
        case("relu", &[(&[2, 3], S)], |x| x[0].relu()),
        case("gelu", &[(&[2, 3], S)], |x| x[0].gelu()),
        case("erf", &[(&[2, 3], S)], |x| x[0].erf()),
        case("floor", &[(&[2, 3], S)], |x| x[0].floor()),
        // Binary ops, broadcasting.
        case("add", &[(&[2, 3], S), (&[3], S)], |x| x[0].add(&x[1])),
        case("sub", &[(&[2, 3], S), (&[2, 1], S)], |x| x[0].sub(&x[1])),
        case("mul", &[(&[2, 3], S), (&[2, 3], S)], |x| x[0].mul(&x[1])),
        case("div", &[(&[2, 3], S), (&[3], P)], |x| x[0].div(&x[1])),
        case("pow", &[(&[2, 3], P), (&[2, 3], S)], |x| x[0].pow(&x[1])),
        case("maximum", &[(&[2, 3], S), (&[2, 3], S)], |x| {
            x[0].maximum(&x[1])
        }),
        case("minimum", &[(&[2, 3], S), (&[3], S)], |x| {
            x[0].minimum(&x[1])
        }),
        case("atan2", &[(&[2, 3], S), (&[2, 3], P)], |x| {
            x[0].atan2(&x[1])
        }),
        case("scalar ops", &[(&[2, 3], S)], |x| {
            x[0].mul(3.0)?.add(1.0)?.sub(0.5)?.div(2.0)
        }),
        case("where", &[(&[2, 3], S), (&[2, 3], S)], |x| {
            Tensor::where_cond(&x[0].gt(0.0)?, &x[0], &x[1])
        }),
        case("clamp", &[(&[2, 3], S)], |x| x[0].clamp(-0.6, 0.7)),
        case("fma", &[(&[2, 3], S), (&[2, 3], S), (&[3], S)], |x| {
            x[0].fma(&x[1], &x[2])
        }),
        case("lerp", &[(&[2, 3], S), (&[2, 3], S)], |x| {
            x[0].lerp(&x[1], 0.3)
        }),
        case("to_dtype", &[(&[2, 3], S)], |x| {
            x[0].to_dtype(DType::F64)?.mul(&x[0].to_dtype(DType::F64)?)
        }),
        // Reductions.
        case("sum all", &[(&[2, 3], S)], |x| x[0].sum(Axes::All, false)),
        case("sum axis", &[(&[2, 3, 2], S)], |x| x[0].sum([0, 2], true)),
        case("mean", &[(&[2, 3], S)], |x| x[0].mean(1, false)),
        case("prod", &[(&[2, 3], S)], |x| x[0].prod(1, false)),
        case("max", &[(&[2, 3], S)], |x| x[0].max(0, false)),
        case("min all", &[(&[2, 3], S)], |x| x[0].min(Axes::All, true)),
        case("var", &[(&[2, 4], S)], |x| x[0].var(1, 1, false)),
        case("std", &[(&[2, 4], S)], |x| x[0].std(Axes::All, 0, false)),
        case("logsumexp", &[(&[2, 3], S)], |x| x[0].logsumexp(1, true)),
        case("softmax", &[(&[2, 3], S)], |x| x[0].softmax(-1)),
        case("softmax axis 0", &[(&[3, 2], S)], |x| x[0].softmax(0)),
        case("log_softmax", &[(&[2, 3], S)], |x| x[0].log_softmax(-1)),
        // Matmul: matrices, a broadcast batch, 1-D operands.
        case("matmul", &[(&[2, 3], S), (&[3, 2], S)], |x| {
            x[0].matmul(&x[1])
        }),
        case("matmul batch", &[(&[2, 2, 3], S), (&[3, 2], S)], |x| {
            x[0].matmul(&x[1])
        }),
        case("matmul vector", &[(&[3], S), (&[3, 2], S)], |x| {
            x[0].matmul(&x[1])
        }),
        case("dot", &[(&[4], S), (&[4], S)], |x| x[0].dot(&x[1])),
        // Views.
        case("slice", &[(&[3, 4], S)], |x| x[0].slice(s![1.., ..;2])),
        case("slice negative step", &[(&[3, 4], S)], |x| {
            x[0].slice(s![..;-2, 1..3])
        }),
        case("transpose", &[(&[2, 3], S)], |x| {
            x[0].t()?.mul(&x[0].t()?.exp()?)
        }),
        case("permute", &[(&[2, 3, 2], S)], |x| {
            x[0].permute([2, 0, 1])?.exp()
        }),
        case("expand", &[(&[3, 1], S)], |x| {
            x[0].expand([2, 3, 4])?.mul(2.0)
        }),
        case("reshape", &[(&[2, 3], S)], |x| {
            x[0].t()?.reshape([6])?.exp()
        }),
        case("flip", &[(&[2, 3], S)], |x| x[0].flip(&[1])?.mul(&x[0])),
        case("narrow", &[(&[4, 2], S)], |x| x[0].narrow(0, 1, 2)),
        case("squeeze", &[(&[1, 3, 1], S)], |x| x[0].squeeze().exp()),
        case("unsqueeze", &[(&[3], S)], |x| {
            x[0].unsqueeze(0)?.expand([2, 3])?.exp()
        }),
        // Index ops (repeated indices accumulate).
        case("index_select", &[(&[3, 2], S)], |x| {
            let dev = x[0].device();
            x[0].index_select(0, &Tensor::from_slice(&[2i64, 0, 2, 2], [4], dev)?)
        }),
        case("gather", &[(&[2, 3], S)], |x| {
            let dev = x[0].device();
            x[0].gather(1, &Tensor::from_slice(&[0i64, 0, 2, 1], [2, 2], dev)?)
        }),
        case("take", &[(&[2, 3], S)], |x| {
            let dev = x[0].device();
            x[0].take(&Tensor::from_slice(&[5i64, -1, 0], [3], dev)?)
        }),
        case("masked_fill", &[(&[2, 3], S)], |x| {
            x[0].masked_fill(&x[0].gt(0.0)?, 0.25)
        }),
        case("scatter_add", &[(&[2, 3], S), (&[2, 2], S)], |x| {
            let dev = x[0].device();
            let idx = Tensor::from_slice(&[1i64, 1, 0, 2], [2, 2], dev)?;
            x[0].scatter_add(1, &idx, &x[1])
        }),
        case("scatter", &[(&[2, 3], S), (&[2, 2], S)], |x| {
            let dev = x[0].device();
            let idx = Tensor::from_slice(&[1i64, 2, 0, 2], [2, 2], dev)?;
            x[0].scatter(1, &idx, &x[1])
        }),
        // Joins and splits.
        case("cat", &[(&[2, 3], S), (&[1, 3], S)], |x| {
            Tensor::cat(&[&x[0], &x[1], &x[0]], 0)
        }),
        // Padding on both sides, cropping on one, and a pad of the last axis only.
        case("pad", &[(&[3, 4], S)], |x| {
            x[0].pad(&[(1, -1), (2, 1)], 0.5)?
                .mul(&x[0].pad(&[(0, 0), (3, 0)], 0)?)
        }),
        case("stack", &[(&[2, 3], S), (&[2, 3], S)], |x| {
            Tensor::stack(&[&x[0], &x[1]], 1)
        }),
        case("split", &[(&[5, 2], S)], |x| {
            let parts = x[0].split(2, 0)?;
            parts[0]
                .mul(&parts[1])?
                .add(&parts[2].sum(Axes::All, false)?)
        }),
        case("roll", &[(&[2, 3], S)], |x| x[0].roll(1, Some(1))),
        case("tril", &[(&[3, 3], S)], |x| x[0].tril(0)),
        case("triu", &[(&[2, 3], S)], |x| x[0].triu(1)),
    ]
}

/// How an op's input reaches it from its leaf: as the leaf, a transposed view of a leaf of
/// the reversed shape, a view with negative steps, or a broadcast of a leaf with its first
/// axis 1.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Contiguous,
    Transposed,
    NegativeSteps,
    Broadcast,
}

const LAYOUTS: [Layout; 4] = [
    Layout::Contiguous,
    Layout::Transposed,
    Layout::NegativeSteps,
    Layout::Broadcast,
];

/// The leaf's shape for an op input of `shape` reached through `layout`.
fn leaf_shape(shape: &[usize], layout: Layout) -> Vec<usize> {
    match layout {
        Layout::Transposed => shape.iter().rev().copied().collect(),
        Layout::Broadcast if !shape.is_empty() => {
            let mut s = shape.to_vec();
            s[0] = 1;
            s
        }
        _ => shape.to_vec(),
    }
}

/// The op input from its leaf.
fn view_of(leaf: &Tensor, shape: &[usize], layout: Layout) -> Result<Tensor> {
    match layout {
        Layout::Contiguous => Ok(leaf.clone()),
        Layout::Transposed => {
            let order: Vec<isize> = (0..shape.len() as isize).rev().collect();
            leaf.permute(order)
        }
        Layout::NegativeSteps => {
            let all: Vec<isize> = (0..shape.len() as isize).collect();
            leaf.flip(&all)
        }
        Layout::Broadcast => leaf.expand(shape.to_vec()),
    }
}

/// Distinct values for input `j` of `n` elements: multiples of 1/64 in (-2, 2) (or
/// (0.25, 3.5) when positive), exact in every float dtype, apart from other inputs' values
/// (no ties, so `max` and `maximum` have one derivative).
fn values(n: usize, j: usize, range: Range) -> Vec<f64> {
    (0..n)
        .map(|k| {
            let k = ((k * 7 + 3) % n.max(1)) as i64;
            match range {
                Range::Signed => (8 * (k - n as i64 / 2) + 2 + j as i64) as f64 / 64.0,
                Range::Positive => (8 * k + 2 + j as i64) as f64 / 64.0 + 0.25,
            }
        })
        .collect()
}

/// The leaves of a case (values as `values`, in `dtype` on `dev`), requiring gradients.
fn leaves(c: &Case, layouts: &[Layout], dtype: DType, dev: &Device) -> Result<Vec<Tensor>> {
    c.inputs
        .iter()
        .enumerate()
        .map(|(j, (shape, range))| {
            let ls = leaf_shape(shape, layouts[j]);
            let n: usize = ls.iter().product();
            Tensor::from_slice(&values(n, j, *range), ls, dev)?
                .to_dtype(dtype)?
                .requires_grad_(true)
        })
        .collect()
}

/// The op's value weighted by fixed weights and summed: a one-element loss whose gradient
/// with respect to the op's output is the weights.
fn loss(c: &Case, leaves: &[Tensor], layouts: &[Layout]) -> Result<Tensor> {
    let inputs = c
        .inputs
        .iter()
        .zip(leaves)
        .zip(layouts)
        .map(|(((shape, _), leaf), &l)| view_of(leaf, shape, l))
        .collect::<Result<Vec<_>>>()?;
    let y = (c.f)(&inputs)?;
    let n = y.numel();
    let w: Vec<f64> = (0..n)
        .map(|k| ((k * 5 + 1) % 7) as f64 / 4.0 - 0.75)
        .collect();
    let w = Tensor::from_slice(&w, y.shape().to_vec(), y.device())?.to_dtype(y.dtype())?;
    y.mul(&w)?.sum(Axes::All, false)
}

/// The analytic gradients of a case's loss for each leaf, as f64 host values.
fn analytic(c: &Case, layouts: &[Layout], dtype: DType, dev: &Device) -> Result<Vec<Vec<f64>>> {
    let ls = leaves(c, layouts, dtype, dev)?;
    loss(c, &ls, layouts)?.backward()?;
    ls.iter()
        .map(|l| match l.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>(),
            None => Ok(vec![0.0; l.numel()]),
        })
        .collect()
}

/// Central differences of the loss in f64 on the CPU, leaf by leaf, element by element.
fn numeric(c: &Case, layouts: &[Layout]) -> Result<Vec<Vec<f64>>> {
    let cpu = Device::cpu();
    let eps = 1e-6;
    let base = autograd::no_grad(|| leaves(c, layouts, DType::F64, &cpu))?;
    let mut out = Vec::new();
    for (j, leaf) in base.iter().enumerate() {
        let host = leaf.to_vec::<f64>()?;
        let mut grads = Vec::with_capacity(host.len());
        for i in 0..host.len() {
            let at = |delta: f64| -> Result<f64> {
                let mut v = host.clone();
                v[i] += delta;
                let mut ls: Vec<Tensor> = base.iter().map(|t| t.detach()).collect();
                ls[j] = Tensor::from_slice(&v, leaf.shape().to_vec(), &cpu)?;
                autograd::no_grad(|| loss(c, &ls, layouts))?.item::<f64>()
            };
            grads.push((at(eps)? - at(-eps)?) / (2.0 * eps));
        }
        out.push(grads);
    }
    Ok(out)
}

fn close(got: &[Vec<f64>], want: &[Vec<f64>], tol: f64, ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}");
    for (j, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{ctx}: leaf {j}");
        for (k, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= tol * (1.0 + b.abs()),
                "{ctx}: leaf {j} element {k}: {a} vs {b}\ngot  {g:?}\nwant {w:?}"
            );
        }
    }
}

/// The layouts a case runs in: each layout for every input (a broadcast only where the
/// input's first axis can grow).
fn layout_sets(c: &Case) -> Vec<Vec<Layout>> {
    LAYOUTS
        .iter()
        .map(|&l| {
            c.inputs
                .iter()
                .map(|(shape, _)| match l {
                    Layout::Broadcast if shape.first().is_none_or(|&n| n < 2) => Layout::Contiguous,
                    other => other,
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_op_matches_finite_differences_in_f64() {
    let cpu = Device::cpu();
    for c in cases() {
        for layouts in layout_sets(&c) {
            let ctx = format!("{} with {layouts:?}", c.name);
            let want = numeric(&c, &layouts).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let got =
                analytic(&c, &layouts, DType::F64, &cpu).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            close(&got, &want, 1e-6, &ctx);
        }
    }
}

/// Every device and float dtype against the CPU's f64 gradients (contiguous inputs, and
/// transposed ones in f32; the finite-difference test covers the other layouts on the CPU).
fn every_device_matches_the_cpu(dev: &Device) -> Result<()> {
    let cpu = Device::cpu();
    for c in cases() {
        for (k, layouts) in layout_sets(&c).into_iter().take(2).enumerate() {
            let want = analytic(&c, &layouts, DType::F64, &cpu)?;
            let dtypes = strata_tests::dtypes()
                .into_iter()
                .filter(|d| d.is_float() && (k == 0 || *d == DType::F32));
            for dtype in dtypes {
                let tol = match dtype {
                    DType::F64 => 1e-9,
                    DType::F32 => 2e-3,
                    DType::F16 => 4e-2,
                    _ => 8e-2,
                };
                let ctx = format!("{} in {dtype} with {layouts:?} on {}", c.name, dev.name());
                let got = analytic(&c, &layouts, dtype, dev)
                    .map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
                close(&got, &want, tol, &ctx);
            }
        }
    }
    Ok(())
}
test_device!(
    every_device_matches_the_cpu_gradients,
    every_device_matches_the_cpu
);

fn f32s(v: &[f32], dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(v, [v.len()], dev)
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.to_vec::<f32>()
}

/// Repeated indices, `cat` pieces, broadcast operands and views of leaves get the gradients
/// PyTorch gives.
fn tricky_gradients(dev: &Device) -> Result<()> {
    // A position gathered three times gets three shares.
    let x = f32s(&[1.0, 2.0, 3.0], dev)?.requires_grad_(true)?;
    let idx = Tensor::from_slice(&[2i64, 2, 0, 2], [4], dev)?;
    x.index_select(0, &idx)?.sum(Axes::All, false)?.backward()?;
    assert_eq!(host(&x.grad().unwrap())?, vec![1.0, 0.0, 3.0]);
    // cat of a tensor with itself: both pieces' gradients add up.
    let a = f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?;
    let w = f32s(&[1.0, 2.0, 3.0, 4.0], dev)?;
    Tensor::cat(&[&a, &a], 0)?
        .mul(&w)?
        .sum(Axes::All, false)?
        .backward()?;
    assert_eq!(host(&a.grad().unwrap())?, vec![4.0, 6.0]);
    // A broadcast operand's gradient is summed back to its shape.
    let b = f32s(&[1.0, 2.0, 3.0], dev)?.requires_grad_(true)?;
    let m = Tensor::ones([4, 3], DType::F32, dev)?;
    m.mul(&b)?.sum(Axes::All, false)?.backward()?;
    assert_eq!(b.grad().unwrap().shape(), &[3]);
    assert_eq!(host(&b.grad().unwrap())?, vec![4.0, 4.0, 4.0]);
    // A view of a leaf sends its gradient to the leaf.
    let l = Tensor::arange(0, 6, 1, DType::F32, dev)?
        .reshape([2, 3])?
        .requires_grad_(true)?;
    l.slice(s![.., 1])?
        .mul(10.0)?
        .sum(Axes::All, false)?
        .backward()?;
    assert_eq!(
        host(&l.grad().unwrap())?,
        vec![0.0, 10.0, 0.0, 0.0, 10.0, 0.0]
    );
    // maximum splits a tie; max over an axis shares it among the tied maxima.
    let p = f32s(&[1.0, 5.0], dev)?.requires_grad_(true)?;
    let q = f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?;
    p.maximum(&q)?.sum(Axes::All, false)?.backward()?;
    assert_eq!(host(&p.grad().unwrap())?, vec![0.5, 1.0]);
    assert_eq!(host(&q.grad().unwrap())?, vec![0.5, 0.0]);
    let t = f32s(&[3.0, 1.0, 3.0], dev)?.requires_grad_(true)?;
    t.max(Axes::All, false)?.backward()?;
    assert_eq!(host(&t.grad().unwrap())?, vec![0.5, 0.0, 0.5]);
    // prod with one zero: the zero gets the product of the others.
    let z = f32s(&[2.0, 0.0, 3.0], dev)?.requires_grad_(true)?;
    z.prod(Axes::All, false)?.backward()?;
    assert_eq!(host(&z.grad().unwrap())?, vec![0.0, 6.0, 0.0]);
    // relu and abs give 0 at 0.
    let r = f32s(&[-1.0, 0.0, 2.0], dev)?.requires_grad_(true)?;
    r.relu()?
        .add(&r.abs()?)?
        .sum(Axes::All, false)?
        .backward()?;
    assert_eq!(host(&r.grad().unwrap())?, vec![-1.0, 0.0, 2.0]);
    // clamp passes the gradient inside its bounds, the bounds included; a tensor bound gets
    // it where it clamped.
    let v = f32s(&[-1.0, 0.0, 0.5, 1.0, 2.0], dev)?.requires_grad_(true)?;
    let lo = f32s(&[0.0], dev)?.requires_grad_(true)?;
    v.clamp(&lo, 1.0)?.sum(Axes::All, false)?.backward()?;
    assert_eq!(host(&v.grad().unwrap())?, vec![0.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(host(&lo.grad().unwrap())?, vec![1.0]);
    // An f16 leaf gets an f16 gradient through an f32 computation.
    let h = Tensor::ones([2], DType::F16, dev)?.requires_grad_(true)?;
    h.to_dtype(DType::F32)?
        .mul(3.0)?
        .sum(Axes::All, false)?
        .backward()?;
    let hg = h.grad().unwrap();
    assert_eq!((hg.dtype(), host(&hg)?), (DType::F16, vec![3.0, 3.0]));
    Ok(())
}
test_device!(tricky_gradients_match_pytorch, tricky_gradients);

/// Accumulation over two backward passes, `retain_graph`, `autograd::grad`, `no_grad`,
/// `detach`, and the errors PyTorch raises.
fn graph_semantics(dev: &Device) -> Result<()> {
    let x = f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?;
    let y = x.square()?.sum(Axes::All, false)?;
    autograd::backward(&[&y], None, true)?;
    autograd::backward(&[&y], None, false)?;
    assert_eq!(host(&x.grad().unwrap())?, vec![4.0, 8.0]);
    let err = y.backward().unwrap_err().to_string();
    assert!(
        err.contains("second time") && err.contains("retain_graph"),
        "{err}"
    );
    // grad() returns and accumulates nothing.
    x.zero_grad();
    let z = x.exp()?.sum(Axes::All, false)?;
    let g = autograd::grad(&[&z], &[&x], None, false)?;
    assert!((host(g[0].as_ref().unwrap())?[0] - 1f32.exp()).abs() < 1e-5);
    assert!(x.grad().is_none());
    // no_grad and detach cut the graph.
    assert!(!autograd::no_grad(|| x.mul(2.0))?.requires_grad());
    assert!(!x.mul(2.0)?.detach().requires_grad());
    assert_eq!(x.mul(2.0)?.grad_fn(), Some("MulBackward"));
    // Only float leaves; only leaves switch off; one-element roots without a gradient.
    assert!(Tensor::zeros([1], DType::I32, dev)?
        .requires_grad_(true)
        .is_err());
    assert!(x.mul(2.0)?.requires_grad_(false).is_err());
    assert!(x.mul(2.0)?.backward().is_err());
    assert!(f32s(&[1.0], dev)?.backward().is_err());
    // Comparisons and integer results cut the graph.
    assert!(!x.gt(0.0)?.requires_grad());
    assert!(!x.argmax(None, false)?.requires_grad());
    Ok(())
}
test_device!(graph_semantics_match_pytorch, graph_semantics);

/// Post-accumulate hooks: once per pass after a leaf's last contribution, with the
/// accumulated gradient (earlier passes' included), while the pass goes on; not for
/// `autograd::grad`, not once removed; an `Err` ends the pass; only leaves take them.
fn post_accumulate_hooks(dev: &Device) -> Result<()> {
    use std::sync::{Arc, Mutex};
    let w = f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?;
    let v = f32s(&[3.0], dev)?.requires_grad_(true)?;
    // (leaf, gradient) of each call.
    type Calls = Arc<Mutex<Vec<(char, Vec<f32>)>>>;
    let seen: Calls = Arc::default();
    let hook = |name: char| {
        let log = seen.clone();
        move |g: &Tensor| -> Result<()> {
            log.lock().unwrap().push((name, g.to_vec::<f32>()?));
            Ok(())
        }
    };
    let on_w = w.register_post_accumulate_grad_hook(hook('w'))?;
    v.register_post_accumulate_grad_hook(hook('v'))?;
    // w reaches the loss three times (twice through one product), v once: one call each.
    let loss = |w: &Tensor| -> Result<Tensor> {
        let early = w.mul(w)?.sum(Axes::All, false)?; // Σ w²
        early.add(&w.mul(&v)?.sum(Axes::All, false)?) // + v Σ w
    };
    loss(&w)?.backward()?;
    let want_w = vec![2.0 * 1.0 + 3.0, 2.0 * 2.0 + 3.0];
    let mut calls = seen.lock().unwrap().clone();
    calls.sort_by_key(|c| c.0);
    assert_eq!(calls, vec![('v', vec![3.0]), ('w', want_w.clone())]);
    // A second pass: the hook sees the accumulated gradient.
    seen.lock().unwrap().clear();
    loss(&w)?.backward()?;
    let twice: Vec<f32> = want_w.iter().map(|g| 2.0 * g).collect();
    assert!(seen.lock().unwrap().contains(&('w', twice)));
    // autograd::grad accumulates nothing and runs no hook.
    seen.lock().unwrap().clear();
    autograd::grad(&[&loss(&w)?], &[&w], None, false)?;
    assert!(seen.lock().unwrap().is_empty());
    // A leaf that is the root: its hook runs too.
    v.zero_grad();
    v.backward_with(&f32s(&[7.0], dev)?)?;
    assert_eq!(seen.lock().unwrap().as_slice(), &[('v', vec![7.0])]);
    // Removed: not called; a hook's Err ends the pass with its message.
    on_w.remove();
    seen.lock().unwrap().clear();
    loss(&w)?.backward()?;
    assert_eq!(seen.lock().unwrap().len(), 1, "only v's hook");
    w.register_post_accumulate_grad_hook(|_| Err(Error::Invalid("stop here".into())))?;
    let err = loss(&w)?.backward().unwrap_err().to_string();
    assert!(err.contains("stop here"), "{err}");
    // A hook runs while the pass goes on: the last layer's weight is final before the
    // first layer's gradient exists.
    let (first, last) = (
        f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?,
        f32s(&[3.0], dev)?.requires_grad_(true)?,
    );
    let early: Arc<Mutex<Option<bool>>> = Arc::default();
    let (probe, seen_early) = (first.clone(), early.clone());
    let handle = last.register_post_accumulate_grad_hook(move |_| {
        *seen_early.lock().unwrap() = Some(probe.grad().is_none());
        Ok(())
    })?;
    first.exp()?.sum(Axes::All, false)?.mul(&last)?.backward()?;
    assert_eq!(
        *early.lock().unwrap(),
        Some(true),
        "the hook ran after the pass"
    );
    assert!(first.grad().is_some());
    handle.remove(); // (its closure held `first`)
                     // Only leaves that require a gradient.
    assert!(w
        .mul(2.0)?
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .is_err());
    assert!(f32s(&[1.0], dev)?
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .is_err());
    Ok(())
}
test_device!(
    post_accumulate_hooks_run_after_the_last_contribution,
    post_accumulate_hooks
);

/// In-place writes: into a leaf that requires a gradient (outside no_grad), of a value that
/// requires one, and into a tensor a backward function saved.
fn in_place_writes(dev: &Device) -> Result<()> {
    let w = f32s(&[1.0, 2.0], dev)?.requires_grad_(true)?;
    let err = w.add_(1.0).unwrap_err().to_string();
    assert!(err.contains("leaf"), "{err}");
    autograd::no_grad(|| w.sub_(0.5))?; // an optimizer step
    assert_eq!(host(&w)?, vec![0.5, 1.5]);
    let plain = Tensor::zeros([2], DType::F32, dev)?;
    assert!(plain.assign(&w.mul(2.0)?).is_err());
    // The saved input was overwritten after the op read it.
    let x = f32s(&[1.0, 2.0], dev)?;
    let y = w.mul(&x)?.sum(Axes::All, false)?;
    x.fill(5.0)?;
    let err = y.backward().unwrap_err().to_string();
    assert!(err.contains("modified by an in-place operation"), "{err}");
    Ok(())
}
test_device!(in_place_writes_are_refused_or_caught, in_place_writes);

/// 10^4 steps of gradient descent keep the device's allocated bytes flat: each step's graph
/// and saved tensors are freed with its loss.
fn training_memory(dev: &Device) -> Result<()> {
    let steps: usize = std::env::var("STRATA_AUTOGRAD_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let x = Tensor::arange(0, 8, 1, DType::F32, dev)?.div(8.0)?;
    let target = x.mul(3.0)?.add(1.0)?;
    let w = Tensor::zeros([1], DType::F32, dev)?.requires_grad_(true)?;
    let b = Tensor::zeros([1], DType::F32, dev)?.requires_grad_(true)?;
    let mut allocated = Vec::new();
    for step in 0..steps {
        let loss = x
            .mul(&w)?
            .add(&b)?
            .sub(&target)?
            .square()?
            .mean(Axes::All, false)?;
        loss.backward()?;
        autograd::no_grad(|| -> Result<()> {
            w.sub_(&w.grad().unwrap().mul(0.5)?)?;
            b.sub_(&b.grad().unwrap().mul(0.5)?)?;
            Ok(())
        })?;
        w.zero_grad();
        b.zero_grad();
        if step % (steps / 4).max(1) == 0 {
            dev.synchronize()?;
            allocated.push(dev.memory_stats().allocated);
        }
    }
    dev.synchronize()?;
    allocated.push(dev.memory_stats().allocated);
    let (first, last) = (
        allocated[1.min(allocated.len() - 1)],
        *allocated.last().unwrap(),
    );
    assert!(
        last <= first,
        "allocated bytes grew over {steps} steps: {allocated:?}"
    );
    if steps >= 1000 {
        assert!((w.item::<f32>()? - 3.0).abs() < 0.05 && (b.item::<f32>()? - 1.0).abs() < 0.05);
    }
    Ok(())
}
test_device!(a_training_loop_keeps_memory_flat, training_memory);

/// A chain of 10^4 ops runs backward without overflowing a stack, and a graph nobody holds
/// is freed.
fn long_chain(dev: &Device) -> Result<()> {
    let x = f32s(&[1.0], dev)?.requires_grad_(true)?;
    let mut y = x.clone();
    for _ in 0..10_000 {
        y = y.mul(1.0001)?;
    }
    y.backward()?;
    let g = host(&x.grad().unwrap())?[0];
    assert!((g - 1.0001f32.powi(10_000)).abs() < 1e-2, "{g}");
    Ok(())
}
test_device!(a_long_chain_runs_backward, long_chain);

/// The backward of `relu(a*b + c).sum()` is lazy elementwise work like any other: the three
/// gradients, flushed, run as one kernel (they share the relu's gradient: siblings).
fn fused_backward(dev: &Device) -> Result<()> {
    let n = 1000;
    let leaf = |k: i64| -> Result<Tensor> {
        Tensor::arange(k, k + n, 1, DType::F32, dev)?
            .div(500.0)?
            .sub(0.7)?
            .requires_grad_(true)
    };
    let (a, b, c) = (leaf(0)?, leaf(7)?, leaf(3)?);
    let loss = a.mul(&b)?.add(&c)?.relu()?.sum(Axes::All, false)?;
    loss.realize()?;
    dev.synchronize()?;
    let p = dev.profile(|| {
        loss.backward()?;
        dev.flush()
    })?;
    let kernels = p
        .device_work()
        .filter(|r| r.kind == RecordKind::Kernel)
        .count();
    if dev.fusion() && !dev.blocking() {
        assert_eq!(kernels, 1, "backward ran {kernels} kernels:\n{p}");
    }
    // The values: relu' · (b, a, 1).
    let (ha, hb, hc) = (host(&a)?, host(&b)?, host(&c)?);
    let on: Vec<bool> = (0..n as usize)
        .map(|i| ha[i] * hb[i] + hc[i] > 0.0)
        .collect();
    let want = |v: &[f32]| -> Vec<f32> {
        (0..n as usize)
            .map(|i| if on[i] { v[i] } else { 0.0 })
            .collect()
    };
    assert_eq!(host(&a.grad().unwrap())?, want(&hb));
    assert_eq!(host(&b.grad().unwrap())?, want(&ha));
    assert_eq!(host(&c.grad().unwrap())?, want(&vec![1.0; n as usize]));
    Ok(())
}
test_device!(the_backward_of_an_elementwise_chain_fuses, fused_backward);

/// Softmax's backward, `y·(g − Σ g·y)`, and log-softmax's, `g − exp(y)·Σ g`: where the
/// backend stages a row epilogue on its own (CUDA), the sum and the map run as one kernel;
/// the CPU's gradient on every backend.
fn softmax_backward_fuses(dev: &Device) -> Result<()> {
    for log in [false, true] {
        softmax_backward_in_one_kernel(dev, log)?;
    }
    Ok(())
}

fn softmax_backward_in_one_kernel(dev: &Device, log: bool) -> Result<()> {
    let mut gen = Generator::new(8);
    let xv = Tensor::randn([4, 1024], DType::F32, &mut gen, &Device::cpu())?;
    let wv = Tensor::randn([4, 1024], DType::F32, &mut gen, &Device::cpu())?;
    let grad_on = |d: &Device| -> Result<(Vec<f32>, usize)> {
        let x = xv.to_device(d)?.requires_grad_(true)?;
        let w = wv.to_device(d)?;
        let y = if log {
            x.log_softmax(-1)?
        } else {
            x.softmax(-1)?
        };
        let loss = y.mul(&w)?.sum(Axes::All, false)?;
        loss.realize()?;
        d.synchronize()?;
        let p = d.profile(|| {
            loss.backward()?;
            d.flush()
        })?;
        let kernels = p
            .device_work()
            .filter(|r| r.kind == RecordKind::Kernel)
            .count();
        Ok((host(&x.grad().unwrap())?, kernels))
    };
    let (got, kernels) = grad_on(dev)?;
    let target = dev.backend().target();
    if dev.fusion() && !dev.blocking() && target.stages_row_epilogue_alone {
        assert_eq!(
            kernels, 1,
            "softmax's backward (log {log}) ran {kernels} kernels"
        );
    }
    let (want, _) = grad_on(&Device::cpu())?;
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "log {log}, {k}: {a} vs {b}"
        );
    }
    Ok(())
}
test_device!(softmax_backward_runs_as_one_kernel, softmax_backward_fuses);

/// One step of a random differentiable chain (smooth ops only, so a rounding difference
/// between devices cannot move a value across a kink).
#[derive(Clone, Debug)]
enum Step {
    Unary(&'static str),
    /// With a second leaf of a shape that broadcasts to the current one.
    Binary(&'static str, Vec<usize>),
    Reduce(&'static str, isize, bool),
    Softmax(bool, isize),
    Transpose,
    Flip,
    MatmulSquare,
}

fn apply(step: &Step, x: &Tensor, other: Option<&Tensor>) -> Result<Tensor> {
    Ok(match step {
        Step::Unary(op) => match *op {
            "tanh" => x.tanh()?,
            "sigmoid" => x.sigmoid()?,
            "sin" => x.sin()?,
            "cos" => x.cos()?,
            "neg" => x.neg()?,
            "gelu" => x.gelu()?,
            _ => x.square()?.mul(0.5)?,
        },
        Step::Binary(op, _) => {
            let y = other.unwrap();
            match *op {
                "add" => x.add(y)?,
                "sub" => x.sub(y)?,
                "mul" => x.mul(y)?,
                _ => x.div(&y.square()?.add(1.0)?)?,
            }
        }
        Step::Reduce(op, axis, keepdim) => match *op {
            "sum" => x.sum(*axis, *keepdim)?,
            "mean" => x.mean(*axis, *keepdim)?,
            _ => x.logsumexp(*axis, *keepdim)?,
        },
        Step::Softmax(log, axis) => {
            if *log {
                x.log_softmax(*axis)?
            } else {
                x.softmax(*axis)?
            }
        }
        Step::Transpose => x.transpose(0, -1)?,
        Step::Flip => x.flip(&[-1])?,
        Step::MatmulSquare => x.matmul(&x.t()?)?,
    })
}

/// A random chain over a leaf of a random shape (rank 1–3): its steps, built so that each
/// applies to the shape the one before leaves.
fn random_chain(rng: &mut Rng) -> (Vec<usize>, Vec<Step>) {
    let rank = 1 + rng.below(3);
    let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(4)).collect();
    let mut current = shape.clone();
    let mut steps = Vec::new();
    for _ in 0..1 + rng.below(5) {
        let nd = current.len();
        let step = match rng.below(7) {
            0 | 1 => Step::Unary(
                ["tanh", "sigmoid", "sin", "cos", "neg", "gelu", "square"][rng.below(7)],
            ),
            2 => {
                let other: Vec<usize> = current
                    .iter()
                    .enumerate()
                    .skip(rng.below(nd + 1).min(nd))
                    .map(|(_, &n)| if rng.below(3) == 0 { 1 } else { n })
                    .collect();
                Step::Binary(["add", "sub", "mul", "div"][rng.below(4)], other)
            }
            3 if nd > 0 => Step::Reduce(
                ["sum", "mean", "logsumexp"][rng.below(3)],
                rng.below(nd) as isize,
                rng.below(2) == 0,
            ),
            4 if nd > 0 => Step::Softmax(rng.below(2) == 0, -1 - rng.below(nd) as isize),
            5 if nd >= 2 => Step::Transpose,
            6 if nd == 2 => Step::MatmulSquare,
            _ if nd > 0 => Step::Flip,
            _ => Step::Unary("tanh"),
        };
        current = match &step {
            Step::Reduce(_, axis, keepdim) => {
                let mut s = current.clone();
                if *keepdim {
                    s[*axis as usize] = 1;
                } else {
                    s.remove(*axis as usize);
                }
                s
            }
            Step::Transpose => {
                let mut s = current.clone();
                s.swap(0, nd - 1);
                s
            }
            Step::MatmulSquare => vec![current[0], current[0]],
            _ => current,
        };
        steps.push(step);
    }
    (shape, steps)
}

/// Runs a chain in `dtype` on `dev`: the gradients of every leaf, as f64 host values.
fn chain_grads(
    shape: &[usize],
    steps: &[Step],
    dtype: DType,
    dev: &Device,
) -> Result<Vec<Vec<f64>>> {
    let leaf = |s: &[usize], j: usize| -> Result<Tensor> {
        let n: usize = s.iter().product();
        Tensor::from_slice(&values(n, j % 4, Range::Signed), s.to_vec(), dev)?
            .to_dtype(dtype)?
            .requires_grad_(true)
    };
    let mut leaves = vec![leaf(shape, 0)?];
    let mut x = leaves[0].clone();
    for step in steps {
        let other = match step {
            Step::Binary(_, s) => {
                leaves.push(leaf(s, leaves.len())?);
                leaves.last().cloned()
            }
            _ => None,
        };
        x = apply(step, &x, other.as_ref())?;
    }
    let n = x.numel();
    let w: Vec<f64> = (0..n)
        .map(|k| ((k * 3 + 1) % 5) as f64 / 4.0 - 0.5)
        .collect();
    let w = Tensor::from_slice(&w, x.shape().to_vec(), dev)?.to_dtype(x.dtype())?;
    x.mul(&w)?.sum(Axes::All, false)?.backward()?;
    leaves
        .iter()
        .map(|l| match l.grad() {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>(),
            None => Ok(vec![0.0; l.numel()]),
        })
        .collect()
}

/// Random differentiable chains (the random-program test's backward steps): every device's
/// gradients against the CPU's, in every float dtype. `STRATA_AUTOGRAD_CHAINS` sets how many
/// (default 40).
fn random_chains(dev: &Device) -> Result<()> {
    let count: u64 = std::env::var("STRATA_AUTOGRAD_CHAINS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let cpu = Device::cpu();
    for seed in 0..count {
        let mut rng = Rng(seed);
        let (shape, steps) = random_chain(&mut rng);
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            let tol = match dtype {
                DType::F64 => 1e-9,
                DType::F32 => 2e-3,
                DType::F16 => 5e-2,
                _ => 1e-1,
            };
            let ctx = format!("seed {seed}: {shape:?} {dtype} {steps:?} on {}", dev.name());
            let want = chain_grads(&shape, &steps, dtype, &cpu)
                .map_err(|e| Error::Invalid(format!("{ctx} (cpu): {e}")))?;
            let got = chain_grads(&shape, &steps, dtype, dev)
                .map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
            close(&got, &want, tol, &ctx);
        }
    }
    Ok(())
}
test_device!(random_chains_backward_match_the_cpu, random_chains);
