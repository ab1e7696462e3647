//! The host cost of core's launch path, without a GPU: one-element adds on the CPU device
//! (realized, or with `--record` only recorded by lazy fusion), or
//! (`--plan`) only the operand checks and the map plan a GPU backend makes for each launch.
//! Wall-clock times on a shared machine are noisy; count instructions instead with
//! `valgrind --tool=callgrind` at two values of `HOST_COST_N` and divide the difference.
//!
//! `cargo run --release -p strata-core --example host_cost [-- --plan | --record]`

use std::time::Instant;
use strata_core::backend::KernelArgs;
use strata_core::ir::{BinaryOp, Expr};
use strata_core::lower::{map_plan, operands::MapOperands, pieces::BufferInfo};
use strata_core::target::Target;
use strata_core::{DType, Device, Tensor};

fn main() -> strata_core::Result<()> {
    let n: usize = std::env::var("HOST_COST_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dev = Device::cpu();
    let one = Tensor::ones([1], DType::F32, &dev)?;
    if std::env::args().any(|a| a == "--plan") {
        // CUDA's target: 16-byte vectors, reduction groups, an H100's slots.
        let mut target = Target::cpu(1);
        target.vector_bytes = 16;
        target.group_sizes = &[1, 32, 256];
        target.parallel_slots = 132 * 2048;
        let x = |k| Expr::input(k, DType::F32);
        let expr = Expr::binary(BinaryOp::Add, x(0), x(1));
        let args = KernelArgs {
            outputs: vec![one.operand().unwrap()],
            inputs: vec![one.operand().unwrap(), one.operand().unwrap()],
            scalars: vec![],
        };
        let buffers = vec![
            BufferInfo {
                address: 4096,
                bytes: 4
            };
            3
        ];
        let t = Instant::now();
        let mut pieces = 0;
        for _ in 0..n {
            let ops = MapOperands::of(&expr, &args)?;
            pieces += map_plan::plan(&ops, false, &buffers, &target)?.pieces.len();
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("operand checks + map plan: {us:.3} us ({pieces} pieces)");
        return Ok(());
    }
    // `--record`: recording only (lazy fusion; a pending add dropped unread never runs).
    // Otherwise each add is realized: recording, then its one-op kernel.
    let record_only = std::env::args().any(|a| a == "--record");
    let add = || -> strata_core::Result<()> {
        let y = (&one + &one)?;
        if record_only {
            Ok(())
        } else {
            y.realize()
        }
    };
    for _ in 0..(n / 5).max(10) {
        add()?;
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            add()?;
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    let what = if record_only { "recorded" } else { "realized" };
    println!("one-element add on the CPU device, {what}: {best:.3} us (best of 5 × {n})");
    Ok(())
}
