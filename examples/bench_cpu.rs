//! CPU backend vs ndarray on the same machine: `cargo run --release --example bench_cpu`.
//! Prints one table: median time of 15 runs, GB/s (bytes read + written), and the ratio to
//! ndarray (higher is better for strata).

use ndarray::Array1;
use std::time::Instant;
use strata::ops::Axes;
use strata::prelude::*;

fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[runs / 2]
}

fn main() -> Result<()> {
    let n = 1usize << 24;
    let dev = Device::cpu();
    let a = Tensor::rand(
        [n],
        DType::F32,
        &mut strata::random::Generator::new(1),
        &dev,
    )?;
    let b = Tensor::rand(
        [n],
        DType::F32,
        &mut strata::random::Generator::new(2),
        &dev,
    )?;
    let (na, nb) = (
        Array1::from(a.to_vec::<f32>()?),
        Array1::from(b.to_vec::<f32>()?),
    );

    // Lazy fusion defers elementwise work until it is needed: realize each result so the
    // timed op runs (a result dropped unread never does).
    let add_s = median_ms(15, || (&a + &b).unwrap().realize().unwrap());
    let add_n = median_ms(15, || drop(&na + &nb));
    let sum_s = median_ms(15, || {
        std::hint::black_box(a.sum(Axes::All, false).unwrap().item::<f32>().unwrap());
    });
    let sum_n = median_ms(15, || {
        std::hint::black_box(na.sum());
    });
    let t = a.reshape([4096, 4096])?.t()?;
    let nt = na
        .view()
        .into_shape_with_order((4096, 4096))
        .unwrap()
        .reversed_axes();
    let tadd_s = median_ms(9, || (&t + &t).unwrap().realize().unwrap());
    let tadd_n = median_ms(9, || drop(&nt + &nt));
    // relu(a*b + c): one fused pass in strata, one Zip pass in ndarray; strata eager too.
    let c = Tensor::rand(
        [n],
        DType::F32,
        &mut strata::random::Generator::new(3),
        &dev,
    )?;
    let nc = Array1::from(c.to_vec::<f32>()?);
    let chain = || (&a * &b)?.add(&c)?.relu()?.realize();
    let relu_s = median_ms(15, || chain().unwrap());
    dev.set_fusion(false)?;
    let relu_eager = median_ms(15, || chain().unwrap());
    dev.set_fusion(true)?;
    let relu_n = median_ms(15, || {
        drop(
            ndarray::Zip::from(&na)
                .and(&nb)
                .and(&nc)
                .map_collect(|&x, &y, &z| (x * y + z).max(0.0)),
        )
    });

    let gbs = |bytes: usize, ms: f64| bytes as f64 / ms / 1e6;
    println!("| op (f32, 2^24 elements) | strata ms | strata GB/s | ndarray ms | ndarray GB/s | strata / ndarray |");
    println!("|---|---|---|---|---|---|");
    for (name, s, nd, bytes) in [
        ("add a + b", add_s, add_n, 12 * n),
        ("sum (all)", sum_s, sum_n, 4 * n),
        ("add of transposed 4096² views", tadd_s, tadd_n, 12 * n),
        (
            "relu(a*b + c), fused (ndarray: one Zip)",
            relu_s,
            relu_n,
            16 * n,
        ),
        (
            "relu(a*b + c), eager (fusion off)",
            relu_eager,
            relu_n,
            16 * n,
        ),
    ] {
        println!(
            "| {name} | {s:.2} | {:.1} | {nd:.2} | {:.1} | {:.2}× |",
            gbs(bytes, s),
            gbs(bytes, nd),
            nd / s
        );
    }
    Ok(())
}
