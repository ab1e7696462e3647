//! What random programs and other tests found (issue 15 on), one test per finding, on every
//! device: each failed before its fix on the backend named in its comment.

use half::{bf16, f16};
use strata::prelude::*;
use strata_tests::test_device;

fn bits32(t: &Tensor) -> Result<Vec<u32>> {
    Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
}

/// Float `floor_divide` is Python's (every backend computed `floor(a / b)`).
fn floor_divide_is_pythons(dev: &Device) -> Result<()> {
    let a = Tensor::from_slice(&[-9.0f64, 7.0, -7.0, 0.0, -0.0, 5.0, -5.0], [7], dev)?;
    let b = Tensor::from_slice(
        &[-1e-10f64, 2.0, 2.0, -3.0, 3.0, f64::INFINITY, f64::INFINITY],
        [7],
        dev,
    )?;
    let q = a.floor_divide(&b)?.to_vec::<f64>()?;
    let want: [f64; 7] = [89999999999.0, 3.0, -4.0, -0.0, -0.0, 0.0, -1.0];
    for (g, w) in q.iter().zip(want) {
        assert_eq!(g.to_bits(), w.to_bits(), "f64 {q:?}");
    }
    // Division by zero is IEEE's quotient (NumPy and PyTorch), and 0 // 0 is NaN.
    let z = Tensor::from_slice(&[1.0f64, -1.0, 0.0], [3], dev)?.floor_divide(0.0)?;
    let z = z.to_vec::<f64>()?;
    assert!(
        z[0] == f64::INFINITY && z[1] == f64::NEG_INFINITY && z[2].is_nan(),
        "{z:?}"
    );
    // bf16: 0.0015 // -inf is -1, inf // -9.22e18 is NaN.
    let h = |v: &[f64]| -> Result<Tensor> {
        Tensor::from_slice(v, [v.len()], dev)?.to_dtype(DType::BF16)
    };
    let q = h(&[0.0015, f64::INFINITY])?.floor_divide(&h(&[f64::NEG_INFINITY, -9.22e18])?)?;
    let q = q.to_vec::<bf16>()?;
    assert_eq!(q[0].to_f64(), -1.0);
    assert!(q[1].is_nan(), "{q:?}");
    // f32 and f16 take the same steps in f32; the in-place form too.
    let x = Tensor::from_slice(&[-9.0f32, 1e30, 7.5], [3], dev)?;
    x.floor_divide_(&Tensor::from_slice(&[-1e-10f32, 3.0, -0.5], [3], dev)?)?;
    let want: Vec<f32> = [(-9.0f32, -1e-10f32), (1e30, 3.0), (7.5, -0.5)]
        .iter()
        .map(|&(a, b)| python_floor_div_f32(a, b))
        .collect();
    assert_eq!(x.to_vec::<f32>()?, want);
    let y =
        Tensor::from_slice(&[f16::from_f32(-9.0), f16::from_f32(1000.0)], [2], dev)?.floor_divide(
            &Tensor::from_slice(&[f16::from_f32(0.1), f16::from_f32(-0.3)], [2], dev)?,
        )?;
    let want: Vec<f32> = [(-9.0f32, 0.1f32), (1000.0, -0.3)]
        .iter()
        .map(|&(a, b)| {
            let (a, b) = (f16::from_f32(a).to_f32(), f16::from_f32(b).to_f32());
            f16::from_f32(python_floor_div_f32(a, b)).to_f32()
        })
        .collect();
    assert_eq!(y.to_dtype(DType::F32)?.to_vec::<f32>()?, want);
    Ok(())
}

/// CPython's float floor division, in f32 steps.
fn python_floor_div_f32(a: f32, b: f32) -> f32 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0f32.copysign(a / b);
    }
    let f = div.floor();
    if div - f > 0.5 {
        f + 1.0
    } else {
        f
    }
}
test_device!(float_floor_divide_is_pythons, floor_divide_is_pythons);

/// `masked_fill` of an integer tensor with a float value leaves unmasked elements untouched
/// (every backend rounded them through f32).
fn masked_fill_keeps_integers(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[-4505192772754814380i64, 7], [2], dev)?;
    let none = Tensor::from_slice(&[false, false], [2], dev)?;
    assert_eq!(
        t.masked_fill(&none, 2.5)?.to_vec::<i64>()?,
        vec![-4505192772754814380, 7]
    );
    let i = Tensor::from_slice(&[-2147483647i32, 5], [2], dev)?;
    let first = Tensor::from_slice(&[false, true], [2], dev)?;
    i.masked_fill_(&first, 2.7)?;
    // The value takes the tensor's dtype (2.7 → 2), as PyTorch.
    assert_eq!(i.to_vec::<i32>()?, vec![-2147483647, 2]);
    Ok(())
}
test_device!(
    masked_fill_leaves_unmasked_integers_alone,
    masked_fill_keeps_integers
);

/// f16 `std` takes the root before rounding (the f16 variance, 1.07e9, overflowed to inf).
fn f16_std(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[f16::from_f32(65504.0), f16::from_f32(-1.0)], [2], dev)?;
    let s = t.std(0, 0, false)?;
    assert_eq!(s.dtype(), DType::F16);
    assert_eq!(s.item::<f16>()?.to_f32(), 32752.0);
    Ok(())
}
test_device!(f16_std_does_not_overflow, f16_std);

/// `index_select` checks its index when the result is empty (it returned a `[4, 0, 1]` tensor).
fn index_select_empty(dev: &Device) -> Result<()> {
    let t = Tensor::zeros([0, 0, 1], DType::F32, dev)?;
    let idx = Tensor::from_slice(&[0i64, 0, 0, 0], [4], dev)?;
    let e = t.index_select(0, &idx).unwrap_err();
    assert!(matches!(e, Error::Index(_)), "{e}");
    assert!(
        e.to_string()
            .contains("index 0 is out of range for an axis of size 0"),
        "{e}"
    );
    assert!(t.index_put_(0, &idx, 1.0, false).is_err());
    // An empty index on an empty axis is fine.
    let none = Tensor::from_slice::<i64>(&[], [0], dev)?;
    assert_eq!(t.index_select(0, &none)?.shape(), &[0, 0, 1]);
    Ok(())
}
test_device!(
    index_select_checks_an_index_with_an_empty_result,
    index_select_empty
);

/// Where PyTorch succeeds: softmax over an empty axis, axes 0 and -1 of a 0-d tensor.
fn pytorch_accepts(dev: &Device) -> Result<()> {
    let e = Tensor::zeros([2, 0], DType::F32, dev)?;
    assert_eq!(e.softmax(1)?.shape(), &[2, 0]);
    assert_eq!(e.log_softmax(-1)?.shape(), &[2, 0]);
    assert_eq!(e.softmax(0)?.shape(), &[2, 0]);
    let s = Tensor::scalar(3.5f32, dev)?;
    assert_eq!(s.transpose(0, -1)?.item::<f32>()?, 3.5);
    assert_eq!(s.squeeze_axis(0)?.ndim(), 0);
    assert_eq!(s.squeeze_axis(-1)?.ndim(), 0);
    assert!(s.transpose(0, 1).is_err() && s.squeeze_axis(2).is_err());
    Ok(())
}
test_device!(ops_pytorch_accepts_are_not_errors, pytorch_accepts);

/// `all` of values none of which is zero, subnormals included, is true (NVIDIA's Vulkan driver
/// answered false). Each intermediate is checked bit for bit first, so a failure says whether
/// a copy or the reduction went wrong.
fn all_of_nonzero(dev: &Device) -> Result<()> {
    let vals: Vec<f32> = (0..32)
        .map(|i| if i == 5 { 1.4e-45 } else { i as f32 - 15.5 })
        .collect();
    let cpu = Device::cpu();
    let chain = |d: &Device| -> Result<Vec<Tensor>> {
        let t = Tensor::from_slice(&vals, [2, 2, 2, 4], d)?;
        let r1 = t.flip(&[1, 2])?;
        let r2 = Tensor::stack(&[&r1, &r1], 3)?;
        let r3 = Tensor::cat(&[&r2, &r2, &r2], 2)?;
        Ok(vec![t, r1, r2, r3])
    };
    for (i, (g, w)) in chain(dev)?.iter().zip(chain(&cpu)?).enumerate() {
        assert_eq!(
            bits32(g)?,
            bits32(&w)?,
            "step {i}: the values differ from the CPU's"
        );
        assert!(
            g.all(Axes::All, true)?.item::<bool>()?,
            "step {i}: all() is false over values with no zero"
        );
    }
    let r3 = &chain(dev)?[3];
    assert!(r3
        .to_dtype(DType::Bool)?
        .all(Axes::All, false)?
        .item::<bool>()?);
    assert!(!r3.logical_not()?.any(Axes::All, false)?.item::<bool>()?);
    // A subnormal alone, and the shape without one.
    let one = Tensor::from_slice(&[1.4e-45f32], [1], dev)?;
    assert!(one.all(Axes::All, false)?.item::<bool>()?, "all([1.4e-45])");
    assert!(one.any(Axes::All, false)?.item::<bool>()?, "any([1.4e-45])");
    let plain: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
    let p = Tensor::from_slice(&plain, [2, 2, 2, 4], dev)?;
    assert!(
        p.all(Axes::All, false)?.item::<bool>()?,
        "all of [2, 2, 2, 4]"
    );
    Ok(())
}
test_device!(all_counts_subnormals_as_nonzero, all_of_nonzero);

/// Writing through an index tensor converts the value (wgpu reinterpreted its bits).
fn indexed_set_converts(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[8.25f64, 0.25], [2], dev)?;
    let v = Tensor::from_slice(&[bf16::from_f32(-1.5)], [1], dev)?;
    t.set(s![&Tensor::from_slice(&[-2i32], [1], dev)?], &v)?;
    assert_eq!(t.to_vec::<f64>()?, vec![-1.5, 0.25]);
    let f = Tensor::zeros([3], DType::F32, dev)?;
    let idx = Tensor::from_slice(&[2i64, 0], [2], dev)?;
    f.set(s![&idx], &Tensor::from_slice(&[7i64, -3], [2], dev)?)?;
    f.index_put_(
        0,
        &Tensor::from_slice(&[1i64], [1], dev)?,
        &Tensor::from_slice(&[0.5f64], [1], dev)?,
        false,
    )?;
    assert_eq!(f.to_vec::<f32>()?, vec![-3.0, 0.5, 7.0]);
    let i = Tensor::zeros([2], DType::I32, dev)?;
    i.scatter_(
        0,
        &idx.narrow(0, 1, 1)?,
        &Tensor::from_slice(&[-70000i64], [1], dev)?,
    )?;
    assert_eq!(i.to_vec::<i32>()?, vec![-70000, 0]);
    Ok(())
}
test_device!(
    writes_through_an_index_convert_the_value,
    indexed_set_converts
);

/// f32 `/`, `sqrt`, `reciprocal` and `rsqrt` are correctly rounded (NVIDIA's Vulkan driver was
/// within WGSL's 2.5 ulp): bit for bit what Rust's f32 arithmetic gives.
fn f32_rounding(dev: &Device) -> Result<()> {
    let q = Tensor::scalar(-5i64, dev)?.div(&Tensor::from_slice(&[3i64], [1], dev)?)?;
    assert_eq!(q.to_vec::<f32>()?, vec![-5.0f32 / 3.0]);
    let xs: Vec<f32> = (0..4000)
        .map(|i| {
            let m = 1.0 + (i as f32 * 0.618034).fract();
            m * 2f32.powi(i % 60 - 30) * if i % 7 == 0 { -1.0 } else { 1.0 }
        })
        .collect();
    let ys: Vec<f32> = xs.iter().rev().map(|v| v.abs() * 1.37 + 0.1).collect();
    let (x, y) = (
        Tensor::from_slice(&xs, [xs.len()], dev)?,
        Tensor::from_slice(&ys, [ys.len()], dev)?,
    );
    let want = |f: &dyn Fn(f32, f32) -> f32| -> Vec<u32> {
        xs.iter()
            .zip(&ys)
            .map(|(&a, &b)| f(a, b).to_bits())
            .collect()
    };
    assert_eq!(bits32(&x.div(&y)?)?, want(&|a, b| a / b), "div");
    assert_eq!(bits32(&y.sqrt()?)?, want(&|_, b| b.sqrt()), "sqrt");
    assert_eq!(
        bits32(&x.reciprocal()?)?,
        want(&|a, _| 1.0 / a),
        "reciprocal"
    );
    assert_eq!(bits32(&y.rsqrt()?)?, want(&|_, b| 1.0 / b.sqrt()), "rsqrt");
    // Square roots lying next to a midpoint between two f32 values (the squares of midpoints,
    // rounded, and their neighbours), at powers of two and their neighbours, at the ends of the
    // normal range and below 2^-100 (where the wgpu backend's residual would be subnormal).
    let mut hard = vec![f32::MAX, f32::MIN_POSITIVE, 1.0, 4.0, 2.0, 0.5];
    for i in 0..3000u32 {
        let s = f32::from_bits(0x3f80_0000 + i.wrapping_mul(2_654_435_761) % 0x80_0000);
        let scale = 2f64.powi((i % 120) as i32 - 60);
        let mid = (s as f64 + f32::from_bits(s.to_bits() + 1) as f64) / 2.0 * scale;
        let x = (mid * mid) as f32;
        hard.extend([
            x,
            f32::from_bits(x.to_bits() + 1),
            f32::from_bits(x.to_bits() - 1),
        ]);
    }
    for e in -126..128 {
        let p = 2f32.powi(e);
        hard.extend([
            p,
            f32::from_bits(p.to_bits() + 1),
            f32::from_bits(p.to_bits() - 1),
        ]);
    }
    hard.retain(|v| v.is_normal());
    let h = Tensor::from_slice(&hard, [hard.len()], dev)?;
    let roots: Vec<u32> = hard.iter().map(|v| v.sqrt().to_bits()).collect();
    assert_eq!(bits32(&h.sqrt()?)?, roots, "sqrt near midpoints");
    // Zero and infinite divisors.
    let s = Tensor::from_slice(&[1.0f32, -1.0, 0.0, f32::INFINITY, 2.0], [5], dev)?;
    let d = s.div(&Tensor::from_slice(
        &[0.0f32, 0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY],
        [5],
        dev,
    )?)?;
    let d = d.to_vec::<f32>()?;
    assert!(d[0] == f32::INFINITY && d[1] == f32::NEG_INFINITY && d[2].is_nan() && d[3].is_nan());
    assert_eq!(d[4].to_bits(), (-0.0f32).to_bits());
    Ok(())
}
test_device!(f32_division_and_roots_are_correctly_rounded, f32_rounding);

/// One rule for the sign of a zero from min, max and clamp: -0 is below +0 (IEEE 754-2019).
fn signed_zeros(dev: &Device) -> Result<()> {
    let sign = |t: &Tensor| -> Result<Vec<bool>> {
        Ok(t.to_dtype(DType::F64)?
            .to_vec::<f64>()?
            .iter()
            .map(|v| v.is_sign_negative())
            .collect())
    };
    let c = Tensor::scalar(0.0f32, dev)?.clamp(-2.75, -0.0)?;
    assert_eq!(sign(&c)?, vec![true], "clamp(0, -2.75, -0.0) is -0");
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let p = Tensor::from_slice(&[0.0f64, -0.0], [2], dev)?.to_dtype(d)?;
        let n = Tensor::from_slice(&[-0.0f64, 0.0], [2], dev)?.to_dtype(d)?;
        assert_eq!(sign(&p.maximum(&n)?)?, vec![false, false], "{d} maximum");
        assert_eq!(sign(&p.minimum(&n)?)?, vec![true, true], "{d} minimum");
        let z = Tensor::from_slice(&[0.0f64, -0.0, 0.0, 0.0], [4], dev)?.to_dtype(d)?;
        assert_eq!(sign(&z.min(Axes::All, false)?)?, vec![true], "{d} min");
        assert_eq!(
            sign(&z.flip(&[0])?.max(Axes::All, false)?)?,
            vec![false],
            "{d} max"
        );
        // Positions treat the zeros as equal: the first.
        assert_eq!(z.argmin(None, false)?.item::<i64>()?, 0);
    }
    // sign() of either zero is +0.
    let s = Tensor::from_slice(&[-0.0f32, 0.0], [2], dev)?.sign()?;
    assert_eq!(sign(&s)?, vec![false, false]);
    Ok(())
}
test_device!(zeros_have_one_sign_rule_for_min_max_and_clamp, signed_zeros);

/// Mixed integer operands keep their values (lavapipe: widened to i64, they read as 0).
fn mixed_integers(dev: &Device) -> Result<()> {
    let a = Tensor::from_slice(&[-3i16, 7], [2], dev)?;
    let b = Tensor::from_slice(&[5i64, -2], [2], dev)?;
    assert_eq!(a.floor_divide(&b)?.to_vec::<i64>()?, vec![-1, -4]);
    let p = Tensor::from_slice(&[3i64, 2], [2], dev)?.pow(&Tensor::from_slice(
        &[-1i8, 3],
        [2],
        dev,
    )?)?;
    assert_eq!(p.to_vec::<i64>()?, vec![0, 8]);
    let r = Tensor::from_slice(&[100u32, 7], [2], dev)?
        .bitwise_right_shift(&Tensor::from_slice(&[2i32, 1], [2], dev)?)?;
    assert_eq!(r.dtype(), DType::I64);
    assert_eq!(r.to_vec::<i64>()?, vec![25, 3]);
    let w = Tensor::from_slice(&[-1i8, 100], [2], dev)?.add(&Tensor::from_slice(
        &[u32::MAX, 1],
        [2],
        dev,
    )?)?;
    assert_eq!(w.to_vec::<i64>()?, vec![u32::MAX as i64 - 1, 101]);
    Ok(())
}
test_device!(mixed_integer_operands_keep_their_values, mixed_integers);

/// `log1p` of the largest f64 is finite (lavapipe: inf).
fn log1p_large(dev: &Device) -> Result<()> {
    let t = Tensor::from_slice(&[f64::MAX, 1e300], [2], dev)?
        .log1p()?
        .to_vec::<f64>()?;
    assert!((t[0] - f64::MAX.ln()).abs() < 1e-9, "{t:?}");
    assert!((t[1] - 1e300f64.ln()).abs() < 1e-9, "{t:?}");
    Ok(())
}
test_device!(log1p_of_the_largest_float_is_finite, log1p_large);

/// A reduction of a zero-size view that starts at the end of its storage (wgpu: the binding
/// overflowed the buffer).
fn empty_view_reduction(dev: &Device) -> Result<()> {
    let t = Tensor::ones([2, 4, 4], DType::U32, dev)?.narrow(0, 2, 0)?;
    let p = t.prod([0, 1], false)?;
    assert_eq!(p.to_vec::<i64>()?, vec![1; 4]);
    assert_eq!(t.sum(Axes::All, false)?.item::<i64>()?, 0);
    Ok(())
}
test_device!(
    reductions_of_empty_views_at_the_end_of_storage,
    empty_view_reduction
);

/// `scatter_add_` into a dtype packed several to a word keeps the old value (wgpu read it after
/// its store had cleared the bits, on NVIDIA's driver).
fn scatter_add_packed(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(
        &[3u8, 5, 2, 227, 40, 255, 10, 253, 250, 5, 1, 39],
        [3, 4, 1],
        dev,
    )?;
    let idx = Tensor::from_slice(&[0i32, 0, -1, -1, -1, -1], [3, 2, 1], dev)?;
    let src = Tensor::from_slice(&[11u8, 1, 10, 2, 0, 13], [3, 2, 1], dev)?;
    x.scatter_add_(2, &idx, &src)?;
    assert_eq!(
        x.to_vec::<u8>()?,
        vec![14, 6, 2, 227, 50, 1, 10, 253, 250, 18, 1, 39]
    );
    let y = Tensor::from_slice(&[-3194i16, 3, 7, -7545, -13, 0, 5, 20517, 7], [9], dev)?;
    let idx = Tensor::from_slice(&[-5i64, 4, 0, 1, 8, 8, -7], [7], dev)?;
    let src = Tensor::from_slice(&[11431i16, 12, -11, 1, -32484, 32767, 451], [7], dev)?;
    y.scatter_add_(0, &idx, &src)?;
    // Integer sums wrap: -13 + 11431 + 12 and 7 + -32484 + 32767.
    assert_eq!(
        y.to_vec::<i16>()?,
        vec![-3205, 4, 458, -7545, 11430, 0, 5, 20517, 290]
    );
    Ok(())
}
test_device!(scatter_add_keeps_packed_neighbours, scatter_add_packed);

/// An empty slice at the far end of a flipped axis is an empty view, not a layout before the
/// storage (the CPU refused `mean` of it).
fn empty_end_of_flip(dev: &Device) -> Result<()> {
    let x = Tensor::from_slice(&[4.8f32, f32::INFINITY], [2], dev)?;
    let e = x.flip(&[0])?.narrow(0, 2, 0)?;
    assert_eq!(e.shape(), &[0]);
    assert!(e.mean(0, false)?.item::<f32>()?.is_nan());
    assert_eq!(e.sum(0, false)?.item::<f32>()?, 0.0);
    let z = Tensor::zeros([0, 3], DType::F32, dev)?;
    assert_eq!(
        z.narrow(1, 2, 1)?.sum(Axes::All, false)?.item::<f32>()?,
        0.0
    );
    assert_eq!(z.flip(&[0, 1])?.contiguous()?.shape(), &[0, 3]);
    Ok(())
}
test_device!(empty_slice_of_a_flipped_axis, empty_end_of_flip);

/// Functions odd at 0 keep the sign of a zero (NVIDIA's Vulkan driver gave f16 tan(-0) = +0).
fn odd_functions_at_zero(dev: &Device) -> Result<()> {
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let z = Tensor::from_slice(&[-0.0f64, 0.0], [2], dev)?.to_dtype(d)?;
        for op in ["neg", "sin", "tan", "tanh", "expm1", "log1p", "erf", "gelu"] {
            let got = match op {
                "neg" => z.neg()?.neg()?,
                "sin" => z.sin()?,
                "tan" => z.tan()?,
                "tanh" => z.tanh()?,
                "expm1" => z.expm1()?,
                "log1p" => z.log1p()?,
                "erf" => z.erf()?,
                _ => z.gelu()?,
            };
            let v = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
            assert!(
                v[0] == 0.0 && v[0].is_sign_negative() && v[1] == 0.0 && v[1].is_sign_positive(),
                "{d} {op}(±0) = {v:?}"
            );
        }
    }
    Ok(())
}
test_device!(odd_functions_keep_the_sign_of_zero, odd_functions_at_zero);

/// A row-broadcast operand (`x - m` with `m` of shape `[rows, 1]`, as softmax composes it)
/// over rows whose length is even but not a multiple of four: wgpu planned vectors of two,
/// which its shaders do not have, and the second half of the elements was left unwritten (found by
/// training on the digits: ten classes a row). Each result against the host's arithmetic.
fn row_broadcast_rows_of_ten(dev: &Device) -> Result<()> {
    for (rows, n) in [(64usize, 10usize), (100, 6), (40, 14), (33, 18)] {
        let x: Vec<f32> = (0..rows * n).map(|i| (i * 37 % 11) as f32 * 0.25).collect();
        let m: Vec<f32> = (0..rows).map(|r| r as f32).collect();
        let xt = Tensor::from_slice(&x, [rows, n], dev)?;
        let mt = Tensor::from_slice(&m, [rows, 1], dev)?;
        let got = xt.sub(&mt)?.to_vec::<f32>()?;
        let want: Vec<f32> = (0..rows * n).map(|i| x[i] - m[i / n]).collect();
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "[{rows}, {n}] - [{rows}, 1] at {i}: {} vs {}",
                got[i], want[i]
            );
        }
        let sm = xt.log_softmax(-1)?.to_vec::<f32>()?;
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let top = row.iter().copied().fold(f32::MIN, f32::max);
            let lse = top + row.iter().map(|v| (v - top).exp()).sum::<f32>().ln();
            for (j, v) in row.iter().enumerate() {
                let (g, w) = (sm[r * n + j], v - lse);
                assert!(
                    (g - w).abs() <= 1e-5,
                    "log_softmax [{rows}, {n}] at ({r}, {j}): {g} vs {w}"
                );
            }
        }
    }
    Ok(())
}

test_device!(row_broadcasts_over_rows_of_ten, row_broadcast_rows_of_ten);
