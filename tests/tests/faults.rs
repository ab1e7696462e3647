//! The failure model (docs/semantics.md): an allocation, compile or launch failure injected
//! into deferred (fused) work and into an op that runs at once, on every backend. The error
//! keeps its kind and values, deferred work names its op and the line that called it, a failed
//! launch leaves its tensor failing the same way, an allocation failure leaves the work to run
//! at the next read, and the device and every other tensor keep working.

use strata::fault::Fault;
use strata::prelude::*;
use strata_tests::test_device;

fn deferred_faults(dev: &Device) -> Result<()> {
    let a = Tensor::arange(0, 8, 1, DType::F32, dev)?;
    let want: Vec<f32> = (0..8).map(|i| i as f32 * 2.0 + 1.0).collect();
    if !dev.fusion() || dev.blocking() {
        // Every op runs at once: each fault is the op's own error.
        dev.inject_fault(Fault::Allocation);
        let e = a.mul(2.0).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { requested: 32, .. }), "{e}");
        for fault in [Fault::Compile, Fault::Launch] {
            dev.inject_fault(fault);
            let e = a.mul(2.0).unwrap_err();
            assert!(matches!(e, Error::Backend(_)), "{e}");
        }
        assert_eq!(a.mul(2.0)?.add(1.0)?.to_vec::<f32>()?, want);
        return Ok(());
    }
    // Out of memory when a read runs the chain: `OutOfMemory` with the size, for the chain's
    // last op and this file's line; the chain stays pending and the next read runs it.
    let y = a.mul(2.0)?.add(1.0)?;
    dev.inject_fault(Fault::Allocation);
    let e = y.to_vec::<f32>().unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { requested: 32, .. }), "{e}");
    let m = e.to_string();
    assert!(m.contains("`add`") && m.contains("faults.rs:"), "{m}");
    assert_eq!(y.to_vec::<f32>()?, want);
    // A compile or launch failure: the backend's error, naming the op and the line, returned
    // again by every use of the tensor (its memory holds nothing valid) and by what reads it;
    // other tensors, the inputs and new chains are unaffected.
    for (fault, says) in [(Fault::Compile, "compile"), (Fault::Launch, "launch")] {
        let y = a.mul(2.0)?.exp()?;
        dev.inject_fault(fault);
        let e = y.realize().unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Error::Backend(_)), "{m}");
        assert!(
            m.contains(says) && m.contains("`exp`") && m.contains("faults.rs:"),
            "{m}"
        );
        assert_eq!(y.to_vec::<f32>().unwrap_err(), e);
        // (A reduction of the pending `y + 1` is deferred too: its read fails, naming it.)
        let sum = y.add(1.0)?.sum(strata::ops::Axes::All, false);
        let e2 = sum.and_then(|s| s.realize()).unwrap_err();
        let m2 = e2.to_string();
        assert!(matches!(e2, Error::Backend(_)), "{m2}");
        assert!(m2.contains(says) && m2.contains("`exp`"), "{m2}");
        assert_eq!(a.to_vec::<f32>()?[7], 7.0);
        assert_eq!(a.mul(2.0)?.add(1.0)?.to_vec::<f32>()?, want);
    }
    // An op that runs at once (a matmul) gets its own allocation's error.
    let m2 = a.reshape([2, 4])?;
    dev.inject_fault(Fault::Allocation);
    let e = m2.matmul(&m2.t()?).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { requested: 16, .. }), "{e}");
    assert_eq!(
        m2.matmul(&m2.t()?)?.to_vec::<f32>()?,
        vec![14., 38., 38., 126.]
    );
    Ok(())
}
test_device!(injected_faults_keep_their_kind, deferred_faults);

/// Out of memory in the middle of work: with the device filled up to a memory limit (or, with
/// `STRATA_TEST_FILL_DEVICE=1`, filled for real: the GPU machine's run), a fused chain, a
/// matmul, a training step (forward, backward, AdamW) and, on CUDA, a pinned upload each give
/// `Err(OutOfMemory)` and leave what they would have written unchanged; with the filler
/// dropped, the same calls succeed.
fn out_of_memory_midway(dev: &Device) -> Result<()> {
    use strata::nn::{AdamW, Optimizer};
    let mut g = strata::random::Generator::new(4);
    let x = Tensor::randn([64, 32], DType::F32, &mut g, dev)?;
    let w = Tensor::randn([32, 16], DType::F32, &mut g, dev)?.requires_grad_(true)?;
    let w_before = w.to_vec::<f32>()?;
    let mut opt = AdamW::new([w.clone()], 1e-2)?;
    let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let pinned = match dev.pinned_host() {
        Ok(p) => Some(Tensor::from_slice(&host, [4096], &p)?),
        Err(_) => None,
    };
    dev.synchronize()?;
    // Fill up to the limit: large blocks, then smaller ones, until not even 4 bytes fit.
    let for_real = std::env::var("STRATA_TEST_FILL_DEVICE").is_ok_and(|v| v == "1");
    if !for_real {
        dev.set_memory_limit(Some(dev.memory_stats().allocated + (4 << 20)));
    }
    let mut filler = Vec::new();
    for elements in [1 << 28, 1 << 20, 1 << 14, 1 << 10, 64, 1] {
        let refused = loop {
            match Tensor::empty([elements], DType::F32, dev) {
                Ok(t) => filler.push(t),
                Err(e) => break e,
            }
            assert!(filler.len() < 1 << 14, "the memory limit never refused");
        };
        assert!(matches!(refused, Error::OutOfMemory { .. }), "{refused}");
    }
    let step = |opt: &mut AdamW| -> Result<()> {
        let loss = x.matmul(&w)?.relu()?.sum(strata::ops::Axes::All, false)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        Ok(())
    };
    let oom = |r: Result<()>, what: &str| match r {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("{what}: expected OutOfMemory, got {other:?}"),
    };
    oom(
        x.mul(2.0)
            .and_then(|t| t.add(1.0))
            .and_then(|t| t.realize()),
        "a fused chain",
    );
    oom(x.matmul(&x.t()?).map(|_| ()), "a matmul");
    oom(step(&mut opt), "a training step");
    if let Some(p) = &pinned {
        oom(p.to_device(dev).map(|_| ()), "a pinned upload");
    }
    dev.set_memory_limit(None);
    drop(filler);
    opt.zero_grad();
    assert_eq!(
        w.to_vec::<f32>()?,
        w_before,
        "a failed step changed the parameters"
    );
    assert_eq!(opt.steps(0), 0);
    // Room again: the same calls succeed.
    assert_eq!(x.mul(2.0)?.add(1.0)?.shape(), &[64, 32]);
    assert_eq!(x.matmul(&x.t()?)?.shape(), &[64, 64]);
    step(&mut opt)?;
    assert_ne!(w.to_vec::<f32>()?, w_before);
    if let Some(p) = &pinned {
        assert_eq!(p.to_device(dev)?.to_vec::<f32>()?, host);
    }
    Ok(())
}
test_device!(
    out_of_memory_midway_leaves_no_half_writes,
    out_of_memory_midway
);
