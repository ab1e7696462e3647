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
        assert_eq!(
            y.add(1.0)?.sum(strata::ops::Axes::All, false).unwrap_err(),
            e
        );
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
