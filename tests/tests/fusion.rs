//! Lazy fusion on every backend: elementwise results are pending until something needs them,
//! and every way of needing them (host reads, non-fused ops, writes into what a pending tree
//! reads, views, streams, events, blocking mode, size limits, `realize`, `flush`) gives the
//! eager answer. The aliasing tests matter most: peers have shipped silently wrong results
//! there (burn#1659, pytorch#198033).
//!
//! With `STRATA_FUSION=0` the same tests run eagerly (nothing is ever pending), which
//! `scripts/test.sh` also does for the whole suite.

use strata::prelude::*;
use strata::RecordKind;
use strata_tests::test_device;

fn fusing(dev: &Device) -> bool {
    dev.fusion() && !dev.blocking()
}

fn f32s(v: &[f32], dev: &Device) -> Result<Tensor> {
    Tensor::from_slice(v, [v.len()], dev)
}

/// `b = a * 2; a += 1`: `b` holds the old `a`'s double.
fn write_after_pending_read(dev: &Device) -> Result<()> {
    let a = f32s(&[1.0, 2.0, 3.0], dev)?;
    let b = (&a * 2.0)?;
    assert_eq!(b.is_pending(), fusing(dev));
    a.add_(1.0)?;
    assert_eq!(b.to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
    assert_eq!(a.to_vec::<f32>()?, vec![2.0, 3.0, 4.0]);
    Ok(())
}
test_device!(
    write_after_pending_read_sees_old_values,
    write_after_pending_read
);

/// Writes through views, `fill`, `set`, `assign`, `out=` and scatter into a storage that a
/// pending tree reads all run the tree first.
fn writes_through_views(dev: &Device) -> Result<()> {
    let base = || Tensor::arange(0, 6, 1, DType::F32, dev)?.reshape([2, 3]);
    // fill through a column view
    let a = base()?;
    let b = (&a + 10.0)?;
    a.slice(s![.., 1])?.fill(-1.0)?;
    assert_eq!(b.to_vec::<f32>()?, vec![10., 11., 12., 13., 14., 15.]);
    // assign through a transposed view
    let a = base()?;
    let b = a.exp()?.log()?.round()?;
    a.t()?.assign(&Tensor::zeros([3, 2], DType::F32, dev)?)?;
    assert_eq!(b.to_vec::<f32>()?, vec![0., 1., 2., 3., 4., 5.]);
    // an out= form writing the tree's own input
    let a = base()?;
    let b = (&a * &a)?;
    a.neg_out(&a)?;
    assert_eq!(b.to_vec::<f32>()?, vec![0., 1., 4., 9., 16., 25.]);
    // scatter through an index tensor
    let a = base()?.reshape([6])?;
    let b = (&a - 1.0)?;
    let idx = Tensor::from_slice(&[5i64, 0], [2], dev)?;
    a.scatter_(0, &idx, &f32s(&[100.0, 200.0], dev)?)?;
    assert_eq!(b.to_vec::<f32>()?, vec![-1., 0., 1., 2., 3., 4.]);
    // a write into a pending tree's *indirect* input (through an intermediate it holds)
    let a = base()?;
    let c = (&a + 1.0)?.mul(3.0)?;
    a.fill(0.0)?;
    assert_eq!(c.to_vec::<f32>()?, vec![3., 6., 9., 12., 15., 18.]);
    Ok(())
}
test_device!(
    writes_through_views_run_pending_readers_first,
    writes_through_views
);

/// Views of a pending result, and in-place ops on one.
fn views_and_inplace_of_pending(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 6, 1, DType::I32, dev)?.reshape([2, 3])?;
    let b = (&a * 2i64)?;
    let v = b.slice(s![.., ..;-1])?;
    assert_eq!(v.to_vec::<i32>()?, vec![4, 2, 0, 10, 8, 6]);
    let b = (&a * 2i64)?;
    let t = b.t()?;
    // The transposed view of a pending tensor as an input of another pending op.
    let c = (&t + 1i64)?;
    assert_eq!(c.to_vec::<i32>()?, vec![1, 7, 3, 9, 5, 11]);
    let d = (&a + 1i64)?;
    d.mul_(10i32)?;
    assert_eq!(d.to_vec::<i32>()?, vec![10, 20, 30, 40, 50, 60]);
    // A broadcast view of a pending row.
    let row = (&a.slice(s![0])? + 100i64)?;
    let e = (&a + &row)?;
    assert_eq!(e.to_vec::<i32>()?, vec![100, 102, 104, 103, 105, 107]);
    Ok(())
}
test_device!(
    views_and_inplace_ops_of_pending_results,
    views_and_inplace_of_pending
);

/// Non-fused ops (matmul, reductions, index ops, joins, copies) take pending inputs.
fn non_fused_consumers(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 4, 1, DType::F32, dev)?.reshape([2, 2])?;
    let b = (&a + 1.0)?;
    assert_eq!(b.matmul(&b)?.to_vec::<f32>()?, vec![7., 10., 15., 22.]);
    let b = (&a + 1.0)?;
    assert_eq!(b.sum(Axes::All, false)?.item::<f32>()?, 10.0);
    let b = (&a + 1.0)?;
    let idx = Tensor::from_slice(&[1i64], [1], dev)?;
    assert_eq!(b.index_select(0, &idx)?.to_vec::<f32>()?, vec![3., 4.]);
    let b = (&a + 1.0)?;
    let c = Tensor::cat(&[&b, &b], 0)?;
    assert_eq!(c.shape(), &[4, 2]);
    assert_eq!(c.to_vec::<f32>()?, vec![1., 2., 3., 4., 1., 2., 3., 4.]);
    let b = (&a + 1.0)?;
    assert_eq!(b.copy()?.to_vec::<f32>()?, vec![1., 2., 3., 4.]);
    let b = (&a + 1.0)?;
    let other = Device::cpu();
    assert_eq!(b.to_device(&other)?.to_vec::<f32>()?, vec![1., 2., 3., 4.]);
    Ok(())
}
test_device!(non_fused_ops_consume_pending_inputs, non_fused_consumers);

/// A pending tensor used on another stream, and the stream/event/synchronize flush points.
fn streams_and_events(dev: &Device) -> Result<()> {
    let s1 = dev.new_stream()?;
    let s2 = dev.new_stream()?;
    let a = Tensor::arange(0, 1024, 1, DType::F32, dev)?;
    let b = dev.with_stream(&s1, || (&a * 2.0)?.add(1.0))??;
    let c = dev.with_stream(&s2, || (&b + 1.0)?.sum(Axes::All, false))??;
    assert_eq!(
        c.item::<f32>()?,
        (0..1024).map(|i| 2.0 * i as f32 + 2.0).sum::<f32>()
    );
    let d = (&a + 1.0)?;
    let e = s1.record_event()?;
    assert!(!d.is_pending(), "record_event runs what is pending");
    s2.wait_event(&e)?;
    let f = a.neg()?;
    dev.synchronize()?;
    assert!(!f.is_pending(), "synchronize runs what is pending");
    let g = a.abs()?;
    s1.synchronize()?;
    assert!(!g.is_pending());
    Ok(())
}
test_device!(pending_tensors_meet_streams_and_events, streams_and_events);

/// A chain of 10,000 ops built in a loop: no stack overflow anywhere, the size limit flushes
/// along the way, and the value is the eager one.
fn long_chain(dev: &Device) -> Result<()> {
    let mut x = Tensor::zeros([64], DType::I64, dev)?;
    for k in 0..10_000i64 {
        x = if k % 3 == 0 { (&x + k)? } else { (&x - 1i64)? };
    }
    let want: i64 = (0..10_000i64)
        .map(|k| if k % 3 == 0 { k } else { -1 })
        .sum();
    assert_eq!(x.to_vec::<i64>()?, vec![want; 64]);
    // A diamond repeated: each step reads the previous result twice.
    let mut y = Tensor::ones([8], DType::F64, dev)?;
    for _ in 0..2_000 {
        y = (&(&y * 0.5)? + &(&y * 0.5)?)?;
    }
    assert_eq!(y.to_vec::<f64>()?, vec![1.0; 8]);
    Ok(())
}
test_device!(long_chains_flush_at_the_limit, long_chain);

/// Wide trees: more inputs than one kernel may bind, and deep trees past the node limit.
fn wide_and_deep(dev: &Device) -> Result<()> {
    let inputs: Vec<Tensor> = (0..20)
        .map(|k| Tensor::full([5], Scalar::F32(k as f32), DType::F32, dev))
        .collect::<Result<_>>()?;
    let mut acc = (&inputs[0] * 1.0)?;
    for t in &inputs[1..] {
        acc = (&acc + t)?;
    }
    assert_eq!(acc.to_vec::<f32>()?, vec![190.0; 5]);
    // A balanced tree over all 20 inputs (each level pending).
    let mut level = inputs.clone();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|p| {
                if p.len() == 2 {
                    &p[0] + &p[1]
                } else {
                    Ok(p[0].clone())
                }
            })
            .collect::<Result<_>>()?;
    }
    assert_eq!(level[0].to_vec::<f32>()?, vec![190.0; 5]);
    let mut deep = inputs[3].clone();
    for _ in 0..500 {
        deep = deep.sqrt()?.square()?;
    }
    let got = deep.to_vec::<f32>()?;
    assert!(got.iter().all(|v| (v - 3.0).abs() < 1e-3), "{got:?}");
    Ok(())
}
test_device!(wide_and_deep_trees_respect_the_limits, wide_and_deep);

/// A chain that reads the same tensors at every step binds each once, so it fuses until the
/// node limit (40 steps of `y * w + b`: 163 nodes, three inputs) instead of running whenever
/// its reads add up past the input limit.
fn chains_rereading_inputs(dev: &Device) -> Result<()> {
    let x = f32s(&[1.0, 2.0, 3.0], dev)?;
    let w = f32s(&[1.0; 3], dev)?;
    let b = f32s(&[0.5; 3], dev)?;
    let mut y = Tensor::zeros([1], DType::F32, dev)?;
    let (kernels, _) = kernels_of(dev, || {
        y = (&x * 1.0)?;
        for _ in 0..40 {
            y = (&(&y * &w)? + &b)?;
        }
        y.realize()
    })?;
    assert_eq!(kernels, if fusing(dev) { 1 } else { 81 });
    assert_eq!(y.to_vec::<f32>()?, vec![21.0, 22.0, 23.0]);
    Ok(())
}
test_device!(
    chains_rereading_inputs_fuse_to_the_node_limit,
    chains_rereading_inputs
);

/// Errors come from the op that caused them, pending inputs or not.
fn errors_at_the_op(dev: &Device) -> Result<()> {
    let a = (&Tensor::ones([2, 3], DType::F32, dev)? * 2.0)?;
    let c = Tensor::ones([4], DType::F32, dev)?;
    let e = (&a + &c).unwrap_err();
    assert!(
        e.to_string().contains("[2, 3]") && e.to_string().contains("[4]"),
        "{e}"
    );
    let e = a.bitwise_and(1i32).unwrap_err();
    assert!(e.to_string().contains("f32"), "{e}");
    assert_eq!(a.to_vec::<f32>()?, vec![2.0; 6]);
    Ok(())
}
test_device!(errors_are_reported_at_the_op, errors_at_the_op);

/// Random draws inside chains equal eager draws, and fused results equal eager ones bit for
/// bit (integers everywhere; floats on the CPU, whose eager and fused paths round alike).
fn fused_equals_eager(dev: &Device) -> Result<()> {
    // Every element's bits (f16 and f32 widen to f64 exactly; NaN stays NaN).
    let bits = |t: &Tensor| -> Result<Vec<u64>> {
        Ok(if t.dtype().is_float() {
            let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
            v.iter()
                .map(|x| if x.is_nan() { 1 } else { x.to_bits() })
                .collect()
        } else {
            let v = t.to_dtype(DType::I64)?.to_vec::<i64>()?;
            v.iter().map(|&x| x as u64).collect()
        })
    };
    let run = |fuse: bool| -> Result<Vec<Vec<u64>>> {
        let before = dev.fusion();
        dev.set_fusion(fuse)?;
        let mut g = Generator::new(11);
        let x = Tensor::randn([257], DType::F32, &mut g, dev)?;
        let r = Tensor::rand([257], DType::F32, &mut g, dev)?
            .mul(4.0)?
            .sub(2.0)?;
        let h = x.to_dtype(DType::F16)?;
        let gelu = (&x * 0.5)?.mul(
            &(&(&(&x * &x)?.mul(&x)?.mul(0.044715)? + &x)? * 0.7978845608)?
                .tanh()?
                .add(1.0)?,
        )?;
        let half = (&h * &h)?.add(&h)?.exp()?.sub(1.0)?;
        let ints = (&x * 1000.0)?
            .to_dtype(DType::I32)?
            .mul(7i32)?
            .bitwise_xor(0x55i32)?
            .bitwise_right_shift(1i32)?
            .floor_divide(3i32)?;
        let masked = Tensor::where_cond(&x.gt(0.0)?, &r, &x.exp()?)?.clamp(-1.0, 1.0)?;
        let out = [gelu, half, ints, masked, r];
        let bytes = out.iter().map(bits).collect::<Result<_>>()?;
        dev.set_fusion(before)?;
        Ok(bytes)
    };
    let (fused, eager) = (run(true)?, run(false)?);
    // Integers (index 2) and the random draws (4) agree bit for bit everywhere.
    assert_eq!(fused[2], eager[2], "integer chain");
    assert_eq!(fused[4], eager[4], "random draws in a chain");
    if dev.kind() != strata::BackendKind::Wgpu {
        // wgpu drivers may contract a*b + c inside one shader (docs/semantics.md).
        assert_eq!(fused, eager, "fused vs eager, bit for bit");
    }
    Ok(())
}
test_device!(fused_results_equal_eager_results, fused_equals_eager);

/// A dropped pending tensor costs nothing; an intermediate only the tree holds is never
/// allocated: the peak of `relu(a*b + c)` is the three inputs and the output.
fn dropped_and_intermediates(dev: &Device) -> Result<()> {
    let dev = if dev.kind() == strata::BackendKind::Cpu {
        Device::cpu() // a fresh allocator, so the peak below is this test's own
    } else {
        return Ok(()); // shared GPU devices carry other tests' peaks
    };
    let n = 1 << 16;
    let [a, b, c] = [1.0f32, 2.0, 3.0].map(|v| Tensor::full([n], Scalar::F32(v), DType::F32, &dev));
    let (a, b, c) = (a?, b?, c?);
    let inputs = dev.memory_stats().allocated;
    drop(a.exp()?.sin()?);
    assert_eq!(dev.memory_stats().allocated, inputs);
    if !dev.fusion() {
        return Ok(());
    }
    let y = (&a * &b)?.add(&c)?.relu()?;
    assert_eq!(
        dev.memory_stats().peak,
        inputs,
        "nothing allocated while pending"
    );
    assert_eq!(y.to_vec::<f32>()?, vec![5.0; n]);
    assert_eq!(
        dev.memory_stats().peak,
        inputs + 4 * n,
        "inputs and the output only"
    );
    Ok(())
}
test_device!(
    dropped_pending_tensors_cost_nothing,
    dropped_and_intermediates
);

/// Blocking mode runs every op at once; `set_fusion(false)` too; a pending tensor survives
/// device clones and is run by a clone's `flush`.
fn switches_and_clones(dev: &Device) -> Result<()> {
    let a = Tensor::ones([4], DType::F32, dev)?;
    let clone = dev.clone();
    let b = a.exp()?;
    clone.flush()?;
    assert!(!b.is_pending());
    let c = a.exp()?;
    c.realize()?;
    assert!(!c.is_pending());
    let was = dev.blocking();
    dev.set_blocking(true);
    let d = a.exp()?;
    dev.set_blocking(was);
    assert!(!d.is_pending(), "blocking mode runs each op at once");
    assert!((d.to_vec::<f32>()?[0] - std::f32::consts::E).abs() < 1e-6);
    Ok(())
}
test_device!(blocking_mode_and_device_clones, switches_and_clones);

/// A chain written in one statement fuses although its temporaries are alive when it runs
/// (their nodes are recomputed in registers); intermediates the user keeps run once at a flush
/// and later trees read them.
fn one_statement_chains(dev: &Device) -> Result<()> {
    let fresh = dev.kind() == strata::BackendKind::Cpu;
    let dev = if fresh { Device::cpu() } else { dev.clone() };
    let n = 1 << 12;
    let a = Tensor::full([n], Scalar::F32(2.0), DType::F32, &dev)?;
    let b = Tensor::full([n], Scalar::F32(3.0), DType::F32, &dev)?;
    let c = Tensor::full([n], Scalar::F32(-1.0), DType::F32, &dev)?;
    let inputs = dev.memory_stats().allocated;
    let explained = (&a * &b)?.add(&c)?.relu()?.explain()?;
    assert_eq!(explained.kernels.len(), usize::from(dev.fusion()));
    if let Some(k) = explained.kernels.first() {
        // Each op with the line that called it.
        assert_eq!(k.ops, vec!["mul", "add", "relu"]);
        assert!(
            k.sources
                .iter()
                .all(|s| s.starts_with("tests/tests/fusion.rs:")),
            "{k:?}"
        );
    }
    let v = (&a * &b)?.add(&c)?.relu()?.to_vec::<f32>()?;
    assert_eq!(v, vec![5.0; n]);
    if fresh && dev.fusion() {
        assert_eq!(
            dev.memory_stats().peak,
            inputs + 4 * n,
            "only the result was written"
        );
    }
    // Kept intermediates: a flush runs the newest tree, which stores the one it reads.
    let ab = (&a * &b)?;
    let y = (&ab + &c)?.relu()?;
    dev.flush()?;
    assert!(!ab.is_pending() && !y.is_pending());
    assert_eq!(ab.to_vec::<f32>()?, vec![6.0; n]);
    assert_eq!(y.to_vec::<f32>()?, vec![5.0; n]);
    Ok(())
}
test_device!(one_statement_chains_fuse, one_statement_chains);

/// A chain reading seven tensors is one kernel where the backend binds eight tensors (the CPU
/// and CUDA bind any number), and two where it binds fewer (a wgpu adapter with WebGPU's
/// default of 8 storage buffers, one holding the parameters: `STRATA_WGPU_MAX_BINDINGS=8` in
/// scripts/test.sh): `explain` shows the kernel's inputs before it runs.
fn seven_input_chain(dev: &Device) -> Result<()> {
    let xs: Vec<Tensor> = (0..7)
        .map(|k| Tensor::full([33], Scalar::F32(k as f32 + 1.0), DType::F32, dev))
        .collect::<Result<_>>()?;
    let chain = || -> Result<Tensor> {
        let mut y = (&xs[0] * 1.0)?;
        for x in &xs[1..] {
            y = (&y + x)?;
        }
        Ok(y)
    };
    let fits = dev.backend().target().binds(8);
    let y = chain()?;
    if fusing(dev) {
        let e = y.explain()?;
        assert_eq!(e.kernels.len(), 1, "{e}");
        let inputs = e.kernels[0].inputs.len();
        assert!(if fits { inputs == 7 } else { inputs < 7 }, "{e}");
    }
    assert_eq!(y.to_vec::<f32>()?, vec![28.0; 33]);
    let (kernels, _) = kernels_of(dev, || chain()?.realize())?;
    let expected = match (fusing(dev), fits) {
        (false, _) => 7,
        (true, true) => 1,
        (true, false) => 2,
    };
    assert_eq!(kernels, expected);
    Ok(())
}
test_device!(
    seven_input_chains_fuse_within_the_binding_limit,
    seven_input_chain
);

/// `explain` runs nothing and allocates nothing: the kernels a read would run (a pending
/// input read through another view first, a deferred maximum) are planned over the buffers
/// that exist and stand-ins for the others; every tensor stays pending and the allocator's
/// count does not move.
fn explain_runs_nothing(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 12, 1, DType::F32, dev)?.reshape([3, 4])?;
    a.realize()?;
    let b = (&a * 2.0)?;
    let c = (&b.t()? + 1.0)?; // reads b through another view: b runs as its own kernel first
    let d = (&c.exp()? - &a.t()?)?;
    let m = a.max(-1, true)?; // deferred where the backend fuses row prologues
    let e = (&a - &m)?;
    let tensors = [&b, &c, &d, &m, &e];
    let pending = || tensors.iter().map(|t| t.is_pending()).collect::<Vec<_>>();
    let (allocated, before) = (dev.memory_stats().allocated, pending());
    let (xd, xe) = (d.explain()?, e.explain()?);
    assert_eq!(dev.memory_stats().allocated, allocated, "explain allocated");
    assert_eq!(pending(), before, "explain ran something");
    if fusing(dev) {
        assert_eq!(xd.kernels.len(), 2, "{xd}");
        assert_eq!(xd.kernels[0].ops, vec!["mul"], "{xd}");
        assert!(
            xd.kernels.iter().all(|k| k.pending && k.source.is_some()),
            "{xd}"
        );
        let prologue = dev.backend().target().fuses_row_prologue;
        assert_eq!(xe.kernels.len(), 1 + usize::from(prologue), "{xe}");
    }
    let (av, dv) = (a.to_vec::<f32>()?, d.to_vec::<f32>()?);
    for (k, v) in dv.iter().enumerate() {
        let (i, j) = (k / 3, k % 3); // d is [4, 3]: d[i, j] = exp(2 a[j, i] + 1) - a[j, i]
        let x = av[j * 4 + i];
        assert!(
            (v - ((2.0 * x + 1.0).exp() - x)).abs() <= 1e-4 * v.abs(),
            "{k}: {v}"
        );
    }
    assert_eq!(e.to_vec::<f32>()?[..4], [-3.0, -2.0, -1.0, 0.0]);
    Ok(())
}
test_device!(
    explain_runs_nothing_and_allocates_nothing,
    explain_runs_nothing
);

/// Kernels a closure launched (fused kernels count once however many outputs they write),
/// and the bytes they wrote.
fn kernels_of(dev: &Device, f: impl FnOnce() -> Result<()>) -> Result<(usize, u64)> {
    let p = dev.profile(f)?;
    let kernels: Vec<_> = p
        .device_work()
        .filter(|r| r.kind == RecordKind::Kernel)
        .collect();
    Ok((kernels.len(), kernels.iter().map(|r| r.bytes_written).sum()))
}

/// Multi-output fusion: at a flush, a pending intermediate someone still holds is stored by
/// the kernel that computes the tree reading it, so it is computed once (newest tree first,
/// so the last tree takes its held inputs along); intermediates of every dtype, random draws,
/// the vectorized tail and the tiled path (a transposed input) give the eager values. A read
/// of one tensor stores nothing else (a statement's temporaries look held too).
fn multi_output(dev: &Device) -> Result<()> {
    let n = 4099; // not a multiple of any vector width: the tail runs too
    let a = Tensor::arange(0, n as i64, 1, DType::F32, dev)?.sub(2000.0)?;
    let c = Tensor::full([n], Scalar::F32(1.5), DType::F32, dev)?;
    a.realize()?;
    let av = a.to_vec::<f32>()?;
    let double: Vec<f32> = av.iter().map(|x| x * 2.0).collect();
    let relu: Vec<f32> = double.iter().map(|x| (x + 1.5).max(0.0)).collect();
    let eager = |f: &dyn Fn() -> Result<Vec<Tensor>>| -> Result<Vec<Tensor>> {
        let was = dev.fusion();
        dev.set_fusion(false)?;
        let out = f();
        dev.set_fusion(was)?;
        out
    };

    // A held intermediate and the tree reading it: at a flush, one kernel writes both; a
    // read of the tree alone writes only its result.
    for flush in [true, false] {
        let (mut ab, mut y) = (None, None);
        let (kernels, written) = kernels_of(dev, || {
            let b = (&a * 2.0)?;
            let t = (&b + &c)?.relu()?;
            if flush {
                dev.flush()?;
            } else {
                t.realize()?;
            }
            assert_eq!(b.is_pending(), fusing(dev) && !flush, "flush {flush}");
            (ab, y) = (Some(b), Some(t));
            Ok(())
        })?;
        if fusing(dev) {
            // After the read, b was still pending: the profile's closing synchronize ran it
            // as a second kernel.
            let runs = if flush { 1 } else { 2 };
            assert_eq!((kernels, written), (runs, 8 * n as u64), "flush {flush}");
        }
        assert_eq!(ab.unwrap().to_vec::<f32>()?, double);
        assert_eq!(y.unwrap().to_vec::<f32>()?, relu);
    }

    // The newest tree stores the three held links of its chain (a length of whole vectors
    // too, so the vector path runs everywhere).
    for len in [n, 4096] {
        let part = a.slice(s![..len])?;
        let (kernels, _) = kernels_of(dev, || {
            let b = (&part + 1.0)?;
            let c2 = (&b * 2.0)?;
            let d = (&c2 - 3.0)?;
            let e = d.abs()?;
            dev.flush()?;
            assert!([&b, &c2, &d, &e].iter().all(|t| !t.is_pending()));
            let want_b: Vec<f32> = av[..len].iter().map(|x| x + 1.0).collect();
            assert_eq!(b.to_vec::<f32>()?, want_b);
            let want_d: Vec<f32> = want_b.iter().map(|x| x * 2.0 - 3.0).collect();
            assert_eq!(d.to_vec::<f32>()?, want_d);
            let want_e: Vec<f32> = want_d.iter().map(|x| x.abs()).collect();
            assert_eq!(e.to_vec::<f32>()?, want_e);
            Ok(())
        })?;
        if fusing(dev) {
            assert_eq!(kernels, 1, "b, c2, d and e from one kernel");
        }
    }

    // Intermediates of other dtypes (f16, i32, bool) beside an f32 result.
    let chain = || -> Result<Vec<Tensor>> {
        let h = a.to_dtype(DType::F16)?;
        let i = h.to_dtype(DType::I32)?;
        let m = i.gt(0i64)?;
        let half_i = (&i.to_dtype(DType::F32)? * 0.5)?;
        let r = Tensor::where_cond(&m, &h.to_dtype(DType::F32)?, &half_i)?;
        Ok(vec![h, i, m, r])
    };
    let fused = chain()?;
    dev.flush()?;
    assert!(fused.iter().all(|t| !t.is_pending()));
    let want = eager(&chain)?;
    assert_eq!(
        fused[0].to_vec::<half::f16>()?,
        want[0].to_vec::<half::f16>()?
    );
    assert_eq!(fused[1].to_vec::<i32>()?, want[1].to_vec::<i32>()?);
    assert_eq!(fused[2].to_vec::<bool>()?, want[2].to_vec::<bool>()?);
    assert_eq!(fused[3].to_vec::<f32>()?, want[3].to_vec::<f32>()?);

    // A random draw stored beside a tree that reads it: the same numbers as drawn alone.
    let u = Tensor::rand([n], DType::F32, &mut Generator::new(7), dev)?;
    let twice = (&u * 2.0)?;
    dev.flush()?;
    let (u, twice) = (u.to_vec::<f32>()?, twice.to_vec::<f32>()?);
    let alone = Tensor::rand([n], DType::F32, &mut Generator::new(7), dev)?.to_vec::<f32>()?;
    assert_eq!(u, alone);
    assert!(u.iter().zip(&twice).all(|(x, y)| 2.0 * x == *y));

    // A transposed input (the tiled path on GPUs) feeding a held intermediate.
    let x = Tensor::arange(0, 96 * 64, 1, DType::F32, dev)?.reshape([64, 96])?;
    let xt = x.t()?;
    let chain = || -> Result<Vec<Tensor>> {
        let b = (&xt * 3.0)?;
        let y = (&b + 1.0)?;
        Ok(vec![b, y])
    };
    let fused = chain()?;
    dev.flush()?;
    let want = eager(&chain)?;
    for (f, w) in fused.iter().zip(&want) {
        assert_eq!(f.to_vec::<f32>()?, w.to_vec::<f32>()?);
    }

    // More held intermediates than one kernel stores: a second kernel takes the rest.
    let mut kept = vec![(&a + 0.0)?];
    for k in 1..12 {
        let next = (kept.last().unwrap() + k as f64)?;
        kept.push(next);
    }
    dev.flush()?;
    let mut want = av.clone();
    for (k, t) in kept.iter().enumerate() {
        want.iter_mut().for_each(|w| *w += k as f32);
        assert_eq!(t.to_vec::<f32>()?, want, "link {k}");
    }

    // explain: what a read would run (nothing stored), then what the flush ran.
    let b = (&a * 2.0)?;
    let y = (&b + 1.0)?;
    assert!(y.explain()?.kernels.iter().all(|k| k.also.is_empty()));
    dev.flush()?;
    if fusing(dev) {
        let ran = y.explain()?;
        assert_eq!(ran.kernels[0].also.len(), 1, "{ran}");
        assert!(ran.to_string().contains("also out1 = in0 * s0"), "{ran}");
    }
    Ok(())
}
test_device!(held_intermediates_are_stored_by_one_kernel, multi_output);

/// Sibling outputs: at a flush, pending trees over the same elements that share an
/// intermediate run as one kernel (the intermediate computed once, stored only if held);
/// trees over other elements, or reading a sibling through another view, run apart; more
/// siblings than one kernel stores take a second kernel. Values as eager.
fn siblings(dev: &Device) -> Result<()> {
    let n = 1027;
    let a = Tensor::arange(0, n as i64, 1, DType::F32, dev)?.div(100.0)?;
    a.realize()?;
    let av = a.to_vec::<f32>()?;
    // (Exact or single-rounding ops: the host's reference is the device's value.)
    let x_of = |v: f32| -(v * 3.0);
    // Two readers of an intermediate nobody holds: one kernel, two outputs.
    let (mut y, mut z) = (None, None);
    let (kernels, written) = kernels_of(dev, || {
        let x = (&a * 3.0)?.neg()?;
        y = Some((&x * 2.0)?);
        z = Some((&x * 0.5)?);
        drop(x);
        dev.flush()
    })?;
    if fusing(dev) {
        assert_eq!((kernels, written), (1, 8 * n as u64));
    }
    let want = |f: &dyn Fn(f32) -> f32| -> Vec<f32> { av.iter().map(|&v| f(x_of(v))).collect() };
    let (y, z) = (y.unwrap(), z.unwrap());
    assert_eq!(y.to_vec::<f32>()?, want(&|x| x * 2.0));
    assert_eq!(z.to_vec::<f32>()?, want(&|x| x * 0.5));
    if fusing(dev) {
        let ran = y.explain()?;
        assert_eq!(ran.kernels.len(), 1, "{ran}");
        assert_eq!(ran.kernels[0].also.len(), 1, "{ran}");
    }

    // Held too: the intermediate is a third output of the same kernel.
    let (kernels, _) = kernels_of(dev, || {
        let x = (&a * 3.0)?.neg()?;
        let y = (&x * 2.0)?;
        let z = (&x * 0.5)?.to_dtype(DType::F16)?;
        dev.flush()?;
        assert!(!x.is_pending() && !y.is_pending() && !z.is_pending());
        assert_eq!(x.to_vec::<f32>()?, want(&|x| x));
        assert_eq!(y.to_vec::<f32>()?, want(&|x| x * 2.0));
        let zh: Vec<half::f16> = want(&|x| x * 0.5)
            .into_iter()
            .map(half::f16::from_f32)
            .collect();
        assert_eq!(z.to_vec::<half::f16>()?, zh);
        Ok(())
    })?;
    if fusing(dev) {
        assert_eq!(kernels, 1);
    }

    // Other elements (a slice of the intermediate): not siblings (the slice's reader has the
    // intermediate realized first, and the other reads it).
    let (mut y, mut z) = (None, None);
    let (kernels, _) = kernels_of(dev, || {
        let x = (&a * 3.0)?.neg()?;
        y = Some((&x * 2.0)?);
        z = Some(x.slice(s![..100])?.mul(0.5)?);
        drop(x);
        dev.flush()
    })?;
    if fusing(dev) {
        assert!(kernels >= 2, "{kernels}");
    }
    assert_eq!(y.unwrap().to_vec::<f32>()?, want(&|x| x * 2.0));
    assert_eq!(z.unwrap().to_vec::<f32>()?, want(&|x| x * 0.5)[..100]);

    // A tree reading another through a transposed view is no sibling of it: it runs after
    // it, reading its values (here it is the newest, so it runs first and has `y` run).
    let m = Tensor::arange(0, 64, 1, DType::F32, dev)?.reshape([8, 8])?;
    let x = m.mul(3.0)?.mul(0.5)?;
    let y = (&x * 2.0)?;
    let z = (&y.t()? + &x)?;
    drop(x);
    dev.flush()?;
    let mv = m.to_vec::<f32>()?;
    let xv: Vec<f32> = mv.iter().map(|v| v * 3.0 * 0.5).collect();
    let zv: Vec<f32> = (0..64)
        .map(|k| xv[(k % 8) * 8 + k / 8] * 2.0 + xv[k])
        .collect();
    assert_eq!(
        y.to_vec::<f32>()?,
        xv.iter().map(|v| v * 2.0).collect::<Vec<_>>()
    );
    assert_eq!(z.to_vec::<f32>()?, zv);

    // Readers of one random draw are no siblings (a map's draws are its first tree's), yet
    // both see the same numbers.
    let u = Tensor::rand([n], DType::F32, &mut Generator::new(5), dev)?;
    let (y, z) = ((&u * 2.0)?, (&u * 3.0)?);
    drop(u);
    dev.flush()?;
    let (y, z) = (y.to_vec::<f32>()?, z.to_vec::<f32>()?);
    assert!(y.iter().zip(&z).all(|(y, z)| y / 2.0 * 3.0 == *z));

    // A sibling whose new input would pass the binding limit (WebGPU's default of 8 storage
    // buffers: `STRATA_WGPU_MAX_BINDINGS=8` in scripts/test.sh) is undone and runs apart.
    let ins: Vec<Tensor> = (0..7)
        .map(|k| Tensor::full([n], Scalar::F32(k as f32), DType::F32, dev))
        .collect::<Result<_>>()?;
    let x = (&(&ins[0] + &ins[1])? + &(&ins[2] + &ins[3])?)?;
    let y = (&x * &ins[4])?;
    let z = (&(&x * &ins[5])? * &ins[6])?;
    drop(x);
    dev.flush()?;
    assert_eq!(y.to_vec::<f32>()?, vec![24.0; n]);
    assert_eq!(z.to_vec::<f32>()?, vec![180.0; n]);

    // Twelve readers: more than one kernel's outputs, so two kernels (where eight outputs and
    // the input may be bound together).
    let mut outs = Vec::new();
    let (kernels, _) = kernels_of(dev, || {
        let x = (&a * 3.0)?.neg()?;
        outs = (0..12)
            .map(|k| &x * k as f64)
            .collect::<Result<Vec<Tensor>>>()?;
        drop(x);
        dev.flush()
    })?;
    // (Eight outputs and the input bound together; fewer bindings take more kernels.)
    if fusing(dev) && dev.backend().target().binds(9) {
        assert_eq!(kernels, 2);
    }
    for (k, t) in outs.iter().enumerate() {
        assert_eq!(t.to_vec::<f32>()?, want(&|x| x * k as f32), "reader {k}");
    }
    Ok(())
}
test_device!(trees_sharing_an_intermediate_run_as_one_kernel, siblings);

/// A pending tensor read twice by one tree, element for element and through a transposed
/// view: the first is spliced in, the second reads it realized (its own kernel), never the
/// spliced expression at the wrong positions. Held or not, read or flushed.
fn pending_read_through_two_views(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 12, 1, DType::F32, dev)?.reshape([3, 4])?;
    for (order, flush) in [(0, false), (1, false), (0, true), (1, true)] {
        let sq = a.matmul(&a.t()?)?.mul(0.0)?; // [3, 3] zeros, pending (a non-fused op first)
        let b = (&a.slice(s![.., ..3])? * 2.0)?.add(&sq)?; // [3, 3]: 2·a[:, :3]
        let y = if order == 0 {
            (&b + &b.t()?)?
        } else {
            (&b.t()? + &b)?
        };
        if flush {
            dev.flush()?;
        }
        let got = y.to_vec::<f32>()?;
        let v: Vec<f32> = [0., 1., 2., 4., 5., 6., 8., 9., 10.]
            .iter()
            .map(|x| 2.0 * x)
            .collect();
        let mut sym = vec![0.0; 9];
        for i in 0..3 {
            for j in 0..3 {
                sym[3 * i + j] = v[3 * i + j] + v[3 * j + i];
            }
        }
        assert_eq!(got, sym, "order {order}, flush {flush}");
        assert_eq!(b.to_vec::<f32>()?, v);
    }
    Ok(())
}
test_device!(
    a_tree_reads_one_pending_tensor_through_two_views,
    pending_read_through_two_views
);

/// Random elementwise chains with a random subset of their links kept, run by a flush
/// (multi-output kernels) and eagerly: every kept link equals its eager value, bit for bit on
/// CPU and CUDA (within f32 rounding on wgpu, whose drivers may contract `a*b + c`). Sizes
/// cross the vector tail, and some chains read a transposed input (the tiled path on GPUs).
fn random_kept_links(dev: &Device) -> Result<()> {
    let mut seed = 0x5eed_u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for program in 0..40 {
        let (rows, cols) = (1 + next(70) as usize, 1 + next(70) as usize);
        let steps: Vec<u64> = (0..2 + next(7)).map(|_| next(9)).collect();
        let keep: Vec<bool> = steps.iter().map(|_| next(2) == 0).collect();
        let transposed = next(3) == 0;
        let run = |fuse: bool| -> Result<Vec<Tensor>> {
            let was = dev.fusion();
            dev.set_fusion(fuse)?;
            let mut g = Generator::new(program);
            let base = Tensor::randn([cols, rows], DType::F32, &mut g, dev)?;
            let x = if transposed {
                base.t()?
            } else {
                base.reshape([rows, cols])?
            };
            let y = Tensor::rand([rows, cols], DType::F32, &mut g, dev)?;
            dev.flush()?;
            let mut links = Vec::new();
            let mut t = x.clone();
            for (&step, &kept) in steps.iter().zip(&keep) {
                t = match step {
                    0 => (&t * &y)?,
                    1 => (&t + 0.25)?,
                    2 => t.tanh()?,
                    3 => t.to_dtype(DType::F16)?.mul(1.5)?.to_dtype(DType::F32)?,
                    4 => (&t - &x)?.abs()?,
                    5 => t.relu()?,
                    6 => Tensor::where_cond(&t.gt(0.1)?, &t, &y)?,
                    7 => t.exp()?.clamp(-4.0, 4.0)?,
                    _ => t.maximum(&y)?,
                };
                if kept {
                    links.push(t.clone());
                }
            }
            links.push(t);
            dev.flush()?;
            dev.set_fusion(was)?;
            Ok(links)
        };
        let (fused, eager) = (run(true)?, run(false)?);
        for (k, (f, e)) in fused.iter().zip(&eager).enumerate() {
            assert!(!f.is_pending(), "program {program}: link {k} still pending");
            let (f, e) = (f.to_vec::<f32>()?, e.to_vec::<f32>()?);
            let what = format!("program {program} {steps:?} kept {keep:?} link {k}");
            if dev.kind() == strata::BackendKind::Wgpu {
                let close = f.iter().zip(&e).all(|(&a, &b)| near(a as f64, b as f64));
                assert!(close, "{what}");
            } else {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&f), bits(&e), "{what}");
            }
        }
    }
    Ok(())
}
test_device!(random_chains_with_kept_links_equal_eager, random_kept_links);

/// Map→reduce fusion: a reduction reads a pending elementwise tree directly where the backend
/// fuses it (the CPU and CUDA backends), with the eager results; trees it cannot take (a
/// broadcast leaf, a view of the tree) run first.
fn map_then_reduce(dev: &Device) -> Result<()> {
    let mut g = Generator::new(5);
    let a = Tensor::randn([6, 33], DType::F32, &mut g, dev)?;
    let b = Tensor::randn([6, 33], DType::F32, &mut g, dev)?;
    let i = Tensor::arange(-90, 108, 1, DType::I32, dev)?.reshape([6, 33])?;
    let row = Tensor::randn([33], DType::F32, &mut g, dev)?;
    dev.flush()?;
    let run = |fuse: bool| -> Result<Vec<Vec<u64>>> {
        let before = dev.fusion();
        dev.set_fusion(fuse)?;
        let bits32 = |t: Tensor| -> Result<Vec<u64>> {
            let t = t.to_dtype(DType::F64)?;
            Ok(t.to_vec::<f64>()?.iter().map(|x| x.to_bits()).collect())
        };
        let ints = |t: Tensor| -> Result<Vec<u64>> {
            Ok(t.to_dtype(DType::I64)?
                .to_vec::<i64>()?
                .iter()
                .map(|&x| x as u64)
                .collect())
        };
        let out = vec![
            bits32((&a * &b)?.sum(Axes::All, false)?)?,
            bits32((&a * &b)?.add(1.5)?.exp()?.sum(-1, false)?)?,
            bits32((&a - &b)?.abs()?.max(0, true)?)?,
            ints((&a * &b)?.argmax(Some(-1), false)?)?,
            ints((&i * 3i64)?.bitwise_xor(5i32)?.sum(vec![0, 1], false)?)?,
            ints(a.gt(&b)?.any(-1, false)?)?,
            bits32((&i * 0.5)?.mean(-1, false)?)?,
            // A transposed read and a view of the tree (not fused), a leaf broadcast along
            // the rows (read at each position).
            bits32((&a.t()? * 2.0)?.sum(0, false)?)?,
            bits32((&a * &row)?.sum(-1, false)?)?,
            bits32((&a * &b)?.slice(s![.., ..;2])?.sum(-1, false)?)?,
            bits32((&a * &b)?.var(-1, 1, false)?)?,
            // Composites whose elementwise parts read a keepdim result (one value per output).
            bits32(a.softmax(-1)?)?,
            bits32(a.log_softmax(0)?)?,
            bits32(a.std(Axes::All, 0, true)?)?,
            bits32(a.mean(vec![0, 1], false)?)?,
            bits32((&a - &a.max(-1, true)?)?.exp()?.sum(-1, true)?)?,
        ];
        dev.set_fusion(before)?;
        Ok(out)
    };
    let (fused, eager) = (run(true)?, run(false)?);
    if dev.kind() == strata::BackendKind::Wgpu {
        // A Vulkan driver may contract a*b + c inside one shader (docs/semantics.md): the
        // integer results (3, 4, 5) agree bit for bit, the float ones within f32 rounding.
        for k in [3, 4, 5] {
            assert_eq!(fused[k], eager[k], "result {k}, fused vs eager");
        }
        for (k, (f, e)) in fused.iter().zip(&eager).enumerate() {
            for (&f, &e) in f.iter().zip(e) {
                let (f, e) = (f64::from_bits(f), f64::from_bits(e));
                assert!(near(f, e), "result {k}: fused {f} vs eager {e}");
            }
        }
    } else {
        assert_eq!(fused, eager, "map→reduce fused vs eager, bit for bit");
    }
    // The tree is read by the reduction, not realized (where the backend fuses and binds it:
    // under a binding limit smaller than `b`, the map runs first, decided by core).
    let p = (&a * &b)?;
    let s = p.sum(Axes::All, false)?;
    let e = (&a - &a.max(-1, true)?)?.exp()?;
    let es = e.sum(-1, true)?;
    if dev.fusion() {
        let binds = dev
            .backend()
            .target()
            .binds_reduce(&[b.nbytes(), b.nbytes()]);
        assert_eq!(
            p.is_pending(),
            binds,
            "the reduction read the tree directly"
        );
        assert!(
            e.is_pending(),
            "a keepdim max broadcast back is one value per output"
        );
    }
    assert!(es.to_vec::<f32>()?.iter().all(|v| *v >= 1.0));
    assert!(s.item::<f32>()?.is_finite());
    Ok(())
}
test_device!(reductions_read_pending_trees, map_then_reduce);

/// wgpu evaluates a fused map inside its reduction shader: no temporary the size of the input
/// (a fresh device, so its allocator's peak counts only this work).
#[test]
fn wgpu_map_reduce_allocates_no_temporary() {
    for dev in strata_tests::devices() {
        if dev.kind() != strata::BackendKind::Wgpu || !dev.fusion() {
            continue;
        }
        let fresh = Device::parse("wgpu").unwrap();
        let n = 1 << 16;
        let a = Tensor::from_slice(&vec![1.5f32; n], [n], &fresh).unwrap();
        let b = Tensor::from_slice(&vec![2.0f32; n], [n], &fresh).unwrap();
        let s = (&a * &b).unwrap().sum(Axes::All, false).unwrap();
        assert_eq!(s.item::<f32>().unwrap(), 3.0 * n as f32);
        let peak = fresh.memory_stats().peak;
        assert!(
            peak < 2 * n * 4 + (64 << 10),
            "peak {peak} bytes: a temporary was written"
        );
    }
}

/// Row prologues: where the backend fuses them (every backend), a maximum or minimum of a
/// realized tensor stays pending, and a later reduction of the same rows that reads it
/// (`(x - x.max(-1, true)).exp().sum(-1)`) computes both in one kernel, reading each row once
/// on CUDA (rows staged in shared memory, the sum in the eager order) and wgpu (rows in a
/// workgroup's registers). Results equal eager ones bit for bit (on wgpu within f32 rounding of
/// the sum): rows that are staged or not, f64 and f16, NaN and signed zeros,
/// reductions over columns and over two axes, a maximum the user keeps and reads.
fn prior_reductions(dev: &Device) -> Result<()> {
    let bits = |t: Tensor| -> Result<Vec<u64>> {
        let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
        Ok(v.iter()
            .map(|x| if x.is_nan() { 1 } else { x.to_bits() })
            .collect())
    };
    let mut g = Generator::new(17);
    let mut inputs = Vec::new();
    for (shape, dtype) in [
        (vec![6, 33], DType::F32),
        (vec![3, 4100], DType::F32), // staged on CUDA (whole vectors, 16 KiB a row)
        (vec![2, 20000], DType::F32), // too long to stage: two launches
        (vec![4, 16384], DType::F32), // staged, the eager sum in two ranges (CUDA)
        (vec![5, 2048], DType::F64),
        (vec![4, 300], DType::F16),
        (vec![2, 3, 64], DType::F32),
    ] {
        inputs.push(
            Tensor::randn(shape, DType::F32, &mut g, dev)?
                .mul(3.0)?
                .to_dtype(dtype)?,
        );
    }
    // A NaN in one row and signed zeros as a row's maximum.
    let mut special = vec![0.25f32; 2 * 64];
    special[5] = f32::NAN;
    special[64..].iter_mut().for_each(|v| *v = -1.0);
    special[64 + 7] = -0.0;
    special[64 + 9] = 0.0;
    inputs.push(Tensor::from_slice(&special, [2, 64], dev)?);
    dev.flush()?;
    let softmax = |x: &Tensor| -> Result<Tensor> {
        let e = (x - &x.max(-1, true)?)?.exp()?;
        &e / &e.sum(-1, true)?
    };
    let run = |fuse: bool| -> Result<Vec<Vec<u64>>> {
        let before = dev.fusion();
        dev.set_fusion(fuse)?;
        let mut out = Vec::new();
        for x in &inputs {
            out.push(bits(softmax(x)?)?);
            let shifted = (x - &x.max(-1, true)?)?;
            out.push(bits((&shifted - &shifted.exp()?.sum(-1, true)?.log()?)?)?);
            out.push(bits((x - &x.min(-1, true)?)?.sum(-1, false)?)?);
            out.push(bits((x - &x.max(0, true)?)?.exp()?.sum(0, false)?)?);
            if x.ndim() == 3 {
                let m = x.max(vec![1, 2], true)?;
                out.push(bits((x - &m)?.exp()?.sum(vec![1, 2], false)?)?);
            }
            // Kept by the user and read after the fused kernel wrote it.
            let m = x.max(-1, true)?;
            let s = (x - &m)?.exp()?.sum(-1, false)?;
            out.push(bits(s)?);
            out.push(bits(m)?);
        }
        dev.set_fusion(before)?;
        Ok(out)
    };
    let (fused, eager) = (run(true)?, run(false)?);
    if dev.kind() == strata::BackendKind::Wgpu {
        // (A Vulkan driver may contract within a shader: docs/semantics.md.)
        for (f, e) in fused.iter().zip(&eager) {
            for (&f, &e) in f.iter().zip(e) {
                let (f, e) = (f64::from_bits(f), f64::from_bits(e));
                assert!(near(f, e), "fused {f} vs eager {e}");
            }
        }
    } else {
        for (k, (f, e)) in fused.iter().zip(&eager).enumerate() {
            assert_eq!(f, e, "result {k}: fused vs eager, bit for bit");
        }
    }

    if dev.kind() == strata::BackendKind::Cuda {
        // Many long rows: a warp a row, each row in two ranges (an H100's or H200's plan).
        let x = Tensor::randn([9000, 2048], DType::F32, &mut g, dev)?;
        let s = |fuse: bool| -> Result<Vec<u64>> {
            let before = dev.fusion();
            dev.set_fusion(fuse)?;
            let r = bits((&x - &x.max(-1, true)?)?.exp()?.sum(-1, false)?);
            dev.set_fusion(before)?;
            r
        };
        assert_eq!(s(true)?, s(false)?, "9000 rows of 2048, fused vs eager");
    }

    // One kernel for the maximum and the sum; the softmax's map is the second.
    let fuses = fusing(dev) && dev.backend().target().fuses_row_prologue;
    let x = &inputs[1];
    let (n, _) = kernels_of(dev, || {
        let s = (x - &x.max(-1, true)?)?.exp()?.sum(-1, true)?;
        s.realize()
    })?;
    // (Without prologue fusion: the max, then the fused exp-sum; eagerly four kernels.)
    let (one, two) = (fuses as usize, fusing(dev) as usize);
    assert_eq!(n, 4 - 2 * two - one, "kernels of max, then exp-sum");
    let (n, _) = kernels_of(dev, || softmax(x)?.realize())?;
    // (With a row epilogue the divide joins the sum's kernel: see `row_epilogues`.)
    let epilogue = fuses && dev.backend().target().fuses_row_epilogue;
    let want = if epilogue { 1 } else { 5 - 2 * two - one };
    assert_eq!(n, want, "softmax kernels");

    // The zero's sign and NaN of a maximum or minimum computed as a prologue, bit for bit on
    // every backend: rows whose extremum is +0 beside -0, -0 alone, and NaN.
    // (Rows of 512: on wgpu one invocation holds elements 256 apart, and WGSL's `max` of two
    // zeros may pick either.)
    let mut z = vec![-1.0f32; 4 * 512];
    z[3] = 0.0;
    z[3 + 256] = -0.0; // row 0: max +0
    z[512 + 10] = -0.0; // row 1: max -0
    z[1024 + 20] = f32::NAN; // row 2: NaN
    z[1536..].iter_mut().for_each(|v| *v = 1.0);
    z[1536 + 5] = -0.0;
    z[1536 + 5 + 256] = 0.0; // row 3: min -0
    let zt = Tensor::from_slice(&z, [4, 512], dev)?;
    for (op, want) in [
        ("max", [0.0f32, -0.0, f32::NAN, 1.0]),
        ("min", [-1.0f32, -1.0, f32::NAN, -0.0]),
    ] {
        let m = match op {
            "max" => zt.max(-1, true)?,
            _ => zt.min(-1, true)?,
        };
        let s = (&zt - &m)?.exp()?.sum(-1, false)?;
        s.realize()?;
        let got: Vec<u32> = m.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        let nan = |b: &u32| b & 0x7fff_ffff > 0x7f80_0000;
        for (r, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g == w || (nan(g) && nan(w)),
                "{op} of row {r}: {g:#x}, want {w:#x}"
            );
        }
    }

    // A deferred maximum is pending until read, runs before a write to its input, and shows
    // in `explain`.
    let a = f32s(&[1.0, 5.0, 3.0, -2.0], dev)?.reshape([2, 2])?;
    let m = a.max(-1, false)?;
    assert_eq!(m.is_pending(), fuses);
    if fuses {
        let e = m.explain()?;
        assert_eq!(e.kernels.len(), 1);
        assert_eq!(e.kernels[0].ops, vec!["max"]);
        assert!(e.kernels[0].expression.contains("max(in0)"), "{e}");
    }
    a.add_(10.0)?;
    assert_eq!(
        m.to_vec::<f32>()?,
        vec![5.0, 3.0],
        "the old values' maximum"
    );
    let m = a.max(-1, true)?;
    let view = m.t()?; // a view of it, read by a map: it runs first
    assert_eq!((&view * 2.0)?.to_vec::<f32>()?, vec![30.0, 26.0]);
    let m = a.min(Axes::All, false)?;
    assert_eq!(m.item::<f32>()?, 8.0);
    // Read on another stream: it runs on its own, ordered by events.
    let s1 = dev.new_stream()?;
    let m = a.max(-1, true)?;
    let s = dev.with_stream(&s1, || (&a - &m)?.sum(-1, false))??;
    assert_eq!(s.to_vec::<f32>()?, vec![-4.0, -5.0]);
    Ok(())
}
test_device!(
    prior_reductions_run_in_the_reduction_that_reads_them,
    prior_reductions
);

/// Row epilogues: where the backend fuses them (every backend), a sum of a tree that takes in a
/// deferred maximum stays pending too, and elementwise work over the same rows that reads it
/// (`e / e.sum(-1, true)`: softmax from its primitives; a further input laid out like the
/// rows) runs in its kernel last: one kernel, each row read once on CUDA and wgpu where it
/// stages. Results equal eager ones bit for bit (CPU, CUDA), the intermediates the user keeps
/// read right afterwards, a write into the input after the work was recorded does not reach
/// it, a weight broadcast along the rows (one value per position in a row) is read by the
/// epilogue too, and work it cannot take (another stream) runs as before.
fn row_epilogues(dev: &Device) -> Result<()> {
    let mut g = Generator::new(23);
    let mut cases = Vec::new();
    for (shape, dtype) in [
        (vec![5, 40], DType::F32),
        (vec![3, 4096], DType::F32), // staged on CUDA; whole vectors on wgpu
        (vec![3, 4100], DType::F32), // vectors, the last of each invocation's not all there
        (vec![2, 20000], DType::F32), // too long to stage: core's launches
        // A warp a row in the eager plan (CUDA: each warp stages its own rows): many rows a
        // block in 8-byte vectors, and two rows split into ranges.
        (vec![300, 1002], DType::F32),
        (vec![2, 1000], DType::F32),
        (vec![4, 512], DType::F64),
        (vec![3, 256], DType::F16),
        (vec![2, 3, 64], DType::F32),
    ] {
        let x = Tensor::randn(shape.clone(), DType::F32, &mut g, dev)?
            .mul(4.0)?
            .to_dtype(dtype)?;
        let z = Tensor::randn(shape, DType::F32, &mut g, dev)?.to_dtype(dtype)?;
        cases.push((x, z));
    }
    dev.flush()?;
    assert_fused_matches_eager(dev, || {
        let mut out = Vec::new();
        for (x, z) in &cases {
            // Softmax from its primitives, the intermediates kept and read after.
            let m = x.max(-1, true)?;
            let e = (x - &m)?.exp()?;
            let s = e.sum(-1, true)?;
            let y = (&e / &s)?;
            out.push(bits(&y)?);
            out.push(bits(&s)?);
            out.push(bits(&m)?);
            out.push(bits(&e)?);
            // Log-softmax from its primitives; a further input laid out like the rows.
            let shifted = (x - &x.max(-1, true)?)?;
            let ls = (&shifted - &shifted.exp()?.sum(-1, true)?.log()?)?;
            out.push(bits(&ls)?);
            let m = x.max(-1, true)?;
            let e = (x - &m)?.exp()?;
            let w = (&(&e / &e.sum(-1, true)?)? * z)?;
            out.push(bits(&w)?);
            // A weight broadcast along the rows: the epilogue reads it at the row's positions.
            let row = z.narrow(0, 0, 1)?;
            let e = (x - &x.max(-1, true)?)?.exp()?;
            out.push(bits(&((&e / &e.sum(-1, true)?)? * &row)?)?);
            // A numerator that overflows to ±inf (or is NaN at a zero weight): the quotient's
            // infinities as the division gives them.
            let big = z.mul(3e38)?.mul(10.0)?;
            let e = (x - &x.max(-1, true)?)?.exp()?;
            out.push(bits(&(&(&e * &big)? / &e.sum(-1, true)?)?)?);
        }
        Ok(out)
    })?;
    let epilogue = fusing(dev) && dev.backend().target().fuses_row_epilogue;
    let x = &cases[1].0;
    // One kernel for softmax and log-softmax from their primitives.
    let (n, written) = kernels_of(dev, || {
        let e = (x - &x.max(-1, true)?)?.exp()?;
        (&e / &e.sum(-1, true)?)?.realize()
    })?;
    if epilogue {
        assert_eq!(n, 1, "softmax from primitives: one kernel");
        // The output, the sums and the maxima; nothing else.
        assert_eq!(written, (x.numel() + 2 * 3) as u64 * 4, "bytes written");
    }
    if epilogue {
        // (Log-softmax from its primitives reads `log(s)`, a tree of its own over the rows'
        // sums, through a broadcast: it runs before the difference, as without epilogues.)
        // A sum read on its own runs as the fused reduction it was (max, then sum).
        let (n, _) = kernels_of(dev, || {
            let s = (x - &x.max(-1, true)?)?.exp()?.sum(-1, true)?;
            assert!(s.is_pending());
            s.realize()
        })?;
        assert_eq!(n, 1, "the deferred sum alone");
        // Softmax times a weight broadcast along the rows: still one kernel.
        let w = cases[1].1.narrow(0, 0, 1)?;
        let (n, _) = kernels_of(dev, || {
            let e = (x - &x.max(-1, true)?)?.exp()?;
            (&(&e / &e.sum(-1, true)?)? * &w)?.realize()
        })?;
        assert_eq!(n, 1, "softmax times a weight a position");
    }
    // `explain` shows the one kernel without running anything.
    let e = (x - &x.max(-1, true)?)?.exp()?;
    let y = (&e / &e.sum(-1, true)?)?;
    let allocated = dev.memory_stats().allocated;
    let report = y.explain()?;
    assert_eq!(dev.memory_stats().allocated, allocated, "explain allocated");
    assert!(y.is_pending() || !fusing(dev));
    if epilogue {
        assert_eq!(report.kernels.len(), 1, "{report}");
        let k = &report.kernels[0];
        assert_eq!(k.ops.first().map(String::as_str), Some("sum"), "{report}");
        assert!(k.ops.iter().any(|o| o == "div"), "{report}");
        assert!(k.expression.contains("row epilogue"), "{report}");
        assert_eq!(k.output.shape, x.shape().to_vec(), "{report}");
    }
    drop((e, y));
    // A write into the input after the work was recorded: the work sees the old values.
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0], [2, 4], dev)?;
    let e = (&a - &a.max(-1, true)?)?.exp()?;
    let y = (&e / &e.sum(-1, true)?)?;
    a.mul_(0.0)?;
    let got = y.to_vec::<f32>()?;
    let z: f32 = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .map(|v| (v - 4.0).exp())
        .sum();
    for (k, v) in [1.0f32, 2.0, 3.0, 4.0].iter().enumerate() {
        assert!((got[k] - (v - 4.0).exp() / z).abs() < 1e-6, "{got:?}");
    }
    assert_eq!(&got[4..], &[0.25; 4]);
    // The divide recorded on another stream: ordered by events, the same numbers.
    let s1 = dev.new_stream()?;
    let b = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0], [1, 4], dev)?;
    let e = (&b - &b.max(-1, true)?)?.exp()?;
    let s = e.sum(-1, true)?;
    let y = dev.with_stream(&s1, || &e / &s)??;
    let sum: f32 = y.to_vec::<f32>()?.iter().sum();
    assert!((sum - 1.0).abs() < 1e-6, "{sum}");
    Ok(())
}
test_device!(row_epilogues_run_in_the_reduction_they_read, row_epilogues);

/// Row epilogues without a prologue: where the backend stages rows for one on its own
/// (`stages_row_epilogue_alone`: CUDA), a sum of a tree over the trailing axes whose rows fit
/// stays pending, and elementwise work over the same rows that reads it runs in its kernel
/// last (softmax's backward, `y·(g − Σ g·y)`: one kernel). Results equal eager ones bit for
/// bit (CPU, CUDA), for rows that stage and rows that do not (too long, not whole vectors,
/// f64, f16), with a pending input spliced into both, the sum read on its own, work over
/// a weight broadcast along the rows (read by the sum's map too: that map runs first), and a
/// layer norm from its primitives with a weight and a bias broadcast along the rows (the
/// epilogue reads them at the row's positions: one kernel after the mean's).
fn row_epilogues_alone(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(29);
    let mut cases = Vec::new();
    for (shape, dtype) in [
        (vec![5, 40], DType::F32),
        (vec![3, 4096], DType::F32),
        (vec![3, 4102], DType::F32),
        (vec![2, 20000], DType::F32),
        // The eager sum in two ranges of a block's lanes (CUDA), whole multiples of the
        // block's vectors or not.
        (vec![4, 16384], DType::F32),
        (vec![2, 10000], DType::F32),
        // A warp a row (CUDA: each warp its own rows), in 8-byte vectors, or in ranges.
        (vec![300, 1002], DType::F32),
        (vec![2, 1000], DType::F32),
        (vec![4, 512], DType::F64),
        (vec![3, 256], DType::F16),
        (vec![2, 3, 64], DType::F32),
    ] {
        let y = Tensor::rand(shape.clone(), DType::F32, &mut gen, dev)?.to_dtype(dtype)?;
        let g = Tensor::randn(shape, DType::F32, &mut gen, dev)?.to_dtype(dtype)?;
        cases.push((y, g));
    }
    dev.flush()?;
    // Sums of up to 20,000 products: where a Vulkan driver contracts the fused map's product
    // into the sum (an fma), each term rounds differently from the stored product's, and the
    // sum's error grows with the row (NVIDIA's: 2·10⁻⁵ of a 10,000-long row's result).
    assert_fused_matches_eager_within(dev, 1e-4, || {
        let mut out = Vec::new();
        for (y, g) in &cases {
            // Softmax's backward, the sum kept and read after.
            let s = (y * g)?.sum(-1, true)?;
            out.push(bits(&(y * &(g - &s)?)?)?);
            out.push(bits(&s)?);
            // A pending gradient, spliced into the sum's map and into the epilogue.
            let g2 = (g * 2.0)?;
            let s = (&g2 * y)?.sum(-1, true)?;
            out.push(bits(&(y * &(&g2 - &s)?)?)?);
            // The sum on its own.
            out.push(bits(&(y * g)?.sum(-1, true)?)?);
            // A weight broadcast along the rows: the work runs as its own map.
            let row = g.narrow(0, 0, 1)?;
            let s = (y * &row)?.sum(-1, true)?;
            out.push(bits(&(y * &(&row - &s)?)?)?);
            let (xc, v, ln) = layer_norm_parts(y, &row, &row.neg()?)?;
            out.push(bits(&ln)?);
            out.push(bits(&v)?);
            out.push(bits(&xc)?);
        }
        Ok(out)
    })?;
    let (y, g) = &cases[1];
    let s = (y * g)?.sum(-1, true)?;
    let target = dev.backend().target();
    let alone = fusing(dev) && target.stages_row_epilogue_alone;
    // (Kept pending too where a kernel may store the tree as it reduces it.)
    assert_eq!(
        s.is_pending(),
        alone || fusing(dev) && target.stores_reduce_map
    );
    drop(s);
    let (n, written) = kernels_of(dev, || {
        let s = (y * g)?.sum(-1, true)?;
        (y * &(g - &s)?)?.realize()
    })?;
    if alone {
        assert_eq!(n, 1, "softmax's backward: one kernel");
        // The output and the sums; nothing else.
        assert_eq!(written, (y.numel() + 3) as u64 * 4, "bytes written");
    }
    // A layer norm: one kernel (the mean's sum as the prologue where the backend adds it in
    // the eager order; the variance's sum; the normalized rows scaled by the weight and
    // shifted by the bias), or the mean's sum and one kernel for the rest. Over rows the eager
    // plan gives a block (case 1) and a warp each (case 6, in 8-byte vectors; CUDA: each warp
    // of a block its own rows).
    for (case, shape) in [(1, [3, 4096]), (6, [300, 1002])] {
        let (y, g) = &cases[case];
        assert_eq!(y.shape(), &shape);
        let (w, b) = (g.narrow(0, 0, 1)?, g.narrow(0, 1, 1)?);
        let (n, written) = kernels_of(dev, || layer_norm_parts(y, &w, &b)?.2.realize())?;
        if alone {
            let want = if target.fuses_sum_prologue { 1 } else { 2 };
            assert_eq!(n, want, "a layer norm from its primitives over {shape:?}");
            let stats = 2 * shape[0];
            assert_eq!(written, (y.numel() + stats) as u64 * 4, "bytes written");
        }
    }
    Ok(())
}

/// A layer norm over the last axis of `x` from its primitives, with `w` and `b` broadcast
/// along the rows: the centred rows, the variance and the result.
fn layer_norm_parts(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let n = x.shape()[x.ndim() - 1] as f64;
    let mean = x.sum(-1, true)?.div(n)?;
    let xc = (x - &mean)?;
    let var = (&xc * &xc)?.sum(-1, true)?.div(n)?;
    let y = (&(&xc * &var.add(1e-5)?.rsqrt()?)? * w)?.add(b)?;
    Ok((xc, var, y))
}
test_device!(row_epilogues_run_without_a_prologue, row_epilogues_alone);

/// A reduction of a pending tree that is then read itself (a bias's gradient: the column sum
/// of the gradient a matmul reads next) runs in one kernel that reduces the tree and stores
/// it, where the backend stores a reduction's map (not wgpu): on a read of the tree, at a
/// flush, and not when the reduction is read first (it runs alone, the tree stays pending).
/// Results equal eager ones bit for bit (CPU, CUDA): over a strided axis (a thread a column,
/// or neighbouring columns together), the last axis (vectors and their tail), every axis
/// (split ranges), for f32, f64 and f16 trees, an f32 tree of f16 leaves and leaves read
/// transposed (whose reductions run at once, as before: they would plan otherwise over the
/// stored tree).
fn stored_maps(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(41);
    let mut cases = Vec::new();
    for (shape, leaf, tree) in [
        (vec![37, 70], DType::F32, DType::F32),
        (vec![4099, 3], DType::F32, DType::F32),
        (vec![64, 1030], DType::F32, DType::F32),
        // Columns a thread walks four at a time (CUDA), in one range and in several.
        (vec![100, 256], DType::F32, DType::F32),
        (vec![3000, 64], DType::F32, DType::F32),
        (vec![5, 6, 8], DType::F32, DType::F32),
        (vec![5, 6, 7], DType::F64, DType::F64),
        (vec![33, 40], DType::F16, DType::F16),
        (vec![33, 40], DType::F16, DType::F32),
    ] {
        let da = Tensor::randn(shape.clone(), DType::F32, &mut gen, dev)?.to_dtype(leaf)?;
        let h = Tensor::randn(shape, DType::F32, &mut gen, dev)?.to_dtype(leaf)?;
        cases.push((da, h, tree));
    }
    dev.flush()?;
    // A gradient-like tree: `da · tanh(h) + 0.5`, in the tree's dtype.
    let tree = |da: &Tensor, h: &Tensor, d: DType| -> Result<Tensor> {
        (&da.to_dtype(d)? * &h.tanh()?.to_dtype(d)?)?.add(0.5)
    };
    assert_fused_matches_eager(dev, || {
        let mut out = Vec::new();
        for (da, h, d) in &cases {
            // The tree read after its column sum, after its row sums, after its total.
            for axes in [Axes::from(0), Axes::from(-1), Axes::All] {
                let t = tree(da, h, *d)?;
                let s = t.sum(axes, false)?;
                out.push(bits(&t)?);
                out.push(bits(&s)?);
            }
            // At a flush; the reduction read first; leaves read transposed.
            let t = tree(da, h, *d)?;
            let s = t.mean(0, true)?;
            dev.flush()?;
            out.push(bits(&s)?);
            out.push(bits(&t)?);
            let t = tree(da, h, *d)?;
            let s = t.sum(0, false)?;
            out.push(bits(&s)?);
            out.push(bits(&t)?);
            if da.ndim() == 2 {
                let t = tree(&da.t()?, &h.t()?, *d)?;
                let s = t.sum(0, false)?;
                out.push(bits(&t)?);
                out.push(bits(&s)?);
            }
        }
        Ok(out)
    })?;
    // One kernel fewer when the tree is read after its reduction than before it.
    let stores = fusing(dev) && dev.backend().target().stores_reduce_map;
    let (da, h, _) = &cases[0];
    let count = |tree_first: bool| {
        kernels_of(dev, || {
            let t = tree(da, h, DType::F32)?;
            let s = t.sum(0, false)?;
            if tree_first {
                t.realize()?;
                assert!(
                    !stores || !s.is_pending(),
                    "the reduction ran with the tree"
                );
                s.realize()
            } else {
                s.realize()?;
                assert!(!fusing(dev) || t.is_pending(), "the tree is left pending");
                t.realize()
            }
        })
    };
    let ((joint, _), (apart, _)) = (count(true)?, count(false)?);
    assert_eq!(
        apart - joint,
        usize::from(stores),
        "{joint} vs {apart} kernels"
    );
    // `explain` on the tree shows the one kernel a read of it will run.
    let t = tree(da, h, DType::F32)?;
    let s = t.sum(0, false)?;
    if stores {
        let e = t.explain()?;
        assert_eq!(e.kernels.len(), 1, "{e:?}");
        assert!(e.kernels[0].expression.contains("stores the tree"), "{e:?}");
        assert_eq!(e.kernels[0].ops[0], "sum", "{e:?}");
    }
    t.realize()?;
    assert!(!stores || !s.is_pending());
    Ok(())
}
test_device!(reductions_store_the_tree_they_reduce, stored_maps);

/// A reduction's map reads operands that hold one value per position along its reduced axes:
/// a row sum of `g·γ` (γ broadcast along the rows), a column sum of `g·(x − mean)·rstd` (the
/// per-row statistics broadcast along the columns: a layer norm's `dγ`), over two reduced
/// axes, an order-free maximum, and a column sum whose tree is read after it (stored as it is
/// reduced). Each runs as one kernel where the backend fuses maps into reductions, equal to
/// the eager launches bit for bit (CPU, CUDA; wgpu within f32 rounding).
fn position_operands(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(43);
    let mut cases = Vec::new();
    // A row a thread, a warp's and a block's rows (vectors and tails), rows of odd length.
    for shape in [[6usize, 33], [300, 1002], [7, 4096], [1030, 64], [5, 3]] {
        let [rows, cols] = shape;
        let x = Tensor::randn(shape, DType::F32, &mut gen, dev)?;
        let g = Tensor::randn(shape, DType::F32, &mut gen, dev)?;
        let w = Tensor::randn([cols], DType::F32, &mut gen, dev)?;
        let mean = Tensor::randn([rows, 1], DType::F32, &mut gen, dev)?;
        let rstd = Tensor::rand([rows, 1], DType::F32, &mut gen, dev)?;
        cases.push((x, g, w, mean, rstd));
    }
    let x3 = Tensor::randn([4, 5, 6], DType::F32, &mut gen, dev)?;
    let m3 = Tensor::randn([4, 5, 1], DType::F32, &mut gen, dev)?;
    dev.flush()?;
    assert_fused_matches_eager(dev, || {
        let mut out = Vec::new();
        for (x, g, w, mean, rstd) in &cases {
            out.push(bits(&(g * w)?.sum(-1, true)?)?);
            let xhat = (&(x - mean)? * rstd)?;
            out.push(bits(&(g * &xhat)?.sum(0, false)?)?);
            out.push(bits(&(&(x - mean)? * w)?.abs()?.max(-1, false)?)?);
            // Read after its column sum: stored as it is reduced, where the backend does.
            let t = (&(g * &(x - mean)?)? * rstd)?;
            let s = t.sum(0, false)?;
            out.push(bits(&s)?);
            out.push(bits(&t)?);
        }
        out.push(bits(&(&x3 * &m3)?.sum(vec![0, 1], false)?)?);
        Ok(out)
    })?;
    if fusing(dev) && dev.backend().target().fuses_map_into_reduce {
        // As many kernels as the reduction of a stored tensor (a split column sum: its
        // ranges and their combine), none for the map.
        let (x, g, w, mean, rstd) = &cases[1];
        let (n, _) = kernels_of(dev, || (g * w)?.sum(-1, true)?.realize())?;
        let (plain, _) = kernels_of(dev, || g.sum(-1, true)?.realize())?;
        assert_eq!(n, plain, "a row sum of g·γ");
        let (n, _) = kernels_of(dev, || {
            (g * &(&(x - mean)? * rstd)?)?.sum(0, false)?.realize()
        })?;
        let (plain, _) = kernels_of(dev, || g.sum(0, false)?.realize())?;
        assert_eq!(n, plain, "a column sum of g·x̂");
    }
    Ok(())
}
test_device!(reduction_maps_read_values_per_position, position_operands);

/// `t.assign(tree)` of a pending tree nothing else holds computes the tree straight into `t`:
/// one kernel, where the tree ran and then a copy. The tree may read `t` itself (a running
/// statistic's update), through another view (read from a copy of the old values), and keep
/// an intermediate someone holds (it runs first, on the old values); a tree someone else
/// holds runs as before. Every result equals the eager one.
fn assign_of_a_tree(dev: &Device) -> Result<()> {
    let mut gen = Generator::new(47);
    let a = Tensor::randn([5, 5], DType::F32, &mut gen, dev)?;
    let b = Tensor::randn([5, 5], DType::F32, &mut gen, dev)?;
    dev.flush()?;
    assert_fused_matches_eager(dev, || {
        let mut out = Vec::new();
        let r = a.copy()?;
        let new = r.mul(0.9)?.add(&b.mul(0.1)?)?;
        r.assign(new)?;
        out.push(bits(&r)?);
        let new = r.t()?.mul(2.0)?;
        r.assign(new)?;
        out.push(bits(&r)?);
        let held = r.mul(3.0)?;
        let new = held.add(1.0)?;
        r.assign(new)?;
        out.push(bits(&r)?);
        out.push(bits(&held)?);
        let kept = r.sub(&b)?;
        r.assign(kept.clone())?;
        out.push(bits(&r)?);
        out.push(bits(&kept)?);
        let half = Tensor::zeros([5, 5], DType::F16, dev)?;
        half.assign(r.exp()?.add(&b)?)?;
        out.push(bits(&half)?);
        Ok(out)
    })?;
    let r = a.copy()?;
    r.realize()?;
    let (n, _) = kernels_of(dev, || {
        let new = r.mul(0.9)?.add(&b.mul(0.1)?)?;
        r.assign(new)
    })?;
    assert_eq!(
        n,
        if fusing(dev) { 1 } else { 4 },
        "kernels of an assigned tree"
    );
    Ok(())
}
test_device!(assign_computes_a_tree_in_place, assign_of_a_tree);

/// `run`'s results with fusion on, then off (the setting restored after each), equal
/// ([`assert_rows_match`]).
fn assert_fused_matches_eager(dev: &Device, run: impl Fn() -> Result<Vec<Vec<u64>>>) -> Result<()> {
    assert_fused_matches_eager_within(dev, 1e-5, run)
}

/// [`assert_fused_matches_eager`], on wgpu within `tol` relative ([`near_within`]).
fn assert_fused_matches_eager_within(
    dev: &Device,
    tol: f64,
    run: impl Fn() -> Result<Vec<Vec<u64>>>,
) -> Result<()> {
    let before = dev.fusion();
    let mut results = Vec::with_capacity(2);
    for fuse in [true, false] {
        dev.set_fusion(fuse)?;
        let out = run();
        dev.set_fusion(before)?;
        results.push(out?);
    }
    assert_rows_match(dev, tol, &results[0], &results[1]);
    Ok(())
}

/// A float tensor's elements as f64 bits (f16 and f32 widen exactly; every NaN is 1).
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    let v = t.to_dtype(DType::F64)?.to_vec::<f64>()?;
    Ok(v.iter()
        .map(|x| if x.is_nan() { 1 } else { x.to_bits() })
        .collect())
}

/// Fused results against eager ones (each a [`bits`] list): bit for bit, or on wgpu within
/// `tol` ([`near_within`]).
fn assert_rows_match(dev: &Device, tol: f64, fused: &[Vec<u64>], eager: &[Vec<u64>]) {
    for (k, (f, e)) in fused.iter().zip(eager).enumerate() {
        if dev.kind() == strata::BackendKind::Wgpu {
            for (&f, &e) in f.iter().zip(e) {
                let (f, e) = (f64::from_bits(f), f64::from_bits(e));
                assert!(near_within(f, e, tol), "result {k}: {f} fused, {e} eager");
            }
        } else {
            assert_eq!(f, e, "result {k}: fused vs eager, bit for bit");
        }
    }
}

/// Fused against eager where a Vulkan driver may contract within a shader (docs/semantics.md):
/// equal, both NaN, or both finite within 1e-5 relative (an infinity matches only itself).
fn near(f: f64, e: f64) -> bool {
    near_within(f, e, 1e-5)
}

/// [`near`] within `tol` relative.
fn near_within(f: f64, e: f64, tol: f64) -> bool {
    f == e
        || (f.is_nan() && e.is_nan())
        || (f.is_finite() && e.is_finite() && (f - e).abs() <= tol * e.abs().max(1.0))
}
