//! On CUDA a map kernel's first launches (f32, f16 and bf16 operands) run through an
//! interpreter and the later ones (and those under the profiler) through the compiled kernel
//! (cuda-backend's `first_launch.rs`), and other kernels run a quickly compiled form until
//! their own one is compiled in the background, and a fused reduction runs as its eager
//! launches until its kernel is compiled: all must give the same bits. The file holds
//! one test, which points the kernel cache at a fresh directory before any device opens, so
//! that no kernel is found compiled on disk.

use strata::prelude::*;

type Case = (&'static str, fn(&Tensor, &Tensor) -> Result<Tensor>);

/// Every op the interpreter runs, alone and in chains, in f32.
const CASES: &[Case] = &[
    ("neg", |x, _| x.neg()),
    ("neg_sat", |x, _| x.neg_sat()),
    ("abs", |x, _| x.abs()),
    ("sign", |x, _| x.sign()),
    ("square", |x, _| x.square()),
    ("sqrt", |x, _| x.sqrt()),
    ("rsqrt", |x, _| x.rsqrt()),
    ("reciprocal", |x, _| x.reciprocal()),
    ("exp", |x, _| x.exp()),
    ("exp2", |x, _| x.exp2()),
    ("expm1", |x, _| x.expm1()),
    ("log", |x, _| x.log()),
    ("log2", |x, _| x.log2()),
    ("log10", |x, _| x.log10()),
    ("log1p", |x, _| x.log1p()),
    ("sin", |x, _| x.sin()),
    ("cos", |x, _| x.cos()),
    ("tan", |x, _| x.tan()),
    ("tanh", |x, _| x.tanh()),
    ("sigmoid", |x, _| x.sigmoid()),
    ("relu", |x, _| x.relu()),
    ("gelu", |x, _| x.gelu()),
    ("erf", |x, _| x.erf()),
    ("floor", |x, _| x.floor()),
    ("ceil", |x, _| x.ceil()),
    ("round", |x, _| x.round()),
    ("trunc", |x, _| x.trunc()),
    ("add", |x, y| x + y),
    ("sub", |x, y| x - y),
    ("mul", |x, y| x * y),
    ("div", |x, y| x / y),
    ("pow", |x, y| x.pow(y)),
    ("maximum", |x, y| x.maximum(y)),
    ("minimum", |x, y| x.minimum(y)),
    ("add a scalar", |x, _| x + 0.75),
    ("fma", |x, y| x.fma(y, x)),
    ("where x < y", |x, y| Tensor::where_cond(&x.lt(y)?, x, y)),
    ("where isnan", |x, y| Tensor::where_cond(&x.isnan()?, y, x)),
    ("where isinf, isfinite", |x, y| {
        Tensor::where_cond(&x.isinf()?, y, &Tensor::where_cond(&y.isfinite()?, x, 2.0)?)
    }),
    ("comparisons", |x, y| {
        let eq = Tensor::where_cond(&x.eq(y)?, 1.0, 0.0)?;
        let ge = Tensor::where_cond(&x.ge(y)?, 2.0, 0.0)?;
        let ne = Tensor::where_cond(&x.ne(y)?, 4.0, 0.0)?;
        let le = Tensor::where_cond(&x.le(y)?, 8.0, 0.0)?;
        let gt = Tensor::where_cond(&x.gt(y)?, 16.0, 0.0)?;
        (((&eq + &ge)? + &ne)? + &le)? + &gt
    }),
    ("sqrt(exp(x*x + x) - x) * 0.5", |x, _| {
        (x * x)?.add(x)?.exp()?.sub(x)?.sqrt()?.mul(0.5)
    }),
    ("relu(x*y + x)", |x, y| (x * y)?.add(x)?.relu()),
    ("tanh-GELU from primitives", |x, _| {
        let inner = (x + &(x.pow(3.0)? * 0.044715)?)?.mul(0.7978845608)?;
        (x * 0.5)?.mul(&(inner.tanh()? + 1.0)?)
    }),
];

fn values(n: usize) -> Vec<f32> {
    let edges = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.5,
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        88.7,
        -104.0,
        1e30,
        3.0e-8,
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            if i < edges.len() {
                return edges[i];
            }
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Mostly moderate magnitudes, some large and small ones.
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let scale = [1.0, 4.0, 100.0, 1e-3][(state & 3) as usize];
            unit * scale
        })
        .collect()
}

fn check(dev: &Device) -> Result<()> {
    // 4,099 elements: the compiled kernels' vector loop and their scalar tail.
    let n = 4099;
    let x = Tensor::from_slice(&values(n), [n], dev)?;
    let y_values: Vec<f32> = values(n + 7).into_iter().skip(7).collect();
    let y = Tensor::from_slice(&y_values, [n], dev)?;
    for (name, f) in CASES {
        let first = f(&x, &y)?.to_vec::<f32>()?;
        let second = f(&x, &y)?.to_vec::<f32>()?;
        // Under the profiler the kernel is compiled (or taken from the background) first.
        let mut third = Vec::new();
        dev.profile(|| {
            third = f(&x, &y)?.to_vec::<f32>()?;
            Ok(())
        })?;
        for (i, ((a, b), c)) in first.iter().zip(&second).zip(&third).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() && b.to_bits() == c.to_bits(),
                "{name} on {}: element {i} (x = {:e}, y = {:e}): launches gave {a:e}, {b:e}, {c:e}",
                dev.name(),
                values(n)[i],
                y_values[i]
            );
        }
    }
    Ok(())
}

/// The same ops over f16 and bf16 operands, which the interpreter computes as the compiled
/// kernel does (in f32, each result rounded to its dtype), and casts between the floats.
fn check_half(dev: &Device) -> Result<()> {
    let n = 4099;
    let x = Tensor::from_slice(&values(n), [n], dev)?;
    let y_values: Vec<f32> = values(n + 7).into_iter().skip(7).collect();
    let y = Tensor::from_slice(&y_values, [n], dev)?;
    let casts: [Case; 3] = [
        ("to f32, exp, back", |x, _| {
            x.to_dtype(DType::F32)?.exp()?.to_dtype(x.dtype())
        }),
        ("to the other half and back, times y", |x, y| {
            let other = if x.dtype() == DType::F16 {
                DType::BF16
            } else {
                DType::F16
            };
            x.to_dtype(other)?.to_dtype(x.dtype())?.mul(y)
        }),
        ("f32 result of half operands", |x, y| {
            (x * y)?.to_dtype(DType::F32)?.add(0.1)
        }),
    ];
    for d in [DType::F16, DType::BF16] {
        let (xh, yh) = (x.to_dtype(d)?, y.to_dtype(d)?);
        xh.realize()?;
        yh.realize()?;
        // A broadcast operand (strided, stored as the half dtype).
        let rows = xh.narrow(0, 0, 61 * 67)?.reshape([61, 67])?;
        let row = yh.narrow(0, 0, 67)?;
        rows.realize()?;
        row.realize()?;
        let broadcast: [Case; 1] = [("rows * row + rows", |x, r| (x * r)?.add(x))];
        for (name, f) in CASES.iter().chain(&casts).chain(&broadcast) {
            let (a, b) = if *name == "rows * row + rows" {
                (&rows, &row)
            } else {
                (&xh, &yh)
            };
            // Realized first, so the read's cast to f32 is a kernel of its own (exact).
            let run = || -> Result<Vec<u32>> {
                let t = f(a, b)?;
                t.realize()?;
                Ok(t.to_dtype(DType::F32)?
                    .to_vec::<f32>()?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect())
            };
            // The first call is interpreted: on CUDA it compiles nothing on this thread.
            let compiles = strata_cuda::shipped::nvrtc_compiles();
            let first = run()?;
            assert_eq!(
                strata_cuda::shipped::nvrtc_compiles(),
                compiles,
                "{name} in {d:?} on {}: the first call compiled instead of being interpreted",
                dev.name()
            );
            let second = run()?;
            let mut profiled = Vec::new();
            dev.profile(|| {
                profiled = run()?;
                Ok(())
            })?;
            let after = run()?;
            assert!(
                first == second && second == profiled && profiled == after,
                "{name} in {d:?} on {}: the first, second, profiled and later calls differ",
                dev.name()
            );
        }
    }
    Ok(())
}

/// Bits of every result `f` gives, on three runs of it and one under the profiler, which
/// compiles the kernel first (the first runs are interpreted while it compiles in the
/// background).
fn three_runs(dev: &Device, f: impl Fn() -> Result<Vec<Tensor>>) -> Result<[Vec<Vec<u32>>; 4]> {
    let run = || -> Result<Vec<Vec<u32>>> {
        let outs = f()?;
        outs.iter()
            .map(|t| Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect()))
            .collect()
    };
    let runs = [run()?, run()?, run()?];
    let mut profiled = Vec::new();
    dev.profile(|| {
        profiled = run()?;
        Ok(())
    })?;
    let [a, b, c] = runs;
    Ok([a, b, c, profiled])
}

/// Broadcast inputs (strided operands) and a kept intermediate (a second output).
fn check_shapes(dev: &Device) -> Result<()> {
    let (rows, cols) = (61, 67);
    let x = Tensor::from_slice(&values(rows * cols), [rows, cols], dev)?;
    let row = Tensor::from_slice(&values(cols + 3)[3..], [cols], dev)?;
    let col = Tensor::from_slice(&values(rows + 5)[5..], [rows, 1], dev)?;
    type Shaped = fn(&Tensor, &Tensor, &Tensor) -> Result<Vec<Tensor>>;
    let cases: [(&str, Shaped); 4] = [
        ("x + row", |x, r, _| Ok(vec![(x + r)?])),
        ("x * col", |x, _, c| Ok(vec![(x * c)?])),
        ("exp(x - row) * col", |x, r, c| {
            Ok(vec![(x - r)?.exp()?.mul(c)?])
        }),
        ("exp(x * row), x * row kept", |x, r, _| {
            let kept = (x * r)?;
            let e = kept.exp()?;
            // Both pending when the first is read: one kernel writes both.
            let first = e.to_vec::<f32>()?;
            assert_eq!(first.len(), x.numel());
            Ok(vec![e, kept])
        }),
    ];
    for (name, f) in cases {
        let [a, b, c, compiled] = three_runs(dev, || f(&x, &row, &col))?;
        assert!(
            a == b && b == c && c == compiled,
            "{name} on {}: launches differ",
            dev.name()
        );
    }
    Ok(())
}

/// Kernels the interpreter does not run: on CUDA each is compiled quickly for its first
/// launches and at its own level in the background (cuda-backend's `function.rs`); the
/// profiler waits for that compile, so a profiled call runs the kernel's own form. Every call
/// must give the same bits.
fn check_kinds(dev: &Device) -> Result<()> {
    let (rows, cols) = (37, 300);
    let x = Tensor::from_slice(&values(rows * cols), [rows, cols], dev)?;
    let x = Tensor::where_cond(&x.isfinite()?, &x, 0.5)?;
    x.realize()?;
    let index = Tensor::from_slice(&[3i64, 0, 36, 3, 11], [5], dev)?;
    let half = x.to_dtype(DType::F16)?;
    type Kind = (
        &'static str,
        fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    );
    let kinds: [Kind; 11] = [
        ("sum over axis 0", |x, _, _| x.sum(0, false)),
        ("sum in f64", |x, _, _| {
            x.to_dtype(DType::F64)?.sum(-1, true)
        }),
        ("max over axis 1", |x, _, _| x.max(1, true)),
        ("argmax", |x, _, _| x.argmax(Some(-1), false)),
        ("softmax", |x, _, _| x.softmax(-1)),
        ("log_softmax", |x, _, _| x.log_softmax(-1)),
        ("softmax from primitives", |x, _, _| {
            let e = (x - &x.max(-1, true)?)?.exp()?;
            &e / &e.sum(-1, true)?
        }),
        ("index_select", |x, i, _| x.index_select(0, i)),
        ("cast to bf16", |x, _, _| x.to_dtype(DType::BF16)),
        ("f16 h*h + h", |_, _, h| (h * h)?.add(h)),
        ("randn", |x, _, _| {
            let mut g = strata::random::Generator::new(11);
            Tensor::randn([300], DType::F32, &mut g, x.device())
        }),
    ];
    let bits = |t: Tensor| -> Result<Vec<u64>> {
        let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
        Ok(v.iter().map(|v| v.to_bits()).collect())
    };
    for (name, f) in kinds {
        let first = bits(f(&x, &index, &half)?)?;
        let second = bits(f(&x, &index, &half)?)?;
        let mut profiled = None;
        dev.profile(|| {
            let t = f(&x, &index, &half)?;
            t.realize()?;
            profiled = Some(t);
            Ok(())
        })?;
        let profiled = bits(profiled.expect("the profiled call ran"))?;
        let after = bits(f(&x, &index, &half)?)?;
        assert!(
            first == second && second == profiled && profiled == after,
            "{name} on {}: the first, second, profiled and later calls differ",
            dev.name()
        );
    }
    Ok(())
}

/// A fused reduction's first calls, before its kernel is compiled, run as its eager launches
/// (cuda-backend's `run::unfused`: the map interpreted into scratch, then the plain reduction
/// already loaded): the first call compiles nothing, and every call gives the eager bits —
/// those of the map realized and then reduced (on the CPU and CUDA, where fused equals eager).
fn check_unfused(dev: &Device) -> Result<()> {
    let (rows, cols) = (37, 300);
    let x = Tensor::from_slice(&values(rows * cols), [rows, cols], dev)?;
    let x = Tensor::where_cond(&x.isfinite()?, &x, 0.25)?;
    let y = (&x * 0.75)?.add(0.5)?;
    let h = x.to_dtype(DType::F16)?;
    for t in [&x, &y, &h] {
        t.realize()?;
    }
    type Map = fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>;
    type Reduction = fn(&Tensor) -> Result<Tensor>;
    let softmax_half = |t: &Tensor| {
        let e = ((t - &t.max(-1, true)?)? * 0.5)?.exp()?;
        &e / &e.sum(-1, true)?
    };
    let cases: [(&str, Map, Reduction); 6] = [
        (
            "|(x - y)·x| summed over rows",
            |x, y, _| (x - y)?.mul(x)?.abs(),
            |t| t.sum(-1, false),
        ),
        (
            "x·y + x summed over columns",
            |x, y, _| (x * y)?.add(x),
            |t| t.sum(0, false),
        ),
        (
            "x·y − y summed whole",
            |x, y, _| (x * y)?.sub(y),
            |t| t.sum(Axes::All, false),
        ),
        (
            "exp(x − y)'s row maxima",
            |x, y, _| (x - y)?.exp(),
            |t| t.max(-1, false),
        ),
        (
            "f16 h·h − h summed over rows",
            |_, _, h| (h * h)?.sub(h),
            |t| t.sum(-1, false),
        ),
        // A row prologue (the maximum of x) and an epilogue (the division), both around a new map.
        (
            "softmax of x/2 from primitives",
            |x, _, _| Ok(x.clone()),
            softmax_half,
        ),
    ];
    let bits = |t: Tensor| -> Result<Vec<u64>> {
        let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
        Ok(v.iter().map(|v| v.to_bits()).collect())
    };
    for (name, map, reduce) in cases {
        // The eager launches: the map realized, then reduced (this loads the plain reduction).
        let eager = if name.starts_with("softmax") {
            let m = x.max(-1, true)?;
            m.realize()?;
            let e = ((&x - &m)? * 0.5)?.exp()?;
            e.realize()?;
            let s = e.sum(-1, true)?;
            s.realize()?;
            bits((&e / &s)?)?
        } else {
            let t = map(&x, &y, &h)?;
            t.realize()?;
            bits(reduce(&t)?)?
        };
        let call = || reduce(&map(&x, &y, &h)?);
        let before = strata_cuda::shipped::nvrtc_compiles();
        let first = call()?;
        first.realize()?;
        let compiled = strata_cuda::shipped::nvrtc_compiles() - before;
        let first = bits(first)?;
        let second = bits(call()?)?;
        let mut profiled = None;
        dev.profile(|| {
            let t = call()?;
            t.realize()?;
            profiled = Some(t);
            Ok(())
        })?;
        let profiled = bits(profiled.expect("the profiled call ran"))?;
        let after = bits(call()?)?;
        assert_eq!(
            compiled,
            0,
            "{name} on {}: the first call compiled",
            dev.name()
        );
        // (wgpu's fused sums may add in another order than its eager ones.)
        let eager_bits = dev.kind() == strata::BackendKind::Wgpu || eager == first;
        assert!(
            eager_bits && first == second && second == profiled && profiled == after,
            "{name} on {}: the eager, first, second, profiled and later calls differ",
            dev.name()
        );
    }
    Ok(())
}

#[test]
fn a_maps_first_launch_equals_its_compiled_launches_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("strata-first-launch-{}", std::process::id()));
    std::env::set_var("STRATA_CACHE_DIR", &dir);
    // Without the shipped kernels, which would load many of these maps' own kernels at once
    // (tests/tests/shipped.rs tests those).
    std::env::set_var("STRATA_CUDA_SHIPPED", "0");
    for dev in strata_tests::devices() {
        if let Err(e) = check(&dev)
            .and_then(|_| check_half(&dev))
            .and_then(|_| check_shapes(&dev))
            .and_then(|_| check_kinds(&dev))
            .and_then(|_| check_unfused(&dev))
        {
            panic!("on {}: {e}", dev.name());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
