//! Tensors and devices used from several threads: the handles are `Send + Sync`; eight
//! threads running mixed work on one device, on the default stream or each on its own, with
//! fusion on and off, get what one thread gets; a thread that panics between ops leaves no
//! lock that breaks the others; a watchdog turns a deadlock into a failure.

use std::sync::mpsc;
use std::time::Duration;
use strata::prelude::*;
use strata::random::Generator;
use strata_tests::test_device;

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tensor>();
    send_sync::<Device>();
    send_sync::<strata::device::Stream>();
    send_sync::<strata::device::Event>();
}

/// One thread's work from seed `k`: a matmul, a fused chain, a reduction, a gather, a view
/// made contiguous, an in-place write, a softmax, a random draw; its values on the host.
fn work(dev: &Device, k: u64) -> Result<Vec<f32>> {
    let mut g = Generator::new(k);
    let a = Tensor::randn([64, 32], DType::F32, &mut g, dev)?;
    let b = Tensor::randn([32, 16], DType::F32, &mut g, dev)?;
    let h = a.matmul(&b)?.relu()?.mul(0.5)?.add(1.0)?;
    let s = h.sum(1, false)?;
    let idx = Tensor::from_slice(&[3i64, 0, 63, 7], [4], dev)?;
    let t = h.index_select(0, &idx)?.t()?.contiguous()?;
    t.mul_(2.0)?;
    let sm = t.softmax(-1)?;
    let mut out = s.to_vec::<f32>()?;
    out.extend(sm.to_vec::<f32>()?);
    out.extend(Tensor::rand([8], DType::F32, &mut g, dev)?.to_vec::<f32>()?);
    Ok(out)
}

/// `work` for seeds 0..8, each on its own thread (on a new stream of its own with
/// `streams`), within a minute.
fn on_threads(dev: &Device, streams: bool) -> Result<Vec<Vec<f32>>> {
    let (send, results) = mpsc::channel();
    for k in 0..8u64 {
        let (dev, send) = (dev.clone(), send.clone());
        std::thread::spawn(move || {
            let run = || -> Result<Vec<f32>> {
                if streams {
                    let s = dev.new_stream()?;
                    let got = dev.with_stream(&s, || {
                        assert_eq!(dev.current_stream(), s, "another thread's stream");
                        work(&dev, k)
                    })??;
                    s.synchronize()?;
                    Ok(got)
                } else {
                    work(&dev, k)
                }
            };
            let _ = send.send((k, run()));
        });
    }
    let mut got = vec![Vec::new(); 8];
    for _ in 0..8 {
        let (k, r) = results
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread did not finish within two minutes (deadlock?)");
        got[k as usize] = r?;
    }
    Ok(got)
}

fn threads(dev: &Device) -> Result<()> {
    let want: Vec<Vec<f32>> = (0..8).map(|k| work(dev, k)).collect::<Result<_>>()?;
    let fusion = dev.fusion();
    for fused in [true, false] {
        dev.set_fusion(fused)?;
        // Three rounds of each: a race shows in some rounds only.
        for streams in [false, true, false, true, false, true] {
            let got = on_threads(dev, streams)?;
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let close = g.len() == w.len()
                    && g.iter()
                        .zip(w)
                        .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
                let first = g
                    .iter()
                    .zip(w)
                    .position(|(a, b)| (a - b).abs() > 1e-5 * b.abs().max(1.0));
                assert!(
                    close,
                    "thread {k} (fusion {fused}, streams {streams}) differs at {first:?} of {}: {:?} vs {:?}",
                    w.len(),
                    first.map(|i| g[i]),
                    first.map(|i| w[i])
                );
            }
        }
    }
    dev.set_fusion(fusion)?;
    // A thread that panics with pending work of its own: the device and its locks serve the
    // others afterwards.
    let d = dev.clone();
    let panicked = std::thread::spawn(move || {
        let t = Tensor::ones([16], DType::F32, &d).and_then(|t| t.exp());
        let _pending = t.expect("ones and exp");
        panic!("a user's panic between ops");
    })
    .join();
    assert!(panicked.is_err());
    assert_eq!(on_threads(dev, true)?, on_threads(dev, false)?);
    assert_eq!(dev.current_stream(), dev.default_stream());
    Ok(())
}
test_device!(eight_threads_equal_one, threads);
