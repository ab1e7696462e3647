//! The sweep benchmark: every op family once, at sizes where the GPU's bandwidth or FLOP rate
//! decides (run by `scripts/gpu-run.sh sweep` beside `scripts/bench_sweep_torch.py`, which times
//! the same ops with PyTorch in the same run; `scripts/bench_sweep_table.py` joins the two).
//!
//! `bench_sweep [--device cuda|wgpu] [--log2n N] [--side S] [--gemm K]` prints one JSON object
//! per line: `op` and the median `ms` of 15 repetitions timed with stream events (CUDA events,
//! wgpu timestamp queries), or with the wall clock for the host↔device copies (`wall: true`).
//! Defaults: 2^28 f32 elements, [16384, 16384] matrices, matmuls of 8192³ (smaller sizes suit
//! lavapipe). Every timed op realizes its result, so lazy fusion cannot skip it.
//! `STRATA_SWEEP_ONLY=randint,zeros` runs only the rows named (the setup still runs).

mod bench_common;

use bench_common::{arg, median};
use std::time::Instant;
use strata::ops::Axes;
use strata::prelude::*;

const REPS: usize = 15;

/// Median milliseconds of `op`, timed with events on the current stream.
fn time(dev: &Device, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
        op()?;
    }
    // Under the profiler every kernel is compiled at its own level first (on CUDA a new kernel
    // runs interpreted or quickly compiled while that compile is in the background).
    dev.profile(&mut op)?;
    dev.synchronize()?;
    let s = dev.current_stream();
    let mut runs = Vec::new();
    for _ in 0..REPS {
        let start = s.record_event()?;
        op()?;
        let end = s.record_event()?;
        end.synchronize()?;
        runs.push(start.elapsed_ms(&end)?);
    }
    Ok(median(runs))
}

/// Median wall-clock milliseconds of `op` (which returns once its result is on the host or
/// once its copy is done), with a device synchronize before and after each repetition.
fn wall(dev: &Device, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    op()?;
    let mut runs = Vec::new();
    for _ in 0..reps {
        dev.synchronize()?;
        let t = Instant::now();
        op()?;
        dev.synchronize()?;
        runs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(runs))
}

fn keep(t: Result<Tensor>) -> Result<()> {
    t?.realize()
}

/// One result line; an op that fails prints its error and the sweep goes on.
/// `STRATA_SWEEP_ONLY` (comma-separated op names) runs only those rows.
fn row(op: &str, ms: impl FnOnce() -> Result<f64>) {
    if let Ok(only) = std::env::var("STRATA_SWEEP_ONLY") {
        if !only.split(',').any(|o| o.trim() == op) {
            return;
        }
    }
    match ms() {
        Ok(ms) => println!("{{\"op\": \"{op}\", \"ms\": {ms:.6}}}"),
        Err(e) => println!("{{\"op\": \"{op}\", \"error\": {:?}}}", e.to_string()),
    }
}

fn main() -> Result<()> {
    let dev = match arg("--device", "cuda").as_str() {
        "cuda" => Device::cuda(0)?,
        "wgpu" => Device::wgpu()?,
        other => {
            return Err(Error::Invalid(format!(
                "--device {other}: expected cuda or wgpu"
            )))
        }
    };
    eprintln!("device: {}", dev.name());
    let n = 1usize << arg("--log2n", "28").parse::<u32>().unwrap_or(28);
    let side: usize = arg("--side", "16384").parse().unwrap_or(16384);
    let k: usize = arg("--gemm", "8192").parse().unwrap_or(8192);
    let mut g = strata::random::Generator::new(1);
    let f32 = DType::F32;

    // Creation and random numbers.
    row("zeros", || {
        time(&dev, || keep(Tensor::zeros([n], f32, &dev)))
    });
    row("arange", || {
        time(&dev, || keep(Tensor::arange(0, n as i64, 1, f32, &dev)))
    });
    row("rand", || {
        time(&dev, || keep(Tensor::rand([n], f32, &mut g, &dev)))
    });
    row("randn", || {
        time(&dev, || keep(Tensor::randn([n], f32, &mut g, &dev)))
    });
    row("randint", || {
        time(&dev, || {
            keep(Tensor::randint(0, 1000, [n], DType::I64, &mut g, &dev))
        })
    });

    // 64-bit outputs: stores of whole 16-byte vectors (wgpu writes four lanes as two).
    row("zeros i64", || {
        time(&dev, || keep(Tensor::zeros([n], DType::I64, &dev)))
    });
    row("rand f64", || {
        time(&dev, || keep(Tensor::rand([n], DType::F64, &mut g, &dev)))
    });
    // Host <-> device copies of 1 GiB (wall clock).
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    row("from_slice 1GiB", || {
        wall(&dev, 5, || keep(Tensor::from_slice(&host, [n], &dev)))
    });
    drop(host);
    let a = Tensor::rand([n], f32, &mut g, &dev)?;
    let b = Tensor::rand([n], f32, &mut g, &dev)?;
    row("to_vec 1GiB", || {
        wall(&dev, 5, || a.to_vec::<f32>().map(drop))
    });
    // From and into pinned host memory (CUDA): PyTorch's `pin_memory()` + `non_blocking`.
    if let Ok(pinned) = dev.pinned_host() {
        let p = Tensor::arange(0, n as i64, 1, f32, &pinned)?;
        row("pinned upload 1GiB", || {
            wall(&dev, 5, || keep(p.to_device(&dev)))
        });
        drop(p);
        row("pinned download 1GiB", || {
            wall(&dev, 5, || a.to_device(&pinned).map(drop))
        });
    }

    // Elementwise, casts.
    row("copy", || time(&dev, || keep(a.copy())));
    row("add", || time(&dev, || keep(&a + &b)));
    row("mul scalar", || time(&dev, || keep(&a * 3.0)));
    row("exp", || time(&dev, || keep(a.exp())));
    row("tanh", || time(&dev, || keep(a.tanh())));
    let cond = a.gt(0.5)?;
    cond.realize()?;
    row("where", || {
        time(&dev, || keep(Tensor::where_cond(&cond, &a, &b)))
    });
    row("cast f32->f16", || {
        time(&dev, || keep(a.to_dtype(DType::F16)))
    });
    row("cast f32->i32", || {
        time(&dev, || keep(a.to_dtype(DType::I32)))
    });
    row("cast f32->f64", || {
        time(&dev, || keep(a.to_dtype(DType::F64)))
    });

    // Reductions along the inner and the outer axis, and argmax.
    let m = a.slice(s![..side * side])?.reshape([side, side])?;
    row("sum all", || time(&dev, || keep(a.sum(Axes::All, false))));
    row("sum axis -1", || time(&dev, || keep(m.sum(-1, false))));
    row("sum axis 0", || time(&dev, || keep(m.sum(0, false))));
    row("max axis 0", || time(&dev, || keep(m.max(0, false))));
    row("max axis -1", || time(&dev, || keep(m.max(-1, false))));
    row("mean axis -1", || time(&dev, || keep(m.mean(-1, false))));
    row("argmax axis -1", || {
        time(&dev, || keep(m.argmax(Some(-1), false)))
    });
    row("transpose contiguous", || {
        time(&dev, || keep(m.t()?.copy()))
    });

    // Index ops: a random permutation's worth of rows (random with repeats, as PyTorch's
    // benchmark does with randint).
    let rows = Tensor::randint(0, side as i64, [side], DType::I64, &mut g, &dev)?;
    rows.realize()?;
    row("index_select axis 0", || {
        time(&dev, || keep(m.index_select(0, &rows)))
    });
    row("index_select axis 1", || {
        time(&dev, || keep(m.index_select(1, &rows)))
    });
    let flat = Tensor::randint(0, n as i64, [n / 4], DType::I64, &mut g, &dev)?;
    flat.realize()?;
    row("take", || time(&dev, || keep(a.take(&flat))));
    let gidx = Tensor::randint(0, side as i64, [side, side], DType::I64, &mut g, &dev)?;
    gidx.realize()?;
    row("gather axis 1", || time(&dev, || keep(m.gather(1, &gidx))));
    let mask = m.gt(0.5)?;
    mask.realize()?;
    row("masked_fill", || {
        time(&dev, || keep(m.masked_fill(&mask, 0.0)))
    });

    // Joins.
    let half = m.narrow(0, 0, side / 2)?;
    let half2 = m.narrow(0, side / 2, side / 2)?;
    row("cat axis 1", || {
        time(&dev, || keep(Tensor::cat(&[&half, &half2], 1)))
    });
    row("cat axis 0", || {
        time(&dev, || keep(Tensor::cat(&[&half, &half2], 0)))
    });
    row("stack axis 0", || {
        time(&dev, || keep(Tensor::stack(&[&half, &half2], 0)))
    });
    row("split axis 1 contiguous", || {
        time(&dev, || {
            for piece in m.split(side / 2, 1)? {
                keep(piece.contiguous())?;
            }
            Ok(())
        })
    });

    // Matmul in each float dtype.
    let x = Tensor::rand([k, k], f32, &mut g, &dev)?;
    let y = Tensor::rand([k, k], f32, &mut g, &dev)?;
    row("matmul f32", || time(&dev, || keep(x.matmul(&y))));
    for dt in [DType::F16, DType::BF16] {
        let (xh, yh) = (x.to_dtype(dt)?, y.to_dtype(dt)?);
        row(&format!("matmul {dt}"), || {
            time(&dev, || keep(xh.matmul(&yh)))
        });
    }
    let (xd, yd) = (
        x.narrow(0, 0, k / 4)?
            .narrow(1, 0, k / 4)?
            .to_dtype(DType::F64)?,
        y.narrow(0, 0, k / 4)?
            .narrow(1, 0, k / 4)?
            .to_dtype(DType::F64)?,
    );
    row("matmul f64 (k/4)", || time(&dev, || keep(xd.matmul(&yd))));
    Ok(())
}
