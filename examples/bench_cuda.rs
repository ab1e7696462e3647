//! The CUDA backend's benchmark (run by `scripts/gpu-run.sh` on the GPU machine beside
//! `scripts/bench_torch.py`, which measures PyTorch the same way in the same run).
//!
//! `bench_cuda` prints one JSON object per line: `op`, median `ms` of 20 timed repetitions
//! (CUDA events around each), and the `bytes` moved or `flops` done, so the caller computes
//! GB/s and TFLOP/s. `bench_cuda first-op` prints the latency of a new process's first add
//! (context, kernel compile or PTX-cache load, launch, read back).

use std::time::Instant;
use strata::ops::Axes;
use strata::prelude::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median milliseconds of `op` over 20 repetitions of `inner` calls each, timed with events.
fn time(dev: &Device, inner: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        op()?;
    }
    dev.synchronize()?;
    let s = dev.current_stream();
    let mut runs = Vec::new();
    for _ in 0..20 {
        let start = s.record_event()?;
        for _ in 0..inner {
            op()?;
        }
        let end = s.record_event()?;
        end.synchronize()?;
        runs.push(start.elapsed_ms(&end)? / inner as f64);
    }
    Ok(median(runs))
}

fn row(op: &str, ms: f64, bytes: f64, flops: f64) {
    println!("{{\"op\": \"{op}\", \"ms\": {ms:.6}, \"bytes\": {bytes}, \"flops\": {flops}}}");
}

fn first_op() -> Result<()> {
    let t0 = Instant::now();
    let dev = Device::cuda(0)?;
    let t1 = Instant::now();
    let a = Tensor::ones([1024], DType::F32, &dev)?;
    let v = (&a + &a)?.sum(Axes::All, false)?.item::<f32>()?;
    let t2 = Instant::now();
    assert_eq!(v, 2048.0);
    println!(
        "{{\"op\": \"first-op\", \"context_ms\": {:.1}, \"first_ops_ms\": {:.1}}}",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3
    );
    Ok(())
}

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("first-op") {
        return first_op();
    }
    let dev = Device::cuda(0)?;
    let n = 1usize << 28;
    let mut g = strata::random::Generator::new(1);
    let a = Tensor::rand([n], DType::F32, &mut g, &dev)?;
    let b = Tensor::rand([n], DType::F32, &mut g, &dev)?;
    let f = 4.0; // bytes per element

    let ms = time(&dev, 1, || a.copy().map(drop))?;
    row("copy", ms, 2.0 * f * n as f64, 0.0);
    let ms = time(&dev, 1, || (&a + &b).map(drop))?;
    row("add", ms, 3.0 * f * n as f64, 0.0);
    let ms = time(&dev, 1, || a.sum(Axes::All, false).map(drop))?;
    row("sum", ms, f * n as f64, 0.0);
    let a4 = a.reshape([n / 4, 4])?;
    let ms = time(&dev, 1, || a4.sum(-1, false).map(drop))?;
    row("sum-inner-4", ms, 1.25 * f * n as f64, 0.0);
    let side = 1usize << 14;
    let (at, bs) = (a.reshape([side, side])?.t()?, b.reshape([side, side])?);
    let ms = time(&dev, 1, || (&at + &bs).map(drop))?;
    row("add-transposed", ms, 3.0 * f * n as f64, 0.0);
    let relu = || -> Result<()> {
        drop(((&a * &b)? + &a)?.relu()?);
        Ok(())
    };
    let ms = time(&dev, 1, relu)?;
    row("relu(a*b+a) eager", ms, 3.0 * f * n as f64, 0.0);

    let k = 4096;
    let mut g = strata::random::Generator::new(2);
    let x = Tensor::rand([k, k], DType::F32, &mut g, &dev)?;
    let y = Tensor::rand([k, k], DType::F32, &mut g, &dev)?;
    let flops = 2.0 * (k * k * k) as f64;
    let ms = time(&dev, 1, || x.matmul(&y).map(drop))?;
    row("sgemm-4096-fp32", ms, 0.0, flops);
    dev.set_allow_tf32(true);
    let ms = time(&dev, 1, || x.matmul(&y).map(drop))?;
    row("sgemm-4096-tf32", ms, 0.0, flops);
    dev.set_allow_tf32(false);

    // Host cost per op: enqueue 20,000 one-element adds, then wait once.
    let one = Tensor::ones([1], DType::F32, &dev)?;
    for _ in 0..1000 {
        drop((&one + &one)?);
    }
    dev.synchronize()?;
    let count = 20_000;
    let t = Instant::now();
    for _ in 0..count {
        drop((&one + &one)?);
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / count as f64;
    dev.synchronize()?;
    println!("{{\"op\": \"host-us-per-add\", \"us\": {us:.3}}}");
    Ok(())
}
