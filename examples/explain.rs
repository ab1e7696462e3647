//! Lazy fusion seen through `explain`: a chain of elementwise ops becomes one kernel.
//!
//! `cargo run --example explain -- [cpu|cuda|wgpu]` prints the kernel behind
//! `relu(a*b + c)` before and after it runs, with the generated source.

use strata::prelude::*;

fn main() -> Result<()> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    let dev = Device::parse(&name)?;
    let mut g = Generator::new(0);
    let [a, b, c] = [(); 3].map(|_| Tensor::randn([4, 1024], DType::F32, &mut g, &dev));
    let (a, b, c) = (a?, b?, c?);
    dev.flush()?;
    let y = (&a * &b)?.add(&c)?.relu()?;
    println!("{}", y.explain()?);
    let peak = dev.memory_stats().peak;
    y.realize()?;
    println!("{}", y.explain()?);
    let s = (&y - 1.0)?.exp()?.t()?;
    println!("{}", s.explain()?);
    println!("peak before the kernel ran: {peak} bytes");
    Ok(())
}
