//! matmul, dot and gemm × dtypes × layouts against a plain triple loop (f64 / wrapping i128).
//! Tolerance: relative 1e-5 for f32, 1e-12 for f64, 1e-2 for 16-bit floats; integers exact.

use strata::prelude::*;
use strata::RecordKind;
use strata_tests::{indices, test_device};

fn make(dtype: DType, shape: &[usize], seed: usize, dev: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|i| (((i + seed) * 7919) % 13) as f64 - 6.0)
        .collect();
    let t = Tensor::empty(shape, dtype, dev)?;
    let flat = t.reshape([-1])?;
    for (i, v) in vals.into_iter().enumerate() {
        flat.set(
            s![i],
            Scalar::F64(if dtype.is_float() { v / 2.0 } else { v }),
        )?;
    }
    Ok(t)
}

fn host(t: &Tensor) -> Result<Vec<Scalar>> {
    let flat = t.reshape([-1])?;
    (0..flat.numel())
        .map(|i| flat.slice(s![i])?.item_scalar())
        .collect()
}

/// Reference batched product with broadcast batch axes, for operands of rank ≥ 2.
fn reference(a: &Tensor, b: &Tensor, dtype: DType) -> Result<(Vec<usize>, Vec<Scalar>)> {
    let (ha, hb) = (host(a)?, host(b)?);
    let (ra, rb) = (a.ndim(), b.ndim());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let nb = (ra - 2).max(rb - 2);
    let pad = |s: &[usize]| [vec![1; nb - (s.len() - 2)], s[..s.len() - 2].to_vec()].concat();
    let (ba, bb) = (pad(a.shape()), pad(b.shape()));
    let batch: Vec<usize> = ba.iter().zip(&bb).map(|(&x, &y)| x.max(y)).collect();
    let at = |h: &[Scalar],
              bshape: &[usize],
              bi: &[usize],
              rows: usize,
              cols: usize,
              r: usize,
              c: usize| {
        let flat_b = bi
            .iter()
            .zip(bshape)
            .fold(0, |acc, (&i, &d)| acc * d + if d == 1 { 0 } else { i });
        h[flat_b * rows * cols + r * cols + c]
    };
    let mut out = vec![];
    for bi in indices(&batch) {
        for i in 0..m {
            for j in 0..n {
                let pairs =
                    (0..k).map(|p| (at(&ha, &ba, &bi, m, k, i, p), at(&hb, &bb, &bi, k, n, p, j)));
                out.push(if dtype.is_float() {
                    Scalar::F64(pairs.map(|(x, y)| x.to_f64() * y.to_f64()).sum())
                        .cast(dtype, false)
                } else {
                    let s = pairs.fold(0i128, |acc, (x, y)| {
                        acc.wrapping_add(x.to_i128().wrapping_mul(y.to_i128()))
                    });
                    Scalar::I64(s as i64).cast(dtype, false)
                });
            }
        }
    }
    Ok(([batch, vec![m, n]].concat(), out))
}

fn close(g: Scalar, w: Scalar) -> bool {
    if !g.dtype().is_float() {
        return g == w;
    }
    let tol = match g.dtype() {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    };
    (g.to_f64() - w.to_f64()).abs() <= tol * w.to_f64().abs().max(1.0)
}

fn products(dev: &Device) -> Result<()> {
    for dtype in strata_tests::dtypes()
        .into_iter()
        .filter(|&d| d != DType::Bool)
    {
        let m = |shape: &[usize], seed| make(dtype, shape, seed, dev);
        let cases: Vec<(&str, Tensor, Tensor)> = vec![
            ("2-D", m(&[2, 3], 1)?, m(&[3, 4], 2)?),
            ("transposed", m(&[3, 2], 3)?.t()?, m(&[4, 3], 4)?.t()?),
            (
                "negative-stride",
                m(&[2, 3], 5)?.slice(s![..;-1, ..;-1])?,
                m(&[3, 4], 6)?.slice(s![.., ..;-1])?,
            ),
            (
                "offset",
                m(&[3, 4], 7)?.slice(s![1.., 1..])?,
                m(&[4, 5], 8)?.slice(s![1.., ..2])?,
            ),
            (
                "batched broadcast",
                m(&[2, 1, 2, 3], 9)?,
                m(&[3, 3, 2], 10)?,
            ),
            (
                "stride-0 batch",
                m(&[2, 3], 11)?.expand([4, 2, 3])?,
                m(&[4, 3, 2], 12)?,
            ),
            ("zero-size k", m(&[2, 0], 13)?, m(&[0, 3], 14)?),
            ("zero-size m", m(&[0, 3], 15)?, m(&[3, 2], 16)?),
        ];
        for (name, a, b) in cases {
            let ctx = format!("matmul {name} on {dtype}");
            let got = a
                .matmul(&b)
                .map_err(|e| Error::Invalid(format!("{ctx}: {e}")))?;
            let (shape, want) = reference(&a, &b, dtype)?;
            assert_eq!(got.shape(), &shape[..], "{ctx}");
            for (i, (g, w)) in host(&got)?.into_iter().zip(want).enumerate() {
                assert!(close(g, w), "{ctx} element {i}: got {g:?}, want {w:?}");
            }
        }
        // 1-D operands.
        let v = m(&[3], 17)?;
        let mat = m(&[3, 2], 18)?;
        let dot = v.dot(&v)?;
        assert_eq!(dot.shape(), &[] as &[usize]);
        let (_, want) = reference(&v.unsqueeze(0)?, &v.unsqueeze(1)?, dtype)?;
        assert!(close(dot.item_scalar()?, want[0]), "dot on {dtype}");
        assert_eq!(v.matmul(&mat)?.shape(), &[2]);
        assert_eq!(mat.t()?.matmul(&v)?.shape(), &[2]);
        assert_eq!(m(&[4, 2, 3], 19)?.matmul(&v)?.shape(), &[4, 2]);
        assert_eq!(v.matmul(&m(&[5, 3, 2], 20)?)?.shape(), &[5, 2]);
    }
    Ok(())
}
test_device!(matmul_every_dtype_and_layout, products);

fn gemm_and_errors(dev: &Device) -> Result<()> {
    let a = make(DType::F64, &[3, 2], 1, dev)?;
    let b = make(DType::F64, &[4, 3], 2, dev)?;
    let c = make(DType::F64, &[2, 4], 3, dev)?;
    let old = host(&c)?;
    Tensor::gemm(0.5, &a, &b, -2.0, &c, true, true)?;
    let (_, ab) = reference(&a.t()?, &b.t()?, DType::F64)?;
    for (i, g) in host(&c)?.into_iter().enumerate() {
        let w = 0.5 * ab[i].to_f64() - 2.0 * old[i].to_f64();
        assert!((g.to_f64() - w).abs() < 1e-12, "gemm element {i}");
    }
    // β = 0 ignores NaN in C; gemm writes through a view of C.
    let big = Tensor::full([2, 6], f64::NAN, DType::F64, dev)?;
    let view = big.slice(s![.., 1..5])?;
    Tensor::gemm(1.0, &a, &b, 0.0, &view, true, true)?;
    assert!(host(&view)?.iter().all(|v| v.to_f64().is_finite()));
    assert!(big
        .slice(s![.., 0])?
        .isnan()?
        .all(0, false)?
        .item::<bool>()?);
    // C is also an operand: the product reads the old values (the CPU's product runs on the
    // operands' memory unless C shares it; wgpu's tiles would overwrite rows others still
    // read). Larger than one tile; a binding cap too small for it (CI's 128-byte run) refuses.
    let sq = make(DType::F32, &[136, 136], 4, dev)?;
    let (before, other) = (host(&sq)?, make(DType::F32, &[136, 136], 5, dev)?);
    let (_, p) = reference(&sq, &other, DType::F32)?;
    let capped =
        std::env::var("STRATA_WGPU_MAX_BINDING").is_ok() && dev.kind() == strata::BackendKind::Wgpu;
    let ran = match Tensor::gemm(1.0, &sq, &other, 1.0, &sq, false, false) {
        Err(Error::Unsupported(_)) if capped => false,
        r => r.map(|()| true)?,
    };
    let got = if ran { host(&sq)? } else { Vec::new() };
    for (i, g) in got.into_iter().enumerate() {
        let w = p[i].to_f64() + before[i].to_f64();
        assert!(
            (g.to_f64() - w).abs() < 1e-4 * w.abs().max(1.0),
            "gemm into a, element {i}"
        );
    }
    // Half gemm (widened to f32 on wgpu): α, β, and a write through a view whose other
    // elements stay NaN. Small integers keep every result exact in f16 and bf16.
    for dtype in [DType::F16, DType::BF16] {
        let ints = |shape: [usize; 2], k: usize| {
            let n = shape[0] * shape[1];
            let v: Vec<f64> = (0..n).map(|i| ((i * k) % 7) as f64 - 3.0).collect();
            Tensor::from_slice(&v, shape, dev)?.to_dtype(dtype)
        };
        let (a, b) = (ints([2, 3], 3)?, ints([3, 4], 5)?);
        let (_, ab) = reference(&a, &b, dtype)?;
        let big = Tensor::full([2, 6], f64::NAN, dtype, dev)?;
        let view = big.slice(s![.., 1..5])?;
        Tensor::gemm(1.0, &a, &b, 0.0, &view, false, false)?;
        view.assign(&ints([2, 4], 2)?.sub(&view)?)?;
        let before = host(&view)?;
        Tensor::gemm(0.5, &a, &b, -2.0, &view, false, false)?;
        for (i, g) in host(&view)?.into_iter().enumerate() {
            let w = 0.5 * ab[i].to_f64() - 2.0 * before[i].to_f64();
            assert_eq!(g.to_f64(), w, "{dtype} gemm element {i}");
        }
        assert!(big
            .slice(s![.., 5])?
            .isnan()?
            .all(0, false)?
            .item::<bool>()?);
    }
    // Integer gemm wraps.
    let i8s = Tensor::full([2, 2], 100, DType::I8, dev)?;
    let ci = Tensor::zeros([2, 2], DType::I8, dev)?;
    Tensor::gemm(1.0, &i8s, &i8s, 0.0, &ci, false, false)?;
    assert_eq!(ci.to_vec::<i8>()?, vec![20000i32 as i8; 4]);
    // Errors name the shapes.
    let e = a.matmul(&a).unwrap_err().to_string();
    assert!(
        e.contains("[3, 2]") && e.contains("inner dimensions 2 and 3"),
        "{e}"
    );
    let e = Tensor::gemm(1.0, &a, &b, 0.0, &c, false, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("inner dimensions"), "{e}");
    let e = Tensor::zeros([2], DType::Bool, dev)?
        .dot(&Tensor::zeros([2], DType::Bool, dev)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bool"), "{e}");
    let e = make(DType::F32, &[2, 2, 3], 1, dev)?
        .matmul(&make(DType::F32, &[3, 3, 2], 2, dev)?)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch"), "{e}");
    // Mixed dtypes promote.
    let mixed = make(DType::I32, &[2, 3], 1, dev)?.matmul(&make(DType::F16, &[3, 2], 2, dev)?)?;
    assert_eq!(mixed.dtype(), DType::F16);
    Ok(())
}
test_device!(gemm_in_place_and_matmul_errors, gemm_and_errors);

/// Products larger than one 128×128 output tile, with edges that are not multiples of the tile
/// or of the staged depth, so every accumulator position of the GPU kernels' tiles is used; B
/// row-major and transposed. Small integers keep every dtype's result exact.
fn multi_tile(dev: &Device) -> Result<()> {
    let (m, k, n) = (150usize, 37usize, 140usize);
    let av: Vec<i64> = (0..m * k).map(|i| (i * 7 % 11) as i64 - 5).collect();
    let bv: Vec<i64> = (0..k * n).map(|i| (i * 5 % 9) as i64 - 4).collect();
    let mut want = vec![0i64; m * n];
    for r in 0..m {
        for c in 0..n {
            want[r * n + c] = (0..k).map(|j| av[r * k + j] * bv[j * n + c]).sum();
        }
    }
    let a64 = Tensor::from_slice(&av, [m, k], dev)?;
    let b64 = Tensor::from_slice(&bv, [k, n], dev)?;
    let bt64 = b64.t()?.contiguous()?.t()?;
    for dtype in [DType::F32, DType::I32, DType::F16, DType::F64, DType::I64] {
        let a = a64.to_dtype(dtype)?;
        for (layout, b) in [("row-major", &b64), ("transposed", &bt64)] {
            let got = match a.matmul(&b.to_dtype(dtype)?) {
                // The windowing pass shrinks wgpu's storage binding below one right-hand
                // matrix, which wgpu's matmul documents as unsupported.
                Err(Error::Unsupported(m))
                    if std::env::var_os("STRATA_WGPU_MAX_BINDING").is_some()
                        && m.contains("storage binding") =>
                {
                    continue
                }
                other => other?,
            };
            let got = got.to_dtype(DType::I64)?.to_vec::<i64>()?;
            assert_eq!(got, want, "{dtype}, B {layout}");
        }
    }
    Ok(())
}
test_device!(products_across_several_tiles, multi_tile);

/// f32 products of small integers (exact) over several tiles with ragged edges and a batch,
/// in the layouts wgpu's tiled kernel stages by 16-byte loads (each operand along its depth or
/// along its rows or columns: unit strides, runs of 4 aligned) and beside them the ones it
/// stages one element a load: contiguous, from a window offset, a depth that is not a multiple
/// of 4, a column offset of 1 (runs unaligned), A and B transposed, and a broadcast batch.
fn f32_staging_layouts(dev: &Device) -> Result<()> {
    let ints = |count: usize, seed: usize, shape: &[usize]| {
        let v: Vec<f32> = (0..count)
            .map(|i| ((i * 37 + seed) % 11) as f32 - 5.0)
            .collect();
        Tensor::from_slice(&v, shape, dev)
    };
    let (batch, m, n) = (2usize, 148usize, 140usize);
    let cases = |k: usize| -> Result<Vec<(&'static str, Tensor, Tensor)>> {
        Ok(vec![
            (
                "contiguous",
                ints(batch * m * k, 1, &[batch, m, k])?,
                ints(batch * k * n, 2, &[batch, k, n])?,
            ),
            (
                "window offset",
                ints(batch * (m + 4) * k, 3, &[batch, m + 4, k])?.slice(s![.., 4.., ..])?,
                ints(batch * (k + 4) * n, 4, &[batch, k + 4, n])?.slice(s![.., 4.., ..])?,
            ),
            (
                "column offset 1",
                ints(batch * m * (k + 1), 5, &[batch, m, k + 1])?.slice(s![.., .., 1..])?,
                ints(batch * k * (n + 1), 6, &[batch, k, n + 1])?.slice(s![.., .., 1..])?,
            ),
            (
                "B transposed, broadcast batch",
                ints(m * k, 7, &[1, m, k])?.expand([batch, m, k])?,
                ints(batch * n * k, 8, &[batch, n, k])?.transpose(1, 2)?,
            ),
            (
                "A transposed",
                ints(batch * k * m, 9, &[batch, k, m])?.transpose(1, 2)?,
                ints(batch * k * n, 10, &[batch, k, n])?,
            ),
            (
                "A transposed with a row offset of 1, B transposed",
                ints(batch * k * (m + 1), 11, &[batch, k, m + 1])?
                    .slice(s![.., .., 1..])?
                    .transpose(1, 2)?,
                ints(batch * n * k, 12, &[batch, n, k])?.transpose(1, 2)?,
            ),
        ])
    };
    let capped = std::env::var_os("STRATA_WGPU_MAX_BINDING").is_some();
    for k in [52usize, 37, 64] {
        for (layout, a, b) in cases(k)? {
            let want = dense_product(&a, &b, batch)?;
            let got = match a.matmul(&b) {
                // CI's binding cap is smaller than one right-hand matrix, which wgpu's matmul
                // documents as unsupported.
                Err(Error::Unsupported(m)) if capped && m.contains("storage binding") => continue,
                other => other?,
            };
            assert_eq!(got.shape(), &[batch, m, n]);
            let got = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
            assert!(
                got == want,
                "{layout}, k {k}: first difference at {:?}",
                got.iter().zip(&want).position(|(g, w)| g != w)
            );
        }
    }
    Ok(())
}
test_device!(f32_products_in_every_staging_layout, f32_staging_layouts);

/// TF32 products whose operands both lie along `m` and `n` (`xᵀ·dy`, a weight's gradient) copy
/// the smaller one contiguous along `k` first where the device's target asks for it (CUDA on
/// Hopper, from 2^32 multiply-adds): two kernels, the copy and the product, and the same bits
/// as the product of that operand copied by hand; a smaller product, one already along `k`, or
/// TF32 off runs the product alone. Elsewhere every product runs alone.
fn k_major_tf32(dev: &Device) -> Result<()> {
    let tf32 = dev.allow_tf32();
    dev.set_allow_tf32(true);
    let result = k_major_tf32_products(dev);
    dev.set_allow_tf32(tf32);
    result
}

fn k_major_tf32_products(dev: &Device) -> Result<()> {
    let from = dev.backend().target().k_major_tf32_from;
    let mut g = Generator::new(3);
    let kernels = |f: &dyn Fn() -> Result<Tensor>| -> Result<(Tensor, Vec<String>)> {
        let mut out = None;
        let p = dev.profile(|| {
            let t = f()?;
            t.realize()?;
            out = Some(t);
            Ok(())
        })?;
        let names = p
            .device_work()
            .filter(|r| r.kind == RecordKind::Kernel)
            .map(|r| r.name.clone())
            .collect();
        Ok((out.expect("the product ran"), names))
    };
    let Some(from) = from else {
        // Small enough for CI's 128-byte binding cap on wgpu.
        let x = Tensor::randn([4, 2], DType::F32, &mut g, dev)?;
        let dy = Tensor::randn([4, 3], DType::F32, &mut g, dev)?;
        x.realize()?;
        dy.realize()?;
        let (_, names) = kernels(&|| x.t()?.matmul(&dy))?;
        assert_eq!(names.len(), 1, "{names:?} on {}", dev.name());
        return Ok(());
    };
    // m·n·k = `from` with k = 8192 and the smaller side 512.
    let (k, small) = (8192usize, 512usize);
    let large = (from as usize / (k * small)).max(small + 1);
    for (m, n) in [(small, large), (large, small)] {
        let x = Tensor::randn([k, m], DType::F32, &mut g, dev)?;
        let dy = Tensor::randn([k, n], DType::F32, &mut g, dev)?;
        x.realize()?;
        dy.realize()?;
        let (got, names) = kernels(&|| x.t()?.matmul(&dy))?;
        assert_eq!(names.len(), 2, "m {m}, n {n}: {names:?}");
        let by_hand = if m <= n {
            x.t()?.contiguous()?.matmul(&dy)?
        } else {
            x.t()?.matmul(&dy.t()?.contiguous()?.t()?)?
        };
        let (got, want) = (got.to_vec::<f32>()?, by_hand.to_vec::<f32>()?);
        assert!(
            got == want,
            "m {m}, n {n}: not the hand-copied product's bits"
        );
        // Against the f32 product (TF32 off, run as it is): within TF32's rounding.
        dev.set_allow_tf32(false);
        let (exact, names) = kernels(&|| x.t()?.matmul(&dy))?;
        dev.set_allow_tf32(true);
        assert_eq!(names.len(), 1, "TF32 off: {names:?}");
        for (i, (g, e)) in got.iter().zip(exact.to_vec::<f32>()?).enumerate() {
            // Each of the k terms is off by up to 2^-10 of its size (|x·dy| ~ 1 each).
            assert!(
                (g - e).abs() <= 0.5,
                "m {m}, n {n}, element {i}: {g} against {e}"
            );
        }
    }
    // Already along k (x contiguous as xᵀ's rows), or a smaller product: the product alone.
    let xt = Tensor::randn([small, k], DType::F32, &mut g, dev)?;
    let dy = Tensor::randn([k, large], DType::F32, &mut g, dev)?;
    assert_eq!(kernels(&|| xt.matmul(&dy))?.1.len(), 1);
    let x = Tensor::randn([k / 4, small], DType::F32, &mut g, dev)?;
    let dy = Tensor::randn([k / 4, large], DType::F32, &mut g, dev)?;
    assert_eq!(kernels(&|| x.t()?.matmul(&dy))?.1.len(), 1);
    Ok(())
}
test_device!(tf32_products_read_one_operand_along_k, k_major_tf32);

/// f16 products of fractional values over a long depth, against an f64 reference rounded to
/// f16: the sums must be accumulated in f32 (an f16 accumulator is off by several units in the
/// last place at this depth). Several tiles with ragged edges and a batch: A transposed and B
/// with every other column, then both contiguous with depth and columns multiples of 8 (wgpu's
/// cooperative kernel stages those by 16-byte loads). Where the device reports cooperative
/// matrices for f16 matmuls (wgpu on NVIDIA's Vulkan driver), the profiler shows that kernel ran.
fn f16_products(dev: &Device) -> Result<()> {
    let vals = |count: usize, seed: usize| -> Vec<f64> {
        (0..count)
            .map(|i| ((i * 37 + seed) % 101) as f64 / 64.0 - 0.78)
            .collect()
    };
    let half = |count: usize, seed: usize, shape: [usize; 3]| {
        Tensor::from_slice(&vals(count, seed), shape, dev)?.to_dtype(DType::F16)
    };
    let (batch, m) = (2usize, 150usize);
    let (k, n) = (300usize, 140usize);
    let strided = (
        half(batch * k * m, 1, [batch, k, m])?.transpose(1, 2)?,
        half(batch * k * 2 * n, 2, [batch, k, 2 * n])?.slice(s![.., .., ..;2])?,
    );
    let (k, n) = (304usize, 136usize);
    let contiguous = (
        half(batch * m * k, 3, [batch, m, k])?,
        half(batch * k * n, 4, [batch, k, n])?,
    );
    // The 16-byte path from a window offset, and with a negative row stride against a
    // broadcast batch; a depth that is not a multiple of 8 falls back to one half a load.
    let offset = (
        half(batch * (m + 8) * k, 5, [batch, m + 8, k])?.slice(s![.., 8.., ..])?,
        contiguous.1.clone(),
    );
    let reversed = (
        half(m * k, 6, [1, m, k])?
            .reshape([m, k])?
            .slice(s![..;-1, ..])?,
        contiguous.1.clone(),
    );
    let ragged = (
        half(batch * m * 300, 7, [batch, m, 300])?,
        half(batch * 300 * n, 8, [batch, 300, n])?,
    );
    let capped = std::env::var_os("STRATA_WGPU_MAX_BINDING").is_some();
    let coop = dev
        .backend()
        .properties()
        .iter()
        .any(|(name, value)| *name == "f16 matmul" && value.starts_with("cooperative"));
    for (layout, (a, b)) in [
        ("strided", strided),
        ("contiguous", contiguous.clone()),
        ("offset", offset),
        ("negative rows, broadcast batch", reversed),
        ("depth 300", ragged),
    ] {
        let want = dense_product(&a, &b, batch)?;
        // The operands' own pending casts run before the profile: it shows the product alone.
        a.realize()?;
        b.realize()?;
        let mut got = None;
        let p = match dev.profile(|| {
            let t = a.matmul(&b)?;
            t.realize()?;
            got = Some(t);
            Ok(())
        }) {
            // CI's binding cap is smaller than one right-hand matrix, which wgpu's matmul
            // documents as unsupported.
            Err(Error::Unsupported(m)) if capped && m.contains("storage binding") => return Ok(()),
            other => other?,
        };
        let got = got.expect("the product ran");
        assert_eq!(got.shape(), &[batch, a.shape()[a.ndim() - 2], b.shape()[2]]);
        let got = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
        for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
            let w16 = Scalar::F64(w).cast(DType::F16, false).to_f64();
            assert!(
                (g - w16).abs() <= 2e-3 * w.abs().max(1.0),
                "{layout} f16 product element {i}: got {g}, want {w16} ({w})"
            );
        }
        if coop {
            let names: Vec<&str> = p
                .records
                .iter()
                .filter(|r| r.kind == RecordKind::Kernel)
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(names, ["strata_matmul_coop"], "{layout} on {}", dev.name());
        }
    }
    // gemm with β ≠ 0 reads the old C (the cooperative kernel's epilogue).
    let (a, b) = (contiguous.0.slice(s![0])?, contiguous.1.slice(s![0])?);
    let c = half(m * n, 9, [1, m, n])?.reshape([m, n])?;
    let before = c.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let ab = dense_product(&a.unsqueeze(0)?, &b.unsqueeze(0)?, 1)?;
    Tensor::gemm(0.5, &a, &b, -2.0, &c, false, false)?;
    let got = c.to_dtype(DType::F64)?.to_vec::<f64>()?;
    for (i, g) in got.into_iter().enumerate() {
        let w = 0.5 * ab[i] - 2.0 * before[i];
        let w16 = Scalar::F64(w).cast(DType::F16, false).to_f64();
        assert!(
            (g - w16).abs() <= 2e-3 * w.abs().max(1.0),
            "f16 gemm element {i}: got {g}, want {w16} ({w})"
        );
    }
    Ok(())
}
test_device!(f16_products_accumulate_in_f32, f16_products);

/// The product of `a` ([m, k] or [batch, m, k]) and `b` ([batch, k, n]) in f64 on the host,
/// row-major [batch, m, n] (read whole: a read an element is slow on a GPU).
fn dense_product(a: &Tensor, b: &Tensor, batch: usize) -> Result<Vec<f64>> {
    let (m, k, n) = (a.shape()[a.ndim() - 2], b.shape()[1], b.shape()[2]);
    let av = a
        .expand([batch, m, k])?
        .to_dtype(DType::F64)?
        .to_vec::<f64>()?;
    let bv = b.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let mut out = vec![0.0; batch * m * n];
    for z in 0..batch {
        for i in 0..m {
            for p in 0..k {
                let x = av[(z * m + i) * k + p];
                for j in 0..n {
                    out[(z * m + i) * n + j] += x * bv[(z * k + p) * n + j];
                }
            }
        }
    }
    Ok(out)
}

/// A pending operand runs before the product's result is allocated, so what its tree holds is
/// freed first: the peak holds the operand and the result, not also the tree's inputs (a
/// backward pass's activations and incoming gradient, 128 MiB at the MLP benchmark's peak).
#[test]
fn pending_operands_run_before_the_result_is_allocated() -> Result<()> {
    let dev = Device::cpu();
    let n = 256;
    let unit = (n * n * 4) as f64;
    let w = Tensor::ones([n, n], DType::F32, &dev)?;
    let source = Tensor::ones([n, n], DType::F32, &dev)?;
    let operand = source.mul(2.0)?; // pending: its tree holds `source`
    drop(source);
    if !operand.is_pending() {
        eprintln!("fusion is off (STRATA_FUSION=0): no pending operand to order, not tested");
        return Ok(());
    }
    let before = dev.memory_stats();
    let product = operand.matmul(&w)?;
    let peak = (dev.memory_stats().peak - before.allocated) as f64 / unit;
    // The source is counted at the start; then the operand is written and the source freed,
    // then the result allocated: one matrix more at most.
    assert!(
        peak <= 1.01,
        "{peak:.2} matrices above the start at the product's peak: the source, the operand \
         and the result were alive at once"
    );
    assert_eq!(product.to_vec::<f32>()?[0], 2.0 * n as f32);
    Ok(())
}
