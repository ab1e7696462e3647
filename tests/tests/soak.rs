//! A soak: cycles of mixed work (fused chains, reductions, views, in-place writes, index ops,
//! matmul, random draws, host reads, streams and events, pinned copies where the device has
//! them, DLPack round trips, a training step), after each of which the device's `allocated`
//! memory is back at its baseline and `reserved` stays bounded. `STRATA_SOAK_CYCLES` sets the
//! count (200 by default, for CI; the GPU machine runs 10^5).

use strata::prelude::*;
use strata::random::Generator;
use strata_tests::test_device;

/// One cycle of mixed work from seed `k`; returns a value read back, so nothing is skipped.
fn cycle(dev: &Device, k: u64, stream: &strata::device::Stream) -> Result<f32> {
    let mut g = Generator::new(k);
    let a = Tensor::randn([48, 40], DType::F32, &mut g, dev)?;
    let b = Tensor::rand([40, 24], DType::F32, &mut g, dev)?;
    let h = a.matmul(&b)?.gelu()?.mul(0.5)?.add(&a.narrow(1, 0, 24)?)?;
    let rows = h.sum(1, true)?;
    let v = h.t()?.slice(s![..;-1, ..])?.contiguous()?;
    v.mul_(2.0)?;
    let idx = Tensor::randint(0, 24, [16], DType::I64, &mut g, dev)?;
    let picked = v.index_select(0, &idx)?;
    let scattered = Tensor::zeros([24, 48], DType::F32, dev)?;
    scattered.index_put_(0, &idx, &picked, true)?;
    let sm = dev.with_stream(stream, || scattered.softmax(-1))??;
    let done = stream.record_event()?;
    dev.current_stream().wait_event(&done)?;
    let w = Tensor::randn([48, 4], DType::F32, &mut g, dev)?.requires_grad_(true)?;
    let loss = sm.matmul(&w)?.relu()?.mean(strata::ops::Axes::All, false)?;
    loss.backward()?;
    let gsum = w
        .grad()
        .expect("a gradient")
        .sum(strata::ops::Axes::All, false)?;
    // Shared where the device's memory can be (CPU, CUDA), copied through the host on wgpu.
    let back = if dev.backend().dlpack_device().is_some() {
        Tensor::from_dlpack(rows.to_dlpack()?, dev)?
    } else {
        let options = strata::dlpack::ExportOptions {
            copy: Some(true),
            ..Default::default()
        };
        Tensor::from_dlpack_copy(rows.to_dlpack_with(&options)?, dev)?
    };
    if let Ok(pinned) = dev.pinned_host() {
        let host = back.to_device(&pinned)?;
        host.to_device(dev)?.realize()?;
    }
    Ok(back.sum(strata::ops::Axes::All, false)?.item::<f32>()? + gsum.item::<f32>()?)
}

fn soak(dev: &Device) -> Result<()> {
    let cycles: u64 = std::env::var("STRATA_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let stream = dev.new_stream()?;
    // Warm caches (kernels, pools) before taking the baseline.
    for k in 0..3 {
        cycle(dev, k, &stream)?;
    }
    dev.synchronize()?;
    let baseline = dev.memory_stats();
    let mut most_reserved = baseline.reserved;
    let start = std::time::Instant::now();
    for k in 0..cycles {
        let v = cycle(dev, k, &stream)?;
        assert!(v.is_finite(), "cycle {k} read {v}");
        dev.synchronize()?;
        let now = dev.memory_stats();
        assert_eq!(
            now.allocated, baseline.allocated,
            "cycle {k}: memory held after the cycle"
        );
        most_reserved = most_reserved.max(now.reserved);
    }
    let bound = 2 * baseline.reserved.max(1 << 20);
    assert!(
        most_reserved <= bound,
        "reserved grew to {most_reserved} bytes (baseline {}, bound {bound})",
        baseline.reserved
    );
    eprintln!(
        "soak on {}: {cycles} cycles in {:.1} s, allocated {} B throughout, reserved at most {most_reserved} B",
        dev.name(),
        start.elapsed().as_secs_f64(),
        baseline.allocated
    );
    Ok(())
}
test_device!(soak_returns_to_baseline, soak);
