//! IEEE 754 identities a compiler may not fold, on every device: `x - x` is NaN for ±inf and
//! NaN (not 0), `x * 0` is NaN for them and keeps the sign of zero, `x + 0` turns -0 into +0,
//! `x / x` is NaN at 0, a product that overflows stays infinite, `(x + 1) - 1` is not `x`,
//! NaN compares unequal to itself. A random program found NVIDIA's Vulkan driver folding
//! `r2 - r2` to 0 where `r2` held ±inf (issue 44); each identity runs on a realized input
//! and inside a fused chain, in f32 and f64, against Rust's own arithmetic, bit for bit
//! (any NaN matches any NaN).

// `x - x` and `x / x` are the point: Rust's own arithmetic is the reference.
#![allow(clippy::eq_op)]

use strata::prelude::*;
use strata_tests::test_device;

/// Edge values: infinities, NaN, both zeros, the largest finite, a value that 1 absorbs.
/// No subnormals (NVIDIA's Vulkan driver flushes those, a documented difference).
const VALUES: [f64; 10] = [
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    -0.0,
    0.0,
    1.0,
    -2.5,
    f64::MAX,
    1e-8,
    -3e38,
];

type Op = fn(&Tensor) -> Result<Tensor>;
/// The same arithmetic on one value: f64 when the flag is set, else f32.
type Host = fn(f64, bool) -> f64;

/// (name, the op on a tensor, the same arithmetic on one f64 value in the tensor's dtype).
fn identities() -> Vec<(&'static str, Op, Host)> {
    // `wide` picks f64 arithmetic, else f32 (rounded at each step, as the device does).
    fn f(v: f64, wide: bool, op: impl Fn(f64) -> f64, op32: impl Fn(f32) -> f32) -> f64 {
        if wide {
            op(v)
        } else {
            op32(v as f32) as f64
        }
    }
    vec![
        ("x - x", |t| t.sub(t), |v, w| f(v, w, |x| x - x, |x| x - x)),
        (
            "x * 0",
            |t| t.mul(0.0),
            |v, w| f(v, w, |x| x * 0.0, |x| x * 0.0),
        ),
        (
            "x + 0",
            |t| t.add(0.0),
            |v, w| f(v, w, |x| x + 0.0, |x| x + 0.0),
        ),
        (
            "x - 0",
            |t| t.sub(0.0),
            |v, w| f(v, w, |x| x - 0.0, |x| x - 0.0),
        ),
        (
            "x + -0",
            |t| t.add(-0.0),
            |v, w| f(v, w, |x| x + -0.0, |x| x + -0.0),
        ),
        ("x / x", |t| t.div(t), |v, w| f(v, w, |x| x / x, |x| x / x)),
        (
            "x * 2 / 2",
            |t| t.mul(2.0)?.div(2.0),
            |v, w| f(v, w, |x| x * 2.0 / 2.0, |x| x * 2.0 / 2.0),
        ),
        (
            "(x + 1) - 1",
            |t| t.add(1.0)?.sub(1.0),
            |v, w| f(v, w, |x| (x + 1.0) - 1.0, |x| (x + 1.0) - 1.0),
        ),
        (
            "x * x - x * x",
            |t| t.mul(t)?.sub(&t.mul(t)?),
            |v, w| f(v, w, |x| x * x - x * x, |x| x * x - x * x),
        ),
    ]
}

fn same(got: f64, want: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got.to_bits() == want.to_bits()
}

/// Every identity that does not hold, so one run on a new driver lists all it folds.
fn identities_hold(dev: &Device) -> Result<()> {
    let mut broken = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        let wide = dtype == DType::F64;
        let input = Tensor::from_slice(&VALUES, [VALUES.len()], &Device::cpu())?
            .to_dtype(dtype)?
            .to_device(dev)?;
        for (name, op, host) in identities() {
            // Realized input, then the same input behind a pending op (`x * 1`), so the
            // identity is one fused kernel that loads the input once.
            for pending in [false, true] {
                let x = if pending {
                    input.mul(1.0)?
                } else {
                    input.clone()
                };
                let got = op(&x)?.to_dtype(DType::F64)?.to_vec::<f64>()?;
                for (k, &v) in VALUES.iter().enumerate() {
                    let want = host(v, wide);
                    if !same(got[k], want) {
                        broken.push(format!(
                            "{name} of {v:e} in {dtype} ({}): {:e}, IEEE gives {want:e}",
                            if pending { "fused" } else { "realized input" },
                            got[k]
                        ));
                    }
                }
            }
        }
        // NaN is unequal to itself, also when both sides are the same value.
        for pending in [false, true] {
            let x = if pending {
                input.mul(1.0)?
            } else {
                input.clone()
            };
            let eq = x.eq(&x)?.to_vec::<bool>()?;
            let ne = x.ne(&x)?.to_vec::<bool>()?;
            for (k, &v) in VALUES.iter().enumerate() {
                if eq[k] == v.is_nan() || ne[k] != v.is_nan() {
                    broken.push(format!(
                        "x == x / x != x for {v:e} in {dtype}: {} / {}",
                        eq[k], ne[k]
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "on {}:\n{}",
        dev.name(),
        broken.join("\n")
    );
    Ok(())
}

test_device!(ieee_identities_are_not_folded, identities_hold);
