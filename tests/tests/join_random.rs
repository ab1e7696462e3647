//! Joining/splitting against plain Rust, and random numbers: Philox known answers, every
//! element recomputed on the host from the documented transform, and distribution checks.

use strata::ops::Axes;
use strata::prelude::*;
use strata::random::{philox4x32_10, Generator};
use strata_tests::test_device;

fn joins(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 6, 1, DType::I32, dev)?.reshape([2, 3])?;
    let b = Tensor::arange(6, 9, 1, DType::I64, dev)?.reshape([1, 3])?;
    let c = Tensor::cat(&[&a, &b], 0)?;
    assert_eq!(
        (c.dtype(), c.to_vec::<i64>()?),
        (DType::I64, (0..9).collect::<Vec<i64>>())
    );
    let d = Tensor::cat(&[&a.t()?, &a.t()?], 1)?; // strided inputs
    assert_eq!(d.to_vec::<i32>()?, vec![0, 3, 0, 3, 1, 4, 1, 4, 2, 5, 2, 5]);
    let s = Tensor::stack(&[&a, &a], 0)?;
    assert_eq!(s.shape(), &[2, 2, 3]);
    assert_eq!(
        Tensor::stack(&[&a, &a], -1)?
            .slice(s![1, 2])?
            .to_vec::<i32>()?,
        vec![5, 5]
    );
    let parts = c.split(2, 0)?;
    assert_eq!(
        parts.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(),
        vec![2, 1]
    );
    assert!(parts[1].shares_storage(&c));
    assert_eq!(c.chunk(2, 1)?.len(), 2);
    assert_eq!(a.flip(&[-1])?.to_vec::<i32>()?, vec![2, 1, 0, 5, 4, 3]);
    assert_eq!(a.roll(1, Some(1))?.to_vec::<i32>()?, vec![2, 0, 1, 5, 3, 4]);
    assert_eq!(
        a.roll(-4, Some(1))?.to_vec::<i32>()?,
        vec![1, 2, 0, 4, 5, 3]
    );
    let ones = Tensor::ones([2, 3, 3], DType::I8, dev)?;
    let lower: Vec<i8> = (0..18)
        .map(|i| ((i % 3) <= ((i / 3) % 3) + 1) as i8)
        .collect();
    assert_eq!(ones.tril(1)?.to_vec::<i8>()?, lower);
    let upper: Vec<i8> = (0..18).map(|i| ((i % 3) >= ((i / 3) % 3)) as i8).collect();
    assert_eq!(
        ones.slice(s![.., ..;-1, ..])?.triu(0)?.to_vec::<i8>()?,
        upper
    );
    // Errors name shapes.
    let e = Tensor::cat(&[&a, &a.t()?], 0).unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
    assert!(Tensor::stack(&[&a, &b], 0).is_err());
    assert!(Tensor::cat(&[], 0).is_err());
    assert!(a
        .split_sizes(&[2, 2], 1)
        .unwrap_err()
        .to_string()
        .contains("[2, 2]"));
    assert!(Tensor::ones([3], DType::F32, dev)?.tril(0).is_err());
    Ok(())
}
test_device!(joining_and_splitting, joins);

/// `pad` against plain Rust: padding and cropping on each side, every dtype, a strided and a
/// reversed source, trailing axes only, a crop to nothing; errors name the widths.
fn pad(dev: &Device) -> Result<()> {
    // Host reference: row-major [rows, cols] i64 values padded with `fill`.
    let reference = |rows: i64, cols: i64, w: [(i64, i64); 2], at: &dyn Fn(i64, i64) -> i64| {
        let (r2, c2) = (rows + w[0].0 + w[0].1, cols + w[1].0 + w[1].1);
        let mut out = Vec::new();
        for i in 0..r2 {
            for j in 0..c2 {
                let (si, sj) = (i - w[0].0, j - w[1].0);
                let inside = (0..rows).contains(&si) && (0..cols).contains(&sj);
                out.push(if inside { at(si, sj) } else { -3 });
            }
        }
        out
    };
    let base = Tensor::arange(0, 12, 1, DType::I64, dev)?.reshape([3, 4])?;
    let widths = [
        [(1, 2), (0, 1)],
        [(-1, 1), (2, -2)],
        [(0, -3), (-1, -1)],
        [(2, 0), (0, 0)],
    ];
    for dtype in [DType::F32, DType::F16, DType::I32, DType::U8, DType::I64] {
        // Negative fills wrap for u8, as the cast rule says: compare through i64 from -3's cast.
        let fill = Tensor::scalar(-3i64, dev)?
            .to_dtype(dtype)?
            .to_dtype(DType::I64)?
            .item::<i64>()?;
        let fix = |v: Vec<i64>| {
            v.into_iter()
                .map(|x| if x == -3 { fill } else { x })
                .collect::<Vec<_>>()
        };
        let t = base.to_dtype(dtype)?;
        for w in widths {
            let want = fix(reference(3, 4, w, &|i, j| i * 4 + j));
            let widths = [
                (w[0].0 as isize, w[0].1 as isize),
                (w[1].0 as isize, w[1].1 as isize),
            ];
            let got = t.pad(&widths, -3)?.to_dtype(DType::I64)?;
            assert_eq!(got.to_vec::<i64>()?, want, "{dtype} {w:?}");
            // The transpose and the reversed rows of the source.
            let want_t = fix(reference(4, 3, w, &|i, j| j * 4 + i));
            assert_eq!(
                t.t()?
                    .pad(&widths, -3)?
                    .to_dtype(DType::I64)?
                    .to_vec::<i64>()?,
                want_t
            );
            let want_r = fix(reference(3, 4, w, &|i, j| (2 - i) * 4 + j));
            let rev = t.slice(s![..;-1, ..])?.pad(&widths, -3)?;
            assert_eq!(rev.to_dtype(DType::I64)?.to_vec::<i64>()?, want_r);
        }
    }
    // Trailing axes only: a batch of two [1, 2] planes padded in their last axis.
    let planes = Tensor::ones([2, 1, 2], DType::F32, dev)?;
    let p = planes.pad(&[(1, 0)], 0.5)?;
    assert_eq!(p.shape(), &[2, 1, 3]);
    assert_eq!(p.to_vec::<f32>()?, vec![0.5, 1.0, 1.0, 0.5, 1.0, 1.0]);
    // Cropped to nothing along one axis: an empty result of the right shape.
    assert_eq!(base.pad(&[(0, 0), (-2, -2)], 1)?.shape(), &[3, 0]);
    let e = base.pad(&[(0, 0), (-3, -2)], 1).unwrap_err().to_string();
    assert!(e.contains("(-3, -2)") && e.contains("size 4"), "{e}");
    let e = base.pad(&[(0, 0); 3], 1).unwrap_err().to_string();
    assert!(e.contains("3 pairs") && e.contains("rank 2"), "{e}");
    Ok(())
}
test_device!(pad_adds_and_crops, pad);

/// `cat` along the last axis writes each part as rows of the output: whole vectors where every
/// row starts on one (strided-row vectors on CUDA and wgpu), element by element where not. Checked
/// against the host for widths that align and widths that do not, in 1-, 2-, 4- and 8-byte
/// dtypes; then reading such rows back (`split` parts made contiguous).
fn cat_rows(dev: &Device) -> Result<()> {
    for dtype in [DType::U8, DType::F16, DType::F32, DType::I64] {
        for (wa, wb) in [(8usize, 4usize), (16, 16), (3, 5), (4, 6), (1, 8)] {
            let rows = 5;
            let a =
                Tensor::arange(0, (rows * wa) as i64, 1, DType::I64, dev)?.reshape([rows, wa])?;
            let b = Tensor::arange(1000, 1000 + (rows * wb) as i64, 1, DType::I64, dev)?
                .reshape([rows, wb])?;
            let (ad, bd) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
            let got = Tensor::cat(&[&ad, &bd], -1)?;
            let (ha, hb) = (a.to_vec::<i64>()?, b.to_vec::<i64>()?);
            let want: Vec<i64> = (0..rows)
                .flat_map(|r| {
                    let mut row = ha[r * wa..(r + 1) * wa].to_vec();
                    row.extend_from_slice(&hb[r * wb..(r + 1) * wb]);
                    row
                })
                .collect();
            let round = |v: Vec<i64>| -> Result<Vec<i64>> {
                let t = Tensor::from_slice(&v, [v.len()], &Device::cpu())?;
                t.to_dtype(dtype)?.to_dtype(DType::I64)?.to_vec::<i64>()
            };
            let want = round(want)?;
            let what = format!("{dtype} widths {wa} + {wb}");
            assert_eq!(got.to_dtype(DType::I64)?.to_vec::<i64>()?, want, "{what}");
            let parts = got.split_sizes(&[wa, wb], -1)?;
            let back = parts[1]
                .contiguous()?
                .to_dtype(DType::I64)?
                .to_vec::<i64>()?;
            assert_eq!(
                back,
                round(hb.clone())?,
                "{what}: the second part read back"
            );
        }
    }
    Ok(())
}
test_device!(cat_along_the_last_axis_writes_rows, cat_rows);

#[test]
fn philox_known_answers() {
    // Random123's known-answer vectors for philox4x32-10.
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

/// Philox words of counter `offset + c` under `seed`.
fn words(seed: u64, offset: u64, c: u64) -> [u32; 4] {
    let c = offset.wrapping_add(c);
    philox4x32_10(
        [c as u32, (c >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A 53-bit uniform from two words.
/// f32 uniforms drawn with `seed` from counter `first`: the top 24 bits of one word each.
fn check_f32_uniforms(values: &[f32], seed: u64, first: u64) {
    for (i, &v) in values.iter().enumerate() {
        let w = words(seed, first, i as u64 / 4)[i % 4];
        assert_eq!(v, (w >> 8) as f32 * 2f32.powi(-24), "f32 rand element {i}");
    }
}

/// f32 normals drawn with `seed` from counter `first`: two Box–Muller pairs per counter, in
/// f32 (each backend's log, cos and sin: a few ulps apart).
fn check_f32_normals(values: &[f32], seed: u64, first: u64) {
    for (i, &v) in values.iter().enumerate() {
        check_f32_normal(i, v, seed, first);
    }
}

/// Element `i` of an f32 normal draw (see [`check_f32_normals`]).
fn check_f32_normal(i: usize, v: f32, seed: u64, first: u64) {
    let w = words(seed, first, i as u64 / 4);
    let k = 2 * ((i % 4) / 2);
    let u1 = 1.0 - (w[k] >> 8) as f32 * 2f32.powi(-24);
    let u2 = (w[k + 1] >> 8) as f32 * 2f32.powi(-24);
    let angle = std::f32::consts::TAU * u2;
    let trig = if i.is_multiple_of(2) {
        angle.cos()
    } else {
        angle.sin()
    };
    let want = (-2.0 * u1.ln()).sqrt() * trig;
    assert!(
        (v - want).abs() <= 4e-6 * want.abs().max(1.0),
        "f32 randn element {i}: {v} vs {want}"
    );
}

fn u53(hi: u32, lo: u32) -> f64 {
    (((hi as u64) << 21) | ((lo as u64) >> 11)) as f64 * 2f64.powi(-53)
}

fn random(dev: &Device) -> Result<()> {
    // f64 uniforms: two elements per counter, two words each.
    let mut g = Generator::new(1234);
    let u = Tensor::rand([4, 5], DType::F64, &mut g, dev)?.to_vec::<f64>()?;
    for (i, &v) in u.iter().enumerate() {
        let w = words(1234, 0, i as u64 / 2);
        let k = 2 * (i % 2);
        assert_eq!(v, u53(w[k], w[k + 1]), "rand element {i}");
    }
    assert_eq!(g.state(), (1234, 10));
    // f64 normals: one Box–Muller pair per counter, cosine then sine.
    let n = Tensor::randn([51], DType::F64, &mut g, dev)?.to_vec::<f64>()?;
    for (i, &v) in n.iter().enumerate() {
        let w = words(1234, 10, i as u64 / 2);
        let (u1, u2) = (1.0 - u53(w[0], w[1]), u53(w[2], w[3]));
        let angle = std::f64::consts::TAU * u2;
        let trig = if i % 2 == 0 { angle.cos() } else { angle.sin() };
        let want = (-2.0 * u1.ln()).sqrt() * trig;
        assert!((v - want).abs() < 1e-12, "randn element {i}: {v} vs {want}");
    }
    assert_eq!(g.state(), (1234, 36));
    // f32 uniforms: four elements per counter, the top 24 bits of one word each (exact).
    let mut g2 = Generator::new(99);
    let f = Tensor::rand([21], DType::F32, &mut g2, dev)?.to_vec::<f32>()?;
    check_f32_uniforms(&f, 99, 0);
    assert_eq!(g2.state(), (99, 6));
    // f32 normals: two pairs per counter.
    let z = Tensor::randn([22], DType::F32, &mut g2, dev)?.to_vec::<f32>()?;
    check_f32_normals(&z, 99, 6);
    // The same where launches take four elements a work item (a multiple of four): the
    // lanes share one Philox call per counter (CUDA and wgpu make it before the lanes).
    let mut g4 = Generator::new(41);
    let f = Tensor::rand([6, 4], DType::F32, &mut g4, dev)?.to_vec::<f32>()?;
    check_f32_uniforms(&f, 41, 0);
    assert_eq!(g4.state(), (41, 6));
    let z = Tensor::randn([24], DType::F32, &mut g4, dev)?.to_vec::<f32>()?;
    check_f32_normals(&z, 41, 6);
    // An element's value does not depend on the draw's length: the first elements of a
    // longer draw (a backend's vector path) equal a short draw's (its per-element path) bit
    // for bit, on every backend (CUDA's vector lanes share a pair's sine and cosine).
    for dt in [DType::F32, DType::F64, DType::F16] {
        let short = Tensor::randn([7], dt, &mut Generator::new(8), dev)?;
        let long = Tensor::randn([4096], dt, &mut Generator::new(8), dev)?;
        let short = short.to_dtype(DType::F64)?.to_vec::<f64>()?;
        let long = long.to_dtype(DType::F64)?.to_vec::<f64>()?;
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&short),
            bits(&long[..7]),
            "{dt} randn of 7 and of 4096"
        );
    }
    // A draw longer than one pass of CUDA's looping grid (64 blocks of 256 threads per
    // multiprocessor, four elements a thread: 8.65 million on 132 multiprocessors), so its
    // threads loop; sampled, with the tail. (Other backends: the short draws above.)
    if dev.kind() == strata::BackendKind::Cuda {
        let n = 3 * (1 << 22) + 5;
        let z = Tensor::randn([n], DType::F32, &mut Generator::new(77), dev)?.to_vec::<f32>()?;
        for i in (0..n).step_by(4099).chain(n - 9..n) {
            check_f32_normal(i, z[i], 77, 0);
        }
    }
    // Integers over a 32-bit range: one word each, four per counter (a vector of two i64
    // lanes on CUDA covers half a counter).
    let mut g3 = Generator::new(5);
    let r = Tensor::randint(-7, 1000, [23], DType::I64, &mut g3, dev)?.to_vec::<i64>()?;
    for (i, &v) in r.iter().enumerate() {
        let w = words(5, 0, i as u64 / 4)[i % 4];
        assert_eq!(v, -7 + (w as u64 % 1007) as i64, "randint element {i}");
    }
    assert_eq!(g3.state(), (5, 6));
    // The same in a multiple of four (wgpu: four i64 lanes a work item, one Philox call), and
    // over a 64-bit range: two words an element (the first the high half), two a counter.
    let r = Tensor::randint(-7, 1000, [64], DType::I64, &mut Generator::new(5), dev)?;
    for (i, &v) in r.to_vec::<i64>()?.iter().enumerate() {
        let w = words(5, 0, i as u64 / 4)[i % 4];
        assert_eq!(
            v,
            -7 + (w as u64 % 1007) as i64,
            "randint of 64, element {i}"
        );
    }
    // Ranges near 2^32, powers of two, odd ones, and a range of one, each against the word
    // modulo the range, in i32 and u8 too.
    for (low, span, dtype) in [
        (-2_000_000_000i64, u32::MAX as u64, DType::I64),
        (0, 3_000_000_019, DType::I64),
        (5, 1 << 31, DType::I64),
        (-9, 1 << 4, DType::I32),
        (0, 1, DType::I32),
        (1, 255, DType::U8),
        (-100, 7, DType::I64),
    ] {
        let r = Tensor::randint(
            low,
            low + span as i64,
            [37],
            dtype,
            &mut Generator::new(8),
            dev,
        )?
        .to_dtype(DType::I64)?;
        for (i, &v) in r.to_vec::<i64>()?.iter().enumerate() {
            let w = words(8, 0, i as u64 / 4)[i % 4];
            assert_eq!(
                v,
                low + (w as u64 % span) as i64,
                "randint({low}, {low} + {span}) as {dtype}, element {i}"
            );
        }
    }
    let span = 1u64 << 40;
    let r = Tensor::randint(
        3,
        3 + span as i64,
        [16],
        DType::I64,
        &mut Generator::new(6),
        dev,
    )?;
    for (i, &v) in r.to_vec::<i64>()?.iter().enumerate() {
        let w = words(6, 0, i as u64 / 2);
        let k = 2 * (i % 2);
        let word = ((w[k] as u64) << 32) | w[k + 1] as u64;
        assert_eq!(
            v,
            3 + (word % span) as i64,
            "randint over 2^40, element {i}"
        );
    }
    // 16-bit floats: as many random bits as they hold, so never 1.0.
    for dt in [DType::F16, DType::BF16] {
        let h = Tensor::rand([4096], dt, &mut g2, dev)?.to_dtype(DType::F64)?;
        let top = h.max(Axes::All, false)?.item::<f64>()?;
        assert!((0.9..1.0).contains(&top), "{dt} rand max {top}");
    }
    // Distribution checks (fixed seeds, so deterministic).
    let mut g = Generator::new(7);
    let big = Tensor::randn([40000], DType::F32, &mut g, dev)?;
    assert!(big.mean(Axes::All, false)?.item::<f32>()?.abs() < 0.02);
    assert!((big.std(Axes::All, 1, false)?.item::<f32>()? - 1.0).abs() < 0.02);
    let r = Tensor::randint(0, 10, [20000], DType::I64, &mut g, dev)?;
    let counts = r.one_hot(Some(10))?.sum(0, false)?.to_vec::<i64>()?;
    assert!(
        counts.iter().all(|&c| (1800..2200).contains(&c)),
        "{counts:?}"
    );
    let b = Tensor::bernoulli([20000], 0.1, DType::Bool, &mut g, dev)?;
    let hits = b.sum(Axes::All, false)?.item::<i64>()?;
    assert!((1800..2200).contains(&hits), "{hits}");
    // Errors.
    assert!(Tensor::rand([2], DType::I32, &mut g, dev)
        .unwrap_err()
        .to_string()
        .contains("randint"));
    assert!(Tensor::randint(5, 5, [2], DType::I32, &mut g, dev).is_err());
    assert!(Tensor::bernoulli([2], 1.5, DType::F32, &mut g, dev).is_err());
    assert!(Tensor::dropout_mask([2], 1.0, DType::F32, &mut g, dev).is_err());
    Ok(())
}
test_device!(random_numbers_follow_philox, random);
