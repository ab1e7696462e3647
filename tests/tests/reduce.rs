//! Reductions × dtypes × layouts × axes × keepdim against plain-Rust references (f64 and
//! i128 folds over the host values). Float tolerance: relative 1e-5 for f32 (summation order
//! differs), 1e-12 for f64, 1e-2 for the 16-bit floats; integers and bools exact.

use strata::ops::Axes;
use strata::prelude::*;
use strata::BackendKind;
use strata_tests::{indices, test_device};

fn values(dtype: DType, n: usize) -> Vec<Scalar> {
    (0..n)
        .map(|i| {
            let v = ((i * 7919) % 23) as f64 - 11.0;
            let v = if dtype.is_float() { v / 4.0 } else { v };
            Scalar::F64(v).cast(dtype, false)
        })
        .collect()
}

fn host(t: &Tensor) -> Result<Vec<Scalar>> {
    let flat = t.reshape([-1])?;
    (0..flat.numel())
        .map(|i| flat.slice(s![i])?.item_scalar())
        .collect()
}

fn make(dtype: DType, shape: &[usize], dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let t = Tensor::empty(shape, dtype, dev)?;
    let flat = t.reshape([-1])?;
    for (i, v) in values(dtype, n).into_iter().enumerate() {
        flat.set(s![i], v)?;
    }
    Ok(t)
}

/// Inputs of logical shape [3, 4, 5] (or an empty / 0-d one) in several layouts.
fn inputs(dtype: DType, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    Ok(vec![
        ("contiguous", make(dtype, &[3, 4, 5], dev)?),
        (
            "permuted",
            make(dtype, &[5, 3, 4], dev)?.permute([1, 2, 0])?,
        ),
        (
            "negative-stride",
            make(dtype, &[3, 4, 5], dev)?.slice(s![..;-1, .., ..;-1])?,
        ),
        (
            "offset",
            make(dtype, &[4, 5, 6], dev)?.slice(s![1.., 1.., 1..])?,
        ),
        ("broadcast", make(dtype, &[4, 1], dev)?.expand([3, 4, 5])?),
        ("zero-size", make(dtype, &[3, 0, 5], dev)?),
        ("0-d", make(dtype, &[], dev)?),
    ])
}

/// Groups the host values by output position: for each output element, its inputs in
/// row-major order of the reduced axes.
fn groups(shape: &[usize], vals: &[Scalar], reduced: &[usize]) -> (Vec<usize>, Vec<Vec<Scalar>>) {
    let out_shape: Vec<usize> = (0..shape.len())
        .filter(|a| !reduced.contains(a))
        .map(|a| shape[a])
        .collect();
    let mut groups = vec![vec![]; out_shape.iter().product()];
    for (flat, idx) in indices(shape).into_iter().enumerate() {
        let key: Vec<usize> = (0..shape.len())
            .filter(|a| !reduced.contains(a))
            .map(|a| idx[a])
            .collect();
        let o = key
            .iter()
            .zip(&out_shape)
            .fold(0, |acc, (&i, &d)| acc * d + i);
        groups[o].push(vals[flat]);
    }
    (out_shape, groups)
}

fn reference(name: &str, g: &[Scalar], dtype: DType) -> Option<Scalar> {
    let f: Vec<f64> = g.iter().map(|s| s.to_f64()).collect();
    let i: Vec<i128> = g.iter().map(|s| s.to_i128()).collect();
    let int_out = |v: i128| Scalar::I64(v as i64);
    Some(match name {
        "sum" if dtype.is_float() => Scalar::F64(f.iter().sum()).cast(dtype, false),
        "sum" => int_out(i.iter().sum()),
        "prod" if dtype.is_float() => Scalar::F64(f.iter().product()).cast(dtype, false),
        "prod" => int_out(i.iter().fold(1i128, |a, &b| a.wrapping_mul(b))),
        "max" | "min" if g.is_empty() => return None,
        "max" => *g
            .iter()
            .max_by(|a, b| a.to_f64().partial_cmp(&b.to_f64()).unwrap())
            .unwrap(),
        "min" => *g
            .iter()
            .min_by(|a, b| a.to_f64().partial_cmp(&b.to_f64()).unwrap())
            .unwrap(),
        "argmax" | "argmin" if g.is_empty() => return None,
        "argmax" => {
            let m = f.iter().cloned().fold(f64::MIN, f64::max);
            Scalar::I64(f.iter().position(|&v| v == m).unwrap() as i64)
        }
        "argmin" => {
            let m = f.iter().cloned().fold(f64::MAX, f64::min);
            Scalar::I64(f.iter().position(|&v| v == m).unwrap() as i64)
        }
        "any" => Scalar::Bool(g.iter().any(|s| s.to_bool())),
        "all" => Scalar::Bool(g.iter().all(|s| s.to_bool())),
        "mean" if dtype.is_float() => {
            Scalar::F64(f.iter().sum::<f64>() / f.len() as f64).cast(dtype, false)
        }
        "var" if dtype.is_float() => {
            let m = f.iter().sum::<f64>() / f.len() as f64;
            Scalar::F64(
                f.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (f.len() as f64 - 1.0).max(0.0),
            )
            .cast(dtype, false)
        }
        // Integers are converted to the default float dtype first.
        "logsumexp" => {
            let out = if dtype.is_float() { dtype } else { DType::F32 };
            Scalar::F64(f.iter().map(|v| v.exp()).sum::<f64>().ln()).cast(out, false)
        }
        "mean" | "var" => return None,
        _ => unreachable!(),
    })
}

fn close(got: Scalar, want: Scalar) -> bool {
    if got.dtype() != want.dtype() {
        return false;
    }
    if !got.dtype().is_float() {
        return got == want;
    }
    let (g, w) = (got.to_f64(), want.to_f64());
    if g.is_nan() || w.is_nan() {
        return g.is_nan() && w.is_nan();
    }
    let tol = match got.dtype() {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    };
    g == w || (g - w).abs() <= tol * w.abs().max(1.0)
}

fn run(t: &Tensor, name: &str, axes: Axes, keepdim: bool) -> Result<Tensor> {
    match name {
        "sum" => t.sum(axes, keepdim),
        "prod" => t.prod(axes, keepdim),
        "max" => t.max(axes, keepdim),
        "min" => t.min(axes, keepdim),
        "any" => t.any(axes, keepdim),
        "all" => t.all(axes, keepdim),
        "mean" => t.mean(axes, keepdim),
        "var" => t.var(axes, 1, keepdim),
        "logsumexp" => t.logsumexp(axes, keepdim),
        _ => unreachable!(),
    }
}

fn reductions(dev: &Device) -> Result<()> {
    let names = [
        "sum",
        "prod",
        "max",
        "min",
        "any",
        "all",
        "mean",
        "var",
        "logsumexp",
    ];
    for dtype in strata_tests::dtypes() {
        for (layout, t) in inputs(dtype, dev)? {
            let vals = host(&t)?;
            let nd = t.ndim() as isize;
            let mut axes_list: Vec<Axes> = vec![Axes::All];
            if nd >= 3 {
                axes_list.extend([
                    Axes::from(0),
                    Axes::from(-1),
                    Axes::from([0, 2]),
                    Axes::from([-2, 0, 1]),
                ]);
            }
            for axes in axes_list {
                let reduced: Vec<usize> = match &axes {
                    Axes::All => (0..t.ndim()).collect(),
                    Axes::List(l) => l.iter().map(|&a| ((a + nd) % nd.max(1)) as usize).collect(),
                };
                let (out_shape, gs) = groups(t.shape(), &vals, &reduced);
                for name in names {
                    for keepdim in [false, true] {
                        let ctx =
                            format!("{name} {axes:?} keepdim={keepdim} on {dtype} ({layout})");
                        let probe = [Scalar::I8(1).cast(dtype, false)];
                        let dtype_ok = reference(name, &probe, dtype).is_some();
                        let want: Option<Vec<Scalar>> =
                            gs.iter().map(|g| reference(name, g, dtype)).collect();
                        let got = run(&t, name, axes.clone(), keepdim);
                        let Some(want) = want.filter(|_| dtype_ok) else {
                            assert!(got.is_err(), "{ctx}: expected an error");
                            continue;
                        };
                        let got = got.map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
                        let shape: Vec<usize> = if keepdim {
                            (0..t.ndim())
                                .map(|a| {
                                    if reduced.contains(&a) {
                                        1
                                    } else {
                                        t.shape()[a]
                                    }
                                })
                                .collect()
                        } else {
                            out_shape.clone()
                        };
                        assert_eq!(got.shape(), &shape[..], "{ctx}");
                        for (k, (g, w)) in host(&got)?.into_iter().zip(want).enumerate() {
                            assert!(close(g, w), "{ctx} element {k}: got {g:?}, want {w:?}");
                        }
                    }
                }
            }
            // Arg reductions: one axis or all.
            for axis in [None, Some(0isize), Some(-1)] {
                if t.ndim() == 0 && axis.is_some() {
                    continue;
                }
                let reduced: Vec<usize> = match axis {
                    None => (0..t.ndim()).collect(),
                    Some(a) => vec![((a + nd) % nd) as usize],
                };
                let (_, gs) = groups(t.shape(), &vals, &reduced);
                for name in ["argmax", "argmin"] {
                    let want: Option<Vec<Scalar>> =
                        gs.iter().map(|g| reference(name, g, dtype)).collect();
                    let got = if name == "argmax" {
                        t.argmax(axis, false)
                    } else {
                        t.argmin(axis, false)
                    };
                    let ctx = format!("{name} {axis:?} on {dtype} ({layout})");
                    match want {
                        None => assert!(got.is_err(), "{ctx}: expected an error"),
                        Some(w) => assert_eq!(host(&got?)?, w, "{ctx}"),
                    }
                }
            }
        }
    }
    Ok(())
}
test_device!(reductions_every_dtype_layout_and_axes, reductions);

fn accumulation_and_special_values(dev: &Device) -> Result<()> {
    // Integer sums return i64 and do not overflow the input dtype.
    let u = Tensor::full([1000], 255, DType::U8, dev)?;
    assert_eq!(u.sum(Axes::All, false)?.item::<i64>()?, 255_000);
    // f16 accumulates in f32: 3000 ones sum exactly (f16 alone would stall at 2048).
    let h = Tensor::ones([3000], DType::F16, dev)?;
    assert_eq!(
        h.sum(0, false)?.item::<half::f16>()?,
        half::f16::from_f32(3000.0)
    );
    assert_eq!(h.sum_upcast(0, false)?.dtype(), DType::F32);
    // Empty extents: sum 0, prod 1, any false, all true, max an error (as PyTorch).
    let e = Tensor::zeros([2, 0], DType::F32, dev)?;
    assert_eq!(e.sum(1, false)?.to_vec::<f32>()?, vec![0.0, 0.0]);
    assert_eq!(e.prod(1, false)?.to_vec::<f32>()?, vec![1.0, 1.0]);
    assert_eq!(e.any(1, false)?.to_vec::<bool>()?, vec![false, false]);
    assert_eq!(e.all(1, false)?.to_vec::<bool>()?, vec![true, true]);
    let err = e.max(1, false).unwrap_err().to_string();
    assert!(err.contains("empty") && err.contains("[2, 0]"), "{err}");
    // NaN propagates through max/min and wins argmax/argmin (first occurrence).
    let n = Tensor::from_slice(&[1.0f32, f32::NAN, 5.0, f32::NAN], [4], dev)?;
    assert!(n.max(0, false)?.item::<f32>()?.is_nan());
    assert_eq!(n.argmax(None, false)?.item::<i64>()?, 1);
    assert_eq!(n.argmin(None, false)?.item::<i64>()?, 1);
    // Softmax rows sum to 1 and survive large inputs.
    let x = Tensor::from_slice(&[1000.0f32, 1001.0, 1002.0, -5.0, 0.0, 5.0], [2, 3], dev)?;
    let sm = x.softmax(-1)?;
    let rows = sm.sum(1, false)?.to_vec::<f32>()?;
    assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-6), "{rows:?}");
    let lsm = x.log_softmax(1)?.exp()?.to_vec::<f32>()?;
    for (a, b) in lsm.iter().zip(sm.to_vec::<f32>()?) {
        assert!((a - b).abs() < 1e-6);
    }
    let inf = Tensor::from_slice(&[f32::NEG_INFINITY, f32::NEG_INFINITY], [2], dev)?;
    assert_eq!(inf.logsumexp(0, false)?.item::<f32>()?, f32::NEG_INFINITY);
    // Bad axes name the axis and the rank.
    let err = x.sum(2, false).unwrap_err().to_string();
    assert!(err.contains("axis 2") && err.contains("rank 2"), "{err}");
    assert!(Tensor::zeros([2], DType::I32, dev)?
        .mean(0, false)
        .unwrap_err()
        .to_string()
        .contains("i32"));
    // A long reduction split across threads, and many small ones.
    let big = Tensor::ones([1 << 18], DType::F32, dev)?;
    assert_eq!(big.sum(0, false)?.item::<f32>()?, (1 << 18) as f32);
    let rows4 = Tensor::ones([1 << 16, 4], DType::I32, dev)?.sum(1, false)?;
    assert_eq!(rows4.sum(0, false)?.item::<i64>()?, 1 << 18);
    // Long rows are cut into ranges whose partials a second launch combines: arg ops must
    // keep the first occurrence of a value repeated across range boundaries.
    let n = 60_000usize;
    let vals: Vec<i32> = (0..2 * n).map(|i| ((i * 7919) % 1009) as i32).collect();
    let t = Tensor::from_slice(&vals, [2, n], dev)?;
    for (row, chunk) in vals.chunks(n).enumerate() {
        let max = *chunk.iter().max().unwrap_or(&0);
        let first_max = chunk.iter().position(|&v| v == max).unwrap_or(0) as i64;
        let first_min = chunk.iter().position(|&v| v == 0).unwrap_or(0) as i64;
        assert_eq!(t.argmax(Some(1), false)?.to_vec::<i64>()?[row], first_max);
        assert_eq!(t.argmin(Some(1), false)?.to_vec::<i64>()?[row], first_min);
        assert_eq!(t.max(1, false)?.to_vec::<i32>()?[row], max);
        let sum: i64 = chunk.iter().map(|&v| v as i64).sum();
        assert_eq!(t.sum(1, false)?.to_vec::<i64>()?[row], sum);
    }
    Ok(())
}
test_device!(
    accumulation_empty_extents_nan_and_softmax,
    accumulation_and_special_values
);

/// Softmax and log-softmax along the last axis (one kernel where the backend has one) against
/// the composition they are defined by, written out here from primitives: bit for bit on the
/// CPU (the same kernels), within the summation-order tolerance elsewhere, NaN where it is.
fn softmax_matches_its_composition(dev: &Device) -> Result<()> {
    let composed = |x: &Tensor, log: bool| -> Result<Tensor> {
        let shifted = x.sub(&x.max(-1, true)?)?;
        if log {
            let lse = shifted.exp()?.sum(-1, true)?.log()?;
            return shifted.sub(&lse);
        }
        let e = shifted.exp()?;
        e.div(&e.sum(-1, true)?)
    };
    let special = |n: usize, i: usize| -> f64 {
        // Row 1 holds a NaN, row 2 a +inf, row 3 is all -inf, row 4 mixes -0 and +0.
        match (i / n, i % n) {
            (1, 0) => f64::NAN,
            (2, 1) => f64::INFINITY,
            (3, _) => f64::NEG_INFINITY,
            (4, j) => [0.0, -0.0][j % 2],
            _ => ((i * 7919) % 97) as f64 / 8.0 - 6.0,
        }
    };
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let tol = match dtype {
            DType::F64 => 1e-12,
            DType::F32 => 1e-5,
            _ => 1e-2,
        };
        // Row lengths for each thread grouping: a thread per row, a warp, a block, a block of
        // 1,024 (with and without whole vectors); past 16,384 wgpu reads the row in each pass.
        for n in [1usize, 7, 256, 4096, 4100, 8192, 16390] {
            let rows = 6;
            let vals: Vec<f64> = (0..rows * n).map(|i| special(n, i)).collect();
            let base = Tensor::from_slice(&vals, [rows, n], dev)?.to_dtype(dtype)?;
            // The same rows one column over in a wider tensor (a misaligned start).
            let padded: Vec<f64> = vals
                .chunks(n)
                .flat_map(|row| std::iter::once(0.5).chain(row.iter().copied()))
                .collect();
            let wide = Tensor::from_slice(&padded, [rows, n + 1], dev)?.to_dtype(dtype)?;
            let layouts = [
                ("contiguous", base.clone()),
                ("3-d", base.view([2, 3, n])?),
                ("offset by one", wide.slice(s![.., 1..])?),
                ("transposed", base.t()?.contiguous()?.t()?),
                (
                    "broadcast rows",
                    base.slice(s![..1, ..])?.expand([rows, n])?,
                ),
            ];
            for (name, x) in layouts {
                for log in [false, true] {
                    let got = if log {
                        x.log_softmax(-1)?
                    } else {
                        x.softmax(-1)?
                    };
                    assert_eq!(got.shape(), x.shape());
                    let want = composed(&x, log)?;
                    let (g, w) = (
                        got.to_dtype(DType::F64)?.to_vec::<f64>()?,
                        want.to_dtype(DType::F64)?.to_vec::<f64>()?,
                    );
                    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
                        let what = format!("{dtype} n={n} {name} log={log} at {k}: {a} vs {b}");
                        if dev.kind() == BackendKind::Cpu {
                            assert!(
                                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                                "{what}"
                            );
                        } else if b.is_nan() || b.is_infinite() {
                            assert!(a.is_nan() == b.is_nan() && (b.is_nan() || a == b), "{what}");
                        } else {
                            assert!((a - b).abs() <= tol * b.abs().max(1.0), "{what}");
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
test_device!(
    softmax_in_one_kernel_matches_its_composition,
    softmax_matches_its_composition
);

/// Softmax over many short rows and over rows longer than a small storage binding (CI runs it
/// under wgpu's 128-byte cap: short rows go in pieces of rows, each piece a dispatch; longer
/// ones take the composition, whose reductions split rows), against the CPU's numbers.
fn softmax_rows_in_pieces(dev: &Device) -> Result<()> {
    let cpu = Device::cpu();
    for (rows, n) in [(40usize, 3usize), (40, 7), (12, 100)] {
        let vals: Vec<f32> = (0..rows * n)
            .map(|i| ((i * 37) % 23) as f32 / 4.0 - 2.0)
            .collect();
        for log in [false, true] {
            let run = |d: &Device| -> Result<Vec<f32>> {
                let x = Tensor::from_slice(&vals, [rows, n], d)?;
                let y = if log {
                    x.log_softmax(-1)?
                } else {
                    x.softmax(-1)?
                };
                y.to_vec::<f32>()
            };
            let (got, want) = (run(dev)?, run(&cpu)?);
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "rows={rows} n={n} log={log} at {k}: {a} vs {b}"
                );
            }
        }
    }
    Ok(())
}
test_device!(softmax_rows_in_pieces_or_composed, softmax_rows_in_pieces);

/// Per-channel statistics of `[N, C, H, W]` (a batch norm's: N, H and W reduced), whose rows
/// along W are long enough for a group of threads to read together (CUDA's row loop): sum,
/// max, min, mean and var against host folds, in f32, f64 and i32, for a contiguous tensor, a
/// sliced one (an odd offset and rows of 33) and one with a strided innermost axis.
fn per_channel_statistics(dev: &Device) -> Result<()> {
    let (n, c, h, w) = (3usize, 5usize, 4usize, 40usize);
    let host: Vec<f64> = (0..n * c * h * w)
        .map(|i| ((i * 7919) % 101) as f64 / 8.0 - 6.0)
        .collect();
    for dtype in [DType::F32, DType::F64, DType::I32] {
        let full = Tensor::from_slice(&host, [n, c, h, w], dev)?.to_dtype(dtype)?;
        let cases = [
            ("contiguous", full.clone()),
            ("sliced", full.slice(s![.., .., 1.., 3..36])?),
            ("strided rows", full.slice(s![.., .., .., ..;2])?),
        ];
        for (layout, t) in cases {
            let [tn, tc, th, tw] = t.shape()[..] else {
                unreachable!()
            };
            let vals = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
            let channel = |k: usize| -> Vec<f64> {
                (0..tn * th * tw)
                    .map(|i| {
                        let (b, rest) = (i / (th * tw), i % (th * tw));
                        vals[(b * tc + k) * th * tw + rest]
                    })
                    .collect()
            };
            for name in ["sum", "max", "min", "mean", "var"] {
                if matches!(name, "mean" | "var") && !dtype.is_float() {
                    continue;
                }
                let got = run(&t, name, Axes::from([0, 2, 3]), false)?
                    .to_dtype(DType::F64)?
                    .to_vec::<f64>()?;
                for (k, g) in got.iter().enumerate() {
                    let v = channel(k);
                    let mean = v.iter().sum::<f64>() / v.len() as f64;
                    let want = match name {
                        "sum" => v.iter().sum(),
                        "max" => v.iter().copied().fold(f64::MIN, f64::max),
                        "min" => v.iter().copied().fold(f64::MAX, f64::min),
                        "mean" => mean,
                        _ => {
                            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64
                        }
                    };
                    assert!(
                        (g - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{name} of channel {k} on {dtype} ({layout}): got {g}, want {want}"
                    );
                }
            }
        }
    }
    Ok(())
}
test_device!(
    per_channel_statistics_over_long_rows,
    per_channel_statistics
);

/// Rows long enough for a group and vector loads (four 32-bit elements a load where the
/// backend has them): lengths with a tail of 1–3 elements, a view starting on a vector and one
/// starting between vectors, a reduction of everything (cut into ranges), argmax/argmin with
/// ties (the first position wins), and a fused map reading a second tensor laid out alike.
fn long_rows(dev: &Device) -> Result<()> {
    for dtype in [DType::F32, DType::I32] {
        // (rows, their length, the first element, the row stride)
        let cases = [
            (4, 1024, 0, 1024),
            (3, 1030, 0, 1032),
            (5, 4099, 4, 4104),
            (2, 2048, 1, 2052),
            (1, 70001, 0, 70001),
        ];
        for (rows, len, start, stride) in cases {
            let host: Vec<f64> = (0..rows * stride)
                .map(|i| ((i * 7919) % 97) as f64 - 48.0)
                .collect();
            let full = Tensor::from_slice(&host, [rows, stride], dev)?.to_dtype(dtype)?;
            let t = full.slice(s![.., start..start + len])?;
            let other = (&full + &full)?.slice(s![.., start..start + len])?;
            let row = |r: usize| &host[r * stride + start..r * stride + start + len];
            let ctx = format!("{rows}×{len} from {start} (stride {stride}) on {dtype}");
            let sums = t.sum(-1, false)?.to_dtype(DType::F64)?.to_vec::<f64>()?;
            let maxima = t.max(-1, false)?.to_dtype(DType::F64)?.to_vec::<f64>()?;
            let argmax = t.argmax(Some(-1), false)?.to_vec::<i64>()?;
            let argmin = t.argmin(Some(-1), false)?.to_vec::<i64>()?;
            let fused = (&t * &other)?.sum(-1, false)?.to_dtype(DType::F64)?;
            let fused = fused.to_vec::<f64>()?;
            for r in 0..rows {
                let v = row(r);
                let max = v.iter().copied().fold(f64::MIN, f64::max);
                let min = v.iter().copied().fold(f64::MAX, f64::min);
                let first = |x: f64| v.iter().position(|&e| e == x).unwrap() as i64;
                let squares: f64 = v.iter().map(|x| 2.0 * x * x).sum();
                assert_eq!(sums[r], v.iter().sum::<f64>(), "sum of row {r}, {ctx}");
                assert_eq!(maxima[r], max, "max of row {r}, {ctx}");
                assert_eq!(argmax[r], first(max), "argmax of row {r}, {ctx}");
                assert_eq!(argmin[r], first(min), "argmin of row {r}, {ctx}");
                // (Exact below 2^24; f32 rounds the longest row's partial sums.)
                let tol = if dtype == DType::F32 {
                    1e-6 * squares
                } else {
                    0.0
                };
                let err = (fused[r] - squares).abs();
                assert!(err <= tol, "sum of t·2t along row {r}, {ctx}: {}", fused[r]);
            }
            let all = t
                .sum(Axes::All, false)?
                .to_dtype(DType::F64)?
                .item::<f64>()?;
            let want: f64 = (0..rows).map(|r| row(r).iter().sum::<f64>()).sum();
            assert_eq!(all, want, "sum of everything, {ctx}");
        }
    }
    Ok(())
}
test_device!(long_rows_in_vectors_with_tails_offsets_and_ties, long_rows);
