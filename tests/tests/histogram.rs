//! Histograms on every backend against counts made on the host: `histc`, `histogram`,
//! `bincount` and exponent histograms, on random and edge inputs (NaN, ±inf, values on edges,
//! empty tensors, one bin, integer dtypes).

use strata::prelude::*;
use strata_tests::{test_device, Rng};

fn supported(dev: &Device, d: DType) -> bool {
    dev.backend().check_dtype(d).is_ok()
}

/// Random values over [-3, 7) with NaN, ±inf and the range's ends mixed in.
fn values(n: usize, rng: &mut Rng) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n)
        .map(|_| (rng.word() >> 11) as f64 / 2f64.powi(53) * 10.0 - 3.0)
        .collect();
    v.extend([
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        4.0,
        -1.0,
        2.5,
        1.0,
    ]);
    v
}

/// histc's count on the host, with the kernel's arithmetic in the compute dtype.
fn host_histc(v: &[f64], bins: usize, lo: f64, hi: f64, f32_math: bool) -> Vec<f64> {
    let mut out = vec![0.0; bins];
    for &x in v {
        if !(x >= lo && x <= hi) {
            continue;
        }
        let pos = if f32_math {
            let (x, lo, hi, b) = (x as f32, lo as f32, hi as f32, bins as f32);
            (((x - lo) * b) / (hi - lo)).floor() as f64
        } else {
            (((x - lo) * bins as f64) / (hi - lo)).floor()
        };
        out[(pos as usize).min(bins - 1)] += 1.0;
    }
    out
}

fn histc_cases(dev: &Device) -> Result<()> {
    let mut rng = Rng(21);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        if !supported(dev, dtype) {
            continue;
        }
        let v: Vec<f64> = values(3000, &mut rng)
            .iter()
            .map(|&x| Scalar::F64(x).cast(dtype, false).to_f64())
            .collect();
        let t = Tensor::from_slice(&v, [v.len()], dev)?.to_dtype(dtype)?;
        for (bins, lo, hi) in [
            (10, -1.0, 4.0),
            (1, 0.0, 1.0),
            (64, -3.0, 7.0),
            (7, 2.5, 2.75),
        ] {
            let h = t.histc(bins, lo, hi)?;
            assert_eq!(h.dtype(), dtype);
            let got = h.to_dtype(DType::F64)?.to_vec::<f64>()?;
            let want = host_histc(&v, bins, lo, hi, dtype != DType::F64);
            // 16-bit counts round like any value of the dtype.
            let want: Vec<f64> = want
                .iter()
                .map(|&c| Scalar::F64(c).cast(dtype, false).to_f64())
                .collect();
            assert_eq!(
                got,
                want,
                "{dtype} histc({bins}, {lo}, {hi}) on {}",
                dev.name()
            );
        }
    }
    // The data's own range when min == max, on a strided view.
    let t = Tensor::from_slice(&[1.0f32, 9.0, 2.0, 3.0, 5.0, 4.0], [3, 2], dev)?.transpose(0, 1)?;
    let h = t.histc(4, 0.0, 0.0)?.to_vec::<f32>()?;
    assert_eq!(
        h,
        host_histc(&[1.0, 9.0, 2.0, 3.0, 5.0, 4.0], 4, 1.0, 9.0, true)
            .iter()
            .map(|&c| c as f32)
            .collect::<Vec<_>>()
    );
    // Empty input, and every value equal.
    let empty = Tensor::zeros([0], DType::F32, dev)?;
    assert_eq!(empty.histc(3, 0.0, 1.0)?.to_vec::<f32>()?, vec![0.0; 3]);
    let same = Tensor::full([5], 2.0, DType::F32, dev)?;
    assert_eq!(same.histc(2, 0.0, 0.0)?.to_vec::<f32>()?, vec![0.0, 5.0]);
    // Errors name the values.
    let with_nan = Tensor::from_slice(&[1.0f32, f32::NAN], [2], dev)?;
    assert!(with_nan
        .histc(3, 0.0, 0.0)
        .unwrap_err()
        .to_string()
        .contains("not finite"));
    assert!(same.histc(0, 0.0, 1.0).is_err());
    assert!(same
        .histc(2, 3.0, 1.0)
        .unwrap_err()
        .to_string()
        .contains("below"));
    assert!(Tensor::ones([2], DType::I32, dev)?
        .histc(2, 0.0, 1.0)
        .is_err());
    Ok(())
}
test_device!(histc_counts_like_the_host, histc_cases);

fn histogram_cases(dev: &Device) -> Result<()> {
    let mut rng = Rng(5);
    let v = values(1992, &mut rng);
    let t = Tensor::from_slice(&v, [40, v.len() / 40], dev)?.to_dtype(DType::F32)?;
    let edges = [-2.0, -1.0, 0.0, 0.5, 2.5, 4.0];
    let e = Tensor::from_slice(&edges, [edges.len()], dev)?.to_dtype(DType::F32)?;
    let w: Vec<f64> = (0..v.len()).map(|k| (k % 7) as f64 * 0.25).collect();
    let wt = Tensor::from_slice(&w, [40, v.len() / 40], dev)?.to_dtype(DType::F32)?;
    let mut count = vec![0.0; edges.len() - 1];
    let mut weighted = vec![0.0; edges.len() - 1];
    for (k, &x) in v.iter().enumerate() {
        let x = x as f32 as f64;
        let last = edges.len() - 1;
        if !(x >= edges[0] && x <= edges[last]) {
            continue;
        }
        let b = (0..last).rev().find(|&b| x >= edges[b]).unwrap();
        count[b] += 1.0;
        weighted[b] += w[k];
    }
    let got = t
        .histogram(&e, None)?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    assert_eq!(got, count, "histogram on {}", dev.name());
    let got = t
        .histogram(&e, Some(&wt))?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    for (g, w) in got.iter().zip(&weighted) {
        assert!(
            (g - w).abs() <= 1e-3 * w.abs().max(1.0),
            "weighted {got:?} vs {weighted:?}"
        );
    }
    let bad = Tensor::from_slice(&[0.0f32, 2.0, 1.0], [3], dev)?;
    assert!(t
        .histogram(&bad, None)
        .unwrap_err()
        .to_string()
        .contains("increasing"));
    Ok(())
}
test_device!(histogram_counts_between_edges, histogram_cases);

fn bincount_cases(dev: &Device) -> Result<()> {
    let mut rng = Rng(9);
    for dtype in [DType::U8, DType::I16, DType::I32, DType::I64] {
        let v: Vec<i64> = (0..1500).map(|_| rng.below(37) as i64).collect();
        let t = Tensor::from_slice(&v, [v.len()], dev)?.to_dtype(dtype)?;
        let mut want = vec![0i64; 40];
        for &x in &v {
            want[x as usize] += 1;
        }
        let got = t.bincount(None, 40)?;
        assert_eq!(got.dtype(), DType::I64);
        assert_eq!(
            got.to_vec::<i64>()?,
            want,
            "{dtype} bincount on {}",
            dev.name()
        );
        let max = *v.iter().max().unwrap() as usize;
        assert_eq!(t.bincount(None, 0)?.numel(), max + 1);
    }
    let v = [4i64, 3, 6, 3, 4];
    let t = Tensor::from_slice(&v, [5], dev)?;
    let w = Tensor::from_slice(&[0.0f32, 0.25, 0.5, 0.75, 1.0], [5], dev)?;
    let got = t.bincount(Some(&w), 0)?;
    assert_eq!(got.dtype(), DType::F32);
    assert_eq!(
        got.to_vec::<f32>()?,
        vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5]
    );
    if supported(dev, DType::F64) {
        let wi = Tensor::from_slice(&[1i32, 2, 3, 4, 5], [5], dev)?;
        match t.bincount(Some(&wi), 0) {
            Ok(got) => {
                assert_eq!(got.dtype(), DType::F64);
                assert_eq!(
                    got.to_vec::<f64>()?,
                    vec![0.0, 0.0, 0.0, 6.0, 6.0, 0.0, 3.0]
                );
            }
            // wgpu has no 64-bit float atomics; the error says so.
            Err(e) => assert!(dev.name().starts_with("wgpu"), "{e}"),
        }
    }
    let empty = Tensor::zeros([0], DType::I64, dev)?;
    assert_eq!(empty.bincount(None, 3)?.to_vec::<i64>()?, vec![0, 0, 0]);
    let negative = Tensor::from_slice(&[1i64, -2], [2], dev)?;
    assert!(negative
        .bincount(None, 0)
        .unwrap_err()
        .to_string()
        .contains("-2"));
    assert!(w.bincount(None, 0).is_err());
    Ok(())
}
test_device!(bincount_counts_each_value, bincount_cases);

/// Exponent histograms against the host's classification of every value.
fn exponent_cases(dev: &Device) -> Result<()> {
    let mut rng = Rng(13);
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32] {
        if !supported(dev, dtype) {
            continue;
        }
        let mut v: Vec<f64> = (0..2000)
            .map(|_| {
                let m = 1.0 + (rng.word() >> 11) as f64 / 2f64.powi(53);
                let e = rng.below(80) as i32 - 40;
                let s = if rng.chance(50) { -m } else { m };
                s * 2f64.powi(e)
            })
            .collect();
        v.extend([
            0.0,
            -0.0,
            1e-6,
            3e-8,
            1e-40,
            f64::INFINITY,
            f64::NAN,
            65504.0,
            1e5,
        ]);
        let t = Tensor::from_slice(&v, [v.len()], dev)?.to_dtype(dtype)?;
        // The values as stored, from their bits (a device that flushes f32 subnormals in
        // arithmetic still stores and counts them).
        let counted_dtype = if dtype.is_float() { dtype } else { DType::F64 };
        let stored = if dtype.is_float() {
            t.clone()
        } else {
            t.to_dtype(DType::F64)?
        };
        let unsigned = match counted_dtype.itemsize() {
            2 => DType::U16,
            4 => DType::U32,
            _ => DType::U64,
        };
        let held: Vec<f64> = stored
            .bitcast(unsigned)?
            .to_dtype(DType::U64)?
            .to_vec::<u64>()?
            .iter()
            .map(|&b| Scalar::from_bits(counted_dtype, b).to_f64())
            .collect();
        let h = t.exponent_histogram()?;
        let counted = if dtype.is_float() { dtype } else { DType::F64 };
        let f = counted.float_format().unwrap();
        let (mut zeros, mut subnormal, mut inf, mut nan) = (0, 0, 0, 0);
        let mut per = std::collections::BTreeMap::new();
        for &x in &held {
            if x.is_nan() {
                nan += 1;
            } else if x.is_infinite() {
                inf += 1;
            } else if x == 0.0 {
                zeros += 1;
            } else if x.abs() < 2f64.powi(f.min_exponent) {
                subnormal += 1;
            } else {
                *per.entry(x.abs().log2().floor() as i32).or_insert(0u64) += 1;
            }
        }
        assert_eq!(
            (h.zeros, h.subnormals, h.infinities, h.nans),
            (zeros, subnormal, inf, nan),
            "{dtype}"
        );
        for (&e, &c) in &per {
            assert_eq!(h.count(e), c, "{dtype} exponent {e} on {}", dev.name());
        }
        assert_eq!(h.total(), v.len() as u64);
    }
    Ok(())
}
test_device!(exponent_histograms_count_powers_of_two, exponent_cases);

/// One histogram kernel per count (no one-hot composition where the backend runs the kernel),
/// with private copies (64 bins) and without (10,000 bins: past workgroup memory).
fn one_kernel(dev: &Device) -> Result<()> {
    let mut rng = Rng(17);
    let v: Vec<f32> = (0..20_000)
        .map(|_| (rng.word() % 10_000) as f32 + 0.5)
        .collect();
    let t = Tensor::from_slice(&v, [v.len()], dev)?;
    for bins in [64usize, 10_000] {
        let mut want = vec![0f32; bins];
        for &x in &v {
            let b = ((x as f64) * bins as f64 / 10_000.0).floor() as usize;
            want[b.min(bins - 1)] += 1.0;
        }
        let p = dev.profile(|| t.histc(bins, 0.0, 10_000.0)?.realize())?;
        let kernels: Vec<_> = p
            .device_work()
            .filter(|r| r.ops.iter().any(|o| o == "histogram"))
            .collect();
        assert_eq!(kernels.len(), 1, "{bins} bins on {}: {p}", dev.name());
        let got = t.histc(bins, 0.0, 10_000.0)?.to_vec::<f32>()?;
        assert_eq!(got, want, "{bins} bins on {}", dev.name());
    }
    let w = Tensor::full([v.len()], 0.5, DType::F32, dev)?;
    let idx = t
        .to_dtype(DType::I32)?
        .floor_divide(100)?
        .to_dtype(DType::I64)?;
    let got = idx.bincount(Some(&w), 0)?.to_vec::<f32>()?;
    assert_eq!(got.iter().sum::<f32>(), 10_000.0);
    Ok(())
}
test_device!(a_histogram_is_one_kernel, one_kernel);

/// `profile_exponents` counts each float kernel output's exponents (the counting kernels are
/// not records); a plain profile counts none.
fn profiled_exponents(dev: &Device) -> Result<()> {
    let a = Tensor::full([1000], 300.0, DType::F32, dev)?;
    let b = Tensor::full([1000], 1e-3, DType::F32, dev)?;
    let p = dev.profile_exponents(|| {
        let y = (&a * &a)?;
        y.realize()?;
        (&y * &b)?.realize()
    })?;
    let by_ops = |op: &str| {
        p.exponent_histograms
            .iter()
            .filter(|(r, _)| p.records[*r].ops.last().map(String::as_str) == Some(op))
            .map(|(_, h)| h.clone())
            .collect::<Vec<_>>()
    };
    let squares = by_ops("mul");
    assert_eq!(squares.len(), 2, "{p}");
    // 300² = 90000 (2^16: past f16), then 90 (2^6).
    assert_eq!(squares[0].count(16), 1000);
    assert_eq!(squares[1].count(6), 1000);
    assert!(
        p.device_work()
            .all(|r| !r.ops.iter().any(|o| o == "histogram")),
        "{p}"
    );
    assert!(p.exponent_histograms_svg().as_str().matches("<svg").count() >= 3);
    let plain = dev.profile(|| (&a * &a)?.realize())?;
    assert!(plain.exponent_histograms.is_empty());
    Ok(())
}
test_device!(
    profiles_count_exponents_per_kernel_output,
    profiled_exponents
);
