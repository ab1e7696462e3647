//! Creation, copies, casts, assignment, display, streams and memory statistics on every
//! device, each checked against plain Rust.

use strata::prelude::*;
use strata::{Element, MemoryStats};
use strata_tests::test_device;

/// Edge values of every dtype, as scalars.
fn samples() -> Vec<Scalar> {
    let mut out = vec![Scalar::Bool(true), Scalar::Bool(false)];
    for v in [
        0.0f64, 1.0, -1.0, 2.5, -2.5, 127.5, 300.7, -300.7, 65535.0, 70000.0, 3.0e9, -3.0e9,
        1.0e20, -1.0e20,
    ] {
        out.push(Scalar::F64(v));
        out.push(Scalar::F32(v as f32));
    }
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        out.extend([
            Scalar::F64(v),
            Scalar::F32(v as f32),
            Scalar::F16(half::f16::from_f64(v)),
            Scalar::BF16(half::bf16::from_f64(v)),
        ]);
    }
    out.extend([
        Scalar::F16(half::f16::from_f32(-7.75)),
        Scalar::BF16(half::bf16::from_f32(1.0e10)),
    ]);
    out.extend([
        Scalar::I64(i64::MIN),
        Scalar::I64(i64::MAX),
        Scalar::I64(-1),
        Scalar::I64(1 << 40),
    ]);
    out.extend([
        Scalar::U64(u64::MAX),
        Scalar::U64(1 << 63),
        Scalar::I32(-40),
        Scalar::I32(300),
    ]);
    out.extend([
        Scalar::U8(200),
        Scalar::I8(-128),
        Scalar::U16(40000),
        Scalar::I16(-30000),
        Scalar::U32(u32::MAX),
    ]);
    out
}

/// Every value of `source` dtype cast to every dtype, wrapping and saturating, must equal
/// `Scalar::cast` (the documented rule) bit for bit.
fn casts_follow_the_scalar_rule(dev: &Device) -> Result<()> {
    for from in DType::ALL {
        let values: Vec<Scalar> = samples().into_iter().map(|s| s.cast(from, false)).collect();
        let t = Tensor::empty([values.len()], from, dev)?;
        for (i, v) in values.iter().enumerate() {
            t.set(s![i], *v)?;
        }
        for to in DType::ALL {
            for saturate in [false, true] {
                let out = if saturate {
                    t.to_dtype_sat(to)?
                } else {
                    t.to_dtype(to)?
                };
                assert_eq!(out.dtype(), to);
                for (i, v) in values.iter().enumerate() {
                    let got = out.slice(s![i])?.item_scalar()?;
                    let want = v.cast(to, saturate);
                    let same = got == want || (got.to_f64().is_nan() && want.to_f64().is_nan());
                    assert!(
                        same,
                        "{from} {v} -> {to} (saturate {saturate}): got {got}, want {want}"
                    );
                }
            }
        }
    }
    Ok(())
}
test_device!(
    casts_match_scalar_cast_for_every_dtype_pair,
    casts_follow_the_scalar_rule
);

fn creation(dev: &Device) -> Result<()> {
    for dtype in DType::ALL {
        let z = Tensor::zeros([2, 3], dtype, dev)?;
        assert!(z.to_vec_scalars()?.iter().all(|s| !s.to_bool()), "{dtype}");
        let o = Tensor::ones([4], dtype, dev)?;
        assert!(
            o.to_vec_scalars()?.iter().all(|s| s.to_f64() == 1.0),
            "{dtype}"
        );
        let e = Tensor::eye(3, dtype, dev)?;
        let v: Vec<f64> = e.to_vec_scalars()?.iter().map(|s| s.to_f64()).collect();
        assert_eq!(v, vec![1., 0., 0., 0., 1., 0., 0., 0., 1.], "{dtype}");
        assert_eq!(o.zeros_like()?.dtype(), dtype);
    }
    assert_eq!(
        Tensor::full([2], -3, DType::U8, dev)?.to_vec::<u8>()?,
        vec![253, 253]
    );
    assert_eq!(
        Tensor::full([1], 1e10, DType::I32, dev)?.to_vec::<i32>()?,
        vec![i32::MAX]
    );
    assert_eq!(
        Tensor::arange(-3, 3, 2, DType::I16, dev)?.to_vec::<i16>()?,
        vec![-3, -1, 1]
    );
    assert_eq!(Tensor::arange(0, 0, 1, DType::I16, dev)?.numel(), 0);
    let big = Tensor::arange(i64::MAX - 2, i64::MAX, 1, DType::I64, dev)?;
    assert_eq!(big.to_vec::<i64>()?, vec![i64::MAX - 2, i64::MAX - 1]);
    let f = Tensor::arange(1.0, 2.0, 0.3, DType::F64, dev)?.to_vec::<f64>()?;
    let want: Vec<f64> = (0..4).map(|i| 1.0 + i as f64 * 0.3).collect();
    assert_eq!(f, want);
    let h = Tensor::arange(0, 5, 1, DType::F16, dev)?;
    assert_eq!(h.to_vec::<half::f16>()?[4], half::f16::from_f32(4.0));
    // linspace: PyTorch's symmetric formula.
    let l = Tensor::linspace(-1.0, 1.0, 7, DType::F64, dev)?.to_vec::<f64>()?;
    let step = 2.0 / 6.0;
    let want: Vec<f64> = (0..7)
        .map(|i| {
            if i < 3 {
                -1.0 + step * i as f64
            } else {
                1.0 - step * (6 - i) as f64
            }
        })
        .collect();
    // Within a rounding of the range: Vulkan drivers may fuse `end - step * k` into one fma
    // (naga marks no SPIR-V NoContraction), which differs from the CPU in the last bit.
    for (g, w) in l.iter().zip(&want) {
        assert!(
            (g - w).abs() <= 2.0 * f64::EPSILON,
            "linspace: got {l:?}, want {want:?}"
        );
    }
    assert_eq!(
        Tensor::linspace(2.0, 9.0, 1, DType::F32, dev)?.to_vec::<f32>()?,
        vec![2.0]
    );
    assert_eq!(
        Tensor::linspace(0.0, 4.0, 5, DType::U8, dev)?.to_vec::<u8>()?,
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(Tensor::scalar(7i64, dev)?.shape(), &[] as &[usize]);
    Ok(())
}
test_device!(creation_functions, creation);

fn copies_and_assignment(dev: &Device) -> Result<()> {
    let t = Tensor::arange(0, 12, 1, DType::I32, dev)?.reshape([3, 4])?;
    // Strided copy of a negative-stride, offset view.
    let v = t.slice(s![..;-1, 1..;2])?;
    assert_eq!(v.copy()?.to_vec::<i32>()?, vec![9, 11, 5, 7, 1, 3]);
    // Broadcasting assignment into a view writes through to the base.
    t.set(s![.., 0], &Tensor::from_slice(&[-1i32, -2, -3], [3], dev)?)?;
    t.set(s![0, 1..], &Tensor::scalar(100i32, dev)?)?;
    assert_eq!(
        t.to_vec::<i32>()?,
        vec![-1, 100, 100, 100, -2, 5, 6, 7, -3, 9, 10, 11]
    );
    // Assignment converts dtypes by the cast rules.
    t.set(
        s![2],
        &Tensor::from_slice(&[1.9f32, -1.9, 3e10, f32::NAN], [4], dev)?,
    )?;
    assert_eq!(t.slice(s![2])?.to_vec::<i32>()?, vec![1, -1, i32::MAX, 0]);
    // Overlapping source and destination in one storage: reads see the old values.
    let r = Tensor::arange(0, 6, 1, DType::I64, dev)?;
    r.slice(s![1..])?.assign(&r.slice(s![..-1])?)?;
    assert_eq!(r.to_vec::<i64>()?, vec![0, 0, 1, 2, 3, 4]);
    let m = Tensor::arange(0, 9, 1, DType::I64, dev)?.reshape([3, 3])?;
    m.assign(&m.t()?)?;
    assert_eq!(m.to_vec::<i64>()?, vec![0, 3, 6, 1, 4, 7, 2, 5, 8]);
    // Large enough to be split across threads, strided on both sides.
    let n = 300_000;
    let big = Tensor::arange(0, n as i64, 1, DType::I64, dev)?.reshape([n / 3, 3])?;
    let col = big.t()?.contiguous()?;
    let got = col.to_vec::<i64>()?;
    let want: Vec<i64> = (0..3)
        .flat_map(|c| (0..n / 3).map(move |r| (r * 3 + c) as i64))
        .collect();
    assert_eq!(got, want);
    Ok(())
}
test_device!(copies_and_assignment_through_views, copies_and_assignment);

fn display(dev: &Device) -> Result<()> {
    let f = Tensor::from_slice(&[1.0f32, -2.5, 3.25, 4.0], [2, 2], dev)?;
    assert_eq!(
        f.to_string(),
        format!(
            "[[ 1.0000, -2.5000],\n [ 3.2500,  4.0000]]\nshape=[2, 2], dtype=f32, device={}",
            dev.name()
        )
    );
    let w = Tensor::from_slice(&[1.0f64, 2.0], [2], dev)?;
    assert_eq!(w.format_values()?, "[1., 2.]");
    let e = Tensor::from_slice(&[1.0e-5f32, 1.0e5, f32::NAN, f32::NEG_INFINITY], [4], dev)?;
    assert_eq!(
        e.format_values()?,
        "[1.0000e-05, 1.0000e+05,        nan,       -inf]"
    );
    let b = Tensor::from_slice(&[true, false], [2], dev)?;
    assert_eq!(b.format_values()?, "[ true, false]");
    assert_eq!(Tensor::scalar(5u8, dev)?.format_values()?, "5");
    assert_eq!(
        Tensor::zeros([2, 0], DType::F32, dev)?.format_values()?,
        "[[],\n []]"
    );
    let three = Tensor::arange(0, 8, 1, DType::I8, dev)?.reshape([2, 2, 2])?;
    assert_eq!(
        three.format_values()?,
        "[[[0, 1],\n  [2, 3]],\n\n [[4, 5],\n  [6, 7]]]"
    );
    // Summarized: only the ends of long axes, and the footer has the real shape.
    let big = Tensor::arange(0, 2000, 1, DType::I32, dev)?.reshape([40, 50])?;
    let text = big.to_string();
    assert!(
        text.starts_with("[[   0,    1,    2, ...,   47,   48,   49],\n [  50,"),
        "{text}"
    );
    assert!(text.contains(" ...,\n [1850,"), "{text}");
    assert!(text.ends_with(&format!(
        "1999]]\nshape=[40, 50], dtype=i32, device={}",
        dev.name()
    )));
    let long = Tensor::arange(0, 40, 1, DType::I64, dev)?;
    assert!(long.format_values()?.contains(",\n "), "long rows wrap");
    // Debug: the layout, then the values on one line (PyTorch's repr), read from the device.
    let debug = format!("{:?}", big.slice(s![1..;2, ..;-1])?);
    let head = format!(
        "Tensor {{ shape: [20, 50], strides: [100, -1], offset: 99, dtype: i32, device: {}, \
         values: [[  99,   98,",
        dev.name()
    );
    assert!(debug.starts_with(&head), "{debug}");
    assert!(debug.contains("  50], [ 199,"), "{debug}");
    assert!(
        debug.ends_with("1951, 1950]] }") && !debug.contains('\n'),
        "{debug}"
    );
    Ok(())
}
test_device!(display_like_pytorch, display);

fn streams_and_events(dev: &Device) -> Result<()> {
    let s1 = dev.new_stream()?;
    let s2 = dev.new_stream()?;
    let t = dev.with_stream(&s1, || Tensor::full([1000], 2.0, DType::F32, dev))??;
    let start = s2.record_event()?;
    // Written on s1, read on s2 without an explicit event: core orders it.
    let u = dev.with_stream(&s2, || t.copy())??;
    let end = s2.record_event()?;
    end.synchronize()?;
    assert!(start.elapsed_ms(&end)? >= 0.0);
    assert_eq!(u.to_vec::<f32>()?, vec![2.0; 1000]);
    s1.wait_event(&end)?;
    s1.synchronize()?;
    dev.synchronize()?;
    assert_eq!(dev.current_stream(), dev.default_stream());
    dev.set_blocking(true);
    assert_eq!(
        Tensor::ones([3], DType::U8, dev)?.to_vec::<u8>()?,
        vec![1, 1, 1]
    );
    dev.set_blocking(false);
    let other = Device::cpu();
    assert!(dev.set_stream(&other.new_stream()?).is_err());
    Ok(())
}
test_device!(streams_events_and_blocking_mode, streams_and_events);

fn memory(dev: &Device) -> Result<()> {
    let before = dev.memory_stats();
    let t = Tensor::zeros([1 << 20], DType::F32, dev)?;
    let during = dev.memory_stats();
    assert!(during.allocated >= before.allocated + (4 << 20));
    assert!(during.peak >= during.allocated && during.reserved >= during.allocated);
    drop(t);
    dev.empty_cache();
    let after: MemoryStats = dev.memory_stats();
    assert_eq!(after.allocated, before.allocated);
    Ok(())
}
test_device!(memory_statistics_follow_allocations, memory);

/// A helper so tests can read any dtype without naming its Rust type.
trait ToScalars {
    fn to_vec_scalars(&self) -> Result<Vec<Scalar>>;
}
impl ToScalars for Tensor {
    fn to_vec_scalars(&self) -> Result<Vec<Scalar>> {
        let flat = self.flatten()?;
        (0..flat.numel())
            .map(|i| flat.slice(s![i])?.item_scalar())
            .collect()
    }
}

#[test]
fn element_types_name_their_dtypes() {
    assert_eq!(<u8 as Element>::DTYPE, DType::U8);
    assert_eq!(<half::f16 as Element>::DTYPE, DType::F16);
    for d in DType::ALL {
        let (code, bits, lanes) = d.dlpack();
        assert_eq!(DType::from_dlpack(code, bits, lanes).unwrap(), d);
        assert_eq!(bits as usize, d.itemsize() * 8);
        assert_eq!(d.name().parse::<DType>().unwrap(), d);
    }
}
