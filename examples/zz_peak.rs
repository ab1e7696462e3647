use strata::nn::{AdamW, Optimizer};
use strata::ops::Axes;
use strata::prelude::*;
fn mib(d: &Device) -> String {
    let s = d.memory_stats();
    format!(
        "alloc {:.1} peak {:.1}",
        s.allocated as f64 / 1048576.0,
        s.peak as f64 / 1048576.0
    )
}
fn main() -> Result<()> {
    let dev = Device::cpu();
    let batch: usize = std::env::var("B")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048);
    let mut g = strata::random::Generator::new(5);
    let sizes = [784, 4096, 4096, 10];
    let mut params = Vec::new();
    for pair in sizes.windows(2) {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let w = Tensor::randn([fan_in, fan_out], DType::F32, &mut g, &dev)?
            .mul(1.0 / (fan_in as f64).sqrt())?
            .requires_grad_(true)?;
        let b = Tensor::zeros([fan_out], DType::F32, &dev)?.requires_grad_(true)?;
        params.push((w, b));
    }
    let x = Tensor::randn([batch, 784], DType::F32, &mut g, &dev)?;
    let y = Tensor::randint(0, 10, [batch, 1], DType::I64, &mut g, &dev)?;
    dev.flush()?;
    let flat: Vec<Tensor> = params
        .iter()
        .flat_map(|(w, b)| [w.clone(), b.clone()])
        .collect();
    for (i, p) in flat.iter().enumerate() {
        let d = dev.clone();
        let _ = p.register_post_accumulate_grad_hook(move |_| {
            eprintln!("  grad {i} done: {}", mib(&d));
            Ok(())
        })?;
    }
    let mut opt = AdamW::new(flat.clone(), 1e-3)?;
    for s in 0..2 {
        eprintln!("step {s} start: {}", mib(&dev));
        let mut h = x.clone();
        for (k, (w, b)) in params.iter().enumerate() {
            h = h.matmul(w)?.add(b)?;
            if k + 1 < params.len() {
                h = h.gelu()?;
            }
        }
        let loss = h
            .log_softmax(-1)?
            .gather(1, &y)?
            .mean(Axes::All, false)?
            .neg()?;
        loss.realize()?;
        eprintln!("forward: {}", mib(&dev));
        loss.backward()?;
        eprintln!("backward returned: {}", mib(&dev));
        dev.flush()?;
        eprintln!("backward flushed: {}", mib(&dev));
        opt.step()?;
        dev.flush()?;
        eprintln!("step: {}", mib(&dev));
        opt.zero_grad();
        drop(loss);
        drop(h);
        eprintln!("end: {}", mib(&dev));
    }
    Ok(())
}
