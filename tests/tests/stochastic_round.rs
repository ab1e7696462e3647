//! Bit reads (`bitcast`) and stochastic rounding on every backend, against host references:
//! exact values stay, only the two neighbours occur, the mean of many roundings is the input,
//! the bits equal the CPU's for a seed, specials pass through, and a fused chain equals eager.

use strata::prelude::*;
use strata::random::Generator;
use strata_tests::{test_device, Rng};

/// Every (source, target) pair `to_dtype_stochastic` takes.
const CASTS: [(DType, DType); 5] = [
    (DType::F32, DType::BF16),
    (DType::F32, DType::F16),
    (DType::F64, DType::F32),
    (DType::F64, DType::BF16),
    (DType::F64, DType::F16),
];

fn wanted(dev: &Device, dtypes: &[DType]) -> bool {
    dtypes.iter().all(|&d| dev.backend().check_dtype(d).is_ok())
}

/// A value of float `dtype` as f64.
fn as_f64(s: Scalar) -> f64 {
    s.to_f64()
}

/// The neighbours of `x` in `target` around it (one value when it is representable): the
/// round-to-nearest result and the next value on the other side, by its bit pattern.
fn neighbours(x: f64, target: DType) -> Vec<f64> {
    let r = Scalar::F64(x).cast(target, false);
    let rv = as_f64(r);
    if rv == x || x.is_nan() || x.is_infinite() {
        return vec![rv];
    }
    let bits = r.bits();
    // Bit patterns grow with the magnitude for either sign.
    let other = if rv.abs() < x.abs() {
        bits + 1
    } else {
        bits - 1
    };
    let ov = as_f64(Scalar::from_bits(target, other));
    vec![rv.min(ov), rv.max(ov)]
}

/// Random values of `dtype` spread over many binades, with the edge values.
fn samples(dtype: DType, n: usize, rng: &mut Rng) -> Vec<f64> {
    let f = dtype.float_format().unwrap();
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.0,
        65520.0,
        7e4,
        2f64.powi(-24),
    ];
    v.extend([
        2f64.powi(-14) * 0.99,
        2f64.powi(-25),
        3e-8,
        -5e-6,
        1e-40,
        -1e-39,
    ]);
    while v.len() < n {
        let m = (rng.word() >> 11) as f64 / 2f64.powi(53) + 1.0;
        let e = rng.below(60) as i32 - 40;
        let sign = if rng.chance(50) { -1.0 } else { 1.0 };
        v.push(sign * m * 2f64.powi(e.max(f.min_exponent - 12)));
    }
    // As the dtype holds them.
    v.iter()
        .map(|&x| as_f64(Scalar::F64(x).cast(dtype, false)))
        .collect()
}

fn tensor_of(values: &[f64], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(values, [values.len()], dev)?.to_dtype(dtype)
}

fn values_f64(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn bits_u64(t: &Tensor) -> Result<Vec<u64>> {
    let unsigned = match t.dtype().itemsize() {
        2 => DType::U16,
        4 => DType::U32,
        _ => DType::U64,
    };
    t.bitcast(unsigned)?.to_dtype(DType::U64)?.to_vec::<u64>()
}

/// `bitcast` between every pair of same-size dtypes equals reading the host's bits; a round
/// trip through a float gives the bits back for non-NaN patterns.
fn bitcasts(dev: &Device) -> Result<()> {
    let mut rng = Rng(7);
    let groups: [&[DType]; 3] = [
        &[DType::U16, DType::I16, DType::F16, DType::BF16],
        &[DType::U32, DType::I32, DType::F32],
        &[DType::U64, DType::I64, DType::F64],
    ];
    for group in groups {
        if !wanted(dev, group) {
            continue;
        }
        let width = group[0].itemsize() * 8;
        let mask = if width == 64 {
            u64::MAX
        } else {
            (1 << width) - 1
        };
        let mut words: Vec<u64> = (0..64).map(|_| rng.word() & mask).collect();
        // Zeros, the smallest subnormal, infinities.
        words.extend([0, 1, 1 << (width - 1)]);
        let source = Tensor::from_slice(&words, [words.len()], dev)?.to_dtype(group[0])?;
        assert!(!group[0].is_float());
        for &to in group {
            let read = source.bitcast(to)?;
            assert_eq!(read.dtype(), to);
            for (k, (&w, got)) in words.iter().zip(bits_u64(&read)?).enumerate() {
                let host = Scalar::from_bits(to, w);
                let is_nan = to.is_float() && host.to_f64().is_nan();
                if is_nan {
                    assert!(values_f64(&read)?[k].is_nan(), "{to} of {w:#x}");
                } else {
                    assert_eq!(got, w, "bits {w:#x} read as {to} on {}", dev.name());
                }
            }
        }
    }
    let x = Tensor::from_slice(&[1.5f32, -0.0], [2], dev)?;
    assert_eq!(
        x.bitcast(DType::I32)?.to_vec::<i32>()?,
        vec![0x3fc0_0000, i32::MIN]
    );
    assert!(x.bitcast(DType::F16).is_err());
    assert!(x.bitcast(DType::Bool).is_err());
    Ok(())
}
test_device!(bitcast_reads_the_bits, bitcasts);

/// Every result is one of the input's two neighbours in the target (exact inputs stay),
/// specials pass through, and the bits equal the CPU's for the same generator state.
fn neighbours_only(dev: &Device) -> Result<()> {
    let cpu = Device::cpu();
    let flushes = strata_tests::flushes_subnormals(dev);
    let mut rng = Rng(11);
    for (from, to) in CASTS {
        if !wanted(dev, &[from, to]) {
            continue;
        }
        let mut v = samples(from, 400, &mut rng);
        v.extend([f64::NAN, f64::INFINITY, f64::NEG_INFINITY]);
        if flushes && (from == DType::F32 || matches!(to, DType::F32 | DType::BF16)) {
            // Documented: such a device flushes f32 subnormals, read or written (bf16 is
            // computed in f32).
            v.retain(|x| !(*x != 0.0 && x.abs() < 2f64.powi(-126)));
        }
        let x = tensor_of(&v, from, dev)?;
        let mut g = Generator::new(99);
        let r = x.to_dtype_stochastic(to, &mut g)?;
        assert_eq!(r.dtype(), to);
        let got = values_f64(&r)?;
        for (&xi, &ri) in v.iter().zip(&got) {
            if xi.is_nan() {
                assert!(ri.is_nan());
                continue;
            }
            let n = neighbours(xi, to);
            let ok = n.contains(&ri) || (ri.is_infinite() && n.iter().any(|y| y.is_infinite()));
            assert!(ok, "{from}→{to}: {xi:e} gave {ri:e}, neighbours {n:?}");
            if ri == 0.0 {
                assert_eq!(
                    ri.is_sign_negative(),
                    xi.is_sign_negative(),
                    "sign of {xi:e}"
                );
            }
        }
        let mut g = Generator::new(99);
        let on_cpu = tensor_of(&v, from, &cpu)?.to_dtype_stochastic(to, &mut g)?;
        // NaN's bits are the backend's own (documented): NaN-ness is compared there.
        let (cpu_bits, cpu_values) = (bits_u64(&on_cpu)?, values_f64(&on_cpu)?);
        for (k, (b, c)) in bits_u64(&r)?.iter().zip(&cpu_bits).enumerate() {
            if cpu_values[k].is_nan() {
                assert!(got[k].is_nan(), "{from}→{to}: NaN stays NaN");
            } else {
                assert_eq!(b, c, "{from}→{to} bits of {:e} vs the CPU", v[k]);
            }
        }
    }
    Ok(())
}
test_device!(stochastic_rounding_picks_a_neighbour, neighbours_only);

/// The mean of 10^5 roundings of one value is that value within five standard deviations,
/// in the normal range, in f16's subnormals and below them, and for `round_mantissa`.
fn unbiased(dev: &Device) -> Result<()> {
    let n = 100_000;
    let cases = [
        (DType::F32, DType::BF16, 1.0 + 2f64.powi(-9)),
        (DType::F32, DType::F16, -(1.0 + 3.0 * 2f64.powi(-13))),
        (DType::F32, DType::F16, 2f64.powi(-26)),
        (DType::F32, DType::F16, 5.3 * 2f64.powi(-20)),
        (DType::F64, DType::F32, 1.0 + 2f64.powi(-25)),
        (DType::F64, DType::BF16, 3.0 + 2f64.powi(-12)),
    ];
    let mut g = Generator::new(5);
    for (from, to, x) in cases {
        if !wanted(dev, &[from, to]) {
            continue;
        }
        let t = Tensor::full([n], x, from, dev)?;
        let r = values_f64(&t.to_dtype_stochastic(to, &mut g)?)?;
        check_mean(&r, x, &neighbours(x, to), &format!("{from}→{to} of {x:e}"));
    }
    for (dtype, bits, x) in [
        (DType::F32, 3, 1.1f64),
        (DType::F16, 4, -0.3),
        (DType::BF16, 2, 7.0),
        (DType::F64, 40, 1.0 + 2f64.powi(-43)),
    ] {
        if !wanted(dev, &[dtype]) {
            continue;
        }
        let x = as_f64(Scalar::F64(x).cast(dtype, false));
        let t = Tensor::full([n], x, dtype, dev)?;
        let r = values_f64(&t.round_mantissa_stochastic(bits, &mut g)?)?;
        let f = dtype.float_format().unwrap();
        let ulp = 2f64.powi(x.abs().log2().floor() as i32 - bits as i32);
        let lo = (x / ulp).floor() * ulp;
        check_mean(
            &r,
            x,
            &[lo, lo + ulp],
            &format!("{dtype} to {bits} of {} bits", f.mantissa_bits),
        );
    }
    Ok(())
}
test_device!(stochastic_rounding_is_unbiased, unbiased);

fn check_mean(r: &[f64], x: f64, neighbours: &[f64], what: &str) {
    assert_eq!(neighbours.len(), 2, "{what}: not between two values");
    let (lo, hi) = (neighbours[0], neighbours[1]);
    assert!(
        r.iter().all(|&y| y == lo || y == hi),
        "{what}: a third value"
    );
    let n = r.len() as f64;
    // Summed as offsets from `lo` (a sum of values near 1 would round away 2^-40 steps).
    let mean = lo + r.iter().map(|&y| y - lo).sum::<f64>() / n;
    let p = (x - lo) / (hi - lo);
    let sd = (hi - lo) * (p * (1.0 - p) / n).sqrt();
    assert!(
        (mean - x).abs() <= 5.0 * sd,
        "{what}: mean {mean:e}, wanted {x:e} ± {:e}",
        5.0 * sd
    );
}

/// `round_mantissa_stochastic`: exact values stay, results have the bits asked for, and a
/// chain holding the rounding equals its eager run bit for bit.
fn mantissa_and_fusion(dev: &Device) -> Result<()> {
    let mut rng = Rng(3);
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        if !wanted(dev, &[dtype]) {
            continue;
        }
        let m = dtype.float_format().unwrap().mantissa_bits;
        let v = samples(dtype, 200, &mut rng);
        let x = tensor_of(&v, dtype, dev)?;
        for bits in [0, 2, m - 1, m] {
            let mut g = Generator::new(bits as u64);
            let r = x.round_mantissa_stochastic(bits, &mut g)?;
            let dropped = m - bits;
            for (w, xi) in bits_u64(&r)?.iter().zip(&v) {
                let f = Scalar::from_bits(dtype, *w).to_f64();
                if f.is_finite() {
                    assert_eq!(
                        w & ((1u64 << dropped) - 1),
                        0,
                        "{dtype} {bits} bits of {xi:e}"
                    );
                }
            }
            // Rounding twice to the same grid changes nothing.
            let again = r.round_mantissa_stochastic(bits, &mut g)?;
            assert_eq!(bits_u64(&again)?, bits_u64(&r)?, "{dtype} twice");
        }
    }
    if wanted(dev, &[DType::F32, DType::BF16]) {
        let v = samples(DType::F32, 300, &mut rng);
        let run = |fuse: bool| -> Result<Vec<u64>> {
            let before = dev.fusion();
            dev.set_fusion(fuse)?;
            let x = tensor_of(&v, DType::F32, dev)?;
            let mut g = Generator::new(8);
            let r = x
                .mul(4.0)?
                .to_dtype_stochastic(DType::BF16, &mut g)?
                .to_dtype(DType::F32)?
                .add(1.0)?;
            let out = bits_u64(&r);
            dev.set_fusion(before)?;
            out
        };
        assert_eq!(run(true)?, run(false)?, "fused vs eager");
    }
    Ok(())
}
test_device!(
    stochastic_rounding_fuses_and_keeps_exact_values,
    mantissa_and_fusion
);

#[test]
fn stochastic_rounding_errors_name_the_dtypes() {
    let dev = Device::cpu();
    let mut g = Generator::new(0);
    let i = Tensor::ones([2], DType::I32, &dev).unwrap();
    let e = i
        .to_dtype_stochastic(DType::F16, &mut g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("i32"), "{e}");
    let h = Tensor::ones([2], DType::F16, &dev).unwrap();
    let e = h
        .to_dtype_stochastic(DType::F32, &mut g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("f16 to f32"), "{e}");
    let e = h
        .to_dtype_stochastic(DType::BF16, &mut g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("narrower"), "{e}");
    assert!(i.round_mantissa_stochastic(3, &mut g).is_err());
    // The same dtype is a copy.
    let same = h.to_dtype_stochastic(DType::F16, &mut g).unwrap();
    assert_eq!(same.dtype(), DType::F16);
    assert_eq!(
        same.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 1.0]
    );
}
